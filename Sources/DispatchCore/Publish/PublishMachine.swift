/// The write path of one worker as a pure state machine (PGConnectionMachine's shape): every
/// input is a `mutating func` returning the actions the shell (the server's `Publisher`)
/// performs, in order. No I/O, no clock (time comes in with each input), no random numbers
/// (a cancel's webhook id comes with its request). The state is committed before any action
/// runs, so a completion that submits again sees the new state.
///
/// It plans each change against the newest known snapshot (a bounded cache of live ones, kept
/// current by this worker's commits and by what `heard` hears of others') or a fresh read,
/// and group-commits what is ready: one batch in flight, at most `maxBatch` changes (a
/// request of many changes, `submittedAll`, goes whole: its changes wait until none of them is
/// being read, then go in one batch however large).
/// While load is present a commit window gathers more: after a batch that carried the changes
/// of several requests (and fewer than `windowFull`), the next batch waits up to
/// `commitWindowMs` for more to arrive (`.wake`, answered `windowElapsed`), or goes as soon as
/// `windowFull` changes wait. A lone publisher is never held: a batch of one request opens no
/// window, so the first change after a quiet spell goes at once (issue 35: PostgreSQL's cost
/// per publish is mostly the commit).
/// Publishes for one activity are serialised here (one in progress, the rest wait in order);
/// across processes a compare-and-set on `seq` keeps the history gap-free, and a miss re-reads
/// and re-plans.
public struct PublishMachine {
    /// Names a submitted op until it is answered (also the token of its read).
    public typealias OpID = UInt64
    public typealias BatchID = UInt64
    /// Names the changes of one request that go to the database together.
    public typealias GroupID = UInt64
    /// Names one opening of the commit window (a late `windowElapsed` of a closed one is ignored).
    public typealias WindowID = UInt64

    public static let maxBatch = 512
    /// Compare-and-set misses before a publisher is told to retry later.
    public static let maxAttempts = 20
    /// Changes waiting that close an open commit window at once: the batch is big enough.
    public static let windowFull = 64
    /// Times a change is sent again because another change rolled its batch back.
    public static let maxReplays = 3

    public enum Action: Equatable, Sendable {
        /// Read the activity (and what `idempotencyKey` applied to it); answer `readLoaded(op, …)`.
        case read(OpID, activityID: String, idempotencyKey: String?)
        /// Send the batch as one transaction; answer `batchFinished(batch, …)`. Counts a batch.
        case write(BatchID, PublishBatch)
        /// The commit window opened: answer `windowElapsed(window, …)` after `afterMs`.
        case wake(WindowID, afterMs: Int64)
        /// A change committed: tell streams and the carrier (before its publisher is answered).
        /// Counts a published event.
        case announce(ActivityEvent, json: [UInt8])
        /// Call the op's completion.
        case answer(OpID, PublishOp.Outcome)
        /// The committed batch marked the push outbox: wake the push sender.
        case kickPushes
        /// A change missed its compare-and-set and is planned again (a metric).
        case casMissed(activityID: String)
        case log(Log)
    }

    public enum Log: Equatable, Sendable {
        /// The database refused the batch's writes (readiness turns `writes_refused`).
        case writesRefused(error: String)
        /// A batch of several changes rolled back: each is retried alone.
        case batchRolledBack(error: String, changes: Int)
        /// A change that failed alone (or too many times): its publisher gets a 500.
        case changeFailed(activityID: String, error: String)
    }

    /// An op not yet answered.
    struct Pending {
        let id: OpID
        let op: PublishOp
        var attempts = 0
        var replays = 0
        /// The request of several changes (`POST /v1/changes`) it belongs to: its changes go in
        /// one batch once none of them is still being read.
        var group: GroupID?
        /// Sent in a batch of its own: a batch it was in rolled back at a step shared by all
        /// its changes (the finalize), so each is retried alone to find the one at fault.
        var alone = false
    }

    /// A change decided against a snapshot, waiting for (or in) a batch.
    struct Planned {
        var pending: Pending
        let event: ActivityEvent
        let expectedSeq: Int64
        let previousState: ActivityState?
        let endFingerprint: String?
        let webhook: PublishBatch.Webhook?
    }

    struct Batch {
        let id: BatchID
        let changes: [Planned]
        let jsons: [[UInt8]]
    }

    /// `staleAfter` for starts that do not give one (seconds; 0: never).
    public let defaultStaleAfter: Int
    public let maxBatch: Int
    /// Mark the push outbox in each batch (APNs is configured).
    public var marksPushes = false
    /// The last batch was refused by a database that does not take writes (readiness); the
    /// next committed batch clears it, and so may the owner when the database says it is
    /// writable again.
    public var writesRefused = false
    /// Live activities one key may hold (DISPATCH_MAX_LIVE_PER_KEY): named in the refusal of a
    /// start past it (the starts statement enforces it).
    public var maxLivePerKey = KeyRules.defaultMaxLive
    /// Activities one key may finish in 24 hours (DISPATCH_MAX_FINISHED_PER_KEY): named in the
    /// refusal of a start past it (the starts statement enforces it).
    public var maxFinishedPerKey = KeyRules.defaultMaxFinished
    public private(set) var writerIsReady = false
    /// How long the next batch may wait for more changes once load is present (ms; 0: the
    /// window never opens, and each batch goes as soon as the one before it committed).
    public var commitWindowMs: Int64 = 0

    /// Live activities this worker has seen lately; bounded by bytes (a snapshot may be a few
    /// hundred bytes or several kilobytes).
    private var cache: BoundedCache<String, CachedActivity>
    /// Activities with an op being planned, queued or written; each holds one.
    private var busy: Set<String> = []
    private var waiting: [String: WaitLine<Pending>] = [:]
    private var reading: [OpID: Pending] = [:]
    private var writeQueue: [Planned] = []
    private var inFlight: Batch?
    private var nextOp: OpID = 1
    private var nextBatch: BatchID = 1
    private var nextGroup: GroupID = 1
    /// The commit window while it is open (never with a batch in flight): queued changes wait.
    private var window: WindowID?
    private var nextWindow: WindowID = 1
    /// Reads in flight per group: its planned changes wait for them (one transaction).
    private var readsInGroup: [GroupID: Int] = [:]
    /// Keys whose starts the database refused for DISPATCH_MAX_FINISHED_PER_KEY, until it is
    /// worth asking again: their new starts are refused here without counting again (a key at
    /// its limit repeating starts costs the database a primary-key read each, not a count).
    private var finishedFull: [Int64: FinishedFull] = [:]

    struct FinishedFull {
        /// When the oldest counted end leaves the window (ms; nil unknown): Retry-After.
        var freeAtMs: Int64?
        /// When the database is asked again: that time, or `finishedRecheckMs` after the
        /// refusal if sooner (ends may be deleted or the limit changed meanwhile).
        var recheckAt: Int64
    }

    /// The longest a key's finished-limit refusal is repeated here before the database counts again.
    public static let finishedRecheckMs: Int64 = 60_000

    public init(defaultStaleAfter: Int, maxBatch: Int = PublishMachine.maxBatch, cacheBytes: Int = 32 << 20) {
        self.defaultStaleAfter = defaultStaleAfter
        self.maxBatch = maxBatch
        cache = BoundedCache(maxBytes: cacheBytes)
    }

    /// Nothing is being planned, waiting or written: every publisher has its answer.
    public var isIdle: Bool { busy.isEmpty && inFlight == nil }

    /// The commit window is open: what is queued waits for `windowElapsed` or `windowFull`.
    public var isWindowOpen: Bool { window != nil }

    /// Changes planned and waiting for a commit (behind the batch in flight or an open window).
    public var queuedChanges: Int { writeQueue.count }

    // MARK: - The cache

    /// Whether a change of `id` is being planned or written here (its cache entry is this
    /// process's own newest then).
    public func isInFlight(_ id: String) -> Bool { busy.contains(id) }

    /// Whether the cache holds `id` at an older seq than a change just heard of.
    public func isStale(_ id: String, seq: Int64) -> Bool {
        guard let entry = cache[id] else { return false }
        return entry.newestSeq < seq
    }

    public mutating func forget(_ id: String) { cache.remove(id) }

    /// A change committed (here or elsewhere): keeps a cached snapshot current.
    public mutating func observe(_ event: ActivityEvent) {
        guard let entry = cache[event.snapshot.activityId], entry.newestSeq < event.seq else { return }
        if event.snapshot.state.isTerminal { cache.remove(event.snapshot.activityId); return }
        var stored = entry.stored
        stored.activity = event.snapshot
        stored.lastEvent = event.name.rawValue
        remember(stored)
    }

    /// A change another process committed, as its notice carried it (`json` empty: it did not
    /// fit, so the cached snapshot is dropped). Kept undecoded: it is decoded only if a change
    /// of that activity is planned here before a newer one arrives.
    public mutating func heard(_ id: String, seq: Int64, event: String, json: String) {
        guard var entry = cache[id], entry.newestSeq < seq else { return }
        if json.isEmpty { cache.remove(id); return }
        if case .state(let state)? = EventName(rawValue: event), state.isTerminal { cache.remove(id); return }
        entry.heard = CachedActivity.Heard(event: event, seq: seq, json: json)
        cache.set(id, entry, bytes: entry.approximateBytes)
    }

    /// The newest snapshot known here (a heard change decoded now), or nil.
    public mutating func cached(_ id: String) -> StoredActivity? {
        guard let entry = cache[id] else { return nil }
        guard let heard = entry.heard else { return entry.stored }
        guard let name = EventName(rawValue: heard.event), let value = try? JSONParser.parse(heard.json),
              let activity = Activity.decode(value), activity.seq == heard.seq, !activity.state.isTerminal else {
            cache.remove(id)
            return nil
        }
        var stored = entry.stored
        stored.activity = activity
        stored.lastEvent = name.rawValue
        remember(stored)
        return stored
    }

    private mutating func remember(_ s: StoredActivity) {
        let entry = CachedActivity(stored: s)
        cache.set(s.activity.activityId, entry, bytes: entry.approximateBytes)
    }

    // MARK: - Inputs

    /// A new request. Its id names it in `.answer` (register the completion before performing).
    public mutating func submitted(_ op: PublishOp, now: Int64) -> (id: OpID, actions: [Action]) {
        let id = nextOp
        nextOp += 1
        let pending = Pending(id: id, op: op)
        if busy.contains(op.activityID) {
            waiting[op.activityID, default: WaitLine<Pending>()].append(pending)
            return (id, [])
        }
        busy.insert(op.activityID)
        var actions: [Action] = []
        begin(pending, now: now, &actions)
        flush(now: now, &actions)
        return (id, actions)
    }

    /// A request of several changes (`POST /v1/changes`), in its order: changes of one activity
    /// apply in that order (each planned after the one before it committed); the others are
    /// planned at once and, once none of them waits for a read, go to the database in one
    /// batch (kept whole even past `maxBatch`). Ids in the ops' order.
    public mutating func submittedAll(_ ops: [PublishOp], now: Int64) -> (ids: [OpID], actions: [Action]) {
        let group = nextGroup
        nextGroup += 1
        var ids: [OpID] = []
        ids.reserveCapacity(ops.count)
        var actions: [Action] = []
        for op in ops {
            let id = nextOp
            nextOp += 1
            ids.append(id)
            var pending = Pending(id: id, op: op)
            pending.group = group
            if busy.contains(op.activityID) {
                waiting[op.activityID, default: WaitLine<Pending>()].append(pending)
                continue
            }
            busy.insert(op.activityID)
            begin(pending, now: now, &actions)
        }
        flush(now: now, &actions)
        return (ids, actions)
    }

    /// The answer to `.read(op, …)`: nil when there is no such activity.
    public mutating func readLoaded(_ id: OpID, _ result: Result<PublishRead?, DispatchError>, now: Int64) -> [Action] {
        guard let pending = reading.removeValue(forKey: id) else { return [] }
        if let group = pending.group {
            let left = (readsInGroup[group] ?? 1) - 1
            readsInGroup[group] = left > 0 ? left : nil
        }
        var actions: [Action] = []
        switch result {
        case .failure(let e):
            finish(pending, .failed(e), now: now, &actions)
        case .success(nil):
            if case .start = pending.op.kind, pending.attempts == 0 {
                // A start read first because its key was at its finished limit.
                if let refusal = finishedRefusal(pending.op, now: now) {
                    finish(pending, .failed(refusal), now: now, &actions)
                } else if let outcome = plan(pending, now: now, &actions) {
                    finish(pending, outcome, now: now, &actions)
                }
                break
            }
            finish(pending, .failed(DispatchError(.notFound, "no activity \(pending.op.activityID)")), now: now, &actions)
        case .success(let read?):
            if !read.stored.activity.state.isTerminal { remember(read.stored) }
            if let outcome = answerFromRead(pending, read) ?? decide(pending, read.stored, now: now) {
                finish(pending, outcome, now: now, &actions)
            }
        }
        flush(now: now, &actions)
        return actions
    }

    /// The answer to `.write(batch, …)`.
    public mutating func batchFinished(_ id: BatchID, _ result: PublishBatchResult, now: Int64) -> [Action] {
        guard let batch = inFlight, batch.id == id else { return [] }
        inFlight = nil
        var actions: [Action] = []
        switch result {
        case .connectionFailed:
            // It may have committed: plan anything next on a fresh read.
            for planned in batch.changes {
                cache.remove(planned.pending.op.activityID)
                finish(planned.pending, .failed(.unavailable), now: now, &actions)
            }
        case .committed(let applied, let pushesMarked, let overLimit, let overFinished):
            writesRefused = false
            for (planned, json) in zip(batch.changes, batch.jsons) {
                let id = planned.pending.op.activityID
                if let freeAt = overFinished[id] {
                    let freeAtMs: Int64? = freeAt == 0 ? nil : freeAt
                    if let key = planned.pending.op.ownerKeyID {
                        let due = freeAtMs.map { $0 + KeyRules.finishedWindowMs } ?? now
                        finishedFull[key] = FinishedFull(freeAtMs: freeAtMs, recheckAt: min(due, now + Self.finishedRecheckMs))
                    }
                    let refusal = KeyRules.tooManyFinished(max: maxFinishedPerKey, freeAtMs: freeAtMs, now: now)
                    finish(planned.pending, .failed(refusal), now: now, &actions)
                    continue
                }
                if overLimit.contains(id) {
                    finish(planned.pending, .failed(KeyRules.tooManyLive(max: maxLivePerKey)), now: now, &actions)
                    continue
                }
                settle(planned, applied: applied.contains(id), json: json, now: now, &actions)
            }
            if marksPushes && pushesMarked > 0 { actions.append(.kickPushes) }
            openWindow(after: batch, &actions)
        case .refused(let error):
            writesRefused = true
            actions.append(.log(.writesRefused(error: error)))
            for planned in batch.changes { finish(planned.pending, .failed(.refusesWrites), now: now, &actions) }
        case .rolledBack(let error):
            // The batch's statements carry every change, so the one at fault is found by
            // retrying each alone; a change that fails alone fails (after a few replays at
            // most, in case the cause is not its own).
            let count = batch.changes.count
            if count > 1 { actions.append(.log(.batchRolledBack(error: error, changes: count))) }
            for var planned in batch.changes {
                planned.pending.replays += 1
                if count == 1 || planned.pending.replays > Self.maxReplays {
                    actions.append(.log(.changeFailed(activityID: planned.pending.op.activityID, error: error)))
                    finish(planned.pending, .failed(DispatchError(.internalError, "the change could not be stored")), now: now, &actions)
                } else {
                    planned.pending.alone = true
                    writeQueue.append(planned)
                }
            }
        }
        flush(now: now, &actions)
        return actions
    }

    /// The commit window's time is up: what gathered goes now.
    public mutating func windowElapsed(_ id: WindowID, now: Int64) -> [Action] {
        guard window == id else { return [] }
        window = nil
        var actions: [Action] = []
        flush(now: now, &actions)
        return actions
    }

    /// The writer (re)connected: send what waits.
    public mutating func writerReady(now: Int64) -> [Action] {
        writerIsReady = true
        var actions: [Action] = []
        flush(now: now, &actions)
        return actions
    }

    /// The writer's connection was lost: until it is back, changes fail at once.
    public mutating func writerLost() {
        writerIsReady = false
        window = nil
    }

    // MARK: - Planning

    /// Plans `first` and, while ops are answered without a read or a write, the ones waiting
    /// behind it on the same activity (a loop, not a recursion: thousands may wait).
    private mutating func begin(_ first: Pending, now: Int64, _ actions: inout [Action]) {
        var pending = first
        while let outcome = plan(pending, now: now, &actions) {
            actions.append(.answer(pending.id, outcome))
            guard let next = dequeueWaiting(pending.op.activityID) else { return }
            pending = next
        }
    }

    /// The refusal of a start whose key the database found at its finished limit, while that
    /// holds; nil (and the key forgotten) once it is worth asking the database again.
    private mutating func finishedRefusal(_ op: PublishOp, now: Int64) -> DispatchError? {
        guard let key = op.ownerKeyID, let full = finishedFull[key] else { return nil }
        guard now < full.recheckAt else {
            finishedFull[key] = nil
            return nil
        }
        return KeyRules.tooManyFinished(max: maxFinishedPerKey, freeAtMs: full.freeAtMs, now: now)
    }

    /// Answers `pending` and starts the next op waiting on its activity.
    private mutating func finish(_ pending: Pending, _ outcome: PublishOp.Outcome, now: Int64, _ actions: inout [Action]) {
        actions.append(.answer(pending.id, outcome))
        if let next = dequeueWaiting(pending.op.activityID) { begin(next, now: now, &actions) }
    }

    /// The next op waiting on `activityID`; nil (and the activity is free) when none.
    private mutating func dequeueWaiting(_ activityID: String) -> Pending? {
        guard let next = waiting[activityID]?.takeFirst() else {
            busy.remove(activityID)
            return nil
        }
        if waiting[activityID]!.isEmpty { waiting[activityID] = nil }
        return next
    }

    /// Decides the change against the newest known snapshot, or asks for a read. Returns the
    /// answer when there is nothing to write; nil when the op now waits for a read or a batch.
    private mutating func plan(_ pending: Pending, now: Int64, _ actions: inout [Action]) -> PublishOp.Outcome? {
        let op = pending.op
        if case .start(let cmd) = op.kind, pending.attempts == 0 {
            if finishedRefusal(op, now: now) == nil {
                writeQueue.append(Planned(pending: pending, event: ActivityMachine.start(cmd, id: op.activityID, now: now), expectedSeq: 0,
                                          previousState: nil, endFingerprint: nil, webhook: nil))
                return nil
            }
            // Its key is at its finished limit: an id that exists is answered as always (the
            // same start again is 200), so it is read first; a new one is refused on the read.
        }
        // A broadcast activity waiting for its channel is read afresh: the channel's arrival is
        // no change, and the next change's snapshot should carry it.
        if pending.attempts == 0, op.access.staleTouch == nil, let current = cached(op.activityID),
           !(current.activity.broadcast && current.activity.channelId == nil) {
            return decide(pending, current, now: now)
        }
        reading[pending.id] = pending
        if let group = pending.group { readsInGroup[group, default: 0] += 1 }
        actions.append(.read(pending.id, activityID: op.activityID, idempotencyKey: op.idempotencyKey))
        return nil
    }

    /// A stored answer for this Idempotency-Key: only to the same key's owner, for the same call.
    private func answerFromRead(_ pending: Pending, _ read: PublishRead) -> PublishOp.Outcome? {
        guard let replay = read.replay else { return nil }
        if let denied = pending.op.access.denial(read.stored) { return .failed(denied) }
        guard replay.call == pending.op.callKind else {
            return .failed(DispatchError(
                .conflict, "this Idempotency-Key was already used for a different request (\(replay.call.rawValue) of \(pending.op.activityID))"))
        }
        return .replay(replay.json)
    }

    /// Plans the change against `current`: queued for the next batch (nil), or answered now.
    private mutating func decide(_ pending: Pending, _ current: StoredActivity, now: Int64) -> PublishOp.Outcome? {
        let op = pending.op
        if let denied = op.access.denial(current) { return .failed(denied) }
        let event: ActivityEvent
        var endFingerprint: String?
        var webhook: PublishBatch.Webhook?
        switch op.kind {
        case .start(let cmd):
            switch ActivityMachine.restart(cmd, existing: current.activity, storedFingerprint: current.startFingerprint) {
            case .success(let a): return .ok(a)
            case .failure(let e): return .failed(e)
            }
        case .update(let cmd):
            switch ActivityMachine.update(cmd, current: current.activity, now: now) {
            case .success(let planned): event = planned
            case .failure(let e): return .failed(e)
            }
        case .end(let cmd):
            switch ActivityMachine.end(cmd, current: current.activity, storedEndFingerprint: current.endFingerprint, now: now) {
            case .success(.alreadyEnded(let a)): return .ok(a)
            case .success(.ended(let planned)):
                event = planned
                endFingerprint = cmd.fingerprint
            case .failure(let e): return .failed(e)
            }
        case .cancel(let reason, let deliveryID):
            switch ActivityMachine.cancel(current: current.activity, reason: reason, now: now) {
            case .success(.alreadyRequested(let a)): return .ok(a)
            case .success(.requested(let planned)):
                event = planned
                webhook = PublishBatch.Webhook(
                    deliveryID: deliveryID,
                    body: CancelWebhook.body(activityID: op.activityID, reason: reason, requestedAt: now, seq: planned.seq))
            case .failure(let e): return .failed(e)
            }
        }
        writeQueue.append(Planned(pending: pending, event: event, expectedSeq: current.activity.seq, previousState: current.activity.state,
                                  endFingerprint: endFingerprint, webhook: webhook))
        return nil
    }

    // MARK: - Writing

    /// Group commit: what is queued goes in one batch (an op retried alone goes by itself),
    /// which the shell sends as one transaction; one batch in flight at a time. A request's
    /// changes are held while one of them is being read, and are not split by `maxBatch`
    /// (the batch grows past it to take the rest of a request it started). With the
    /// writer down, everything queued fails at once (and what that lets through, too).
    private mutating func flush(now: Int64, _ actions: inout [Action]) {
        guard inFlight == nil else { return }
        guard writerIsReady else {
            while !writeQueue.isEmpty {
                let failed = writeQueue
                writeQueue.removeAll()
                for planned in failed { finish(planned.pending, .failed(.unavailable), now: now, &actions) }
            }
            return
        }
        if window != nil {
            guard writeQueue.count >= Self.windowFull else { return }
            window = nil
        }
        // A request's changes wait while any of them is being read, so they go together.
        guard let first = writeQueue.firstIndex(where: { !isGathering($0) }) else { return }
        var changes: [Planned] = []
        if writeQueue[first].pending.alone {
            changes.append(writeQueue.remove(at: first))
        } else {
            var kept: [Planned] = []
            var groups: Set<GroupID> = []
            for planned in writeQueue {
                let group = planned.pending.group
                let full = changes.count >= maxBatch && !(group.map { groups.contains($0) } ?? false)
                if planned.pending.alone || full || isGathering(planned) {
                    kept.append(planned)
                    continue
                }
                changes.append(planned)
                if let group { groups.insert(group) }
            }
            writeQueue = kept
        }
        let count = changes.count
        var batch = PublishBatch(marksPushes: marksPushes, now: now)
        var jsons: [[UInt8]] = []
        jsons.reserveCapacity(count)
        batch.changes.reserveCapacity(count)
        for planned in changes {
            let op = planned.pending.op, event = planned.event
            let json = event.snapshot.json()
            jsons.append(json)
            batch.changes.append(PublishBatch.Change(
                activityID: op.activityID, seq: event.seq, event: event.name.rawValue, data: String(decoding: json, as: UTF8.self),
                idempotencyKey: op.idempotencyKey, createdMs: event.snapshot.updatedAt,
                pushPriority: event.pushPriority(previous: planned.previousState)))
            switch op.kind {
            case .start(let cmd):
                batch.starts.append(PublishBatch.Start(event: event, ownerKeyID: op.ownerKeyID, fingerprint: cmd.fingerprint,
                                                       staleAfter: cmd.staleAfter ?? defaultStaleAfter))
            case .update, .end, .cancel:
                var reason: String?
                if case .cancel(let r, _) = op.kind { reason = r }
                batch.updates.append(PublishBatch.Update(
                    event: event, expectedSeq: planned.expectedSeq, endFingerprint: planned.endFingerprint, cancelReason: reason,
                    webhook: planned.webhook, idempotencyKey: op.idempotencyKey, staleTouch: op.access.staleTouch))
            }
        }
        let id = nextBatch
        nextBatch += 1
        inFlight = Batch(id: id, changes: changes, jsons: jsons)
        actions.append(.write(id, batch))
    }

    /// Opens the commit window after a committed batch that shows load: changes of at least two
    /// requests (a request of many changes counts once: one publisher), and fewer than
    /// `windowFull` (a batch that large needs no help).
    private mutating func openWindow(after batch: Batch, _ actions: inout [Action]) {
        guard commitWindowMs > 0, batch.changes.count < Self.windowFull else { return }
        var requests = 0
        var groups: Set<GroupID> = []
        for planned in batch.changes {
            if let group = planned.pending.group {
                guard groups.insert(group).inserted else { continue }
            }
            requests += 1
            if requests >= 2 { break }
        }
        guard requests >= 2 else { return }
        let id = nextWindow
        nextWindow += 1
        window = id
        actions.append(.wake(id, afterMs: commitWindowMs))
    }

    private func isGathering(_ planned: Planned) -> Bool {
        guard let group = planned.pending.group else { return false }
        return readsInGroup[group] != nil
    }

    /// One change of a committed batch: announced and answered if it applied; planned again
    /// on a fresh read if someone else changed the activity first (or this request was already
    /// applied), up to `maxAttempts` times.
    private mutating func settle(_ planned: Planned, applied: Bool, json: [UInt8], now: Int64,
                                 _ actions: inout [Action]) {
        var pending = planned.pending
        let op = pending.op
        guard applied else {
            cache.remove(op.activityID)
            pending.attempts += 1
            actions.append(.casMissed(activityID: op.activityID))
            guard pending.attempts <= Self.maxAttempts else {
                var busy = DispatchError(.concurrentChanges, "too many concurrent changes to \(op.activityID); retry")
                busy.retryAfterSeconds = 1
                return finish(pending, .failed(busy), now: now, &actions)
            }
            return begin(pending, now: now, &actions)
        }
        let event = planned.event
        if case .start(let cmd) = op.kind {
            if !event.snapshot.state.isTerminal {
                remember(StoredActivity(activity: event.snapshot, lastEvent: event.name.rawValue, ownerKeyID: op.ownerKeyID,
                                        startFingerprint: cmd.fingerprint, endFingerprint: nil,
                                        staleAfter: cmd.staleAfter ?? defaultStaleAfter))
            }
        } else {
            observe(event)
        }
        actions.append(.announce(event, json: json))
        finish(pending, .committed(json: json, created: op.callKind == .start), now: now, &actions)
    }
}

/// A cache entry: the snapshot planned against, and a newer one heard from another process's
/// commit, still as the notice's JSON.
private struct CachedActivity {
    struct Heard {
        var event: String
        var seq: Int64
        var json: String
    }

    var stored: StoredActivity
    var heard: Heard?

    var newestSeq: Int64 { heard?.seq ?? stored.activity.seq }
    var approximateBytes: Int { stored.approximateBytes + (heard.map { 64 + $0.json.utf8.count } ?? 0) }
}
