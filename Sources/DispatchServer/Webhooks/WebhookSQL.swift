import DispatchCore
import DispatchIO

/// All SQL on `webhook_outbox` (Migrations/0005_cancel_and_stale.sql), for the sender in the
/// event loop and for `dispatchd webhooks` alike. Rows are queued by the cancel's own publish
/// statement (`ActivityRepository.updatesStatement`), never here.
///
/// A claim is `FOR UPDATE SKIP LOCKED`: concurrent claims by several servers never take the
/// same row. It counts the attempt and moves `due_at` past the attempt's deadline, which is
/// the claim's lease: if the server dies before marking, the row comes due again then. Marks
/// are fenced on the attempt count, so a sender whose lease ran out (the row was claimed again
/// since) changes nothing.
enum WebhookSQL {
    /// Seconds a claim keeps a row by default: the 10 s attempt plus a margin for marking it.
    static let leaseSeconds = 30.0

    /// Claims up to `limit` due rows fairly (issue 24): rows of keys and destinations already at
    /// their cap here (`busyKeys`, `busyHosts` against `perKey`, `perHost`) are skipped, the
    /// rest are taken round-robin between keys (every key's oldest due row first), at most
    /// up to each cap. The owning key and the URL's host[:port] come back with each row.
    static func claim(limit: Int, perKey: Int = 8, perHost: Int = 4, busyKeys: [Int64: Int] = [:], busyHosts: [String: Int] = [:],
                      lease: Double = leaseSeconds) -> PGQuery {
        let keys = busyKeys.sorted { $0.key < $1.key }, hosts = busyHosts.sorted { $0.key < $1.key }
        return PGQuery("""
            WITH expired AS (
              UPDATE webhook_outbox SET state = 'failed', lease_until = NULL,
                     last_status = coalesce(last_status || '; ', '') || 'gave up after 24 hours'
              WHERE state = 'pending' AND due_at <= now() AND give_up_at <= now()
            ), busy_keys AS (
              SELECT * FROM unnest($5::bigint[], $6::integer[]) AS b(key_id, n)
            ), busy_hosts AS (
              SELECT * FROM unnest($7::text[], $8::integer[]) AS b(host, n)
            ), candidates AS (
              SELECT c.* FROM (
                SELECT o.id, o.due_at, coalesce(a.owner_key_id, 0) AS key_id,
                       lower(coalesce(substring(o.url from '^[^:/?#]+://(?:[^/?#@]*@)?([^/?#]*)'), '')) AS host
                FROM webhook_outbox o LEFT JOIN activities a ON a.activity_id = o.activity_id
                WHERE o.state = 'pending' AND o.due_at <= now() AND o.give_up_at > now()
                ORDER BY o.due_at
              ) c
              WHERE NOT EXISTS (SELECT 1 FROM busy_keys b WHERE b.key_id = c.key_id AND b.n >= $3::integer)
                AND NOT EXISTS (SELECT 1 FROM busy_hosts b WHERE b.host = c.host AND b.n >= $4::integer)
              LIMIT 10000
            ), ranked AS (
              SELECT c.id, c.due_at, c.key_id, c.host,
                     row_number() OVER (PARTITION BY c.key_id ORDER BY c.due_at, c.id) + coalesce(bk.n, 0) AS key_slot,
                     row_number() OVER (PARTITION BY c.host ORDER BY c.due_at, c.id) + coalesce(bh.n, 0) AS host_slot
              FROM candidates c LEFT JOIN busy_keys bk ON bk.key_id = c.key_id LEFT JOIN busy_hosts bh ON bh.host = c.host
            ), due AS (
              SELECT o.id, r.key_id, r.host FROM webhook_outbox o JOIN ranked r ON r.id = o.id
              WHERE r.key_slot <= $3::integer AND r.host_slot <= $4::integer
              ORDER BY r.key_slot, r.due_at, r.id LIMIT $1::integer
              FOR UPDATE OF o SKIP LOCKED
            )
            UPDATE webhook_outbox o SET attempts = o.attempts + 1,
                   due_at = now() + make_interval(secs => $2::integer), lease_until = now() + make_interval(secs => $2::integer)
            FROM due WHERE o.id = due.id
            RETURNING o.id, o.delivery_id, o.activity_id, o.url, o.body, o.attempts, due.key_id, due.host,
                      extract(epoch FROM o.give_up_at - now())::float8 AS seconds_left
            """, [String(limit), String(Int(max(leaseSeconds, lease).rounded(.up))), String(perKey), String(perHost),
                  PGArray.numbers(keys.map { $0.key }), PGArray.numbers(keys.map { Int64($0.value) }),
                  PGArray.text(hosts.map { $0.key }), PGArray.numbers(hosts.map { Int64($0.value) })], name: "webhook_claim")
    }

    static func delivery(_ r: PGRow) -> WebhookDelivery? {
        guard let id = r.int64("id"), let deliveryID = r["delivery_id"], let activityID = r["activity_id"], let url = r["url"],
              let body = r["body"], let attempts = r.int("attempts"), let left = r.double("seconds_left") else { return nil }
        return WebhookDelivery(rowID: id, deliveryID: deliveryID, activityID: activityID, url: url, body: body,
                               attempt: attempts, secondsLeft: left, key: r.int64("key_id") ?? 0, host: r["host"] ?? "")
    }

    static func delivered(_ d: WebhookDelivery, status: String) -> PGQuery {
        PGQuery("""
            UPDATE webhook_outbox SET state = 'delivered', delivered_at = now(), last_status = $3, lease_until = NULL
            WHERE id = $1::bigint AND attempts = $2::integer AND state = 'pending'
            """, [String(d.rowID), String(d.attempt), status], name: "webhook_delivered")
    }

    static func retry(_ d: WebhookDelivery, after seconds: Double, status: String) -> PGQuery {
        PGQuery("""
            UPDATE webhook_outbox SET due_at = now() + make_interval(secs => $3::float8), last_status = $4, lease_until = NULL
            WHERE id = $1::bigint AND attempts = $2::integer AND state = 'pending'
            """, [String(d.rowID), String(d.attempt), String(seconds), status], name: "webhook_retry")
    }

    static func failed(_ d: WebhookDelivery, status: String) -> PGQuery {
        PGQuery("""
            UPDATE webhook_outbox SET state = 'failed', last_status = $3, lease_until = NULL
            WHERE id = $1::bigint AND attempts = $2::integer AND state = 'pending'
            """, [String(d.rowID), String(d.attempt), status], name: "webhook_failed")
    }

    /// Gives claims back (the server is stopping): due again at once.
    static func release(_ ds: [WebhookDelivery]) -> PGQuery {
        PGQuery("""
            UPDATE webhook_outbox o SET due_at = now(), lease_until = NULL
            FROM unnest($1::bigint[], $2::integer[]) AS r(id, attempts)
            WHERE o.id = r.id AND o.attempts = r.attempts AND o.state = 'pending'
            """, ["{" + ds.map { String($0.rowID) }.joined(separator: ",") + "}",
                  "{" + ds.map { String($0.attempt) }.joined(separator: ",") + "}"], name: "webhook_release")
    }

    /// Forgets up to 5,000 finished deliveries (delivered or failed) older than `days`, as
    /// retention forgets finished activities.
    static func prune(olderThanDays days: Double) -> PGQuery {
        PGQuery("""
            DELETE FROM webhook_outbox WHERE id IN (
              SELECT id FROM webhook_outbox WHERE state <> 'pending' AND created_at < now() - make_interval(secs => $1::float8)
              LIMIT 5000)
            """, [String(days * 86_400)], name: "webhook_prune")
    }

    /// The outbox depth (rows still to deliver), through the partial index on pending rows.
    static let pendingCount = PGQuery("SELECT count(*) AS pending FROM webhook_outbox WHERE state = 'pending'", name: "webhook_pending")

    // MARK: - The operator's view (`dispatchd webhooks`)

    static let summary = PGQuery("""
        SELECT state, count(*) AS n, min(created_at)::text AS oldest FROM webhook_outbox GROUP BY state ORDER BY state
        """)

    /// The newest rows, pending and failed first.
    static func recent(limit: Int, state: String?) -> PGQuery {
        PGQuery("""
            SELECT delivery_id, activity_id, url, state, attempts, coalesce(last_status, '-') AS last_status,
                   to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') AS created,
                   CASE WHEN state = 'pending' THEN to_char(due_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') ELSE '-' END AS due
            FROM webhook_outbox WHERE $2::text IS NULL OR state = $2::text
            ORDER BY (state = 'delivered'), created_at DESC, id DESC LIMIT $1::integer
            """, [String(limit), state])
    }

    /// Sends a failed delivery (or a pending one waiting for its retry) again from now, with a
    /// fresh 24 hours. Not one in flight: its sender still holds the claim.
    static func requeue(deliveryID: String) -> PGQuery {
        PGQuery("""
            UPDATE webhook_outbox SET state = 'pending', due_at = now(), give_up_at = now() + interval '24 hours', lease_until = NULL
            WHERE delivery_id = $1 AND (state = 'failed' OR (state = 'pending' AND lease_until IS NULL)) RETURNING delivery_id
            """, [deliveryID])
    }
}
