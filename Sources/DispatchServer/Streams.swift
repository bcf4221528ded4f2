import DispatchCore
import DispatchIO

/// One event, framed once as SSE and as an HTTP chunk, shared by every subscriber.
final class WireEvent: HubEvent {
    let seq: Int64
    let name: String
    let isTerminal: Bool
    let payload: StreamPayload

    init(seq: Int64, name: String, terminal: Bool, json: String) {
        self.seq = seq
        self.name = name
        isTerminal = terminal
        payload = StreamPayload(SSE.encode(id: String(seq), event: name, data: json))
    }

    convenience init(stored e: StoredEvent) {
        self.init(seq: e.seq, name: e.name, terminal: WireEvent.terminalName(e.name), json: e.data)
    }

    static func terminalName(_ name: String) -> Bool {
        ActivityState(rawValue: name)?.isTerminal ?? false
    }
}

/// One client's status stream.
final class StreamSession {
    let id: Int
    let activityID: String
    let keyID: Int64
    let http: HTTPStream
    var lastWrite: Double
    /// Events waiting for the socket to drain (a replay larger than the socket takes at once).
    var queue: [StreamPayload] = []
    var queueHead = 0
    var queuedLiveBytes = 0
    /// The final event is queued: end the response once the queue is written.
    var endWhenDrained = false

    init(id: Int, activityID: String, keyID: Int64, http: HTTPStream, now: Double) {
        self.id = id
        self.activityID = activityID
        self.keyID = keyID
        self.http = http
        lastWrite = now
    }
}

/// The IO shell around `Hub`: opens and serves status streams, performs the hub's reads
/// and writes, heartbeats idle streams from one timer, and tears each stream down once.
final class StreamService: HTTPStreamDelegate {
    let loop: EventLoop
    let store: Store
    let metrics: Metrics
    let log: Logger
    let heartbeatSeconds: Double
    let maxBacklog: Int
    let writeTimeout: Double
    private var hub = Hub<Int, WireEvent>()
    private var sessions: [Int: StreamSession] = [:]
    private var streamsPerKey: [Int64: Int] = [:]
    private var terminalCache: [String: WireEvent] = [:]
    private var nextID = 1
    private var heartbeatTimer: Timer?
    static let retryMilliseconds = 3000
    /// Bounds what one replaying stream holds in memory; the hub reads the next page after it.
    static let historyPage: Int64 = 1000

    init(loop: EventLoop, store: Store, metrics: Metrics, log: Logger, heartbeatSeconds: Double, maxBacklog: Int, writeTimeout: Double) {
        self.loop = loop
        self.store = store
        self.metrics = metrics
        self.log = log
        self.heartbeatSeconds = heartbeatSeconds
        self.maxBacklog = maxBacklog
        self.writeTimeout = writeTimeout
        let tick = min(1, heartbeatSeconds / 4)
        heartbeatTimer = loop.timer(after: tick, repeating: true) { [weak self] in self?.heartbeat(tick: tick) }
    }

    var openStreams: Int { sessions.count }
    func streams(forKey key: Int64) -> Int { streamsPerKey[key] ?? 0 }

    static let headers: [(String, String)] = [
        ("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache"), ("X-Accel-Buffering", "no"),
    ]

    // MARK: - Opening

    func open(_ req: HTTPRequest, activityID: String, lastEventID: Int64?, keyID: Int64) {
        let http = HTTPStream(loop: loop)
        http.attach(req)
        let session = StreamSession(id: nextID, activityID: activityID, keyID: keyID, http: http, now: Clock.monotonic())
        nextID += 1
        sessions[session.id] = session
        streamsPerKey[keyID, default: 0] += 1
        metrics.streamsActive = sessions.count
        http.tag = session.id
        http.delegate = self

        if let final = terminalCache[activityID] {
            // A finished activity never changes: answer from memory.
            serveFinished(session, final: final, lastEventID: lastEventID)
            return
        }
        perform(hub.subscribe(session.id, topic: activityID, lastEventID: lastEventID))
        beginIfLive(session.id)
    }

    /// A client whose Last-Event-ID is already the newest event goes live with nothing to
    /// send: start its response now, so it gets headers and heartbeats while it waits.
    private func beginIfLive(_ id: Int) {
        guard let session = sessions[id], !session.http.started, hub.isLive(id) else { return }
        begin(session)
    }

    private func beginLiveSubscribers(of topic: String) {
        for id in hub.subscribers(of: topic) { beginIfLive(id) }
    }

    private func serveFinished(_ session: StreamSession, final: WireEvent, lastEventID: Int64?) {
        guard let after = lastEventID else {
            send(session.id, [final])
            finishWhenDrained(session.id)
            return
        }
        if after >= final.seq {
            close(session.id, reason: "no_content")
            return
        }
        store.readHistory(session.activityID, after: after, limit: StreamService.historyPage) { [weak self] result in
            guard let self, self.sessions[session.id] != nil else { return }
            switch result {
            case .failure: self.close(session.id, reason: "database")
            case .success(let events):
                self.send(session.id, events.map(WireEvent.init(stored:)))
                if events.last?.seq ?? final.seq < final.seq {
                    // More history than one page: serve the rest as a fresh replay from there.
                    self.serveFinished(session, final: final, lastEventID: events.last!.seq)
                } else {
                    self.finishWhenDrained(session.id)
                }
            }
        }
    }

    // MARK: - Inputs from the database

    /// A committed event: from this worker's own publish, or NOTIFY from any worker.
    func committed(activityID: String, seq: Int64, name: String, json: String) {
        // A new start for an id (reused after its old activity was pruned) outdates the cache.
        if seq == 1 { terminalCache[activityID] = nil }
        let terminal = WireEvent.terminalName(name)
        guard terminal || hub.wants(topic: activityID, seq: seq) else { return }
        let event = WireEvent(seq: seq, name: name, terminal: terminal, json: json)
        if event.isTerminal { rememberTerminal(activityID, event) }
        perform(hub.published(topic: activityID, event))
    }

    /// NOTIFY payload: `id \n seq \n event \n json` (json empty when it did not fit).
    func notified(_ payload: String) {
        let parts = payload.split(separator: "\n", maxSplits: 3, omittingEmptySubsequences: false)
        guard parts.count == 4, let seq = Int64(parts[1]) else {
            log.warning("notify.malformed", [("payload_bytes", payload.utf8.count)])
            return
        }
        let id = String(parts[0]), name = String(parts[2])
        if seq == 1 { terminalCache[id] = nil }
        let terminal = WireEvent.terminalName(name)
        let observe = store.isStale(id, seq: seq)
        // Most NOTIFYs concern nothing held here (or echo this worker's own commit): skip them cheaply.
        guard observe || terminal || hub.wants(topic: id, seq: seq) else { return }
        let json = String(parts[3])
        if !json.isEmpty {
            if observe, let value = try? JSONParser.parse(json), let a = Activity.decode(value) {
                store.observe(ActivityEvent(name: name, snapshot: a))
            }
            committed(activityID: id, seq: seq, name: name, json: json)
            return
        }
        if observe { store.forget(id) }
        guard hub.wants(topic: id, seq: seq) else { return }
        store.readHistory(id, after: seq - 1, limit: 1) { [weak self] result in
            guard let self, case .success(let events) = result, let e = events.first else { return }
            self.committed(activityID: id, seq: e.seq, name: e.name, json: e.data)
        }
    }

    /// The LISTEN session came back: re-read every topic's history from where it was.
    func listenRestored() {
        perform(hub.listenRestored())
    }

    private func rememberTerminal(_ id: String, _ e: WireEvent) {
        if terminalCache.count >= 50_000 { terminalCache.removeAll(keepingCapacity: true) }
        terminalCache[id] = e
    }

    // MARK: - Performing the hub's decisions

    private func perform(_ actions: [Hub<Int, WireEvent>.Action]) {
        for action in actions {
            switch action {
            case .readSnapshot(let topic, let generation):
                store.readActivity(topic) { [weak self] result in
                    guard let self else { return }
                    switch result {
                    case .failure: self.perform(self.hub.readFailed(topic: topic, generation: generation))
                    case .success(nil): self.perform(self.hub.snapshotLoaded(topic: topic, generation: generation, nil))
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
            case .readHistory(let s, let topic, let after):
                store.readHistory(topic, after: after, limit: StreamService.historyPage) { [weak self] result in
                    guard let self else { return }
                    switch result {
                    case .failure: self.perform(self.hub.readFailed(subscriber: s))
                    case .success(let events):
                        self.perform(self.hub.historyLoaded(subscriber: s, events.map(WireEvent.init(stored:))))
                    }
                }
            case .send(let s, let events):
                send(s, events)
            case .finish(let s):
                finishWhenDrained(s)
            case .noContent(let s):
                close(s, reason: "no_content")
            case .notFound(let s):
                guard let session = sessions[s] else { continue }
                var w = JSONWriter()
                w.beginObject(); w.field("activityId", session.activityID); w.endObject()
                sendPayload(s, StreamPayload(SSE.encode(id: nil, event: "not_found", data: w.string)), count: 0)
                close(s, reason: "not_found")
            case .drop(let s):
                close(s, reason: sessions[s]?.http.started == true ? "slow_client" : "database")
            }
        }
    }

    /// Reads a topic's missed history. While the database is coming back, retry with backoff
    /// rather than dropping its streams: they keep their heartbeats and lose nothing.
    private func resync(_ topic: String, generation: UInt64, after: Int64, attempt: Int) {
        store.readHistory(topic, after: after, limit: StreamService.historyPage) { [weak self] result in
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

    private func begin(_ session: StreamSession) {
        guard !session.http.started else { return }
        session.http.begin(headers: StreamService.headers, writeTimeout: writeTimeout)
        _ = session.http.write(StreamPayload(SSE.retry(milliseconds: StreamService.retryMilliseconds)), maxBacklog: maxBacklog)
    }

    /// Queues events for a stream and writes what the socket takes. A replay (several events
    /// at once) may wait in the queue for the socket to drain; live events count against the
    /// slow-client cap, so a reader that stopped reading is cut off, not buffered without end.
    private func send(_ id: Int, _ events: [WireEvent]) {
        guard let session = sessions[id] else { return }
        begin(session)
        if events.count == 1, session.queueHead == session.queue.count, session.http.backlog < session.http.drainMark {
            // The common case (one live event, nothing waiting): straight to the socket.
            writeNow(session, events[0].payload, count: 1)
            return
        }
        for e in events {
            session.queue.append(e.payload)
            if events.count == 1 { session.queuedLiveBytes += e.payload.chunked.count }
        }
        metrics.eventsDelivered += events.count
        if session.http.backlog + session.queuedLiveBytes > maxBacklog {
            close(id, reason: "slow_client")
            return
        }
        pump(id)
    }

    /// Writes queued events while the connection's output stays under the drain mark.
    private func pump(_ id: Int) {
        guard let session = sessions[id] else { return }
        while session.queueHead < session.queue.count && session.http.backlog < session.http.drainMark {
            let payload = session.queue[session.queueHead]
            session.queueHead += 1
            switch session.http.write(payload, maxBacklog: Int.max) {
            case .written, .queued:
                session.lastWrite = Clock.monotonic()
            case .backlogExceeded, .failed:
                close(id, reason: "write_failed")
                return
            }
        }
        if session.queueHead == session.queue.count {
            session.queue.removeAll(keepingCapacity: false)
            session.queueHead = 0
            session.queuedLiveBytes = 0
            if session.endWhenDrained { close(id, reason: "terminal") }
        }
    }

    private func finishWhenDrained(_ id: Int) {
        guard let session = sessions[id] else { return }
        if session.queueHead == session.queue.count { close(id, reason: "terminal") } else { session.endWhenDrained = true }
    }

    @discardableResult
    private func sendPayload(_ id: Int, _ payload: StreamPayload, count: Int) -> Bool {
        guard let session = sessions[id] else { return false }
        begin(session)
        if session.queueHead < session.queue.count {
            session.queue.append(payload)
            return true
        }
        return writeNow(session, payload, count: count)
    }

    /// Writes (or buffers, up to the slow-client cap) and closes the stream on failure.
    @discardableResult
    private func writeNow(_ session: StreamSession, _ payload: StreamPayload, count: Int) -> Bool {
        switch session.http.write(payload, maxBacklog: maxBacklog) {
        case .written, .queued:
            session.lastWrite = Clock.monotonic()
            metrics.eventsDelivered += count
            return true
        case .backlogExceeded:
            close(session.id, reason: "slow_client")
            return false
        case .failed:
            close(session.id, reason: "write_failed")
            return false
        }
    }

    private func heartbeat(tick: Double) {
        let now = Clock.monotonic()
        let due = heartbeatSeconds - tick
        var ids: [Int] = []
        for (id, s) in sessions where s.http.started && now - s.lastWrite >= due { ids.append(id) }
        let beat = StreamPayload(SSE.heartbeat)
        for id in ids { sendPayload(id, beat, count: 0) }
    }

    func streamPeerClosed(_ tag: Int) { close(tag, reason: "client_closed") }
    func streamDrained(_ tag: Int) { pump(tag) }

    // MARK: - The one teardown path

    /// Removes a stream from memory and ends its connection; safe to call more than once.
    func close(_ id: Int, reason: String) {
        guard let session = sessions.removeValue(forKey: id) else { return }
        hub.unsubscribe(id)
        let remaining = (streamsPerKey[session.keyID] ?? 1) - 1
        streamsPerKey[session.keyID] = remaining > 0 ? remaining : nil
        metrics.streamsActive = sessions.count
        metrics.closed(reason)
        let http = session.http
        http.delegate = nil
        switch reason {
        case "client_closed":
            break
        case "terminal" where !http.started:
            // Nothing was ever sent (the client already had the final event).
            http.respond(status: 204, body: [])
        case "terminal", "not_found":
            http.end()
        case "no_content":
            http.respond(status: 204, body: [])
        case "database" where !http.started:
            http.respond(status: 503, headers: [("Content-Type", "application/json")],
                         body: DispatchError(.databaseUnavailable, "the database is unavailable, retry shortly").jsonBody(now: 0))
        case "shutdown" where http.started:
            http.end()
        default:
            http.abort()
        }
    }

    /// Ends every stream (server shutdown); clients reconnect with Last-Event-ID elsewhere.
    func shutdown() {
        heartbeatTimer?.cancel()
        for id in Array(sessions.keys) { close(id, reason: "shutdown") }
    }
}
