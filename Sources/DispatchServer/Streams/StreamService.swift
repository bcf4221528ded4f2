import DispatchCore
import DispatchIO
import DispatchSystem

/// One client's status stream.
final class StreamSession: KeyedStream {
    let id: Int
    let activityID: String
    let keyID: Int64
    let connection: SSEConnection
    let opened = Clock.monotonic()
    /// Counted in the carrier's interest in its activity (NATS: subscribed to its subject).
    var watching = false
    var sessionHash: String?

    init(id: Int, activityID: String, keyID: Int64, connection: SSEConnection) {
        self.id = id
        self.activityID = activityID
        self.keyID = keyID
        self.connection = connection
    }
}

/// The IO shell around `Hub`: opens and serves status streams, performs the hub's reads and
/// writes, paces replays by what each socket takes; heartbeats, the one teardown, revocation
/// and shutdown are the shell it shares with feeds (`SSESessions`).
final class StreamService: SSESessionsOwner {
    struct Settings {
        var heartbeatSeconds: Double
        var maxBacklog: Int
        var writeTimeout: Double
        /// Events per history page; pages are also bounded in bytes by the outbox.
        var historyPage: Int64 = 1000
    }

    let loop: LoopScheduling
    let activities: ActivityRepository
    let metrics: Metrics
    let log: Logger
    let settings: Settings
    private var hub = Hub<Int, WireEvent>()
    private let sessions: SSESessions<StreamSession>
    /// Final events of finished activities, answered from memory; bounded by bytes.
    private var terminalCache = BoundedCache<String, WireEvent>(maxBytes: 32 << 20)
    /// The carrier's interest in activities: one `watch` per stream subscribed to one, and one
    /// `unwatch` per such stream when it ends (NATS subscribes to what streams here follow).
    weak var interest: StreamInterest?
    /// The worker's replay memory budget, shared with feeds.
    var memory: ReplayMemory?

    init(loop: LoopScheduling, activities: ActivityRepository, metrics: Metrics, log: Logger, settings: Settings) {
        self.loop = loop
        self.activities = activities
        self.metrics = metrics
        self.log = log
        self.settings = settings
        sessions = SSESessions(loop: loop, heartbeatSeconds: settings.heartbeatSeconds)
        sessions.owner = self
    }

    var openStreams: Int { sessions.count }
    func streams(forKey key: Int64) -> Int { sessions.streams(forKey: key) }

    // MARK: - Opening

    func open(_ req: HTTPRequest, activityID: String, lastEventID: Int64?, keyID: Int64, sessionHash: String? = nil,
              extraHeaders: [(String, String)] = []) {
        if lastEventID == nil, let final = terminalCache[activityID] {
            // A finished activity never changes: its whole answer from memory, no session.
            req.respondStream(headers: SSEConnection.headers + extraHeaders, payloads: [SSEConnection.retryPayload, final.payload])
            metrics.eventsDelivered += 1
            metrics.streamCloses[.terminal, default: 0] += 1
            if log.enabled(.info) { log.info("stream.answered", [("activity", activityID), ("reason", StreamCloseReason.terminal.rawValue)]) }
            return
        }
        let http = HTTPStream(loop: loop)
        http.attach(req)
        open(http, activityID: activityID, lastEventID: lastEventID, keyID: keyID, sessionHash: sessionHash, extraHeaders: extraHeaders)
    }

    /// The same on any transport (a test's scripted stream).
    func open(_ http: StreamTransport, activityID: String, lastEventID: Int64?, keyID: Int64, sessionHash: String? = nil,
              extraHeaders: [(String, String)] = []) {
        let session = sessions.add { id in
            let s = StreamSession(id: id, activityID: activityID, keyID: keyID,
                                  connection: SSEConnection(http, loop: loop, tag: id, delegate: sessions, extraHeaders: extraHeaders,
                                                            maxBacklog: settings.maxBacklog, writeTimeout: settings.writeTimeout, pageCap: 16 * 1024))
            s.sessionHash = sessionHash
            return s
        }
        if let memory { session.connection.budgeted(by: memory, as: BudgetedStream(kind: .status, id: session.id), key: keyID) }
        metrics.streamsActive = sessions.count
        if log.enabled(.info) {
            log.info("stream.open", [("activity", activityID), ("stream", session.id), ("resume_after", lastEventID.map { String($0) } ?? "-")])
        }

        if let final = terminalCache[activityID] {
            // A finished activity never changes: answer from memory.
            serveFinished(session.id, final: final, after: lastEventID)
            return
        }
        if let interest {
            session.watching = true
            interest.watch(activityID)
        }
        perform(hub.subscribe(session.id, topic: activityID, lastEventID: lastEventID))
        beginIfLive(session.id)
    }

    /// A client whose Last-Event-ID is already the newest event goes live with nothing to
    /// send: start its response now, so it gets headers and heartbeats while it waits.
    private func beginIfLive(_ id: Int) {
        guard let session = sessions[id], !session.connection.started, hub.isLive(id) else { return }
        session.connection.begin()
    }

    private func beginLiveSubscribers(of topic: String) {
        for id in hub.subscribers(of: topic) { beginIfLive(id) }
    }

    /// A finished activity from the terminal cache: its final event, or the history after
    /// `after` page by page as the socket takes it.
    private func serveFinished(_ id: Int, final: WireEvent, after: Int64?) {
        guard let after else {
            send(id, [final])
            finishWhenDrained(id)
            return
        }
        if after >= final.seq { return close(id, reason: .noContent) }
        readPage(id, after: after) { [weak self] events in
            guard let self else { return }
            self.send(id, events)
            if let last = events.last?.seq, last < final.seq {
                self.serveFinished(id, final: final, after: last)
            } else {
                self.finishWhenDrained(id)
            }
        }
    }

    /// Reads one page of a stream's replay once its outbox has room for it.
    private func readPage(_ id: Int, after: Int64, _ loaded: @escaping ([WireEvent]) -> Void) {
        guard let session = sessions[id] else { return }
        session.connection.whenRoom { [weak self] in
            guard let self, let session = self.sessions[id] else { return }
            self.activities.history(session.activityID, after: after, limit: self.settings.historyPage,
                                    maxBytes: session.connection.pageBudget) { [weak self] result in
                guard let self, self.sessions[id] != nil else { return }
                switch result {
                case .failure: self.close(id, reason: .database)
                case .success(let events): loaded(events.map(WireEvent.init(stored:)))
                }
                self.sessions[id]?.connection.pageDone()
            }
        }
    }

    // MARK: - Inputs from the database

    /// A committed event: from this worker's own publish, or NOTIFY from any worker.
    func committed(activityID: String, seq: Int64, name: String, json: String) {
        // A new start for an id (reused after its old activity was pruned) outdates the cache.
        if seq == 1 { terminalCache.remove(activityID) }
        let terminal = WireEvent.terminalName(name)
        guard terminal || hub.wants(topic: activityID, seq: seq) else { return }
        let event = WireEvent(seq: seq, name: name, terminal: terminal, json: json)
        if event.isTerminal { rememberTerminal(activityID, event) }
        perform(hub.published(topic: activityID, event))
    }

    /// A change heard through NOTIFY or the carrier (`ChangeNotice`).
    func notified(_ notice: ChangeNotice) {
        let id = notice.activityID, seq = notice.seq, name = notice.event
        if seq == 1 { terminalCache.remove(id) }
        let terminal = WireEvent.terminalName(name)
        // Most NOTIFYs concern nothing held here (or echo this worker's own commit): skip them cheaply.
        guard terminal || hub.wants(topic: id, seq: seq) else { return }
        let json = notice.json
        if !json.isEmpty {
            committed(activityID: id, seq: seq, name: name, json: json)
            return
        }
        guard hub.wants(topic: id, seq: seq) else { return }
        activities.history(id, after: seq - 1, limit: 1) { [weak self] result in
            guard let self, case .success(let events) = result, let e = events.first else { return }
            self.committed(activityID: id, seq: e.seq, name: e.name, json: e.data)
        }
    }

    /// The LISTEN session (or the carrier's connection) came back: re-read every topic's
    /// history from where it was. A start of an id used again may have been missed too, so
    /// the final events held in memory are forgotten.
    func listenRestored() {
        terminalCache.removeAll()
        perform(hub.listenRestored())
    }

    /// A NATS carrier hint: `id` changed, its newest seq at least `seq`. Only what the
    /// database returns is sent; a hint that names nothing new costs nothing, one that names
    /// too much costs one read.
    func hinted(_ id: String, seq: Int64) {
        perform(hub.behind(topic: id, seq: seq))
    }

    /// An activity of this id was started (a NATS hint): an older activity of the same id,
    /// pruned since, must not be answered from memory.
    func forgetFinished(_ id: String) { terminalCache.remove(id) }

    /// Finished activities were pruned somewhere (the retention horizon moved): forget every
    /// final event held, since any of their ids may be used again.
    func forgetAllFinished() { terminalCache.removeAll() }

    /// Every topic held here with the seq it has (the carrier's check against the database).
    var syncedTopics: [(topic: String, seq: Int64)] { hub.syncedTopics }

    /// The database holds a newer change of this topic than it has (a lost carrier message).
    func behind(_ topic: String, seq: Int64) {
        perform(hub.behind(topic: topic, seq: seq))
    }

    private func rememberTerminal(_ id: String, _ e: WireEvent) {
        terminalCache.set(id, e, bytes: e.payload.size + id.utf8.count + 128)
    }

    // MARK: - Performing the hub's decisions

    private func perform(_ actions: [Hub<Int, WireEvent>.Action]) {
        for action in actions {
            switch action {
            case .readSnapshot(let topic, let generation):
                queueSnapshot(topic, generation: generation)
            case .readTopicHistory(let topic, let generation, let after):
                metrics.resyncs += 1
                queueResync(topic, generation: generation, after: after)
            case .readHistory(let s, _, let after):
                readPage(s, after: after) { [weak self] events in
                    guard let self else { return }
                    self.perform(self.hub.historyLoaded(subscriber: s, events))
                }
            case .send(let s, let events):
                send(s, events)
            case .finish(let s):
                finishWhenDrained(s)
            case .noContent(let s):
                close(s, reason: .noContent)
            case .notFound(let s):
                guard let session = sessions[s] else { continue }
                var w = JSONWriter()
                w.beginObject(); w.field("activityId", session.activityID); w.endObject()
                // `id: 0`: a browser's EventSource reconnects once with Last-Event-ID: 0, which is
                // answered 204 (it stops) or, if the activity exists by then, its whole history.
                sessions.offer(s, StreamPayload(SSE.encode(id: "0", event: "not_found", data: w.string)), delivered: 0)
                close(s, reason: .notFound)
            case .drop(let s, let why):
                close(s, reason: why.closeReason)
            }
        }
    }

    /// Snapshots asked for: read at the end of the turn in one statement (one per stream cost
    /// PostgreSQL about 18 µs of CPU and dispatchd a round trip's bookkeeping each), one read
    /// out at a time: at light load a stream's snapshot is read at once, in a connect burst
    /// the streams that arrive during a round trip share the next read (a burst's reads had
    /// queued one behind the other on the reader session, a few ids each).
    private var snapshotBatch: [(topic: String, generation: UInt64)] = []
    private var snapshotReading = false
    private var snapshotScheduled = false

    private func queueSnapshot(_ topic: String, generation: UInt64) {
        snapshotBatch.append((topic, generation))
        scheduleSnapshots()
    }

    /// At the end of this turn, unless a read is out (its answer schedules the next).
    private func scheduleSnapshots() {
        guard !snapshotReading, !snapshotScheduled, !snapshotBatch.isEmpty else { return }
        snapshotScheduled = true
        loop.soon { [weak self] in self?.readSnapshots() }
    }

    /// Ids in one snapshot statement at most: a connect storm during a slow read sends the
    /// rest in the next, not one statement that outlasts the session's timeout.
    static let maxSnapshotBatch = 1_000

    private func readSnapshots() {
        snapshotScheduled = false
        let take = min(snapshotBatch.count, Self.maxSnapshotBatch)
        let batch = Array(snapshotBatch.prefix(take))
        snapshotBatch.removeFirst(take)
        guard let first = batch.first else { return }
        snapshotReading = true
        // Weak, as every database answer here: one may come after the service is gone.
        guard batch.count > 1 else {
            activities.read(first.topic) { [weak self] result in
                guard let self else { return }
                self.snapshotRead(first.topic, generation: first.generation, result)
                self.snapshotsAnswered()
            }
            return
        }
        activities.readMany(batch.map(\.topic)) { [weak self] result in
            guard let self else { return }
            for r in batch {
                self.snapshotRead(r.topic, generation: r.generation, result.map { $0[r.topic] })
            }
            self.snapshotsAnswered()
        }
    }

    private func snapshotsAnswered() {
        snapshotReading = false
        scheduleSnapshots()
    }

    private func snapshotRead(_ topic: String, generation: UInt64, _ result: Result<StoredActivity?, DispatchError>) {
        // What the answer sends each subscriber (headers, retry, snapshot, maybe the end) goes
        // out in one send per connection.
        let corks = hub.subscribers(of: topic).compactMap { sessions[$0]?.connection.http.cork() }
        defer { for c in corks { c.uncork() } }
        switch result {
        case .failure:
            perform(hub.readFailed(topic: topic, generation: generation))
        case .success(nil):
            perform(hub.snapshotLoaded(topic: topic, generation: generation, nil))
            beginLiveSubscribers(of: topic)
        case .success(let s?):
            let e = WireEvent(seq: s.activity.seq, name: s.lastEvent, terminal: s.activity.state.isTerminal,
                              json: String(decoding: s.activity.json(), as: UTF8.self))
            if e.isTerminal { rememberTerminal(topic, e) }
            perform(hub.snapshotLoaded(topic: topic, generation: generation, e))
            beginLiveSubscribers(of: topic)
        }
    }

    /// Re-reads wait while one is out, then go as one statement: at light load a hint is read
    /// at once, under load the hints that arrive during a round trip share the next read (the
    /// cost follows the round trips, not the topics or the changes).
    private var resyncBatch: [(topic: String, generation: UInt64, after: Int64)] = []
    private var resyncReading = false
    private var resyncScheduled = false

    private func queueResync(_ topic: String, generation: UInt64, after: Int64) {
        resyncBatch.append((topic, generation, after))
        scheduleResyncs()
    }

    /// At the end of this turn, unless a read is out (its answer schedules the next).
    private func scheduleResyncs() {
        guard !resyncReading, !resyncScheduled, !resyncBatch.isEmpty else { return }
        resyncScheduled = true
        loop.soon { [weak self] in self?.flushResyncs() }
    }

    private func flushResyncs() {
        resyncScheduled = false
        let batch = resyncBatch
        resyncBatch = []
        guard !batch.isEmpty else { return }
        resyncReading = true
        let answered: () -> Void = { [weak self] in
            self?.resyncReading = false
            self?.scheduleResyncs()
        }
        guard batch.count > 1 else {
            let r = batch[0]
            resync(r.topic, generation: r.generation, after: r.after, attempt: 0, firstAnswer: answered)
            return
        }
        metrics.resyncBatches += 1
        activities.histories(batch.map { ($0.topic, $0.after) }, limit: settings.historyPage) { [weak self] result in
            guard let self else { return }
            switch result {
            case .failure:
                for r in batch { self.resync(r.topic, generation: r.generation, after: r.after, attempt: 1) }
            case .success(let found):
                for r in batch {
                    let events = (found[r.topic] ?? []).map(WireEvent.init(stored:))
                    self.perform(self.hub.topicHistoryLoaded(topic: r.topic, generation: r.generation, events))
                    self.beginLiveSubscribers(of: r.topic)
                }
            }
            answered()
        }
    }

    /// Reads a topic's missed history. While the database is coming back, retry with backoff
    /// rather than dropping its streams: they keep their heartbeats and lose nothing.
    private func resync(_ topic: String, generation: UInt64, after: Int64, attempt: Int, firstAnswer: (() -> Void)? = nil) {
        activities.history(topic, after: after, limit: settings.historyPage) { [weak self] result in
            guard let self else { return }
            defer { firstAnswer?() }
            switch result {
            case .failure:
                let retrying = self.hub.isCurrent(topic: topic, generation: generation)
                    && self.sessions.retryLater(attempt: attempt) { [weak self] next in
                        self?.resync(topic, generation: generation, after: after, attempt: next)
                    }
                if !retrying { self.perform(self.hub.readFailed(topic: topic, generation: generation)) }
            case .success(let events):
                self.perform(self.hub.topicHistoryLoaded(topic: topic, generation: generation, events.map(WireEvent.init(stored:))))
                self.beginLiveSubscribers(of: topic)
            }
        }
    }

    // MARK: - Writing

    private func send(_ id: Int, _ events: [WireEvent]) {
        guard sessions[id] != nil else { return }
        sessions.send(id, events.map(\.payload))
    }

    private func finishWhenDrained(_ id: Int) { sessions.finishWhenDrained(id) }

    // MARK: - The one teardown path

    /// Removes a stream from memory and ends its connection; safe to call more than once.
    func close(_ id: Int, reason: StreamCloseReason) { sessions.close(id, reason: reason) }

    func sessionsDelivered(_ count: Int) { metrics.eventsDelivered += count }

    func sessionClosing(_ session: StreamSession) {
        hub.unsubscribe(session.id)
        if session.watching { interest?.unwatch(session.activityID) }
    }

    /// The status stream's part of its teardown, once it left the table and was detached.
    func sessionClosed(_ session: StreamSession, reason: StreamCloseReason) {
        metrics.streamsActive = sessions.count
        metrics.streamCloses[reason, default: 0] += 1
        if log.enabled(.info) {
            log.info("stream.close", [("activity", session.activityID), ("stream", session.id), ("reason", reason.rawValue),
                                      ("duration_s", ((Clock.monotonic() - session.opened) * 1000).rounded() / 1000)])
        }
        let http = session.connection.http
        let extraHeaders = session.connection.extraHeaders
        switch reason {
        case .clientClosed:
            break
        case .terminal where !http.started, .noContent:
            // Nothing was ever sent (the client already had the final event).
            http.respond(status: 204, headers: extraHeaders, body: [])
        case .terminal, .notFound:
            http.end()
        case .database where !http.started:
            http.respond(status: 503, headers: [("Content-Type", "application/json")] + extraHeaders, body: Database.unavailable.jsonBody())
        case .shutdown where http.started:
            http.end()
        case .slowClient, .writeFailed, .shutdown, .database, .revoked:
            http.abort()
        }
    }

    /// Ends the streams opened with a key that was revoked.
    func closeStreams(ofKey keyID: Int64) { sessions.closeStreams(ofKey: keyID) }
    /// Ends the streams a browser session opened.
    func closeStreams(ofSession hash: String) { sessions.closeStreams(ofSession: hash) }

    /// The keys that hold streams here (to re-check after missed revocations).
    var keysWithStreams: [Int64] { sessions.keys }
    var sessionsWithStreams: [String] { sessions.sessionHashes }

    /// Ends every stream (server shutdown), each told when to come back (`SSESessions.shutdown`).
    func shutdown(alongside otherStreams: Int = 0) { sessions.shutdown(alongside: otherStreams) }
}
