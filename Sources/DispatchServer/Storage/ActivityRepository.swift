import DispatchCore
import DispatchIO

/// An activity row with what the publishing rules need beyond the snapshot.
struct StoredActivity {
    var activity: Activity
    var lastEvent: String
    var ownerKeyID: Int64?
    var startFingerprint: String
    var endFingerprint: String?

    init(activity: Activity, lastEvent: String, ownerKeyID: Int64?, startFingerprint: String, endFingerprint: String?) {
        self.activity = activity
        self.lastEvent = lastEvent
        self.ownerKeyID = ownerKeyID
        self.startFingerprint = startFingerprint
        self.endFingerprint = endFingerprint
    }

    /// Decodes a row of `ActivityRepository.columns`; nil when the row breaks the schema's rules.
    init?(row r: PGRow) {
        guard let id = r["activity_id"], let name = r["task_name"], let state = r["state"].flatMap(ActivityState.init(rawValue:)),
              let attempt = r.int64("attempt"), let seq = r.int64("seq"), let created = r.int64("created_ms"),
              let updated = r.int64("updated_ms"), let lastEvent = r["last_event"], let startFP = r["start_fingerprint"]
        else { return nil }
        activity = Activity(activityId: id, taskName: name, systemImage: r["system_image"], machine: r["machine"],
                            cancelURL: r["cancel_url"], state: state, progress: r.double("progress"), status: r["status"],
                            attempt: attempt, seq: seq, cancelRequested: r.bool("cancel_requested") ?? false,
                            createdAt: created, updatedAt: updated, endedAt: r.int64("ended_ms"), error: r["error"])
        self.lastEvent = lastEvent
        ownerKeyID = r.int64("owner_key_id")
        startFingerprint = startFP
        endFingerprint = r["end_fingerprint"]
    }
}

/// One stored change: what history reads and replays return.
struct StoredEvent {
    var seq: Int64
    var name: String
    var data: String
    var createdMs: Int64

    init(seq: Int64, name: String, data: String, createdMs: Int64) {
        self.seq = seq
        self.name = name
        self.data = data
        self.createdMs = createdMs
    }

    init?(row r: PGRow) {
        guard let seq = r.int64("seq"), let name = r["event"], let data = r["data"], let created = r.int64("created_ms") else { return nil }
        self.init(seq: seq, name: name, data: data, createdMs: created)
    }
}

/// All SQL on `activities` and `activity_events`, and the decoding of their rows.
struct ActivityRepository {
    let db: Database

    static let columns = """
        activity_id, task_name, system_image, machine, cancel_url, state, progress, status, attempt, seq, \
        cancel_requested, created_ms, updated_ms, ended_ms, error, last_event, owner_key_id, start_fingerprint, end_fingerprint
        """

    func read(_ id: String, _ completion: @escaping (Result<StoredActivity?, DispatchError>) -> Void) {
        db.read(PGQuery("SELECT \(Self.columns) FROM activities WHERE activity_id = $1", [id], name: "read_activity")) { result in
            completion(result.map { $0.first.flatMap(StoredActivity.init(row:)) })
        }
    }

    /// Stored events after `after`, oldest first: at most `limit`, and no more than about
    /// `maxBytes` of event data (the first event always comes, whatever its size).
    func history(_ id: String, after: Int64, limit: Int64, maxBytes: Int = Int(Int32.max),
                 _ completion: @escaping (Result<[StoredEvent], DispatchError>) -> Void) {
        db.read(PGQuery("""
            SELECT seq, event, data, created_ms FROM (
              SELECT seq, event, data, created_ms, sum(octet_length(data)) OVER (ORDER BY seq) AS upto
              FROM activity_events WHERE activity_id = $1 AND seq > $2::bigint ORDER BY seq LIMIT $3::bigint
            ) page WHERE upto - octet_length(data) < $4::bigint ORDER BY seq
            """, [id, String(after), String(limit), String(maxBytes)], name: "read_history")) { result in
            completion(result.map { $0.rows.compactMap(StoredEvent.init(row:)) })
        }
    }

    struct ListQuery {
        var finished: Bool?
        var machine: String?
        var limit: Int64
        var cursor: ListCursor?
    }

    func list(_ q: ListQuery, _ completion: @escaping (Result<[Activity], DispatchError>) -> Void) {
        var conditions: [String] = []
        var params: [String?] = []
        if let f = q.finished { conditions.append(f ? "ended_ms IS NOT NULL" : "ended_ms IS NULL") }
        if let m = q.machine { params.append(m); conditions.append("machine = $\(params.count)") }
        if let c = q.cursor {
            params.append(String(c.createdAt)); params.append(c.activityId)
            conditions.append("(created_ms, activity_id) < ($\(params.count - 1)::bigint, $\(params.count))")
        }
        params.append(String(q.limit))
        let whereClause = conditions.isEmpty ? "" : "WHERE " + conditions.joined(separator: " AND ")
        db.read(PGQuery("SELECT \(Self.columns) FROM activities \(whereClause) ORDER BY created_ms DESC, activity_id DESC LIMIT $\(params.count)", params)) { result in
            completion(result.map { $0.rows.compactMap { StoredActivity(row: $0)?.activity } })
        }
    }

    /// Deletes up to 5,000 finished activities that ended before `cutoff`, with their history
    /// (a cascading foreign key). Live activities are never touched.
    func prune(endedBefore cutoff: Int64, _ completion: @escaping (Int) -> Void) {
        db.read(PGQuery("""
            WITH old AS (
              DELETE FROM activities WHERE activity_id IN (
                SELECT activity_id FROM activities WHERE ended_ms IS NOT NULL AND ended_ms < $1::bigint LIMIT 5000)
              RETURNING 1
            )
            SELECT count(*) AS pruned FROM old
            """, [String(cutoff)], name: "prune")) { result in
            completion((try? result.get().first?.int("pruned")) ?? 0)
        }
    }

    /// The row a publish is planned against, and the stored answer if this Idempotency-Key was
    /// already applied to this activity.
    func readForPublish(_ id: String, idempotencyKey: String?,
                        _ completion: @escaping (Result<(StoredActivity, replay: String?)?, DispatchError>) -> Void) {
        db.read(PGQuery("""
            SELECT \(Self.columns),
                   (SELECT data FROM activity_events e WHERE e.activity_id = a.activity_id AND e.idempotency_key = $2) AS replay
            FROM activities a WHERE activity_id = $1
            """, [id, idempotencyKey], name: "read_for_publish")) { result in
            completion(result.map { r in
                guard let row = r.first, let stored = StoredActivity(row: row) else { return nil }
                return (stored, row["replay"])
            })
        }
    }

    // MARK: - Writes (statements for the group commit)

    static let maxNotifyPayload = 7900

    /// NOTIFY payload: `id \n seq \n event \n json`, the json left out when it would not fit.
    static func notifyPayload(_ event: ActivityEvent, json: [UInt8]) -> String {
        let head = "\(event.snapshot.activityId)\n\(event.seq)\n\(event.name)\n"
        if head.utf8.count + json.count <= maxNotifyPayload { return head + String(decoding: json, as: UTF8.self) }
        return head
    }

    /// Creates the activity, its first history row and the NOTIFY, in one statement; no row
    /// comes back when the id exists.
    static func startStatement(_ e: ActivityEvent, json: [UInt8], ownerKeyID: Int64?, fingerprint: String, idempotencyKey: String?) -> PGQuery {
        let a = e.snapshot
        return PGQuery("""
            WITH ins AS (
              INSERT INTO activities (activity_id, task_name, system_image, machine, cancel_url, state, progress, status,
                                      attempt, seq, last_event, created_ms, updated_ms, owner_key_id, start_fingerprint)
              VALUES ($1, $2, $3, $4, $5, $6, $7::float8, $8, 1, 1, $6, $9::bigint, $9::bigint, $10::bigint, $11)
              ON CONFLICT (activity_id) DO NOTHING RETURNING activity_id
            ), ev AS (
              INSERT INTO activity_events (activity_id, seq, event, data, idempotency_key, created_ms)
              SELECT activity_id, 1, $6, $12, $13, $9::bigint FROM ins RETURNING activity_id
            )
            SELECT pg_notify('\(Channel.events)', $14) FROM ev
            """, [a.activityId, a.taskName, a.systemImage, a.machine, a.cancelURL, a.state.rawValue, a.progress.map { "\($0)" },
                  a.status, String(a.createdAt), ownerKeyID.map { String($0) }, fingerprint,
                  String(decoding: json, as: UTF8.self), idempotencyKey, notifyPayload(e, json: json)],
            name: "publish_start")
    }

    /// Applies a change if the row is still at `expectedSeq` (compare-and-set across processes)
    /// and this Idempotency-Key was not applied yet; no row comes back otherwise.
    static func changeStatement(_ e: ActivityEvent, json: [UInt8], expectedSeq: Int64, endFingerprint: String?, idempotencyKey: String?) -> PGQuery {
        let a = e.snapshot
        return PGQuery("""
            WITH upd AS (
              UPDATE activities SET state = $3, progress = $4::float8, status = $5, attempt = $6::bigint, seq = $7::bigint,
                     last_event = $8, updated_ms = $9::bigint, ended_ms = $10::bigint, error = $11, end_fingerprint = $12
              WHERE activity_id = $1 AND seq = $2::bigint
                AND NOT EXISTS (SELECT 1 FROM activity_events WHERE activity_id = $1 AND idempotency_key = $13)
              RETURNING activity_id
            ), ev AS (
              INSERT INTO activity_events (activity_id, seq, event, data, idempotency_key, created_ms)
              SELECT activity_id, $7::bigint, $8, $14, $13, $9::bigint FROM upd RETURNING activity_id
            )
            SELECT pg_notify('\(Channel.events)', $15) FROM ev
            """, [a.activityId, String(expectedSeq), a.state.rawValue, a.progress.map { "\($0)" }, a.status, String(a.attempt),
                  String(a.seq), e.name, String(a.updatedAt), a.endedAt.map { String($0) }, a.error, endFingerprint,
                  idempotencyKey, String(decoding: json, as: UTF8.self), notifyPayload(e, json: json)],
            name: "publish_change")
    }
}
