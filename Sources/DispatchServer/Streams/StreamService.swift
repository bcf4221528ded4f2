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

    init(id: Int, activityID: String, keyID: Int64, connection: SSEConnection) {
        self.id = id
        self.activityID = activityID
        self.keyID = keyID
        self.connection = connection
    }
}

/// The IO shell around `Hub`: opens and serves status streams, performs the hub's reads and
/// writes, paces replays by what each socket takes, heartbeats idle streams from one timer,
/// and tears each stream down once.
final class StreamService: HTTPStreamDelegate {
    struct Settings {
        var heartbeatSeconds: Double
        var maxBacklog: Int
        var writeTimeout: Double
        /// Events per history page; pages are also bounded in bytes by the outbox.
        var historyPage: Int64 = 1000
    }

    let loop: EventLoop
    let activities: ActivityRepository
    let publisher: Publisher
    let metrics: Metrics
    let log: Logger
    let settings: Settings
    private var hub = Hub<Int, WireEvent>()
    private var sessions = StreamTable<StreamSession>()
    /// Final events of finished activities, answered from memory; bounded by bytes.
    private var terminalCache = BoundedCache<String, WireEvent>(maxBytes: 32 << 20)
    private var heartbeatTimer: Timer?
    /// The carrier's interest in an activity: one call per stream subscribed to it, and one
    /// `unwatch` per such stream when it ends (NATS subscribes to what streams here follow).
    var watch: ((String) -> Void)?
    var unwatch: ((String) -> Void)?
    /// The worker's replay memory budget, shared with feeds.
    var memory: ReplayMemory?

    init(loop: EventLoop, activities: ActivityRepository, publisher: Publisher, metrics: Metrics, log: Logger, settings: Settings) {
        self.loop = loop
        self.activities = activities
        self.publisher = publisher
        self.metrics = metrics
        self.log = log
        self.settings = settings
        let tick = min(1, settings.heartbeatSeconds / 4)
        heartbeatTimer = loop.timer(after: tick, repeating: true) { [weak self] in self?.heartbeat(tick: tick) }
    }

    var openStreams: Int { sessions.count }
    func streams(forKey key: Int64) -> Int { sessions.streams(forKey: key) }

    // MARK: - Opening

    func open(_ req: HTTPRequest, activityID: String, lastEventID: Int64?, keyID: Int64, extraHeaders: [(String, String)] = []) {
        let session = sessions.add { id in
            StreamSession(id: id, activityID: activityID, keyID: keyID,
                          connection: SSEConnection(req, loop: loop, tag: id, delegate: self, extraHeaders: extraHeaders,
                                                    maxBacklog: settings.maxBacklog, writeTimeout: settings.writeTimeout, pageCap: 16 * 1024))
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
        if let watch {
            session.watching = true
            watch(activityID)
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

    /// A change heard through NOTIFY (`ChangeNotice`).
    func notified(_ notice: ChangeNotice) {
        let id = notice.activityID, seq = notice.seq, name = notice.event
        if seq == 1 { terminalCache.remove(id) }
        let terminal = WireEvent.terminalName(name)
        let observe = publisher.isStale(id, seq: seq)
        // Most NOTIFYs concern nothing held here (or echo this worker's own commit): skip them cheaply.
        guard observe || terminal || hub.wants(topic: id, seq: seq) else { return }
        let json = notice.json
        if !json.isEmpty {
            if observe, let value = try? JSONParser.parse(json), let a = Activity.decode(value) {
                publisher.observe(ActivityEvent(name: name, snapshot: a))
            }
            committed(activityID: id, seq: seq, name: name, json: json)
            return
        }
        if observe { publisher.forget(id) }
        guard hub.wants(topic: id, seq: seq) else { return }
        activities.history(id, after: seq - 1, limit: 1) { [weak self] result in
            guard let self, case .success(let events) = result, let e = events.first else { return }
            self.committed(activityID: id, seq: e.seq, name: e.name, json: e.data)
        }
    }

    /// The LISTEN session (or the carrier's connection) came back: re-read every topic's
    /// history from where it was.
    func listenRestored() {
        perform(hub.listenRestored())
    }

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
                activities.read(topic) { [weak self] result in
                    guard let self else { return }
                    switch result {
                    case .failure:
                        self.perform(self.hub.readFailed(topic: topic, generation: generation))
                    case .success(nil):
                        self.perform(self.hub.snapshotLoaded(topic: topic, generation: generation, nil))
                        self.beginLiveSubscribers(of: topic)
                    case .success(let s?):
                        let e = WireEvent(seq: s.activity.seq, name: s.lastEvent, terminal: s.activity.state.isTerminal,
                                          json: String(decoding: s.activity.json(), as: UTF8.self))
                        if e.isTerminal { self.rememberTerminal(topic, e) }
                        self.perform(self.hub.snapshotLoaded(topic: topic, generation: generation, e))
                        self.beginLiveSubscribers(of: topic)
                    }
                }
            case .readTopicHistory(let topic, let generation, let after):
                metrics.resyncs += 1
                resync(topic, generation: generation, after: after, attempt: 0)
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
                offer(s, StreamPayload(SSE.encode(id: "0", event: "not_found", data: w.string)), delivered: 0)
                close(s, reason: .notFound)
            case .drop(let s, let why):
                close(s, reason: why.closeReason)
            }
        }
    }

    /// Reads a topic's missed history. While the database is coming back, retry with backoff
    /// rather than dropping its streams: they keep their heartbeats and lose nothing.
    private func resync(_ topic: String, generation: UInt64, after: Int64, attempt: Int) {
        activities.history(topic, after: after, limit: settings.historyPage) { [weak self] result in
            guard let self else { return }
            switch result {
            case .failure:
                guard attempt < 60, self.hub.isCurrent(topic: topic, generation: generation) else {
                    self.perform(self.hub.readFailed(topic: topic, generation: generation))
                    return
                }
                self.loop.timer(after: min(2, 0.1 * Double(attempt + 1))) { [weak self] in
                    self?.resync(topic, generation: generation, after: after, attempt: attempt + 1)
                }
            case .success(let events):
                self.perform(self.hub.topicHistoryLoaded(topic: topic, generation: generation, events.map(WireEvent.init(stored:))))
                self.beginLiveSubscribers(of: topic)
            }
        }
    }

    // MARK: - Writing

    /// One live event goes straight to the socket when nothing waits (counted against the
    /// slow-client cap); several (a replay page) queue and are written as the socket drains.
    private func send(_ id: Int, _ events: [WireEvent]) {
        guard let session = sessions[id] else { return }
        if events.count == 1 { return offer(id, events[0].payload, delivered: 1) }
        session.connection.enqueue(events.map(\.payload))
        metrics.eventsDelivered += events.count
        pump(id)
    }

    /// Offers one payload (a live event, a heartbeat, `not_found`) to a stream.
    private func offer(_ id: Int, _ payload: StreamPayload, delivered: Int) {
        guard let session = sessions[id] else { return }
        if let failure = session.connection.offer(payload) {
            close(id, reason: failure == .slowClient ? .slowClient : .writeFailed)
        } else {
            metrics.eventsDelivered += delivered
        }
    }

    private func pump(_ id: Int) {
        switch sessions[id]?.connection.pump() {
        case .finished?: close(id, reason: .terminal)
        case .failed?: close(id, reason: .writeFailed)
        case .open?, nil: break
        }
    }

    private func finishWhenDrained(_ id: Int) {
        guard let session = sessions[id] else { return }
        if session.connection.finishWhenDrained() { close(id, reason: .terminal) }
    }

    private func heartbeat(tick: Double) {
        let beat = StreamPayload(SSE.heartbeat)
        for id in sessions.needingHeartbeat(now: Clock.monotonic(), after: settings.heartbeatSeconds - tick) {
            offer(id, beat, delivered: 0)
        }
    }

    func streamPeerClosed(_ tag: Int) { close(tag, reason: .clientClosed) }
    func streamDrained(_ tag: Int) { pump(tag) }

    // MARK: - The one teardown path

    /// Removes a stream from memory and ends its connection; safe to call more than once.
    func close(_ id: Int, reason: StreamCloseReason) {
        guard let session = sessions.remove(id) else { return }
        hub.unsubscribe(id)
        if session.watching { unwatch?(session.activityID) }
        session.connection.detach()
        metrics.streamsActive = sessions.count
        metrics.streamCloses[reason, default: 0] += 1
        if log.enabled(.info) {
            log.info("stream.close", [("activity", session.activityID), ("stream", id), ("reason", reason.rawValue),
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
    func closeStreams(ofKey keyID: Int64) {
        for id in sessions.ids(ofKey: keyID) { close(id, reason: .revoked) }
    }

    /// The keys that hold streams here (to re-check after missed revocations).
    var keysWithStreams: [Int64] { sessions.keys }

    /// Ends every stream (server shutdown). Each is told first to reconnect after its own
    /// delay, spread over a window that grows with the number of streams, so that tens of
    /// thousands of clients do not all come back in the same second; they resume with
    /// Last-Event-ID and lose nothing.
    func shutdown(alongside otherStreams: Int = 0) {
        heartbeatTimer?.cancel()
        let window = StreamService.reconnectWindow(streams: sessions.count + otherStreams)
        var rng = SystemRandomNumberGenerator()
        for id in sessions.ids {
            if sessions[id]?.connection.started == true {
                let delay = 500 + Int(Double.random(in: 0..<window, using: &rng) * 1000)
                offer(id, StreamPayload(SSE.retry(milliseconds: delay)), delivered: 0)
            }
            close(id, reason: .shutdown)
        }
    }

    /// Seconds over which streams ended by a shutdown are asked to come back: about 2,000
    /// reconnects a second, at least 2 s, at most 30 s.
    static func reconnectWindow(streams: Int) -> Double {
        min(30, max(2, Double(streams) / 2000))
    }
}
