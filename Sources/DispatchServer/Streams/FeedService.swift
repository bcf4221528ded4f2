import DispatchCore
import DispatchIO
import DispatchSystem

/// One client's feed (`GET /v1/stream`).
final class FeedSession: KeyedStream {
    let id: Int
    let keyID: Int64
    let connection: SSEConnection
    /// Finished activities since this time (ms) are in the initial set: the last 24 hours.
    let since: Int64
    /// Its first read waited for the sequencer (NATS carrier), or needs no wait.
    var settled = false
    /// Whether the resume's first replay page was checked for being too far behind.
    var resumeChecked = false
    var sessionHash: String?

    init(id: Int, keyID: Int64, connection: SSEConnection, since: Int64) {
        self.id = id
        self.keyID = keyID
        self.connection = connection
        self.since = since
    }
}

/// The IO shell around `FeedHub` (see its comment for the ordering design): opens feeds,
/// performs the hub's reads and writes, paces initial sets and replays by what each socket
/// takes; heartbeats, the one teardown, revocation and shutdown are the shell it shares with
/// status streams (`SSESessions`). Changes enter only in NOTIFY order (never from this
/// worker's own commits, which would reorder positions across processes) or, with the NATS
/// carrier, as read from the database after a hint; each is framed once for every subscriber.
final class FeedService: SSESessionsOwner {
    let loop: LoopScheduling
    let repository: FeedRepository
    let metrics: Metrics
    let log: Logger
    let settings: StreamService.Settings
    private var hub = FeedHub<Int, FeedEvent>()
    /// Rows per page read, learnt from the rows' sizes so a read brings what its budget sends.
    private var initialSizer: PageSizer
    private var replaySizer: PageSizer
    private let sessions: SSESessions<FeedSession>
    /// The carrier's interest in the feed: told when the first feed opens here and when the
    /// last one ends (NATS listens to feed announcements only meanwhile). With it, changes
    /// committed before a feed opened may not be numbered yet: the feed's first read waits
    /// for them, so that what was acknowledged before it opened is in its initial set, before
    /// `synced`. Without it (LISTEN/NOTIFY), positions are taken at commit.
    weak var interest: FeedInterest?
    /// The worker's replay memory budget, shared with status streams.
    var memory: ReplayMemory?
    /// Finished activities younger than this are part of the initial set.
    static let recentWindowMs: Int64 = 24 * 3_600_000

    /// What the hub asked when a feed left (a follower taking over its reads), performed once
    /// the teardown is over.
    private var handedOver: [FeedHub<Int, FeedEvent>.Action] = []

    init(loop: LoopScheduling, repository: FeedRepository, metrics: Metrics, log: Logger, settings: StreamService.Settings,
         pacer: BulkPacer = .feeds) {
        self.loop = loop
        self.pacer = pacer
        self.repository = repository
        self.metrics = metrics
        self.log = log
        self.settings = settings
        initialSizer = PageSizer(maxRows: Int(settings.historyPage))
        replaySizer = PageSizer(maxRows: Int(settings.historyPage))
        sessions = SSESessions(loop: loop, heartbeatSeconds: settings.heartbeatSeconds)
        sessions.owner = self
    }

    var openFeeds: Int { sessions.count }
    func streams(forKey key: Int64) -> Int { sessions.streams(forKey: key) }

    // MARK: - Opening

    /// `lastEventID` nil: the initial set; `invalidLastEventID`: the client sent one we cannot
    /// read (not a number), which is answered with `reset` and the initial set.
    func open(_ req: HTTPRequest, filter: FeedFilter, lastEventID: Int64?, invalidLastEventID: Bool, keyID: Int64,
              sessionHash: String? = nil, extraHeaders: [(String, String)]) {
        let http = HTTPStream(loop: loop)
        http.attach(req)
        open(http, filter: filter, lastEventID: lastEventID, invalidLastEventID: invalidLastEventID, keyID: keyID,
             sessionHash: sessionHash, extraHeaders: extraHeaders)
    }

    /// The same on any transport (a test's scripted stream).
    func open(_ http: StreamTransport, filter: FeedFilter, lastEventID: Int64?, invalidLastEventID: Bool, keyID: Int64,
              sessionHash: String? = nil, extraHeaders: [(String, String)]) {
        // An initial set is a bulk transfer: its bytes go out when nothing else is ready.
        http.priority = .background
        let session = sessions.add { id in
            let s = FeedSession(id: id, keyID: keyID,
                                connection: SSEConnection(http, loop: loop, tag: id, delegate: sessions, extraHeaders: extraHeaders,
                                                          maxBacklog: settings.maxBacklog, writeTimeout: settings.writeTimeout, pageCap: 64 * 1024),
                                since: Clock.nowMilliseconds() - FeedService.recentWindowMs)
            s.sessionHash = sessionHash
            return s
        }
        if let memory { session.connection.budgeted(by: memory, as: BudgetedStream(kind: .feed, id: session.id), key: keyID) }
        metrics.feedsActive = sessions.count
        metrics.feedsOpened += 1
        if sessions.count == 1 { interest?.feedOpened() }
        // Headers (and heartbeats) at once: the initial set may take a few reads.
        session.connection.begin()
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

    // MARK: - Inputs from the NATS carrier

    /// A hint that positions up to `position` exist (a numbering pass on any server, or the
    /// carrier's check): what follows this process's place is read from the database.
    func hinted(position: Int64) {
        perform(hub.hinted(position: position))
    }

    /// Nobody here reads the feed any more and the carrier stopped listening to it.
    func carrierDetached() { hub.sourceDetached() }

    /// Where this process stands in the feed (nil: nobody live), for the carrier's check.
    var head: Int64? { hub.standing }

    // MARK: - Performing the hub's decisions

    /// The hub's actions in its order; one appended while others wait (or run) goes behind
    /// them, so each feed's events keep their order across slices.
    private var queue: [FeedHub<Int, FeedEvent>.Action] = []
    private var nextAction = 0
    private var performing = false
    /// The rest of the queue goes on a later turn (after a slice, or a rest).
    private var continuing = false
    /// Slices of the queue per turn, and rests between them (see `BulkPacer`).
    private var pacer: BulkPacer
    /// Page reads held back until the queued slices are sent and the rest is over.
    private var afterSlices: [() -> Void] = []

    private func perform(_ actions: [FeedHub<Int, FeedEvent>.Action]) {
        queue.append(contentsOf: actions)
        guard !performing, !continuing else { return }
        performQueued()
    }

    private var resting: Bool { pacer.isResting(now: loop.now) }
    /// Actions the queue still holds, performed or not (for tests).
    var retainedActions: Int { queue.count }

    private func performQueued() {
        guard !resting else { return continueLater() }
        performing = true
        defer { performing = false }
        let began = loop.now
        var written = 0
        while nextAction < queue.count && written < pacer.bytesPerTurn {
            let action = queue[nextAction]
            nextAction += 1
            written += run(action)
        }
        if written > 0 { pacer.sent(busy: loop.now - began, now: loop.now) }
        if nextAction < queue.count {
            // The actions performed hold their pages: let them go now, since under a steady
            // load (pages of two walks answered in turn) the queue never empties.
            if nextAction >= 256 && nextAction * 2 >= queue.count {
                queue.removeFirst(nextAction)
                nextAction = 0
            }
            return continueLater()
        }
        queue.removeAll(keepingCapacity: queue.capacity <= 4096)
        nextAction = 0
        guard !afterSlices.isEmpty else { return }
        guard !resting else { return continueLater() }
        let reads = afterSlices
        afterSlices = []
        for read in reads { read() }
    }

    /// The queue (or the held-back reads) go on at the end of the rest, on a background turn.
    private func continueLater() {
        continuing = true
        let resume: () -> Void = { [weak self] in
            self?.loop.soon(.background) { [weak self] in
                guard let self else { return }
                self.continuing = false
                self.performQueued()
            }
        }
        let rest = pacer.restUntil - loop.now
        if rest > 0 { loop.timer(after: rest, resume) } else { resume() }
    }

    /// Performs one action; returns the bytes it handed to sockets.
    private func run(_ action: FeedHub<Int, FeedEvent>.Action) -> Int {
        switch action {
        case .readChanges(let after, let generation):
            metrics.feedResyncs += 1
            readChanges(after: after, generation: generation, attempt: 0)
        case .readInitial(let s, let filter, let after, let firstHead):
            settled(s) { [weak self] session in
                guard let self else { return }
                let budget = session.connection.pageBudget
                self.metrics.feedInitialReads += 1
                self.repository.initialPage(filter, after: after, firstHead: firstHead, since: session.since,
                                            limit: self.initialSizer.rows(forBudget: budget), maxBytes: budget) { [weak self] result in
                    guard let self else { return }
                    if case .success(let page) = result { self.initialSizer.observe(rows: page.fetched, bytes: page.fetchedBytes) }
                    guard self.sessions[s] != nil else { return }
                    switch result {
                    case .failure: self.perform(self.hub.readFailed(s))
                    case .success(let page):
                        // Those sharing this read stay together while they keep up.
                        self.perform(self.hub.initialLoaded(s, page.events, through: page.head, complete: page.complete) {
                            self.sessions[$0]?.connection.keepsUp ?? false
                        })
                    }
                    self.sessions[s]?.connection.pageDone()
                }
            }
        case .readReplay(let s, let filter, let after):
            settled(s) { [weak self] session in
                guard let self else { return }
                let budget = session.connection.pageBudget
                let first = !session.resumeChecked
                session.resumeChecked = true
                self.repository.replayPage(filter, after: after, limit: self.replaySizer.rows(forBudget: budget),
                                           maxBytes: budget, countActivities: first) { [weak self] result in
                    guard let self else { return }
                    if case .success(let page) = result { self.replaySizer.observe(rows: page.fetched, bytes: page.fetchedBytes) }
                    guard self.sessions[s] != nil else { return }
                    switch result {
                    case .failure:
                        self.perform(self.hub.readFailed(s))
                    case .success(let page):
                        // The page's own read tells whether `after` is resumable: a pruned
                        // change after it (horizon), or a position never issued; its first
                        // page, whether replaying costs more than starting over.
                        let newest = max(page.issued, page.head)
                        if !FeedResume.canResume(after: after, horizon: page.horizon, newest: newest)
                            || (first && FeedResume.tooFarBehind(after: after, newest: newest, activities: page.activities)) {
                            self.perform(self.hub.replayLoaded(s, .reset))
                        } else {
                            self.perform(self.hub.replayLoaded(s, .page(page.events, through: max(page.head, after), complete: page.complete)))
                        }
                    }
                    self.sessions[s]?.connection.pageDone()
                }
            }
        case .send(let s, let events):
            return send(s, events)
        case .sendShared(let s, let events):
            metrics.feedSharedPages += 1
            return send(s, events)
        case .synced(let s, let position):
            sessions.offer(s, StreamPayload(SSE.encode(id: String(position), event: "synced", data: "{\"position\":\(position)}")), delivered: 0)
        case .reset(let s):
            metrics.feedResets += 1
            sessions.offer(s, StreamPayload(SSE.encode(id: nil, event: "reset", data: "{}")), delivered: 0)
        case .drop(let s, let why):
            close(s, reason: why.closeReason)
        }
        return 0
    }

    /// `paced`, after the first read's wait for numbering (NATS carrier).
    private func settled(_ id: Int, _ read: @escaping (FeedSession) -> Void) {
        guard let session = sessions[id] else { return }
        guard !session.settled, let interest else { return paced(id, read) }
        session.settled = true
        interest.awaitNumbering { [weak self] in self?.paced(id, read) }
    }

    /// Runs a stream's next page read now if its outbox has room, else once it drains.
    private func paced(_ id: Int, _ read: @escaping (FeedSession) -> Void) {
        // Pages still waiting for their slices go first, and no page is asked for during a rest.
        guard !continuing, !resting else {
            afterSlices.append { [weak self] in self?.paced(id, read) }
            if !continuing { continueLater() }
            return
        }
        sessions[id]?.connection.whenRoom { [weak self] in
            guard let self, let session = self.sessions[id] else { return }
            read(session)
        }
    }

    /// Re-reads stored changes for the source; while the database comes back, retry with
    /// backoff rather than dropping every feed.
    private func readChanges(after: Int64, generation: UInt64, attempt: Int) {
        repository.changes(after: after, limit: Int(settings.historyPage)) { [weak self] result in
            guard let self else { return }
            switch result {
            case .failure:
                let retrying = self.sessions.retryLater(attempt: attempt) { [weak self] next in
                    self?.readChanges(after: after, generation: generation, attempt: next)
                }
                if !retrying { self.perform(self.hub.changesReadFailed(generation: generation)) }
            case .success(let page):
                self.perform(self.hub.changesLoaded(generation: generation, page.events, complete: page.complete))
            }
        }
    }

    // MARK: - Writing

    private func frame(_ e: FeedEvent) -> StreamPayload {
        e.payload { metrics.feedFramed += 1 }
    }

    /// The bytes handed over (0 for a feed that is gone).
    private func send(_ id: Int, _ events: [FeedEvent]) -> Int {
        // Framed only for a feed still open (a change is framed once, for its first reader).
        guard sessions[id] != nil else { return 0 }
        let payloads = events.map(frame)
        sessions.send(id, payloads)
        return payloads.reduce(0) { $0 + $1.size }
    }

    // MARK: - The one teardown path

    /// Removes a feed from memory and ends its connection; safe to call more than once.
    func close(_ id: Int, reason: StreamCloseReason) { sessions.close(id, reason: reason) }

    func sessionsDelivered(_ count: Int) { metrics.feedDeliveries += count }

    func sessionClosing(_ session: FeedSession) { handedOver += hub.unsubscribe(session.id) }

    /// The feed's part of its teardown, once it left the table and was detached.
    func sessionClosed(_ session: FeedSession, reason: StreamCloseReason) {
        metrics.feedsActive = sessions.count
        metrics.feedCloses[reason, default: 0] += 1
        if sessions.count == 0 { interest?.feedsClosed() }
        let http = session.connection.http
        switch reason {
        case .clientClosed:
            break
        case .shutdown, .terminal, .notFound, .noContent:
            http.end()
        case .slowClient, .writeFailed, .database, .revoked:
            http.abort()
        }
        // Another reader followed this one's initial reads: it reads on by itself.
        let actions = handedOver
        handedOver = []
        perform(actions)
    }

    /// Logs what every feed here waits for (`kill -USR1` a worker): the hub's source, this
    /// shell's queue and pacing, and per feed its phase, position, buffer and socket backlog.
    /// What a stalled feed shows here says which read or drain it is waiting on.
    func dumpState() {
        log.warning("feed.state", [("feeds", sessions.count), ("source", hub.sourceDescription), ("head", hub.head.map { String($0) } ?? "-"),
                                   ("queue", queue.count - nextAction), ("continuing", continuing), ("resting", resting),
                                   ("held_reads", afterSlices.count), ("followers", hub.followerCount)])
        for id in sessions.ids {
            guard let session = sessions[id], let d = hub.describe(id) else { continue }
            log.warning("feed.state.stream", [("feed", id), ("key", session.keyID), ("phase", d.phase), ("at", d.at.map { String($0) } ?? "-"),
                                              ("synced", d.synced), ("buffered", d.buffered), ("follows", d.follows.map { String($0) } ?? "-"),
                                              ("settled", session.settled), ("held_bytes", session.connection.heldBytes),
                                              ("started", session.connection.started)])
        }
    }

    /// Ends the feeds opened with a key that was revoked.
    func closeStreams(ofKey keyID: Int64) { sessions.closeStreams(ofKey: keyID) }
    /// Ends the feeds a browser session opened.
    func closeStreams(ofSession hash: String) { sessions.closeStreams(ofSession: hash) }

    var keysWithStreams: [Int64] { sessions.keys }
    var sessionsWithStreams: [String] { sessions.sessionHashes }

    /// Ends every feed (server shutdown), each told when to come back, spread out with the
    /// status streams (`SSESessions.shutdown`); clients resume with Last-Event-ID.
    func shutdown(alongside otherStreams: Int = 0) { sessions.shutdown(alongside: otherStreams) }
}
