import DispatchCore
import DispatchIO

/// Publishing for one worker: the shell over `PublishMachine`, which decides (planning,
/// per-activity order, batches, retries, what to announce). This class only reads and writes
/// through the repository and the writer, calls completions and callbacks, and counts, in one
/// exhaustive switch.
///
/// Actions run after the machine returned, one at a time: a completion or callback that
/// submits again (or an input arriving while actions run) queues its actions behind the
/// current ones instead of running inside them.
final class Publisher {
    static let maxBatch = PublishMachine.maxBatch

    let loop: LoopScheduling
    let db: Database
    let activities: ActivityRepository
    let log: Logger
    let metrics: Metrics
    let now: () -> Int64
    /// Told of each commit and of marked pushes (the worker).
    weak var delegate: PublisherDelegate?
    /// When history rows get their feed position (the carrier's choice): at commit, or
    /// without one, for the sequencer (NATS carrier).
    var numbering = FeedNumbering.atCommit

    private var machine: PublishMachine
    private var completions: [PublishMachine.OpID: (PublishOp.Outcome) -> Void] = [:]
    private var pending: [PublishMachine.Action] = []
    private var performing = false
    /// The reads the actions being performed asked for: sent together once they are done, as
    /// one statement (`read_for_publish_many`) when there are several.
    private var reads: [(id: PublishMachine.OpID, activityID: String, idempotencyKey: String?)] = []
    /// The open commit window's timer (`.wake`).
    private var windowTimer: Timer?
    private var stopped = false

    init(loop: LoopScheduling, db: Database, log: Logger, metrics: Metrics, defaultStaleAfter: Int, now: @escaping () -> Int64) {
        self.loop = loop
        self.db = db
        activities = ActivityRepository(db: db)
        self.log = log
        self.metrics = metrics
        self.now = now
        machine = PublishMachine(defaultStaleAfter: defaultStaleAfter)
    }

    /// The last batch was refused by a database that does not take writes (readiness).
    var writesRefused: Bool {
        get { machine.writesRefused }
        set { machine.writesRefused = newValue }
    }

    /// Live activities one key may hold (DISPATCH_MAX_LIVE_PER_KEY); the starts statement enforces it.
    var maxLivePerKey: Int {
        get { machine.maxLivePerKey }
        set { machine.maxLivePerKey = newValue }
    }

    /// Activities one key may finish in 24 hours (DISPATCH_MAX_FINISHED_PER_KEY); the starts
    /// statement enforces it.
    var maxFinishedPerKey: Int {
        get { machine.maxFinishedPerKey }
        set { machine.maxFinishedPerKey = newValue }
    }

    /// How long a batch may wait for more changes while load is present
    /// (DISPATCH_COMMIT_WINDOW_MS; 0: never).
    var commitWindowMs: Int64 {
        get { machine.commitWindowMs }
        set { machine.commitWindowMs = newValue }
    }

    /// At shutdown, as the database closes: no commit window fires after it.
    func stop() {
        stopped = true
        windowTimer?.cancel()
        windowTimer = nil
    }

    /// Mark the push outbox in each batch (APNs is configured).
    var pushes: Bool {
        get { machine.marksPushes }
        set { machine.marksPushes = newValue }
    }

    /// Nothing is being planned, waiting or written: every publisher has its answer.
    var isIdle: Bool { machine.isIdle && pending.isEmpty }

    /// The writer (re)connected: send what waited.
    func writerReady() { perform(machine.writerReady(now: now())) }

    /// The writer's connection was lost: publishes fail at once until it is back.
    func writerLost() { machine.writerLost() }

    // MARK: - Cache

    /// Whether the cache holds `id` at an older seq than a change just heard of.
    func isStale(_ id: String, seq: Int64) -> Bool { machine.isStale(id, seq: seq) }

    func forget(_ id: String) { machine.forget(id) }

    /// A change committed by another process (NOTIFY or the carrier): a cached activity older
    /// than it takes it, decoded when next planned (or is dropped when the notice carries no
    /// snapshot).
    func heard(_ notice: ChangeNotice) {
        machine.heard(notice.activityID, seq: notice.seq, event: notice.event, json: notice.json)
    }

    // MARK: - Publishing

    /// `completion` runs once, after the change committed or was refused; never in the middle
    /// of another action.
    func submit(_ op: PublishOp, completion: @escaping (PublishOp.Outcome) -> Void) {
        let (id, actions) = machine.submitted(op, now: now())
        completions[id] = completion
        perform(actions)
    }

    /// Several changes of one request (`POST /v1/changes`), submitted in order; `completion`
    /// runs once with every outcome, in the ops' order, after the last one was answered.
    func submitAll(_ ops: [PublishOp], completion: @escaping ([PublishOp.Outcome]) -> Void) {
        guard !ops.isEmpty else { return completion([]) }
        // A request's changes commit together only if none misses its compare-and-set: what
        // this process cached may be older than another process's commit it has not heard of
        // yet, so each activity not in flight here is read afresh (the reads go as one pipeline).
        for op in ops where !machine.isInFlight(op.activityID) { machine.forget(op.activityID) }
        let (ids, actions) = machine.submittedAll(ops, now: now())
        let collector = OutcomeCollector(count: ids.count, completion: completion)
        for (index, id) in ids.enumerated() {
            completions[id] = { collector.set(index, $0) }
        }
        perform(actions)
    }

    private func perform(_ actions: [PublishMachine.Action]) {
        pending.append(contentsOf: actions)
        guard !performing else { return }
        performing = true
        var next = 0
        repeat {
            while next < pending.count {
                let action = pending[next]
                next += 1
                run(action)
                if next >= 1024 && next * 2 >= pending.count {
                    pending.removeFirst(next)
                    next = 0
                }
            }
            // A read answered at once (a test's driver) queues its actions behind: run them too.
            sendReads()
        } while next < pending.count
        pending.removeAll(keepingCapacity: true)
        performing = false
        metrics.publishQueued = machine.queuedChanges
    }

    /// Sends the reads this turn's actions asked for: one statement for all of them.
    private func sendReads() {
        guard !reads.isEmpty else { return }
        let batch = reads
        reads.removeAll()
        if batch.count == 1, let read = batch.first {
            activities.readForPublish(read.activityID, idempotencyKey: read.idempotencyKey) { [weak self] result in
                guard let self else { return }
                self.perform(self.machine.readLoaded(read.id, result, now: self.now()))
            }
            return
        }
        activities.readManyForPublish(batch.map { ($0.activityID, $0.idempotencyKey) }) { [weak self] result in
            guard let self else { return }
            var actions: [PublishMachine.Action] = []
            for (index, read) in batch.enumerated() {
                actions += self.machine.readLoaded(read.id, result.map { $0[index] }, now: self.now())
            }
            self.perform(actions)
        }
    }

    private func run(_ action: PublishMachine.Action) {
        switch action {
        case .read(let id, let activityID, let idempotencyKey):
            reads.append((id, activityID, idempotencyKey))
        case .write(let id, let batch):
            metrics.publishBatches += 1
            let (queries, writes) = ActivityRepository.publishStatements(batch, maxLivePerKey: maxLivePerKey, maxFinishedPerKey: maxFinishedPerKey,
                                                                               numbering: numbering)
            db.writer.execute(queries) { [weak self] result in
                guard let self else { return }
                self.perform(self.machine.batchFinished(id, ActivityRepository.publishResult(result, writes: writes), now: self.now()))
            }
        case .wake(let window, let afterMs):
            windowTimer?.cancel()
            windowTimer = loop.timer(after: Double(afterMs) / 1000, repeating: false) { [weak self] in
                guard let self, !self.stopped else { return }
                self.windowTimer = nil
                self.perform(self.machine.windowElapsed(window, now: self.now()))
            }
        case .announce(let event, let json):
            metrics.eventsPublished += 1
            delegate?.publisherCommitted(event, json: json)
        case .answer(let id, let outcome):
            completions.removeValue(forKey: id)?(outcome)
        case .kickPushes:
            delegate?.publisherMarkedPushes()
        case .casMissed:
            metrics.casRetries += 1
        case .log(.writesRefused(let error)):
            log.warning("publish.writes_refused", [("error", error)])
        case .log(.batchRolledBack(let error, let changes)):
            log.warning("publish.batch_failed", [("error", error), ("changes", changes)])
        case .log(.changeFailed(let activityID, let error)):
            log.error("publish.failed", [("activity", activityID), ("error", error)])
        }
    }
}

/// Who hears what the publisher did, besides the publishers it answers.
protocol PublisherDelegate: AnyObject {
    /// After each commit, before the publisher is answered. (Feed positions reach readers
    /// from the database, through the carrier, never from here.)
    func publisherCommitted(_ event: ActivityEvent, json: [UInt8])
    /// After a batch that marked the push outbox was committed (wakes the push sender).
    func publisherMarkedPushes()
}

/// Gathers the outcomes of one request's changes; calls its completion when the last arrives.
private final class OutcomeCollector {
    private var outcomes: [PublishOp.Outcome?]
    private var left: Int
    private let completion: ([PublishOp.Outcome]) -> Void

    init(count: Int, completion: @escaping ([PublishOp.Outcome]) -> Void) {
        outcomes = Array(repeating: nil, count: count)
        left = count
        self.completion = completion
    }

    func set(_ index: Int, _ outcome: PublishOp.Outcome) {
        guard outcomes[index] == nil else { return }
        outcomes[index] = outcome
        left -= 1
        if left == 0 { completion(outcomes.map { $0! }) }
    }
}
