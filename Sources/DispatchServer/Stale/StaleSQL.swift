import DispatchIO

/// The SQL of contract §5.4 on `activities.stale_at_ms` (the deadline, ms since epoch; null
/// when finished or never stale), always through its partial index `activities_stale`.
enum StaleSQL {
    /// A touch: renews the deadline to `now + stale_after_s` without an event, and returns
    /// the row as it was (with `touched` 0 or 1), so the caller can tell 404, 403 and 409 apart.
    /// The deadline only ever grows on a touch (`GREATEST(old + 1, ...)`), so a sweeper that
    /// claimed the activity (its fence is the old value) sees that it was touched.
    static func touch(_ id: String, now: Int64, ownerKeyID: Int64?) -> PGQuery {
        PGQuery("""
            WITH t AS (
              UPDATE activities SET stale_at_ms = CASE WHEN stale_after_s > 0
                  THEN GREATEST(stale_at_ms + 1, $2::bigint + stale_after_s::bigint * 1000) END
              WHERE activity_id = $1 AND ended_ms IS NULL AND ($3::bigint IS NULL OR owner_key_id = $3::bigint)
              RETURNING 1
            )
            SELECT (SELECT count(*) FROM t) AS touched, \(ActivityRepository.columns) FROM activities a WHERE a.activity_id = $1
            """, [id, String(now), ownerKeyID.map { String($0) }], name: "touch_activity")
    }

    /// Claims up to `limit` activities whose deadline passed, oldest first, skipping rows another
    /// server is claiming right now: each gets `fence` (a time a little ahead) as its deadline,
    /// so no other sweep takes it until then, and the sweeper's end applies only while the
    /// deadline still holds `fence` (a touch or a change since the claim moved it). A claim whose
    /// end never happened (a crash) comes due again at `fence`.
    static func claim(now: Int64, fence: Int64, limit: Int) -> PGQuery {
        PGQuery("""
            WITH due AS (
              SELECT activity_id FROM activities
              WHERE stale_at_ms <= $1::bigint AND ended_ms IS NULL
              ORDER BY stale_at_ms LIMIT $3::integer
              FOR UPDATE SKIP LOCKED
            )
            UPDATE activities a SET stale_at_ms = $2::bigint FROM due
            WHERE a.activity_id = due.activity_id
            RETURNING a.activity_id, a.seq, a.stale_after_s
            """, [String(now), String(fence), String(limit)], name: "claim_stale")
    }
}
