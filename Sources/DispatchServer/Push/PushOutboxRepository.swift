import DispatchCore
import DispatchIO

/// The sender's SQL on `push_outbox` (Migrations/0004_push.sql): claiming due rows under a
/// lease and writing back what their pushes became, every write fenced by the lease.
enum PushOutboxRepository {
    /// Claims up to `limit` due rows for `leaseMs` and returns each with the activity as it is
    /// now (the newest state is what gets pushed: older changes are coalesced into it) and
    /// the sealed token it goes to. A claimed row's `due_at` becomes its lease's end, so the
    /// due scan skips it while it is out and finds it again by itself if its sender dies.
    static func claim(limit: Int, leaseMs: Int) -> PGQuery {
        PGQuery("""
            WITH due AS (
              SELECT id FROM push_outbox
              WHERE wanted_seq > sent_seq AND NOT failed AND due_at <= now()
              ORDER BY due_at LIMIT $1::int
              FOR UPDATE SKIP LOCKED
            ), lease AS (
              SELECT nextval('push_leases') AS lease_id
            ), claimed AS (
              UPDATE push_outbox o SET lease_id = lease.lease_id, lease_until = now() + $2::int * interval '1 millisecond',
                     due_at = now() + $2::int * interval '1 millisecond', attempts = o.attempts + 1
              FROM due, lease WHERE o.id = due.id
              RETURNING o.id, o.lease_id, o.kind, o.activity_id AS outbox_activity_id, o.device_id, o.priority,
                        o.pending_since_ms, o.last_timestamp, o.attempts
            )
            SELECT c.*, (extract(epoch FROM now()) * 1000)::bigint AS claimed_ms,
                   a.activity_id, a.task_name, a.system_image, a.machine, a.cancel_url, a.state, a.progress, a.status,
                   a.attempt, a.seq, a.cancel_requested, a.created_ms, a.updated_ms, a.ended_ms, a.error, a.last_event,
                   a.owner_key_id, a.start_fingerprint, a.end_fingerprint, a.live_activity, a.stale_after_s,
                   CASE WHEN c.kind = 'start' THEN d.push_to_start_mac ELSE t.token_mac END AS token_mac,
                   CASE WHEN c.kind = 'start' THEN d.push_to_start_sealed ELSE t.token_sealed END AS token_sealed,
                   CASE WHEN c.kind = 'start' THEN d.push_to_start_hint ELSE t.token_hint END AS token_hint
            FROM claimed c
            LEFT JOIN activities a ON a.activity_id = c.outbox_activity_id
            LEFT JOIN activity_tokens t ON c.kind = 'update' AND t.device_id = c.device_id AND t.activity_id = c.outbox_activity_id
            LEFT JOIN devices d ON d.id = c.device_id
            """, [String(limit), String(leaseMs)], name: "push_claim")
    }

    /// One claimed row, decoded.
    struct ClaimedRow {
        var job: PushJob
        var priority: Int
        var lastTimestamp: Int64
        var snapshot: Activity?
        var tokenMac: [UInt8]?
        var tokenSealed: [UInt8]?
        var tokenHint: String
    }

    static func decode(_ row: PGRow) -> ClaimedRow? {
        guard let id = row.int64("id"), let lease = row.int64("lease_id"), let kind = row["kind"].flatMap(PushKind.init(rawValue:)),
              let activityID = row["outbox_activity_id"], let device = row.int64("device_id"), let claimed = row.int64("claimed_ms")
        else { return nil }
        let snapshot = StoredActivity(row: row)?.activity
        let last = row.int64("last_timestamp") ?? 0
        let job = PushJob(outboxID: id, leaseID: lease, kind: kind, activityID: activityID, deviceID: device,
                          seq: snapshot?.seq ?? 0, timestamp: last, attempts: row.int("attempts") ?? 1,
                          pendingSinceMs: row.int64("pending_since_ms"), claimedAtMs: claimed,
                          tokenMac: Bytea.decode(row["token_mac"]) ?? [], tokenHint: row["token_hint"] ?? "…")
        return ClaimedRow(job: job, priority: row.int("priority") ?? 5, lastTimestamp: last, snapshot: snapshot,
                          tokenMac: Bytea.decode(row["token_mac"]), tokenSealed: Bytea.decode(row["token_sealed"]),
                          tokenHint: row["token_hint"] ?? "…")
    }

    /// The statements that write `marks`, as one pipeline batch (one transaction). The rows
    /// are locked first in the order the publish path's upserts take them (activity, device,
    /// kind), so a batch of marks and a publish batch never deadlock.
    static func marks(_ marks: [PushMark]) -> [PGQuery] {
        var queries = [PGQuery("SELECT 1 FROM push_outbox WHERE id = ANY($1::bigint[]) ORDER BY activity_id, device_id, kind FOR UPDATE",
                               [numbers(marks.map(\.job.outboxID))], name: "push_mark_lock")]
        var sent: [(PushJob, pushed: Bool)] = []
        var retries: [(PushJob, delayMs: Int64, status: String, uncount: Int)] = []
        var failed: [(PushJob, String)] = []
        var retired: [(PushJob, sinceMs: Int64, status: String)] = []
        var dropped: [PushJob] = []
        for m in marks {
            switch m {
            case .delivered(let j): sent.append((j, true))
            case .skipped(let j): sent.append((j, false))
            case .retry(let j, let after, let status, let counts): retries.append((j, Int64((after * 1000).rounded()), status, counts ? 0 : 1))
            case .failed(let j, let status): failed.append((j, status))
            case .retire(let j, let since, let status): retired.append((j, since, status))
            case .drop(let j): dropped.append(j)
            }
        }
        if !sent.isEmpty {
            // The next push of the row waits until its timestamp may grow without running ahead
            // of the clock (PushTimestamp); a change that came meanwhile makes it due again.
            queries.append(PGQuery("""
                UPDATE push_outbox o SET sent_seq = GREATEST(o.sent_seq, m.seq), last_timestamp = GREATEST(o.last_timestamp, m.ts),
                       last_status = CASE WHEN m.pushed THEN '200' ELSE 'skipped' END,
                       sent_at = CASE WHEN m.pushed THEN now() ELSE o.sent_at END,
                       attempts = 0, failed = false, lease_id = NULL, lease_until = NULL,
                       due_at = GREATEST(now(), to_timestamp(m.not_before)),
                       pending_since_ms = CASE WHEN o.wanted_seq > GREATEST(o.sent_seq, m.seq) THEN m.claimed_ms END
                FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], $7::boolean[])
                     AS m(id, lease, seq, ts, not_before, claimed_ms, pushed)
                WHERE o.id = m.id AND o.lease_id = m.lease
                """, [numbers(sent.map(\.0.outboxID)), numbers(sent.map(\.0.leaseID)), numbers(sent.map(\.0.seq)),
                      numbers(sent.map(\.0.timestamp)), numbers(sent.map { PushTimestamp.nextAllowed(after: $0.0.timestamp) }),
                      numbers(sent.map(\.0.claimedAtMs)), "{" + sent.map { $0.pushed ? "t" : "f" }.joined(separator: ",") + "}"],
                name: "push_mark_sent"))
        }
        if !retries.isEmpty {
            queries.append(PGQuery("""
                UPDATE push_outbox o SET lease_id = NULL, lease_until = NULL, due_at = now() + m.delay_ms * interval '1 millisecond',
                       last_status = m.status, attempts = GREATEST(o.attempts - m.uncount, 0)
                FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::text[], $5::int[]) AS m(id, lease, delay_ms, status, uncount)
                WHERE o.id = m.id AND o.lease_id = m.lease
                """, [numbers(retries.map(\.0.outboxID)), numbers(retries.map(\.0.leaseID)), numbers(retries.map(\.delayMs)),
                      ActivityRepository.array(retries.map(\.status)), numbers(retries.map { Int64($0.uncount) })],
                name: "push_mark_retry"))
        }
        if !failed.isEmpty {
            queries.append(PGQuery("""
                UPDATE push_outbox o SET failed = true, lease_id = NULL, lease_until = NULL, due_at = now(), last_status = m.status
                FROM unnest($1::bigint[], $2::bigint[], $3::text[]) AS m(id, lease, status)
                WHERE o.id = m.id AND o.lease_id = m.lease
                """, [numbers(failed.map(\.0.outboxID)), numbers(failed.map(\.0.leaseID)), ActivityRepository.array(failed.map(\.1))],
                name: "push_mark_failed"))
        }
        if !dropped.isEmpty {
            queries.append(PGQuery("""
                DELETE FROM push_outbox o USING unnest($1::bigint[], $2::bigint[]) AS m(id, lease)
                WHERE o.id = m.id AND o.lease_id = m.lease
                """, [numbers(dropped.map(\.outboxID)), numbers(dropped.map(\.leaseID))], name: "push_mark_drop"))
        }
        for r in retired {
            queries.append(retire(r.0, sinceMs: r.sinceMs, status: r.status))
        }
        return queries
    }

    /// A 410 or `BadDeviceToken`: the token goes, with every pending push to it, unless it was
    /// registered again after `sinceMs` (APNs' "invalid since"); then the row is due again at
    /// once and the push goes to the new registration. The token is identified by its MAC
    /// as claimed, so a token replaced meanwhile is never retired in its successor's place.
    static func retire(_ job: PushJob, sinceMs: Int64, status: String) -> PGQuery {
        PGQuery("""
            WITH r AS (
              SELECT o.id, o.kind, o.device_id, o.activity_id FROM push_outbox o WHERE o.id = $1::bigint AND o.lease_id = $2::bigint
            ), gone_token AS (
              DELETE FROM activity_tokens t USING r
              WHERE r.kind = 'update' AND t.device_id = r.device_id AND t.activity_id = r.activity_id AND t.token_mac = $3::bytea
                AND t.registered_at <= to_timestamp($4::bigint / 1000.0)
              RETURNING t.device_id, t.activity_id
            ), gone_start AS (
              UPDATE devices d SET push_to_start_mac = NULL, push_to_start_sealed = NULL, push_to_start_hint = NULL, push_to_start_at = NULL
              FROM r
              WHERE r.kind = 'start' AND d.id = r.device_id AND d.push_to_start_mac = $3::bytea
                AND d.push_to_start_at <= to_timestamp($4::bigint / 1000.0)
              RETURNING d.id
            ), cancelled AS (
              DELETE FROM push_outbox o
              WHERE (o.kind = 'update' AND (o.device_id, o.activity_id) IN (SELECT device_id, activity_id FROM gone_token))
                 OR (o.kind = 'start' AND o.wanted_seq > o.sent_seq AND o.device_id IN (SELECT id FROM gone_start))
              RETURNING o.id
            )
            UPDATE push_outbox o SET lease_id = NULL, lease_until = NULL, due_at = now(), last_status = $5
            FROM r WHERE o.id = r.id AND o.id NOT IN (SELECT id FROM cancelled)
            RETURNING o.id
            """, [String(job.outboxID), String(job.leaseID), Bytea.literal(job.tokenMac), String(sinceMs), status],
            name: "push_mark_retire")
    }

    static func numbers(_ values: [Int64]) -> String { "{" + values.map(String.init).joined(separator: ",") + "}" }
}
