import DispatchCore
import DispatchIO
import DispatchSystem

/// One client's feed (`GET /v1/stream`).
final class FeedSession {
    let id: Int
    let keyID: Int64
    let http: HTTPStream
    /// Finished activities since this time (ms) are in the initial set: the last 24 hours.
    let since: Int64
    /// CORS headers of the request, for the stream's answer.
    let extraHeaders: [(String, String)]
    var lastWrite: Double
    var outbox: StreamOutbox<StreamPayload>
    /// The next page of an initial set or replay, read once the outbox has drained (paced).
    var deferredRead: (() -> Void)?

    init(id: Int, keyID: Int64, http: HTTPStream, since: Int64, extraHeaders: [(String, String)], now: Double,
         outbox: StreamOutbox<StreamPayload>) {
        self.id = id
        self.keyID = keyID
        self.http = http
        self.since = since
        self.extraHeaders = extraHeaders
        lastWrite = now
        self.outbox = outbox
    }
}

/// The IO shell around `FeedHub` (see its comment for the ordering design): opens feeds,
/// performs the hub's reads and writes, paces initial sets and replays by what each socket
/// takes, heartbeats idle feeds, and tears each feed down once. Changes enter only in NOTIFY
/// order (never from this worker's own commits, which would reorder positions across
/// processes), and each is framed once for every subscriber.
final class FeedService: HTTPStreamDelegate {
    let loop: EventLoop
    let repository: FeedRepository
    let metrics: Metrics
    let log: Logger
    let settings: StreamService.Settings
    private var hub = FeedHub<Int, FeedEvent>()
    private var sessions: [Int: FeedSession] = [:]
    private var streamsPerKey: [Int64: Int] = [:]
    private var nextID = 1
    private var heartbeatTimer: Timer?
    /// Finished activities younger than this are part of the initial set.
    static let recentWindowMs: Int64 = 24 * 3_600_000

    init(loop: EventLoop, repository: FeedRepository, metrics: Metrics, log: Logger, settings: StreamService.Settings) {
        self.loop = loop
        self.repository = repository
        self.metrics = metrics
        self.log = log
        self.settings = settings
        let tick = min(1, settings.heartbeatSeconds / 4)
        heartbeatTimer = loop.timer(after: tick, repeating: true) { [weak self] in self?.heartbeat(tick: tick) }
    }

    var openFeeds: Int { sessions.count }
    func streams(forKey key: Int64) -> Int { streamsPerKey[key] ?? 0 }

    private func makeOutbox() -> StreamOutbox<StreamPayload> {
        let low = min(16 * 1024, settings.maxBacklog / 4)
        return StreamOutbox(maxBacklog: settings.maxBacklog, lowWater: low, pageBudget: min(64 * 1024, settings.maxBacklog / 2))
    }

    // MARK: - Opening

    /// `lastEventID` nil: the initial set; `invalidLastEventID`: the client sent one we cannot
    /// read (not a number), which is answered with `reset` and the initial set.
    func open(_ req: HTTPRequest, filter: FeedFilter, lastEventID: Int64?, invalidLastEventID: Bool, keyID: Int64,
              extraHeaders: [(String, String)]) {
        let http = HTTPStream(loop: loop)
        http.attach(req)
        let session = FeedSession(id: nextID, keyID: keyID, http: http, since: Clock.nowMilliseconds() - FeedService.recentWindowMs,
                                  extraHeaders: extraHeaders, now: Clock.monotonic(), outbox: makeOutbox())
        nextID += 1
        sessions[session.id] = session
        streamsPerKey[keyID, default: 0] += 1
        metrics.feedsActive = sessions.count
        metrics.feedsOpened += 1
        http.tag = session.id
        http.drainMark = session.outbox.lowWater
        http.delegate = self
        // Headers (and heartbeats) at once: the initial set may take a few reads.
        session.http.begin(headers: StreamService.headers + extraHeaders, writeTimeout: settings.writeTimeout)
        _ = session.http.write(StreamPayload(SSE.retry(milliseconds: StreamService.retryMilliseconds)), maxBacklog: settings.maxBacklog)
        perform(hub.subscribe(session.id, filter: filter, lastEventID: lastEventID, reset: invalidLastEventID))
    }

    // MARK: - Inputs from the database

    /// A change heard through NOTIFY, in commit order.
    func notified(_ notice: ChangeNotice) {
        guard hub.hasSubscribers else {
            // Keep the position only: nobody here needs the change itself.
            perform(hub.notifiedWithoutData(position: notice.position))
            return
        }
        if notice.json.isEmpty {
            perform(hub.notifiedWithoutData(position: notice.position))
        } else {
            perform(hub.notified(FeedEvent(notice: notice)))
        }
    }

    /// The LISTEN session came back: notices sent while it was down are lost.
    func listenRestored() {
        perform(hub.listenRestored())
    }

    // MARK: - Performing the hub's decisions

    private func perform(_ actions: [FeedHub<Int, FeedEvent>.Action]) {
        for action in actions {
            switch action {
            case .readChanges(let after, let generation):
                metrics.feedResyncs += 1
                readChanges(after: after, generation: generation, attempt: 0)
            case .readInitial(let s, let filter, let after, let firstHead):
                paced(s) { [weak self] session in
                    guard let self else { return }
                    self.repository.initialPage(filter, after: after, firstHead: firstHead, since: session.since,
                                                limit: Int(self.settings.historyPage), maxBytes: session.outbox.pageBudget) { [weak self] result in
                        guard let self, self.sessions[s] != nil else { return }
                        switch result {
                        case .failure: self.perform(self.hub.readFailed(s))
                        case .success(let page):
                            self.perform(self.hub.initialLoaded(s, page.events, through: page.head, complete: page.complete))
                        }
                    }
                }
            case .readReplay(let s, let filter, let after):
                paced(s) { [weak self] session in
                    guard let self else { return }
                    self.repository.replayPage(filter, after: after, limit: Int(self.settings.historyPage),
                                               maxBytes: session.outbox.pageBudget) { [weak self] result in
                        guard let self, self.sessions[s] != nil else { return }
                        switch result {
                        case .failure:
                            self.perform(self.hub.readFailed(s))
                        case .success(let page):
                            // The page's own read tells whether `after` is resumable: a pruned
                            // change after it (horizon), or a position never issued.
                            if !FeedResume.canResume(after: after, horizon: page.horizon, newest: max(page.issued, page.head)) {
                                self.perform(self.hub.replayLoaded(s, .reset))
                            } else {
                                self.perform(self.hub.replayLoaded(s, .page(page.events, through: max(page.head, after), complete: page.complete)))
                            }
                        }
                    }
                }
            case .send(let s, let events):
                send(s, events)
            case .synced(let s, let position):
                offer(s, StreamPayload(SSE.encode(id: String(position), event: "synced", data: "{\"position\":\(position)}")), delivered: 0)
            case .reset(let s):
                metrics.feedResets += 1
                offer(s, StreamPayload(SSE.encode(id: nil, event: "reset", data: "{}")), delivered: 0)
            case .drop(let s, let why):
                close(s, reason: why.closeReason)
            }
        }
    }

    /// Runs a stream's next page read now if its outbox has room, else once it drains.
    private func paced(_ id: Int, _ read: @escaping (FeedSession) -> Void) {
        guard let session = sessions[id] else { return }
        let run = { [weak self] in
            guard let self, let session = self.sessions[id] else { return }
            read(session)
        }
        if session.outbox.wantsMore(socketBacklog: session.http.backlog) {
            run()
        } else {
            session.deferredRead = run
        }
    }

    /// Re-reads stored changes for the source; while the database comes back, retry with
    /// backoff rather than dropping every feed.
    private func readChanges(after: Int64, generation: UInt64, attempt: Int) {
        repository.changes(after: after, limit: Int(settings.historyPage)) { [weak self] result in
            guard let self else { return }
            switch result {
            case .failure:
                guard attempt < 60 else { return self.perform(self.hub.changesReadFailed(generation: generation)) }
                self.loop.timer(after: min(2, 0.1 * Double(attempt + 1))) { [weak self] in
                    self?.readChanges(after: after, generation: generation, attempt: attempt + 1)
                }
            case .success(let page):
                self.perform(self.hub.changesLoaded(generation: generation, page.events, complete: page.complete))
            }
        }
    }

    // MARK: - Writing

    private func frame(_ e: FeedEvent) -> StreamPayload {
        e.payload { metrics.feedFramed += 1 }
    }

    /// One live change goes straight to the socket when nothing waits (counted against the
    /// slow-client cap); several (a page) queue and are written as the socket drains.
    private func send(_ id: Int, _ events: [FeedEvent]) {
        guard let session = sessions[id] else { return }
        if events.count == 1 { return offer(id, frame(events[0]), delivered: 1) }
        session.outbox.enqueue(events.map { let p = frame($0); return (p, p.size) })
        metrics.feedDeliveries += events.count
        pump(id)
    }

    private func offer(_ id: Int, _ payload: StreamPayload, delivered: Int) {
        guard let session = sessions[id] else { return }
        switch session.outbox.offer(payload, size: payload.size, socketBacklog: session.http.backlog, live: true) {
        case .writeNow(let p):
            switch session.http.write(p, maxBacklog: settings.maxBacklog) {
            case .written, .queued:
                session.lastWrite = Clock.monotonic()
                metrics.feedDeliveries += delivered
            case .backlogExceeded:
                close(id, reason: .slowClient)
            case .failed:
                close(id, reason: .writeFailed)
            }
        case .queued:
            metrics.feedDeliveries += delivered
        case .overCap:
            close(id, reason: .slowClient)
        }
    }

    private func pump(_ id: Int) {
        guard let session = sessions[id] else { return }
        while let payload = session.outbox.next(socketBacklog: session.http.backlog) {
            switch session.http.write(payload, maxBacklog: Int.max) {
            case .written, .queued:
                session.lastWrite = Clock.monotonic()
            case .backlogExceeded, .failed:
                return close(id, reason: .writeFailed)
            }
        }
        if let read = session.deferredRead, session.outbox.wantsMore(socketBacklog: session.http.backlog) {
            session.deferredRead = nil
            read()
        }
    }

    private func heartbeat(tick: Double) {
        let now = Clock.monotonic()
        let due = settings.heartbeatSeconds - tick
        var ids: [Int] = []
        for (id, s) in sessions where now - s.lastWrite >= due { ids.append(id) }
        let beat = StreamPayload(SSE.heartbeat)
        for id in ids { offer(id, beat, delivered: 0) }
    }

    func streamPeerClosed(_ tag: Int) { close(tag, reason: .clientClosed) }
    func streamDrained(_ tag: Int) { pump(tag) }

    // MARK: - The one teardown path

    /// Removes a feed from memory and ends its connection; safe to call more than once.
    func close(_ id: Int, reason: StreamCloseReason) {
        guard let session = sessions.removeValue(forKey: id) else { return }
        hub.unsubscribe(id)
        session.deferredRead = nil
        let remaining = (streamsPerKey[session.keyID] ?? 1) - 1
        streamsPerKey[session.keyID] = remaining > 0 ? remaining : nil
        metrics.feedsActive = sessions.count
        metrics.feedCloses[reason, default: 0] += 1
        let http = session.http
        http.delegate = nil
        switch reason {
        case .clientClosed:
            break
        case .shutdown, .terminal, .notFound, .noContent:
            http.end()
        case .slowClient, .writeFailed, .database, .revoked:
            http.abort()
        }
    }

    /// Ends the feeds opened with a key that was revoked.
    func closeStreams(ofKey keyID: Int64) {
        guard streamsPerKey[keyID] != nil else { return }
        for (id, s) in sessions where s.keyID == keyID { close(id, reason: .revoked) }
    }

    var keysWithStreams: [Int64] { Array(streamsPerKey.keys) }

    /// Ends every feed (server shutdown), each told when to come back (spread out as status
    /// streams are: `StreamService.reconnectWindow`); clients resume with Last-Event-ID.
    func shutdown(alongside otherStreams: Int = 0) {
        heartbeatTimer?.cancel()
        let window = StreamService.reconnectWindow(streams: sessions.count + otherStreams)
        var rng = SystemRandomNumberGenerator()
        for id in Array(sessions.keys) {
            let delay = 500 + Int(Double.random(in: 0..<window, using: &rng) * 1000)
            offer(id, StreamPayload(SSE.retry(milliseconds: delay)), delivered: 0)
            close(id, reason: .shutdown)
        }
    }
}
