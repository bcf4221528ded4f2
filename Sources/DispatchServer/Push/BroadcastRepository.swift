import DispatchCore
import DispatchIO
import PGCore

/// The SQL on `broadcast_outbox` (Migrations/0011): claims under a lease, as for push_outbox,
/// and the marks each outcome writes, fenced by the lease. Marks lock `activities` before
/// `broadcast_outbox`, the order a publish batch takes them in, so the two never deadlock.
enum BroadcastRepository {
    /// Claims up to `limit` due rows, none while the deployment's sending is paused
    /// (`429 TooManyProviderTokenUpdates`: `apns_provider_tokens.paused_until`, contract §5.2):
    /// channel management and broadcasts wait for the pause as token pushes do. A live row is
    /// due for a newer change or a stale-date refresh (a touch, Migrations/0020).
    static func claim(limit: Int, leaseMs: Int, teamID: String, keyID: String) -> PGQuery {
        PGQuery("""
            WITH lease AS (SELECT nextval('push_leases') AS lease_id)
            UPDATE broadcast_outbox b SET lease_id = (SELECT lease_id FROM lease),
                   lease_until = now() + $2::int * interval '1 millisecond',
                   due_at = now() + $2::int * interval '1 millisecond', attempts = b.attempts + 1
            WHERE b.activity_id = ANY (ARRAY(
              SELECT activity_id FROM broadcast_outbox
              WHERE phase <> 'failed' AND due_at <= now() AND (phase <> 'live' OR wanted_seq > sent_seq OR stale_refresh_ms > 0)
                AND NOT EXISTS (SELECT 1 FROM apns_provider_tokens p WHERE p.team_id = $3 AND p.key_id = $4
                                AND p.paused_until > extract(epoch FROM now()))
              ORDER BY due_at LIMIT $1::int
              FOR UPDATE SKIP LOCKED))
            RETURNING b.activity_id, b.phase, b.channel_id, b.environment, b.lease_id, b.priority, b.pending_since_ms,
                      b.last_timestamp, b.attempts, (extract(epoch FROM now()) * 1000)::bigint AS claimed_ms,
                      b.wanted_seq > b.sent_seq AS has_change
            """, [String(limit), String(leaseMs), teamID, keyID], name: "broadcast_claim")
    }

    static func decode(_ r: PGRow, defaultEnvironment: APNsEnvironment) -> BroadcastJob? {
        guard let id = r["activity_id"], let phase = r["phase"].flatMap(BroadcastPhase.init(rawValue:)), let lease = r.int64("lease_id"),
              let claimed = r.int64("claimed_ms") else { return nil }
        return BroadcastJob(activityID: id, leaseID: lease, phase: phase, channelID: r["channel_id"],
                            environment: r["environment"].flatMap(APNsEnvironment.init(rawValue:)) ?? defaultEnvironment,
                            // A stale-date refresh alone (a touch, no change waiting) goes at 5.
                            attempts: r.int("attempts") ?? 1,
                            priority: r.has("has_change") && r["has_change"] == "f" ? 5 : r.int("priority") ?? 5,
                            lastTimestamp: r.int64("last_timestamp") ?? 0,
                            pendingSinceMs: r.int64("pending_since_ms"), claimedAtMs: claimed)
    }

    /// The claimed activities as they are now (after the claim committed).
    static func read(_ ids: [String]) -> PGQuery {
        PGQuery("""
            SELECT \(ActivityRepository.columns) FROM unnest($1::text[]) AS k(activity_id)
            JOIN LATERAL (SELECT * FROM activities x WHERE x.activity_id = k.activity_id LIMIT 1) a ON true
            """, [PGArray.text(ids)], name: "broadcast_read")
    }

    /// The statements that write `outcomes`, in one transaction.
    static func marks(_ outcomes: [(BroadcastJob, BroadcastOutcome)], paceSeconds: Double) -> [PGQuery] {
        let sorted = outcomes.sorted { $0.0.activityID < $1.0.activityID }
        var queries: [PGQuery] = []
        // First the activities (the channel's arrival: no seq, no event), as a publish would.
        for (job, outcome) in sorted {
            guard case .created(let channel) = outcome else { continue }
            queries.append(PGQuery("""
                UPDATE activities a SET channel_id = $2 WHERE a.activity_id = $1
                  AND EXISTS (SELECT 1 FROM broadcast_outbox b WHERE b.activity_id = $1 AND b.lease_id = $3::bigint)
                """, [job.activityID, channel, String(job.leaseID)], name: "broadcast_mark_channel"))
        }
        let fence = "WHERE activity_id = $1 AND lease_id = $2::bigint"
        let rest = PushFanOutRepository.priorityAfter(activity: "$1", seq: "$3::bigint", wanted: "wanted_seq", current: "priority")
        for (job, outcome) in sorted {
            let key = [job.activityID, String(job.leaseID)]
            switch outcome {
            case .created(let channel):
                queries.append(PGQuery("""
                    UPDATE broadcast_outbox SET phase = 'live', channel_id = $3, environment = $4, lease_id = NULL, lease_until = NULL,
                           due_at = now(), attempts = 0, last_status = '201' \(fence)
                    """, key + [channel, job.environment.rawValue], name: "broadcast_mark_created"))
            case .refused(let status):
                queries.append(PGQuery("""
                    UPDATE broadcast_outbox SET phase = 'failed', lease_id = NULL, lease_until = NULL, last_status = $3,
                           environment = coalesce(environment, $4) \(fence)
                    """, key + [status, job.environment.rawValue], name: "broadcast_mark_failed"))
            case .pushed(let seq, let timestamp, let deleteAt), .dropped(let seq, let timestamp, let deleteAt, _):
                // Paced like token pushes (progress at most once per pace unless a state change
                // waits); after the end, the channel goes at the dismissal date. A push refused
                // for its content counts as pushed: the channel goes on with the next change.
                var status = "200"
                if case .dropped(_, _, _, let s) = outcome { status = s }
                queries.append(PGQuery("""
                    UPDATE broadcast_outbox SET sent_seq = GREATEST(sent_seq, $3::bigint), last_timestamp = GREATEST(last_timestamp, $4::bigint),
                           lease_id = NULL, lease_until = NULL, attempts = 0, last_status = $9,
                           stale_refresh_ms = CASE WHEN stale_refresh_ms <= $6::bigint THEN 0 ELSE stale_refresh_ms END,
                           stale_date = CASE WHEN $10::bigint > 0 THEN $10::bigint ELSE stale_date END,
                           phase = CASE WHEN $5::bigint IS NULL THEN phase ELSE 'delete' END,
                           priority = \(rest),
                           due_at = CASE WHEN $5::bigint IS NOT NULL THEN to_timestamp($5::bigint)
                                         WHEN \(rest) = 10 AND wanted_seq > $3::bigint THEN GREATEST(now(), to_timestamp($4::bigint))
                                         ELSE GREATEST(now(), to_timestamp($8::bigint / 1000.0) + $7::float8 * interval '1 second',
                                                       to_timestamp($4::bigint)) END,
                           pending_since_ms = CASE WHEN wanted_seq > GREATEST(sent_seq, $3::bigint) THEN $6::bigint END \(fence)
                    """, key + [String(seq), String(timestamp), deleteAt.map { String($0) }, String(job.claimedAtMs), String(max(0, paceSeconds)),
                                            String(job.changedAtMs > 0 ? job.changedAtMs : job.claimedAtMs), status, String(job.staleDate)],
                    name: "broadcast_mark_pushed"))
            case .deleted:
                queries.append(PGQuery("DELETE FROM broadcast_outbox \(fence)", key, name: "broadcast_mark_deleted"))
            case .paused(let status):
                // The service turned this into a retry after the pause; kept for exhaustiveness.
                queries.append(PGQuery("""
                    UPDATE broadcast_outbox SET lease_id = NULL, lease_until = NULL, last_status = $3, due_at = now() + interval '1 second' \(fence)
                    """, key + [status], name: "broadcast_mark_paused"))
            case .retry(let after, let status):
                queries.append(PGQuery("""
                    UPDATE broadcast_outbox SET lease_id = NULL, lease_until = NULL, last_status = $4,
                           due_at = now() + $3::bigint * interval '1 millisecond' \(fence)
                    """, key + [String(Int64((after * 1000).rounded())), status], name: "broadcast_mark_retry"))
            }
        }
        return queries
    }

    /// Whether any channel is being made or in use (then commits wake the broadcast sender).
    static let inUse = PGQuery("SELECT EXISTS (SELECT 1 FROM broadcast_outbox WHERE phase IN ('create', 'live')) AS in_use",
                               name: "broadcast_in_use")

    /// Every channel, for `dispatchd push status`.
    static let list = PGQuery("""
        SELECT activity_id, phase, environment, channel_id, sent_seq, wanted_seq, last_status FROM broadcast_outbox
        ORDER BY created_at DESC LIMIT 1000
        """)
}
