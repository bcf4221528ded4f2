import DispatchIO

/// The SQL of contract §5.4. `stale_at_ms` (indexed, partial: live activities with a stale
/// period) is when the sweeper looks at an activity next — its start plus `staleAfter`, or a
/// later real deadline. Changes and touches do not move it (they would cost every progress
/// update its heap-only update): the real deadline is max(updated_ms, touched_ms) + staleAfter.
enum StaleSQL {
    /// A touch: records when (no event, no indexed column changed), and returns the row as it
    /// was (with `touched` 0 or 1), so the caller can tell 404, 403 and 409 apart.
    static func touch(_ id: String, now: Int64, ownerKeyID: Int64?) -> PGQuery {
        PGQuery("""
            WITH t AS (
              UPDATE activities SET touched_ms = GREATEST(coalesce(touched_ms, 0) + 1, $2::bigint)
              WHERE activity_id = $1 AND ended_ms IS NULL AND ($3::bigint IS NULL OR owner_key_id = $3::bigint)
              RETURNING 1
            )
            SELECT (SELECT count(*) FROM t) AS touched, \(ActivityRepository.columns) FROM activities a WHERE a.activity_id = $1
            """, [id, String(now), ownerKeyID.map { String($0) }], name: "touch_activity")
    }

    /// Looks at up to `limit` activities due, oldest first, skipping rows another server holds
    /// right now. One that was updated or touched since is rescheduled to its real deadline;
    /// one really stale gets `fence` (a time a little ahead: no other sweep takes it until then;
    /// a claim whose end never happened comes due again then) and comes back with the touch
    /// time the sweeper's end must still find.
    static func claim(now: Int64, fence: Int64, limit: Int) -> PGQuery {
        PGQuery("""
            WITH due AS (
              SELECT activity_id FROM activities
              WHERE stale_at_ms <= $1::bigint AND ended_ms IS NULL
              ORDER BY stale_at_ms LIMIT $3::integer
              FOR UPDATE SKIP LOCKED
            ), looked AS (
              UPDATE activities a SET stale_at_ms = CASE
                  WHEN GREATEST(a.updated_ms, coalesce(a.touched_ms, 0)) + a.stale_after_s::bigint * 1000 > $1::bigint
                  THEN GREATEST(a.updated_ms, coalesce(a.touched_ms, 0)) + a.stale_after_s::bigint * 1000
                  ELSE $2::bigint END
              FROM due WHERE a.activity_id = due.activity_id AND a.stale_after_s > 0
              RETURNING a.activity_id, a.seq, a.stale_after_s, coalesce(a.touched_ms, 0) AS touched_ms, a.stale_at_ms = $2::bigint AS stale
            )
            SELECT activity_id, seq, stale_after_s, touched_ms FROM looked WHERE stale
            """, [String(now), String(fence), String(limit)], name: "claim_stale")
    }
}
