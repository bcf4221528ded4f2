import DispatchCore
import PGCore
import DispatchIO

/// The sender's SQL on `push_activity_outbox` (Migrations/0016): one entry per activity whose
/// change is to be pushed to every token of it. Claimed in batches under a lease and read, with
/// every token of the batch's activities, in the claim's own batch; marked in one statement per batch.
enum PushFanOutRepository {
    /// Claims up to `limit` due entries for `leaseMs`, as `PushOutboxRepository.claim` does
    /// rows, and notes their activity ids in the transaction (`claimedSetting`) for the reads
    /// that follow it in the same batch.
    static func claim(limit: Int, leaseMs: Int) -> PGQuery {
        PGQuery("""
            WITH lease AS (SELECT nextval('push_leases') AS lease_id), claimed AS (
              UPDATE push_activity_outbox o SET lease_id = (SELECT lease_id FROM lease),
                     lease_until = now() + $2::int * interval '1 millisecond',
                     due_at = now() + $2::int * interval '1 millisecond', attempts = o.attempts + 1
              WHERE o.ctid = ANY (ARRAY(
                SELECT ctid FROM push_activity_outbox
                WHERE (wanted_seq > sent_seq OR stale_refresh_ms > 0) AND due_at <= now()
                ORDER BY due_at LIMIT $1::int
                FOR UPDATE SKIP LOCKED))
              RETURNING o.activity_id, o.lease_id, o.priority, o.pending_since_ms, GREATEST(o.last_timestamp, o.row_timestamp) AS last_timestamp,
                        o.attempts, (extract(epoch FROM now()) * 1000)::bigint AS claimed_ms, o.sent_seq, o.stale_refresh_ms > 0 AS stale_refresh)
            SELECT c.* FROM claimed c
            WHERE (SELECT set_config('\(claimedSetting)', array_agg(activity_id)::text, true) FROM claimed) IS NOT NULL
            """, [String(limit), String(leaseMs)], name: "push_fanout_claim")
    }

    /// The transaction-local setting where `claim` notes what it claimed: the reads run as
    /// later statements of the claim's batch (one round trip), each with its own snapshot, so
    /// they see every change committed before the claim took its entries (an entry waiting to
    /// be claimed is not rewritten per change; see ActivityRepository.finalizeStatement). Unset
    /// or empty when nothing was claimed.
    static let claimedSetting = "dispatch.push_claimed"
    private static let claimedIDs = "unnest(coalesce(nullif(current_setting('\(claimedSetting)', true), ''), '{}')::text[])"

    /// One claimed entry, decoded from the claim, then completed by the reads.
    struct ClaimedEntry {
        var entry: PushEntry
        var priority: Int
        var lastTimestamp: Int64
        /// The seq the entry pushed last, and whether a touch asks for a new stale-date
        /// (then devices that got that seq get the push again, with the new date).
        var sentSeq: Int64 = 0
        var staleRefresh = false
        var snapshot: Activity?
        var staleDeadlineMs: Int64?
        var targets: [Target] = []
    }

    /// A token of the entry's activity, with the state of its device's own row.
    struct Target {
        var deviceID: Int64
        var mac: [UInt8]
        var sealed: [UInt8]
        var hint: String
        var environment: APNsEnvironment
        /// The device's own row: pending (its push goes by itself), its pushed seq, failed.
        var rowPending: Bool
        var rowSentSeq: Int64?
        var rowFailed: Bool
    }

    static func decodeClaim(_ row: PGRow, localID: Int64) -> ClaimedEntry? {
        guard let lease = row.int64("lease_id"), let activityID = row["activity_id"], let claimed = row.int64("claimed_ms") else { return nil }
        let last = row.int64("last_timestamp") ?? 0
        let entry = PushEntry(entryID: localID, leaseID: lease, activityID: activityID, seq: 0, timestamp: 0,
                              attempts: row.int("attempts") ?? 1, pendingSinceMs: row.int64("pending_since_ms"), claimedAtMs: claimed)
        return ClaimedEntry(entry: entry, priority: row.int("priority") ?? 5, lastTimestamp: last,
                            sentSeq: row.has("sent_seq") ? row.int64("sent_seq") ?? 0 : 0,
                            staleRefresh: row.has("stale_refresh") && row["stale_refresh"] == "t")
    }

    /// A touch (contract §5.4): when the activity's new stale deadline is at least half of
    /// `staleAfter` past the stale-date its phones were last pushed (its entry's, its channel's),
    /// the entry or channel is due for an update with the same content-state and the new
    /// stale-date, paced like progress (`due_at` is kept when the pace holds it back).
    static func staleRefresh(_ activityID: String) -> PGQuery {
        PGQuery("""
            WITH a AS (
              SELECT x.activity_id, x.stale_after_s,
                     (GREATEST(x.updated_ms, coalesce(x.touched_ms, 0)) + x.stale_after_s::bigint * 1000) / 1000 AS deadline_s
              FROM activities x WHERE x.activity_id = $1 AND x.ended_ms IS NULL AND x.stale_after_s > 0
            ), e AS (
              UPDATE push_activity_outbox o SET stale_refresh_ms = (extract(epoch FROM clock_timestamp()) * 1000)::bigint,
                     due_at = CASE WHEN o.lease_id IS NULL THEN GREATEST(o.due_at, now()) ELSE o.due_at END
              FROM a WHERE o.activity_id = a.activity_id AND o.stale_date > 0 AND o.stale_refresh_ms = 0
                AND a.deadline_s >= o.stale_date + a.stale_after_s / 2
              RETURNING 1
            ), b AS (
              UPDATE broadcast_outbox o SET stale_refresh_ms = (extract(epoch FROM clock_timestamp()) * 1000)::bigint,
                     due_at = CASE WHEN o.lease_id IS NULL THEN GREATEST(o.due_at, now()) ELSE o.due_at END
              FROM a WHERE o.activity_id = a.activity_id AND o.phase = 'live' AND o.stale_date > 0 AND o.stale_refresh_ms = 0
                AND a.deadline_s >= o.stale_date + a.stale_after_s / 2
              RETURNING 1
            )
            SELECT (SELECT count(*) FROM e) + (SELECT count(*) FROM b) AS refreshed
            """, [activityID], name: "push_stale_refresh")
    }

    /// The claimed entries' activities as they are now (`claimedSetting`).
    static func readActivities() -> PGQuery {
        PGQuery("""
            SELECT k.activity_id AS outbox_activity_id, \(ActivityRepository.columns)
            FROM \(claimedIDs) AS k(activity_id)
            LEFT JOIN LATERAL (SELECT * FROM activities x WHERE x.activity_id = k.activity_id LIMIT 1) a ON true
            """, [], name: "push_fanout_activities")
    }

    /// Every token of the claimed entries' activities (`claimedSetting`): one per token however
    /// many keys registered it (the lowest device id, as `DeviceRepository.updateTargets`),
    /// with the device's environment and the state of its own row.
    static func readTargets() -> PGQuery {
        PGQuery("""
            SELECT t.activity_id, t.device_id, t.token_mac, t.token_sealed, t.token_hint, dev.environment,
                   r.wanted_seq AS row_wanted, r.sent_seq AS row_sent, r.failed AS row_failed
            FROM \(claimedIDs) AS k(activity_id)
            CROSS JOIN LATERAL (
              SELECT DISTINCT ON (x.token_mac) x.activity_id, x.device_id, x.token_mac, x.token_sealed, x.token_hint
              FROM activity_tokens x WHERE x.activity_id = k.activity_id ORDER BY x.token_mac, x.device_id) t
            LEFT JOIN LATERAL (SELECT environment FROM devices d WHERE d.id = t.device_id LIMIT 1) dev ON true
            LEFT JOIN LATERAL (SELECT o.wanted_seq, o.sent_seq, o.failed FROM push_outbox o
                               WHERE o.activity_id = t.activity_id AND o.device_id = t.device_id AND o.kind = 'update' LIMIT 1) r ON true
            """, [], name: "push_fanout_targets")
    }

    /// Completes the claimed entries with the two reads' rows.
    static func complete(_ entries: inout [ClaimedEntry], activities: PGResult, targets: PGResult) {
        var snapshots: [String: StoredActivity] = [:]
        for r in activities.rows {
            if let id = r["outbox_activity_id"], let stored = StoredActivity(row: r) { snapshots[id] = stored }
        }
        var byActivity: [String: [Target]] = [:]
        for r in targets.rows {
            guard let id = r["activity_id"], let device = r.int64("device_id"), let mac = Bytea.decode(r["token_mac"]),
                  let sealed = Bytea.decode(r["token_sealed"]) else { continue }
            let wanted = r.int64("row_wanted"), sent = r.int64("row_sent"), failed = r["row_failed"] == "t"
            byActivity[id, default: []].append(Target(
                deviceID: device, mac: mac, sealed: sealed, hint: r["token_hint"] ?? "…",
                environment: r["environment"].flatMap(APNsEnvironment.init(rawValue:)) ?? .production,
                rowPending: wanted.map { $0 > (sent ?? 0) } ?? false && !failed, rowSentSeq: sent, rowFailed: failed))
        }
        for i in entries.indices {
            let id = entries[i].entry.activityID
            if let stored = snapshots[id] {
                entries[i].snapshot = stored.activity
                entries[i].staleDeadlineMs = LiveActivityPayload.staleDeadline(stored.activity, staleAfterSeconds: stored.staleAfter,
                                                                               touchedMs: stored.touchedMs)
                entries[i].entry.seq = stored.activity.seq
            }
            entries[i].targets = byActivity[id] ?? []
        }
    }

    /// The APNs priority of what waits after a push of `seq` went out (SQL expressions: the
    /// activity, the pushed seq, the entry's `wanted_seq` and its `priority`): a change that
    /// came in while the push was being sent raised the priority to the pushed change's too (as
    /// it must, should the push fail). Read from the history after `seq`: 10 when one of those
    /// changes moved the state (a new state, the end), else 5 (progress, status, a cancel
    /// request). When the statement's snapshot does not hold every change up to `wanted` yet (a
    /// commit racing the mark, which the row lock waited for), the priority stays as it is:
    /// never lower than a waiting state change's.
    static func priorityAfter(activity: String, seq: String, wanted: String, current: String) -> String {
        """
        (CASE WHEN \(wanted) > \(seq) AND coalesce((SELECT max(n.seq) FROM activity_events n WHERE n.activity_id = \(activity)), 0) >= \(wanted)
              THEN CASE WHEN EXISTS (
                     SELECT 1 FROM activity_events h
                     WHERE h.activity_id = \(activity) AND h.seq > \(seq) AND h.event <> 'cancel_requested'
                       AND h.event IS DISTINCT FROM (SELECT s.event FROM activity_events s
                                                     WHERE s.activity_id = \(activity) AND s.seq <= \(seq) AND s.event <> 'cancel_requested'
                                                     ORDER BY s.seq DESC LIMIT 1))
                   THEN 10 ELSE 5 END
              ELSE \(current) END)
        """
    }

    /// The statement writing the entry marks of a batch (with `lockAlso`: the activities whose
    /// entries later statements of the batch touch, locked here first). Entries are locked in
    /// activity order, the order the publish path's upserts take them, so the two never
    /// deadlock; every write is fenced by the entry's lease. A fan-out moves the entry's
    /// `sent_seq`, timestamp and pace as a row's push does (`PushOutboxRepository.marks`), and
    /// raises `wanted_seq` on the rows of the devices it passed over.
    static func marks(_ marks: [PushMark], lockAlso: [String], paceSeconds: Double) -> PGQuery? {
        var done: [(PushEntry, devices: Int, delivered: Int)] = []
        var released: [(PushEntry, delayMs: Int64, status: String)] = []
        var dropped: [PushEntry] = []
        for m in marks {
            switch m {
            case .fannedOut(let e, let devices, let delivered): done.append((e, devices, delivered))
            case .releaseEntry(let e, let after, let status): released.append((e, Int64((after * 1000).rounded()), status.label))
            case .dropEntry(let e): dropped.append(e)
            case .delivered, .skipped, .retry, .retire, .failed, .drop: break
            }
        }
        let lock = Set(done.map(\.0.activityID) + released.map(\.0.activityID) + dropped.map(\.activityID) + lockAlso).sorted()
        guard !lock.isEmpty else { return nil }
        let waiting = priorityAfter(activity: "m.activity_id", seq: "m.seq", wanted: "o.wanted_seq", current: "o.priority")
        let bumps = done.flatMap { d in d.0.passedOver.map { (d.0.activityID, $0, d.0.seq, d.0.claimedAtMs) } }
        return PGQuery("""
            WITH locked AS MATERIALIZED (
              SELECT e.activity_id FROM push_activity_outbox e WHERE e.activity_id = ANY($1::text[]) ORDER BY e.activity_id FOR UPDATE
            ), fanned AS (
              UPDATE push_activity_outbox o SET sent_seq = GREATEST(o.sent_seq, m.seq), last_timestamp = GREATEST(o.last_timestamp, m.ts),
                     last_status = CASE WHEN m.delivered > 0 THEN '200' WHEN m.devices = 0 THEN 'no tokens' ELSE 'retrying per device' END,
                     sent_at = CASE WHEN m.delivered > 0 THEN now() ELSE o.sent_at END, last_devices = m.devices,
                     stale_date = CASE WHEN m.delivered > 0 AND m.stale > 0 THEN m.stale ELSE o.stale_date END,
                     stale_refresh_ms = CASE WHEN o.stale_refresh_ms <= m.claimed_ms THEN 0 ELSE o.stale_refresh_ms END,
                     attempts = 0, lease_id = NULL, lease_until = NULL,
                     priority = \(waiting),
                     due_at = CASE WHEN m.delivered > 0 AND NOT (\(waiting) = 10 AND o.wanted_seq > m.seq)
                                   THEN GREATEST(now(), to_timestamp(m.changed_ms / 1000.0) + $11::float8 * interval '1 second', to_timestamp(m.not_before))
                                   ELSE GREATEST(now(), to_timestamp(m.not_before)) END,
                     pending_since_ms = CASE WHEN o.wanted_seq > GREATEST(o.sent_seq, m.seq) THEN m.claimed_ms END
              FROM locked l JOIN unnest($2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[], $8::bigint[],
                                        $9::int[], $10::int[], $22::bigint[])
                                 AS m(activity_id, lease, seq, ts, not_before, claimed_ms, changed_ms, devices, delivered, stale)
                ON l.activity_id = m.activity_id
              WHERE o.activity_id = m.activity_id AND o.lease_id = m.lease
              RETURNING o.activity_id
            ), released AS (
              UPDATE push_activity_outbox o SET lease_id = NULL, lease_until = NULL, due_at = now() + m.delay_ms * interval '1 millisecond',
                     last_status = m.status, attempts = GREATEST(o.attempts - 1, 0)
              FROM locked l JOIN unnest($12::text[], $13::bigint[], $14::bigint[], $15::text[]) AS m(activity_id, lease, delay_ms, status)
                ON l.activity_id = m.activity_id
              WHERE o.activity_id = m.activity_id AND o.lease_id = m.lease
              RETURNING 1
            ), dropped AS (
              DELETE FROM push_activity_outbox o USING locked l, unnest($16::text[], $17::bigint[]) AS m(activity_id, lease)
              WHERE l.activity_id = m.activity_id AND o.activity_id = m.activity_id AND o.lease_id = m.lease
              RETURNING 1
            ), bumped AS (
              UPDATE push_outbox r SET wanted_seq = GREATEST(r.wanted_seq, b.seq),
                     pending_since_ms = CASE WHEN r.wanted_seq > r.sent_seq THEN r.pending_since_ms ELSE b.since_ms END
              FROM (SELECT b.* FROM unnest($18::text[], $19::bigint[], $20::bigint[], $21::bigint[]) AS b(activity_id, device_id, seq, since_ms)
                    JOIN fanned f ON f.activity_id = b.activity_id ORDER BY b.activity_id, b.device_id) b
              WHERE r.activity_id = b.activity_id AND r.device_id = b.device_id AND r.kind = 'update' AND r.sent_seq < b.seq
              RETURNING 1
            )
            SELECT (SELECT count(*) FROM fanned) AS fanned, (SELECT count(*) FROM released) AS released,
                   (SELECT count(*) FROM dropped) AS dropped, (SELECT count(*) FROM bumped) AS bumped
            """, [PGArray.text(lock),
                  PGArray.text(done.map(\.0.activityID)), PGArray.numbers(done.map(\.0.leaseID)), PGArray.numbers(done.map(\.0.seq)),
                  PGArray.numbers(done.map(\.0.timestamp)), PGArray.numbers(done.map { PushTimestamp.nextAllowed(after: $0.0.timestamp) }),
                  PGArray.numbers(done.map(\.0.claimedAtMs)),
                  PGArray.numbers(done.map { $0.0.changedAtMs > 0 ? $0.0.changedAtMs : $0.0.claimedAtMs }),
                  PGArray.numbers(done.map { Int64($0.devices) }), PGArray.numbers(done.map { Int64($0.delivered) }),
                  String(max(0, paceSeconds)),
                  PGArray.text(released.map(\.0.activityID)), PGArray.numbers(released.map(\.0.leaseID)),
                  PGArray.numbers(released.map(\.delayMs)), PGArray.text(released.map(\.status)),
                  PGArray.text(dropped.map(\.activityID)), PGArray.numbers(dropped.map(\.leaseID)),
                  PGArray.text(bumps.map(\.0)), PGArray.numbers(bumps.map(\.1)), PGArray.numbers(bumps.map(\.2)), PGArray.numbers(bumps.map(\.3)),
                  PGArray.numbers(done.map(\.0.staleDate))],
            name: "push_fanout_mark")
    }

    /// A row's push delivered to an update token also counts for its activity's entry: the
    /// next fan-out's timestamp continues after it (`row_timestamp`: rows continue from the
    /// fan-outs' `last_timestamp`, never from each other), and an entry that is not being sent
    /// starts its pace from it, whether nothing waits or a progress change that committed before
    /// this mark does (so the first push to a new token and the next change are paced like any
    /// two pushes of the activity); a waiting state change still goes at once. An activity
    /// without an entry gets one, up to date.
    static func rowsDelivered(_ jobs: [PushJob], paceSeconds: Double) -> PGQuery {
        PGQuery("""
            INSERT INTO push_activity_outbox AS e (activity_id, wanted_seq, sent_seq, row_timestamp, due_at, sent_at, last_status, stale_date)
            SELECT m.activity_id, max(m.seq), max(m.seq), max(m.ts),
                   GREATEST(now(), to_timestamp(max(m.changed_ms) / 1000.0) + $5::float8 * interval '1 second', to_timestamp(max(m.ts))),
                   now(), '200', max(m.stale)
            FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $6::bigint[]) AS m(activity_id, seq, ts, changed_ms, stale)
            GROUP BY m.activity_id ORDER BY m.activity_id
            ON CONFLICT (activity_id) DO UPDATE SET row_timestamp = GREATEST(e.row_timestamp, EXCLUDED.row_timestamp),
              stale_date = CASE WHEN EXCLUDED.stale_date > 0 AND e.stale_date > 0 THEN LEAST(e.stale_date, EXCLUDED.stale_date)
                                ELSE GREATEST(e.stale_date, EXCLUDED.stale_date) END,
              due_at = CASE WHEN e.lease_id IS NULL AND (e.wanted_seq <= e.sent_seq OR e.priority < 10) THEN GREATEST(e.due_at, EXCLUDED.due_at) ELSE e.due_at END
            """, [PGArray.text(jobs.map(\.activityID)), PGArray.numbers(jobs.map(\.seq)), PGArray.numbers(jobs.map(\.timestamp)),
                  PGArray.numbers(jobs.map { $0.changedAtMs > 0 ? $0.changedAtMs : $0.claimedAtMs }), String(max(0, paceSeconds)),
                  PGArray.numbers(jobs.map(\.staleDate))],
            name: "push_fanout_row_delivered")
    }

    /// What fanned-out pushes that did not simply arrive leave their devices: a row of their
    /// own, due after the backoff (a retry), or flagged failed; a delivery clears a failed flag.
    /// The row pushes the newest state when it comes due; until then the entry's fan-outs pass
    /// the device over. Fenced by nothing: the entry's lease was held when the push was made,
    /// and a row only ever gains a push to make.
    static func deviceRows(retries: [(PushJob, delayMs: Int64, status: String, counted: Bool)], failed: [(PushJob, String)],
                           cleared: [PushJob]) -> PGQuery {
        let jobs = retries.map(\.0) + failed.map(\.0) + cleared
        let op = retries.map { _ in "retry" } + failed.map { _ in "failed" } + cleared.map { _ in "clear" }
        return PGQuery("""
            INSERT INTO push_outbox AS o (activity_id, device_id, kind, wanted_seq, sent_seq, priority, pending_since_ms, due_at, attempts,
                                          last_timestamp, last_status, failed)
            SELECT m.activity_id, m.device_id, 'update', m.seq, CASE WHEN m.op = 'clear' THEN m.seq ELSE 0 END, m.priority, m.since_ms,
                   now() + m.delay_ms * interval '1 millisecond', m.attempts, GREATEST(m.ts - 1, 0), m.status, m.op = 'failed'
            FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::smallint[], $5::bigint[], $6::bigint[], $7::int[], $8::bigint[],
                        $9::text[], $10::text[]) AS m(activity_id, device_id, seq, priority, since_ms, delay_ms, attempts, ts, status, op)
            ORDER BY m.activity_id, m.device_id
            ON CONFLICT (activity_id, device_id, kind) DO UPDATE SET
              wanted_seq = GREATEST(o.wanted_seq, EXCLUDED.wanted_seq),
              sent_seq = CASE WHEN EXCLUDED.failed IS NOT TRUE AND EXCLUDED.last_status = '200' THEN GREATEST(o.sent_seq, EXCLUDED.wanted_seq)
                              ELSE o.sent_seq END,
              priority = GREATEST(o.priority, EXCLUDED.priority),
              pending_since_ms = coalesce(o.pending_since_ms, EXCLUDED.pending_since_ms),
              due_at = CASE WHEN o.lease_id IS NULL THEN EXCLUDED.due_at ELSE o.due_at END,
              attempts = CASE WHEN o.lease_id IS NULL THEN EXCLUDED.attempts ELSE o.attempts END,
              last_timestamp = GREATEST(o.last_timestamp, EXCLUDED.last_timestamp),
              last_status = EXCLUDED.last_status, failed = EXCLUDED.failed
            """, [PGArray.text(jobs.map(\.activityID)), PGArray.numbers(jobs.map(\.deviceID)), PGArray.numbers(jobs.map(\.seq)),
                  PGArray.numbers(jobs.map { Int64($0.priority == 10 ? 10 : 5) }), PGArray.numbers(jobs.map(\.pendingSinceMs)),
                  PGArray.numbers(retries.map(\.delayMs) + failed.map { _ in 0 } + cleared.map { _ in 0 }),
                  PGArray.numbers(retries.map { Int64($0.counted ? $0.0.attempts : max(0, $0.0.attempts - 1)) } + failed.map { _ in 0 } + cleared.map { _ in 0 }),
                  PGArray.numbers(jobs.map(\.timestamp)),
                  PGArray.text(retries.map(\.status) + failed.map(\.1) + cleared.map { _ in "200" }), PGArray.text(op)],
            name: "push_fanout_device_rows")
    }

    /// A fanned-out push answered 410 or `BadDeviceToken`: the token goes with its pending
    /// pushes, unless it was registered again after `sinceMs`; then the device gets a row due
    /// at once (the push goes to the new registration).
    static func retire(_ job: PushJob, sinceMs: Int64, status: String) -> PGQuery {
        PGQuery("""
            WITH gone AS (
              DELETE FROM activity_tokens t
              WHERE t.activity_id = $1 AND t.token_mac = $3::bytea AND t.registered_at <= to_timestamp($4::bigint / 1000.0)
              RETURNING t.device_id, t.activity_id
            ), cancelled AS (
              DELETE FROM push_outbox o USING gone g
              WHERE o.kind = 'update' AND o.activity_id = g.activity_id AND o.device_id = g.device_id
              RETURNING 1
            )
            INSERT INTO push_outbox AS o (activity_id, device_id, kind, wanted_seq, priority, pending_since_ms, last_status)
            SELECT $1, $2::bigint, 'update', $5::bigint, 10, $7::bigint, $6
            WHERE NOT EXISTS (SELECT 1 FROM gone)
              AND EXISTS (SELECT 1 FROM activity_tokens t WHERE t.activity_id = $1 AND t.device_id = $2::bigint)
            ON CONFLICT (activity_id, device_id, kind) DO UPDATE SET wanted_seq = GREATEST(o.wanted_seq, EXCLUDED.wanted_seq),
              due_at = CASE WHEN o.lease_id IS NULL THEN now() ELSE o.due_at END, last_status = EXCLUDED.last_status, failed = false
            """, [job.activityID, String(job.deviceID), Bytea.literal(job.tokenMac), String(sinceMs), String(job.seq), status,
                  job.pendingSinceMs.map(String.init)],
            name: "push_fanout_retire")
    }
}
