import DispatchCore
import DispatchIO

/// An activity row with what the publishing rules need beyond the snapshot.
struct StoredActivity {
    var activity: Activity
    var lastEvent: String
    var ownerKeyID: Int64?
    var startFingerprint: String
    var endFingerprint: String?
}

struct StoredEvent {
    var seq: Int64
    var name: String
    var data: String
    var createdMs: Int64
}

/// One publish request on its way to a commit.
final class PublishOp {
    enum Kind {
        case start(StartCommand)
        case update(UpdateCommand)
        case end(EndCommand)
    }

    enum Outcome {
        case ok(Activity)
        /// Committed now: the snapshot's JSON is the one already written to the database.
        case committed(json: [UInt8], created: Bool)
        /// A repeat of an already applied request: the stored answer, as JSON.
        case replay(String)
        case failed(DispatchError)
    }

    let activityID: String
    let kind: Kind
    let idempotencyKey: String?
    let ownerKeyID: Int64?
    /// Ownership and scope rules for an existing activity; nil means allowed.
    let authorize: (StoredActivity) -> DispatchError?
    let completion: (Outcome) -> Void
    var attempts = 0
    /// Times this op was sent again because another statement rolled its batch back.
    var replays = 0
    var planned: ActivityEvent?
    var expectedSeq: Int64 = 0
    var endFingerprint: String?

    init(activityID: String, kind: Kind, idempotencyKey: String?, ownerKeyID: Int64?,
         authorize: @escaping (StoredActivity) -> DispatchError?, completion: @escaping (Outcome) -> Void) {
        self.activityID = activityID
        self.kind = kind
        self.idempotencyKey = idempotencyKey
        self.ownerKeyID = ownerKeyID
        self.authorize = authorize
        self.completion = completion
    }
}

/// PostgreSQL access for one worker: a connection for group-committed publishes, one for
/// reads, each pipelined. Publishes for one activity are serialised here; across processes a
/// compare-and-set on `seq` keeps the history gap-free, and a miss re-reads and re-plans.
final class Store {
    static let activityColumns = """
        activity_id, task_name, system_image, machine, cancel_url, state, progress, status, attempt, seq, \
        cancel_requested, created_ms, updated_ms, ended_ms, error, last_event, owner_key_id, start_fingerprint, end_fingerprint
        """
    static let notifyChannel = "dispatch_events"
    static let maxNotifyPayload = 7900
    static let maxBatch = 512

    let loop: EventLoop
    let log: Logger
    let metrics: Metrics
    let writer: PGConnection
    let reader: PGConnection
    let now: () -> Int64
    /// Called after each commit with the event, before the publisher is answered.
    var onCommitted: ((ActivityEvent, [UInt8]) -> Void)?

    private var cache: [String: StoredActivity] = [:]
    private var busy: Set<String> = []
    private var waiting: [String: [PublishOp]] = [:]
    private var writeQueue: [PublishOp] = []
    private var writing = false

    init(loop: EventLoop, conninfo: String, log: Logger, metrics: Metrics, now: @escaping () -> Int64) {
        self.loop = loop
        self.log = log
        self.metrics = metrics
        self.now = now
        writer = PGConnection(loop: loop, conninfo: conninfo, name: "writer", log: log)
        reader = PGConnection(loop: loop, conninfo: conninfo, name: "reader", log: log)
        for c in [writer, reader] {
            c.onRoundTrip = { [metrics] in metrics.observeQuery($0) }
        }
        writer.onReady = { [weak self] in self?.flushWrites() }
    }

    var isReady: Bool { writer.isReady && reader.isReady }

    func start() {
        writer.start()
        reader.start()
    }

    func close() {
        writer.close()
        reader.close()
    }

    // MARK: - Reads

    func readActivity(_ id: String, completion: @escaping (Result<StoredActivity?, DispatchError>) -> Void) {
        reader.execute([PGQuery("SELECT \(Store.activityColumns) FROM activities WHERE activity_id = $1", [id], name: "read_activity")]) { result in
            switch result {
            case .failure(let e): completion(.failure(Store.unavailable(e)))
            case .success(let rs):
                guard rs[0].ok else { completion(.failure(DispatchError(.internalError, "read failed"))); return }
                completion(.success(rs[0].rows.first.flatMap(Store.decodeActivity)))
            }
        }
    }

    func readHistory(_ id: String, after: Int64, limit: Int64, completion: @escaping (Result<[StoredEvent], DispatchError>) -> Void) {
        reader.execute([PGQuery("SELECT seq, event, data, created_ms FROM activity_events WHERE activity_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
                                [id, String(after), String(limit)], name: "read_history")]) { result in
            switch result {
            case .failure(let e): completion(.failure(Store.unavailable(e)))
            case .success(let rs):
                guard rs[0].ok else { completion(.failure(DispatchError(.internalError, "history read failed"))); return }
                completion(.success(rs[0].rows.compactMap { r in
                    guard let s = r[0].flatMap({ Int64($0) }), let n = r[1], let d = r[2], let c = r[3].flatMap({ Int64($0) }) else { return nil }
                    return StoredEvent(seq: s, name: n, data: d, createdMs: c)
                }))
            }
        }
    }

    struct ListQuery {
        var finished: Bool?
        var machine: String?
        var limit: Int64
        var cursor: (Int64, String)?
    }

    func list(_ q: ListQuery, completion: @escaping (Result<[Activity], DispatchError>) -> Void) {
        var conditions: [String] = []
        var params: [String?] = []
        if let f = q.finished { conditions.append(f ? "ended_ms IS NOT NULL" : "ended_ms IS NULL") }
        if let m = q.machine { params.append(m); conditions.append("machine = $\(params.count)") }
        if let (t, id) = q.cursor {
            params.append(String(t)); params.append(id)
            conditions.append("(created_ms, activity_id) < ($\(params.count - 1)::bigint, $\(params.count))")
        }
        params.append(String(q.limit))
        let whereClause = conditions.isEmpty ? "" : "WHERE " + conditions.joined(separator: " AND ")
        let sql = "SELECT \(Store.activityColumns) FROM activities \(whereClause) ORDER BY created_ms DESC, activity_id DESC LIMIT $\(params.count)"
        reader.execute([PGQuery(sql, params)]) { result in
            switch result {
            case .failure(let e): completion(.failure(Store.unavailable(e)))
            case .success(let rs):
                guard rs[0].ok else { completion(.failure(DispatchError(.internalError, "list failed"))); return }
                completion(.success(rs[0].rows.compactMap { Store.decodeActivity($0)?.activity }))
            }
        }
    }

    /// Deletes finished activities (and their history) that ended before `cutoff`, a bounded
    /// number per call. Live activities are never touched.
    func prune(endedBefore cutoff: Int64, completion: @escaping (Int) -> Void) {
        reader.execute([PGQuery("""
            WITH old AS (
              DELETE FROM activities WHERE activity_id IN (
                SELECT activity_id FROM activities WHERE ended_ms IS NOT NULL AND ended_ms < $1::bigint LIMIT 5000)
              RETURNING activity_id
            ), gone AS (
              DELETE FROM activity_events e USING old WHERE e.activity_id = old.activity_id RETURNING 1
            )
            SELECT (SELECT count(*) FROM old), (SELECT count(*) FROM gone)
            """, [String(cutoff)], name: "prune")]) { result in
            guard case .success(let rs) = result, let n = rs[0].rows.first?[0].flatMap({ Int($0) }) else { return completion(0) }
            completion(n)
        }
    }

    static func unavailable(_ e: PGError) -> DispatchError {
        DispatchError(.databaseUnavailable, "the database is unavailable, retry shortly")
    }

    static func decodeActivity(_ r: [String?]) -> StoredActivity? {
        guard r.count >= 19, let id = r[0], let name = r[1], let stateText = r[5], let state = ActivityState(rawValue: stateText),
              let attempt = r[8].flatMap({ Int64($0) }), let seq = r[9].flatMap({ Int64($0) }),
              let created = r[11].flatMap({ Int64($0) }), let updated = r[12].flatMap({ Int64($0) }),
              let lastEvent = r[15], let startFP = r[17] else { return nil }
        let a = Activity(activityId: id, taskName: name, systemImage: r[2], machine: r[3], cancelURL: r[4], state: state,
                         progress: r[6].flatMap { Double($0) }, status: r[7], attempt: attempt, seq: seq,
                         cancelRequested: r[10] == "t", createdAt: created, updatedAt: updated,
                         endedAt: r[13].flatMap { Int64($0) }, error: r[14])
        return StoredActivity(activity: a, lastEvent: lastEvent, ownerKeyID: r[16].flatMap { Int64($0) },
                              startFingerprint: startFP, endFingerprint: r[18])
    }

    // MARK: - Cache, kept current by this worker's commits and by NOTIFY

    func cached(_ id: String) -> StoredActivity? { cache[id] }

    /// Whether the cache holds `id` at an older seq than a change just heard of.
    func isStale(_ id: String, seq: Int64) -> Bool {
        guard let entry = cache[id] else { return false }
        return entry.activity.seq < seq
    }

    func forget(_ id: String) { cache[id] = nil }

    func observe(_ event: ActivityEvent) {
        guard var entry = cache[event.snapshot.activityId], entry.activity.seq < event.seq else { return }
        if event.snapshot.state.isTerminal { cache[event.snapshot.activityId] = nil; return }
        entry.activity = event.snapshot
        entry.lastEvent = event.name
        cache[event.snapshot.activityId] = entry
    }

    private func remember(_ s: StoredActivity) {
        if cache.count > 100_000 { cache.removeAll(keepingCapacity: true) }
        cache[s.activity.activityId] = s
    }

    // MARK: - Publishing

    func submit(_ op: PublishOp) {
        if busy.contains(op.activityID) {
            waiting[op.activityID, default: []].append(op)
            return
        }
        busy.insert(op.activityID)
        plan(op)
    }

    private func finish(_ op: PublishOp, _ outcome: PublishOp.Outcome) {
        op.completion(outcome)
        if var queue = waiting[op.activityID], !queue.isEmpty {
            let next = queue.removeFirst()
            waiting[op.activityID] = queue.isEmpty ? nil : queue
            plan(next)
        } else {
            busy.remove(op.activityID)
        }
    }

    /// Decides the change against the newest known snapshot, reading it when not cached.
    private func plan(_ op: PublishOp) {
        if case .start(let cmd) = op.kind, op.attempts == 0 {
            op.planned = ActivityMachine.start(cmd, id: op.activityID, now: now())
            op.expectedSeq = 0
            enqueueWrite(op)
            return
        }
        if op.attempts == 0, let current = cache[op.activityID] {
            decide(op, current)
            return
        }
        reader.execute([PGQuery("""
            SELECT \(Store.activityColumns), (SELECT data FROM activity_events e WHERE e.activity_id = a.activity_id AND e.idempotency_key = $2)
            FROM activities a WHERE activity_id = $1
            """, [op.activityID, op.idempotencyKey], name: "read_for_publish")]) { [weak self] result in
            guard let self else { return }
            switch result {
            case .failure(let e):
                self.finish(op, .failed(Store.unavailable(e)))
            case .success(let rs):
                guard rs[0].ok else { self.finish(op, .failed(DispatchError(.internalError, "read failed"))); return }
                guard let row = rs[0].rows.first, let current = Store.decodeActivity(row) else {
                    self.finish(op, .failed(DispatchError(.notFound, "no activity \(op.activityID)")))
                    return
                }
                if let replay = row[19] {
                    self.finish(op, .replay(replay))
                    return
                }
                if !current.activity.state.isTerminal { self.remember(current) }
                self.decide(op, current)
            }
        }
    }

    private func decide(_ op: PublishOp, _ current: StoredActivity) {
        if let denied = op.authorize(current) {
            finish(op, .failed(denied))
            return
        }
        let t = now()
        switch op.kind {
        case .start(let cmd):
            switch ActivityMachine.restart(cmd, existing: current.activity, storedFingerprint: current.startFingerprint) {
            case .success(let a): finish(op, .ok(a))
            case .failure(let e): finish(op, .failed(e))
            }
        case .update(let cmd):
            switch ActivityMachine.update(cmd, current: current.activity, now: t) {
            case .success(let event):
                op.planned = event
                op.expectedSeq = current.activity.seq
                enqueueWrite(op)
            case .failure(let e): finish(op, .failed(e))
            }
        case .end(let cmd):
            switch ActivityMachine.end(cmd, current: current.activity, storedEndFingerprint: current.endFingerprint, now: t) {
            case .success(.alreadyEnded(let a)): finish(op, .ok(a))
            case .success(.ended(let event)):
                op.planned = event
                op.expectedSeq = current.activity.seq
                op.endFingerprint = cmd.fingerprint
                enqueueWrite(op)
            case .failure(let e): finish(op, .failed(e))
            }
        }
    }

    private func enqueueWrite(_ op: PublishOp) {
        writeQueue.append(op)
        flushWrites()
    }

    static func notifyPayload(_ event: ActivityEvent, json: [UInt8]) -> String {
        let head = "\(event.snapshot.activityId)\n\(event.seq)\n\(event.name)\n"
        if head.utf8.count + json.count <= maxNotifyPayload { return head + String(decoding: json, as: UTF8.self) }
        return head
    }

    private func statement(for op: PublishOp, json: [UInt8]) -> PGQuery {
        let e = op.planned!
        let a = e.snapshot
        let data = String(decoding: json, as: UTF8.self)
        let payload = Store.notifyPayload(e, json: json)
        let progress = a.progress.map { "\($0)" }
        if case .start(let cmd) = op.kind {
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
                SELECT pg_notify('\(Store.notifyChannel)', $14) FROM ev
                """, [a.activityId, a.taskName, a.systemImage, a.machine, a.cancelURL, a.state.rawValue, progress, a.status,
                      String(a.createdAt), op.ownerKeyID.map { String($0) }, cmd.fingerprint, data, op.idempotencyKey, payload],
                name: "publish_start")
        }
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
            SELECT pg_notify('\(Store.notifyChannel)', $15) FROM ev
            """, [a.activityId, String(op.expectedSeq), a.state.rawValue, progress, a.status, String(a.attempt), String(a.seq),
                  e.name, String(a.updatedAt), a.endedAt.map { String($0) }, a.error, op.endFingerprint, op.idempotencyKey,
                  data, payload],
            name: "publish_change")
    }

    /// Group commit: everything queued goes in one pipeline batch, which PostgreSQL runs as one
    /// implicit transaction committed at the batch's sync point (no BEGIN/COMMIT: an error then
    /// rolls the whole batch back instead of leaving the session in an aborted transaction).
    /// Each publisher is answered after that commit. One batch in flight at a time.
    private func flushWrites() {
        guard !writing, !writeQueue.isEmpty, writer.isReady else {
            if !writer.isReady && !writeQueue.isEmpty {
                let failed = writeQueue
                writeQueue.removeAll()
                for op in failed { finish(op, .failed(DispatchError(.databaseUnavailable, "the database is unavailable, retry shortly"))) }
            }
            return
        }
        let ops = Array(writeQueue.prefix(Store.maxBatch))
        writeQueue.removeFirst(ops.count)
        let jsons = ops.map { $0.planned!.snapshot.json() }
        let queries = zip(ops, jsons).map { statement(for: $0, json: $1) }
        writing = true
        metrics.publishBatches += 1
        writer.execute(queries) { [weak self] result in
            guard let self else { return }
            self.writing = false
            switch result {
            case .failure(let e):
                for op in ops { self.cache[op.activityID] = nil; self.finish(op, .failed(Store.unavailable(e))) }
            case .success(let rs):
                if rs.allSatisfy({ $0.ok }) {
                    for (i, op) in ops.enumerated() { self.settle(op, rs[i], json: jsons[i]) }
                } else {
                    // The batch rolled back: fail the statement that erred, replay the others
                    // (a few times at most, in case the cause is not theirs to fix).
                    for (op, r) in zip(ops, rs) {
                        op.replays += 1
                        if let message = r.errorMessage, r.sqlState != nil || op.replays > 3 {
                            self.log.error("publish.failed", [("activity", op.activityID), ("error", message.trimmingNewlines)])
                            self.finish(op, .failed(DispatchError(.internalError, "the change could not be stored")))
                        } else {
                            self.writeQueue.append(op)
                        }
                    }
                }
            }
            self.flushWrites()
        }
    }

    private func settle(_ op: PublishOp, _ r: PGResult, json: [UInt8]) {
        if let message = r.errorMessage {
            log.error("publish.failed", [("activity", op.activityID), ("error", message.trimmingNewlines)])
            finish(op, .failed(DispatchError(.internalError, "the change could not be stored")))
            return
        }
        guard r.rows.count == 1, let event = op.planned else {
            // Someone else changed it first (or this request was already applied): re-read, re-plan.
            cache[op.activityID] = nil
            op.attempts += 1
            metrics.casRetries += 1
            guard op.attempts <= 20 else {
                finish(op, .failed(DispatchError(.conflict, "too many concurrent changes to \(op.activityID); retry")))
                return
            }
            plan(op)
            return
        }
        metrics.eventsPublished += 1
        if case .start(let cmd) = op.kind {
            if !event.snapshot.state.isTerminal {
                remember(StoredActivity(activity: event.snapshot, lastEvent: event.name, ownerKeyID: op.ownerKeyID,
                                        startFingerprint: cmd.fingerprint, endFingerprint: nil))
            }
        } else {
            observe(event)
        }
        onCommitted?(event, json)
        if case .start = op.kind { finish(op, .committed(json: json, created: true)) } else { finish(op, .committed(json: json, created: false)) }
    }
}
