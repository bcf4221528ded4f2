import DispatchCore
import DispatchIO

/// The kinds of call that change an activity (and may carry an Idempotency-Key).
enum PublishCallKind: String {
    case start, update, end, cancel
}

/// One publish request on its way to a commit.
final class PublishOp {
    enum Kind {
        case start(StartCommand)
        case update(UpdateCommand)
        case end(EndCommand)
        /// A remote cancel request, with its optional reason.
        case cancel(reason: String?)
    }

    enum Outcome {
        /// Nothing to write: the stored snapshot answers (an identical start, a repeated end,
        /// a repeated cancel request).
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
    /// Sent in a batch of its own: a batch it was in failed at a step shared by all its
    /// changes (the finalize), so each is retried alone to find the one at fault.
    var alone = false
    var planned: ActivityEvent?
    var expectedSeq: Int64 = 0
    var endFingerprint: String?
    var previousState: ActivityState?
    var webhook: ActivityRepository.Webhook?
    /// Set by the stale sweeper: planned against a fresh read, never the cache, and applied
    /// only if the activity's `touched_ms` still holds this (see StaleSweeper).
    var staleTouch: Int64?

    init(activityID: String, kind: Kind, idempotencyKey: String?, ownerKeyID: Int64?,
         authorize: @escaping (StoredActivity) -> DispatchError?, completion: @escaping (Outcome) -> Void) {
        self.activityID = activityID
        self.kind = kind
        self.idempotencyKey = idempotencyKey
        self.ownerKeyID = ownerKeyID
        self.authorize = authorize
        self.completion = completion
    }

    var isStart: Bool { callKind == .start }

    var callKind: PublishCallKind {
        switch kind {
        case .start: return .start
        case .update: return .update
        case .end: return .end
        case .cancel: return .cancel
        }
    }
}

/// Publishing for one worker: plans each change against the newest known snapshot and
/// group-commits what is ready. Publishes for one activity are serialised here; across
/// processes a compare-and-set on `seq` keeps the history gap-free, and a miss re-reads and
/// re-plans.
final class Publisher {
    static let maxBatch = 512

    let db: Database
    let activities: ActivityRepository
    let log: Logger
    let metrics: Metrics
    let now: () -> Int64
    /// `staleAfter` for starts that do not give one (seconds; 0: never).
    let defaultStaleAfter: Int
    /// The last batch was refused by a database that does not take writes (readiness).
    var writesRefused = false
    /// Mark the push outbox in each batch (APNs is configured).
    var pushes = false
    /// Called after a batch that marked the push outbox was committed (wakes the push sender).
    var onPushesMarked: (() -> Void)?
    /// Called after each commit with the event and its feed position, before the publisher is answered.
    var onCommitted: ((ActivityEvent, [UInt8], Int64) -> Void)?

    /// Live activities this worker has seen lately, kept current by its commits and by NOTIFY;
    /// bounded by bytes (a snapshot may be a few hundred bytes or several kilobytes).
    private var cache = BoundedCache<String, StoredActivity>(maxBytes: 32 << 20)
    private var busy: Set<String> = []
    private var waiting: [String: [PublishOp]] = [:]
    private var writeQueue: [PublishOp] = []
    private var writing = false
    private var rng = SystemRandomNumberGenerator()

    init(db: Database, log: Logger, metrics: Metrics, defaultStaleAfter: Int, now: @escaping () -> Int64) {
        self.db = db
        activities = ActivityRepository(db: db)
        self.log = log
        self.metrics = metrics
        self.defaultStaleAfter = defaultStaleAfter
        self.now = now
    }

    /// The writer (re)connected: send what waited.
    func writerReady() { flushWrites() }

    /// Nothing is being planned, waiting or written: every publisher has its answer.
    var isIdle: Bool { busy.isEmpty && writeQueue.isEmpty && !writing }

    // MARK: - Cache

    /// Whether the cache holds `id` at an older seq than a change just heard of.
    func isStale(_ id: String, seq: Int64) -> Bool {
        guard let entry = cache[id] else { return false }
        return entry.activity.seq < seq
    }

    func forget(_ id: String) { cache.remove(id) }

    func observe(_ event: ActivityEvent) {
        guard var entry = cache[event.snapshot.activityId], entry.activity.seq < event.seq else { return }
        if event.snapshot.state.isTerminal { cache.remove(event.snapshot.activityId); return }
        entry.activity = event.snapshot
        entry.lastEvent = event.name
        remember(entry)
    }

    private func remember(_ s: StoredActivity) {
        cache.set(s.activity.activityId, s, bytes: s.approximateBytes)
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
        // A broadcast activity waiting for its channel is read afresh: the channel's arrival
        // is no change, and the next change's snapshot should carry it.
        if op.attempts == 0, op.staleTouch == nil, let current = cache[op.activityID],
           !(current.activity.broadcast && current.activity.channelId == nil) {
            decide(op, current)
            return
        }
        activities.readForPublish(op.activityID, idempotencyKey: op.idempotencyKey) { [weak self] result in
            guard let self else { return }
            switch result {
            case .failure(let e):
                self.finish(op, .failed(e))
            case .success(nil):
                self.finish(op, .failed(DispatchError(.notFound, "no activity \(op.activityID)")))
            case .success(let (current, replay)?):
                if !current.activity.state.isTerminal { self.remember(current) }
                if let replay {
                    // A stored answer goes only to the same key's owner, for the same call.
                    if let denied = op.authorize(current) { return self.finish(op, .failed(denied)) }
                    guard replay.call == op.callKind else {
                        return self.finish(op, .failed(DispatchError(
                            .conflict, "this Idempotency-Key was already used for a different request (\(replay.call.rawValue) of \(op.activityID))")))
                    }
                    return self.finish(op, .replay(replay.json))
                }
                self.decide(op, current)
            }
        }
    }

    private func decide(_ op: PublishOp, _ current: StoredActivity) {
        if let denied = op.authorize(current) { return finish(op, .failed(denied)) }
        let t = now()
        let planned: ActivityEvent
        switch op.kind {
        case .start(let cmd):
            switch ActivityMachine.restart(cmd, existing: current.activity, storedFingerprint: current.startFingerprint) {
            case .success(let a): return finish(op, .ok(a))
            case .failure(let e): return finish(op, .failed(e))
            }
        case .update(let cmd):
            switch ActivityMachine.update(cmd, current: current.activity, now: t) {
            case .success(let event): planned = event
            case .failure(let e): return finish(op, .failed(e))
            }
        case .end(let cmd):
            switch ActivityMachine.end(cmd, current: current.activity, storedEndFingerprint: current.endFingerprint, now: t) {
            case .success(.alreadyEnded(let a)): return finish(op, .ok(a))
            case .success(.ended(let event)):
                planned = event
                op.endFingerprint = cmd.fingerprint
            case .failure(let e): return finish(op, .failed(e))
            }
        case .cancel(let reason):
            switch ActivityMachine.cancel(current: current.activity, reason: reason, now: t) {
            case .success(.alreadyRequested(let a)): return finish(op, .ok(a))
            case .success(.requested(let event)):
                planned = event
                op.webhook = ActivityRepository.Webhook(
                    deliveryID: RandomID.uuid(using: &rng),
                    body: CancelWebhook.body(activityID: op.activityID, reason: reason, requestedAt: t, seq: event.seq))
            case .failure(let e): return finish(op, .failed(e))
            }
        }
        op.planned = planned
        op.expectedSeq = current.activity.seq
        op.previousState = current.activity.state
        enqueueWrite(op)
    }

    private func enqueueWrite(_ op: PublishOp) {
        writeQueue.append(op)
        flushWrites()
    }

    /// The batch's writes: its new activities in one statement, its changes in another.
    private func writeStatements(_ ops: [PublishOp]) -> [PGQuery] {
        var starts: [ActivityRepository.Start] = []
        var updates: [ActivityRepository.Update] = []
        for op in ops {
            let event = op.planned!
            switch op.kind {
            case .start(let cmd):
                starts.append(.init(event: event, ownerKeyID: op.ownerKeyID, fingerprint: cmd.fingerprint,
                                    staleAfter: cmd.staleAfter ?? defaultStaleAfter))
            case .update, .end, .cancel:
                var reason: String?
                if case .cancel(let r) = op.kind { reason = r }
                updates.append(.init(event: event, expectedSeq: op.expectedSeq, endFingerprint: op.endFingerprint,
                                     cancelReason: reason, webhook: op.webhook, idempotencyKey: op.idempotencyKey,
                                     staleTouch: op.staleTouch))
            }
        }
        return (starts.isEmpty ? [] : [ActivityRepository.startsStatement(starts)])
            + (updates.isEmpty ? [] : [ActivityRepository.updatesStatement(updates)])
    }

    /// Group commit: everything queued goes in one pipeline batch, which PostgreSQL runs as one
    /// implicit transaction committed at the batch's sync point (no BEGIN/COMMIT: an error then
    /// rolls the whole batch back instead of leaving the session in an aborted transaction).
    /// A batch is at most four statements however many changes it carries: the new activities,
    /// the changes, the position lock and the finalize. Each publisher is answered after the
    /// commit. One batch in flight at a time.
    private func flushWrites() {
        guard !writing, !writeQueue.isEmpty else { return }
        guard db.writer.isReady else {
            let failed = writeQueue
            writeQueue.removeAll()
            for op in failed { finish(op, .failed(Database.unavailable)) }
            return
        }
        let ops = writeQueue[0].alone ? [writeQueue[0]] : Array(writeQueue.prefix(Publisher.maxBatch).prefix { !$0.alone })
        writeQueue.removeFirst(ops.count)
        let jsons = ops.map { $0.planned!.snapshot.json() }
        let changes = zip(ops, jsons).map { op, json in
            ActivityRepository.Change(activityID: op.activityID, seq: op.planned!.seq, event: op.planned!.name,
                                      data: String(decoding: json, as: UTF8.self), idempotencyKey: op.idempotencyKey,
                                      createdMs: op.planned!.snapshot.updatedAt,
                                      pushPriority: op.planned!.pushPriority(previous: op.previousState))
        }
        let writes = writeStatements(ops)
        let queries = writes + [ActivityRepository.positionLock, ActivityRepository.finalizeStatement(changes, pushes: pushes, now: now())]
        writing = true
        metrics.publishBatches += 1
        db.writer.execute(queries) { [weak self] result in
            guard let self else { return }
            self.writing = false
            switch result {
            case .failure:
                for op in ops { self.cache.remove(op.activityID); self.finish(op, .failed(Database.unavailable)) }
            case .success(let rs) where rs.allSatisfy(\.ok):
                self.writesRefused = false
                var applied: Set<String> = []
                for r in rs.prefix(writes.count) { for row in r.rows { if let id = row["activity_id"] { applied.insert(id) } } }
                var positions: [String: Int64] = [:]
                for row in rs[rs.count - 1].rows {
                    if let id = row["activity_id"], let position = row.int64("position") { positions[id] = position }
                }
                for (i, op) in ops.enumerated() {
                    self.settle(op, applied: applied.contains(op.activityID), json: jsons[i], position: positions[op.activityID])
                }
                if self.pushes, let marked = rs[rs.count - 1].first?.int64("pushes"), marked > 0 { self.onPushesMarked?() }
            case .success(let rs):
                // The batch rolled back. Its statements carry every change, so the one at fault
                // is found by retrying each change alone; a change that fails alone fails (a
                // few replays at most, in case the cause is not its own).
                if let refused = rs.first(where: { Database.refusedWrite($0.sqlState) }) {
                    self.writesRefused = true
                    self.log.warning("publish.writes_refused", [("error", (refused.errorMessage ?? "").trimmingNewlines)])
                    for op in ops { self.finish(op, .failed(Database.refusesWrites)) }
                    return self.flushWrites()
                }
                let error = rs.first { $0.sqlState != nil }?.errorMessage ?? "batch rolled back"
                if ops.count > 1 { self.log.warning("publish.batch_failed", [("error", error.trimmingNewlines), ("changes", ops.count)]) }
                for op in ops {
                    op.replays += 1
                    if ops.count == 1 || op.replays > 3 {
                        self.log.error("publish.failed", [("activity", op.activityID), ("error", error.trimmingNewlines)])
                        self.finish(op, .failed(DispatchError(.internalError, "the change could not be stored")))
                    } else {
                        op.alone = true
                        self.writeQueue.append(op)
                    }
                }
            }
            self.flushWrites()
        }
    }

    private func settle(_ op: PublishOp, applied: Bool, json: [UInt8], position: Int64?) {
        guard applied, let event = op.planned, let position else {
            // Someone else changed it first (or this request was already applied): re-read, re-plan.
            cache.remove(op.activityID)
            op.attempts += 1
            metrics.casRetries += 1
            guard op.attempts <= 20 else {
                var busy = DispatchError(.concurrentChanges, "too many concurrent changes to \(op.activityID); retry")
                busy.retryAfterSeconds = 1
                return finish(op, .failed(busy))
            }
            return plan(op)
        }
        metrics.eventsPublished += 1
        if case .start(let cmd) = op.kind {
            if !event.snapshot.state.isTerminal {
                remember(StoredActivity(activity: event.snapshot, lastEvent: event.name, ownerKeyID: op.ownerKeyID,
                                        startFingerprint: cmd.fingerprint, endFingerprint: nil,
                                        staleAfter: cmd.staleAfter ?? defaultStaleAfter))
            }
        } else {
            observe(event)
        }
        onCommitted?(event, json, position)
        finish(op, .committed(json: json, created: op.isStart))
    }
}
