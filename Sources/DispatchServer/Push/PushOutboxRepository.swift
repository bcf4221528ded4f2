import DispatchCore
import PGCore
import DispatchIO

/// The sender's SQL on `push_outbox` (Migrations/0004_push.sql): claiming due rows under a
/// lease and writing back what their pushes became, every write fenced by the lease. The rows
/// are the per-device pushes (push-to-start, a new token's first push, a device retrying on
/// its own); the per-activity entries the publish path marks are `PushFanOutRepository`'s.
enum PushOutboxRepository {
    /// Claims up to `limit` due rows for `leaseMs` (SKIP LOCKED: concurrent senders take
    /// different rows). The lease's end becomes the row's `due_at`, so the due scan passes over
    /// rows being sent without visiting them (claims come often: every commit that marked the
    /// outbox wakes a sender), and a lease that ran out (its sender died) makes the row
    /// claimable again by itself.
    ///
    /// The rows are updated by `ctid` (a TID scan): joined on their key, the generic plan of
    /// this prepared statement hash-joined a sequential scan of the whole table, every claim.
    static func claim(limit: Int, leaseMs: Int) -> PGQuery {
        PGQuery("""
            WITH lease AS (SELECT nextval('push_leases') AS lease_id)
            UPDATE push_outbox o SET lease_id = (SELECT lease_id FROM lease),
                   lease_until = now() + $2::int * interval '1 millisecond',
                   due_at = now() + $2::int * interval '1 millisecond', attempts = o.attempts + 1
            WHERE o.ctid = ANY (ARRAY(
              SELECT ctid FROM push_outbox
              WHERE wanted_seq > sent_seq AND NOT failed AND due_at <= now()
              ORDER BY due_at LIMIT $1::int
              FOR UPDATE SKIP LOCKED))
            RETURNING o.activity_id, o.device_id, o.kind, o.lease_id, o.priority, o.pending_since_ms, o.last_timestamp,
                      o.attempts, (extract(epoch FROM now()) * 1000)::bigint AS claimed_ms
            """, [String(limit), String(leaseMs)], name: "push_claim")
    }

    /// What the claimed rows push: each activity as it is now and the sealed token it goes to;
    /// for a push-to-start, how many starts its device was sent in the last hour or has on
    /// their way under another claim's lease (the budget, `DISPATCH_PUSH_TO_START_LIMIT`;
    /// Migrations/0020's index). The rows of one claim share its lease.
    /// Read after the claim committed, so a change committed before the claim took its row is
    /// seen here even when it left the row untouched (a row waiting to be claimed is not
    /// rewritten per change; see ActivityRepository.finalizeStatement). Each look-up is a
    /// LATERAL subquery with LIMIT 1, an index probe per row: as plain joins, the generic plan
    /// hash-joined whole tables.
    static func read(_ rows: [ClaimedRow]) -> PGQuery {
        PGQuery("""
            SELECT k.activity_id AS outbox_activity_id, k.device_id AS outbox_device_id, k.kind AS outbox_kind,
                   \(ActivityRepository.columns),
                   tok.mac AS token_mac, tok.sealed AS token_sealed, tok.hint AS token_hint, dev.environment AS device_environment,
                   (SELECT b.phase FROM broadcast_outbox b WHERE b.activity_id = k.activity_id) AS channel_phase,
                   (SELECT e.last_timestamp FROM push_activity_outbox e WHERE k.kind = 'update' AND e.activity_id = k.activity_id) AS entry_timestamp,
                   (SELECT count(*) FROM push_outbox s WHERE k.kind = 'start' AND s.kind = 'start' AND s.device_id = k.device_id
                      AND (s.sent_at > now() - interval '1 hour'
                           OR (s.lease_id <> $4::bigint AND s.lease_until > now() AND s.wanted_seq > s.sent_seq))) AS starts_last_hour
            FROM unnest($1::text[], $2::bigint[], $3::text[]) AS k(activity_id, device_id, kind)
            LEFT JOIN LATERAL (SELECT * FROM activities x WHERE x.activity_id = k.activity_id LIMIT 1) a ON true
            LEFT JOIN LATERAL (SELECT environment FROM devices d WHERE d.id = k.device_id LIMIT 1) dev ON true
            LEFT JOIN LATERAL (
              SELECT t.token_mac AS mac, t.token_sealed AS sealed, t.token_hint AS hint FROM activity_tokens t
              WHERE k.kind = 'update' AND t.device_id = k.device_id AND t.activity_id = k.activity_id
              UNION ALL
              SELECT d.push_to_start_mac, d.push_to_start_sealed, d.push_to_start_hint FROM devices d
              WHERE k.kind = 'start' AND d.id = k.device_id AND d.push_to_start_sealed IS NOT NULL
              LIMIT 1) tok ON true
            """, keys(rows.map(\.job)) + [String(rows.first?.job.leaseID ?? 0)], name: "push_read")
    }

    /// One claimed row, decoded from the claim, then completed by `read`.
    struct ClaimedRow {
        var job: PushJob
        var priority: Int
        var lastTimestamp: Int64
        var snapshot: Activity?
        /// When the server would end the activity as stale (ms), nil: never.
        var staleDeadlineMs: Int64?
        /// The broadcast channel's phase, for a broadcast activity.
        var channelPhase: BroadcastPhase?
        var tokenSealed: [UInt8]?
        /// Of a push-to-start: the starts its device was sent in the last hour.
        var startsLastHour = 0

        var key: String { Self.key(job.activityID, job.deviceID, job.kind.rawValue) }
        static func key(_ activity: String, _ device: Int64, _ kind: String) -> String { "\(kind) \(device) \(activity)" }
    }

    /// A row of `claim`; `localID` names it in this process (the machine's handle for it).
    static func decodeClaim(_ row: PGRow, localID: Int64) -> ClaimedRow? {
        guard let lease = row.int64("lease_id"), let kind = row["kind"].flatMap(PushKind.init(rawValue:)),
              let activityID = row["activity_id"], let device = row.int64("device_id"), let claimed = row.int64("claimed_ms")
        else { return nil }
        let last = row.int64("last_timestamp") ?? 0
        let job = PushJob(outboxID: localID, leaseID: lease, kind: kind, activityID: activityID, deviceID: device,
                          seq: 0, timestamp: last, attempts: row.int("attempts") ?? 1,
                          pendingSinceMs: row.int64("pending_since_ms"), claimedAtMs: claimed)
        return ClaimedRow(job: job, priority: row.int("priority") ?? 5, lastTimestamp: last)
    }

    /// Completes `row` with its row of `read`.
    static func complete(_ row: inout ClaimedRow, with r: PGRow) {
        let stored = StoredActivity(row: r)
        row.snapshot = stored?.activity
        row.staleDeadlineMs = stored.flatMap {
            LiveActivityPayload.staleDeadline($0.activity, staleAfterSeconds: $0.staleAfter, touchedMs: $0.touchedMs)
        }
        row.job.seq = row.snapshot?.seq ?? 0
        row.job.tokenMac = Bytea.decode(r["token_mac"]) ?? []
        row.job.tokenHint = r["token_hint"] ?? "…"
        row.tokenSealed = Bytea.decode(r["token_sealed"])
        row.startsLastHour = r.has("starts_last_hour") ? r.int("starts_last_hour") ?? 0 : 0
        row.channelPhase = r["channel_phase"].flatMap(BroadcastPhase.init(rawValue:))
        row.job.environment = r["device_environment"].flatMap(APNsEnvironment.init(rawValue:)) ?? .production
        // The activity's fan-outs may have pushed newer timestamps to this phone than the row did
        // (the fan-outs' own, not other rows': those never reached this phone).
        if let entry = r.int64("entry_timestamp"), entry > row.lastTimestamp { row.lastTimestamp = entry }
    }

    static func readKey(_ r: PGRow) -> String? {
        guard let a = r["outbox_activity_id"], let d = r.int64("outbox_device_id"), let k = r["outbox_kind"] else { return nil }
        return ClaimedRow.key(a, d, k)
    }

    /// The statements that write `marks`, as one pipeline batch (one transaction; in the steady
    /// state, entries fanned out and nothing else, one statement). Entries are locked first (in
    /// activity order, as the publish path upserts them), then rows (in the order the publish
    /// path and registrations take them: activity, device, kind), so a batch of marks never
    /// deadlocks with either or with another sender's marks.
    /// `paceSeconds`: how long after a push the next progress-only push of the row or entry
    /// waits (a state change or an end lowers it again: ActivityRepository.finalizeStatement).
    static func marks(_ marks: [PushMark], paceSeconds: Double = 0) -> [PGQuery] {
        var sent: [(PushJob, pushed: Bool)] = []
        var retries: [(PushJob, delayMs: Int64, status: String, uncount: Int)] = []
        var failed: [(PushJob, String)] = []
        var retired: [(PushJob, sinceMs: Int64, status: String)] = []
        var dropped: [PushJob] = []
        var fanRetries: [(PushJob, delayMs: Int64, status: String, counted: Bool)] = []
        var fanFailed: [(PushJob, String)] = []
        var fanCleared: [PushJob] = []
        var corrected: [PushJob] = []
        for m in marks {
            switch m {
            case .delivered(let j):
                if j.switchedEnvironment { corrected.append(j) }
                if j.entryID == nil { sent.append((j, true)) } else if j.clearsFailedRow { fanCleared.append(j) }
            case .skipped(let j):
                if j.entryID == nil { sent.append((j, false)) }
            case .retry(let j, let after, let status, let counts):
                let ms = Int64((after * 1000).rounded())
                if j.entryID == nil { retries.append((j, ms, status.label, counts ? 0 : 1)) } else { fanRetries.append((j, ms, status.label, counts)) }
            case .failed(let j, let status):
                if j.entryID == nil { failed.append((j, status.label)) } else { fanFailed.append((j, status.label)) }
            case .retire(let j, let since, let status): retired.append((j, since, status.label))
            case .drop(let j):
                if j.entryID == nil { dropped.append(j) }
            case .fannedOut, .releaseEntry, .dropEntry: break
            }
        }
        // Rows' pushes delivered to update tokens count for their activity's entry (its pace, its timestamps).
        let rowUpdates = sent.filter { $0.pushed && $0.0.kind == .update }.map(\.0)
        var queries: [PGQuery] = []
        if let entries = PushFanOutRepository.marks(marks, lockAlso: rowUpdates.map(\.activityID), paceSeconds: paceSeconds) {
            queries.append(entries)
        }
        let rowJobs = sent.map(\.0) + retries.map(\.0) + failed.map(\.0) + dropped + retired.filter { $0.0.entryID == nil }.map(\.0)
        let deviceJobs = fanRetries.map(\.0) + fanFailed.map(\.0) + fanCleared
        if !rowJobs.isEmpty || !deviceJobs.isEmpty {
            queries.append(PGQuery("""
                SELECT 1 FROM push_outbox o JOIN unnest($1::text[], $2::bigint[], $3::text[]) AS m(activity_id, device_id, kind)
                  ON o.activity_id = m.activity_id AND o.device_id = m.device_id AND o.kind = m.kind
                ORDER BY o.activity_id, o.device_id, o.kind FOR UPDATE OF o
                """, keys(rowJobs + deviceJobs), name: "push_mark_lock"))
        }
        let match = "o.activity_id = m.activity_id AND o.device_id = m.device_id AND o.kind = m.kind AND o.lease_id = m.lease"
        if !sent.isEmpty {
            // The next push of the row waits until its timestamp may grow without running ahead
            // of the clock (PushTimestamp), and for the pace unless a state change is already
            // waiting; a change that came meanwhile makes it due again.
            let jobs = sent.map(\.0)
            let waiting = PushFanOutRepository.priorityAfter(activity: "m.activity_id", seq: "m.seq", wanted: "o.wanted_seq", current: "o.priority")
            queries.append(PGQuery("""
                UPDATE push_outbox o SET sent_seq = GREATEST(o.sent_seq, m.seq), last_timestamp = GREATEST(o.last_timestamp, m.ts),
                       last_status = CASE WHEN m.pushed THEN '200' ELSE 'skipped' END,
                       sent_at = CASE WHEN m.pushed THEN now() ELSE o.sent_at END,
                       attempts = 0, failed = false, lease_id = NULL, lease_until = NULL,
                       priority = \(waiting),
                       due_at = CASE WHEN m.pushed AND NOT (\(waiting) = 10 AND o.wanted_seq > m.seq)
                                     THEN GREATEST(now(), to_timestamp(m.changed_ms / 1000.0) + $10::float8 * interval '1 second', to_timestamp(m.not_before))
                                     ELSE GREATEST(now(), to_timestamp(m.not_before)) END,
                       pending_since_ms = CASE WHEN o.wanted_seq > GREATEST(o.sent_seq, m.seq) THEN m.claimed_ms END
                FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[], $8::bigint[],
                            $9::boolean[], $11::bigint[]) AS m(activity_id, device_id, kind, lease, seq, ts, not_before, claimed_ms, pushed, changed_ms)
                WHERE \(match)
                """, keys(jobs) + [PGArray.numbers(jobs.map(\.leaseID)), PGArray.numbers(jobs.map(\.seq)), PGArray.numbers(jobs.map(\.timestamp)),
                                   PGArray.numbers(jobs.map { PushTimestamp.nextAllowed(after: $0.timestamp) }), PGArray.numbers(jobs.map(\.claimedAtMs)),
                                   "{" + sent.map { $0.pushed ? "t" : "f" }.joined(separator: ",") + "}", String(max(0, paceSeconds)),
                                   PGArray.numbers(jobs.map { $0.changedAtMs > 0 ? $0.changedAtMs : $0.claimedAtMs })],
                name: "push_mark_sent"))
        }
        if !retries.isEmpty {
            let jobs = retries.map(\.0)
            queries.append(PGQuery("""
                UPDATE push_outbox o SET lease_id = NULL, lease_until = NULL, due_at = now() + m.delay_ms * interval '1 millisecond',
                       last_status = m.status, attempts = GREATEST(o.attempts - m.uncount, 0)
                FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[], $5::bigint[], $6::text[], $7::int[])
                     AS m(activity_id, device_id, kind, lease, delay_ms, status, uncount)
                WHERE \(match)
                """, keys(jobs) + [PGArray.numbers(jobs.map(\.leaseID)), PGArray.numbers(retries.map(\.delayMs)),
                                   PGArray.text(retries.map(\.status)), PGArray.numbers(retries.map { Int64($0.uncount) })],
                name: "push_mark_retry"))
        }
        if !failed.isEmpty {
            let jobs = failed.map(\.0)
            queries.append(PGQuery("""
                UPDATE push_outbox o SET failed = true, lease_id = NULL, lease_until = NULL, due_at = now(), last_status = m.status
                FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[], $5::text[]) AS m(activity_id, device_id, kind, lease, status)
                WHERE \(match)
                """, keys(jobs) + [PGArray.numbers(jobs.map(\.leaseID)), PGArray.text(failed.map(\.1))], name: "push_mark_failed"))
        }
        if !dropped.isEmpty {
            queries.append(PGQuery("""
                DELETE FROM push_outbox o USING unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[]) AS m(activity_id, device_id, kind, lease)
                WHERE \(match)
                """, keys(dropped) + [PGArray.numbers(dropped.map(\.leaseID))], name: "push_mark_drop"))
        }
        if !deviceJobs.isEmpty {
            queries.append(PushFanOutRepository.deviceRows(retries: fanRetries, failed: fanFailed, cleared: fanCleared))
        }
        for r in retired {
            queries.append(r.0.entryID == nil ? retire(r.0, sinceMs: r.sinceMs, status: r.status)
                                              : PushFanOutRepository.retire(r.0, sinceMs: r.sinceMs, status: r.status))
        }
        if !rowUpdates.isEmpty { queries.append(PushFanOutRepository.rowsDelivered(rowUpdates, paceSeconds: paceSeconds)) }
        // Delivered in the other environment than the device's: the device was registered in
        // the wrong one; from now on its pushes go where they work.
        if !corrected.isEmpty {
            queries.append(PGQuery("""
                UPDATE devices d SET environment = m.environment, updated_at = now()
                FROM unnest($1::bigint[], $2::text[]) AS m(device_id, environment)
                WHERE d.id = m.device_id AND d.environment <> m.environment
                """, [PGArray.numbers(corrected.map(\.deviceID)), PGArray.text(corrected.map(\.environment.rawValue))],
                name: "push_mark_environment"))
        }
        return queries
    }

    /// A 410 or `BadDeviceToken`: the token goes, with every pending push to it, unless it was
    /// registered again after `sinceMs` (APNs' "invalid since"); then the row is due again at
    /// once and the push goes to the new registration. The token is identified by its MAC
    /// as claimed, so a token replaced meanwhile is never retired in its successor's place.
    /// Every key's registration of the token goes (the token is dead for APNs whoever holds it).
    static func retire(_ job: PushJob, sinceMs: Int64, status: String) -> PGQuery {
        PGQuery("""
            WITH r AS (
              SELECT o.activity_id, o.device_id, o.kind FROM push_outbox o
              WHERE o.activity_id = $1 AND o.device_id = $2::bigint AND o.kind = $3 AND o.lease_id = $4::bigint
            ), gone_token AS (
              DELETE FROM activity_tokens t USING r
              WHERE r.kind = 'update' AND t.activity_id = r.activity_id AND t.token_mac = $5::bytea
                AND t.registered_at <= to_timestamp($6::bigint / 1000.0)
              RETURNING t.device_id, t.activity_id
            ), gone_start AS (
              UPDATE devices d SET push_to_start_mac = NULL, push_to_start_sealed = NULL, push_to_start_hint = NULL, push_to_start_at = NULL
              FROM r
              WHERE r.kind = 'start' AND d.push_to_start_mac = $5::bytea
                AND d.push_to_start_at <= to_timestamp($6::bigint / 1000.0)
              RETURNING d.id
            ), cancelled AS (
              DELETE FROM push_outbox o
              WHERE (o.kind = 'update' AND (o.activity_id, o.device_id) IN (SELECT activity_id, device_id FROM gone_token))
                 OR (o.kind = 'start' AND o.wanted_seq > o.sent_seq AND o.device_id IN (SELECT id FROM gone_start))
              RETURNING o.activity_id, o.device_id, o.kind
            )
            UPDATE push_outbox o SET lease_id = NULL, lease_until = NULL, due_at = now(), last_status = $7
            FROM r WHERE o.activity_id = r.activity_id AND o.device_id = r.device_id AND o.kind = r.kind
              AND (o.activity_id, o.device_id, o.kind) NOT IN (SELECT activity_id, device_id, kind FROM cancelled)
            RETURNING 1
            """, [job.activityID, String(job.deviceID), job.kind.rawValue, String(job.leaseID), Bytea.literal(job.tokenMac),
                  String(sinceMs), status],
            name: "push_mark_retire")
    }

    /// The rows' keys as the three array parameters (activity, device, kind).
    static func keys(_ jobs: [PushJob]) -> [String?] {
        [PGArray.text(jobs.map(\.activityID)), PGArray.numbers(jobs.map(\.deviceID)), PGArray.text(jobs.map(\.kind.rawValue))]
    }

}
