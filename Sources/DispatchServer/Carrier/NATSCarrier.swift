import DispatchCore
import DispatchIO
import DispatchSystem

/// Committed changes between server processes over NATS (contract §10), for one worker.
///
/// After its commit, a worker publishes each change on its activity's subject and wakes the
/// sequencer, which numbers the changes for the feed and announces them on the feed subject.
/// A worker listens only to the activities its status streams follow, and to the feed while
/// it has feed readers, so NATS routes to each node only what its clients want.
///
/// NATS is at-most-once, so it is never trusted for completeness: status streams see a gap
/// in `seq`, feeds a break in the announcements' chain, and both then read PostgreSQL; a lost
/// connection or dropped messages re-read everything held here; and a periodic check against
/// the database finds a change whose message was lost with nothing after it (a process killed
/// between its commit and its message), so every change reaches every stream within a few
/// seconds, also while NATS is down.
final class NATSCarrier {
    let loop: EventLoop
    let client: NATSClient
    let subjects: CarrierSubjects
    let settings: CarrierSettings
    let db: Database
    let streams: StreamService
    let feeds: FeedService
    let log: Logger
    let metrics: CarrierMetrics
    /// This process's sequencer candidate (worker 0 of each server).
    let sequencer: Sequencer?
    /// A remote cancel request arrived (wakes the webhook sender).
    var onCancelRequested: (() -> Void)?
    /// A change another server committed arrived (the publisher's cache takes it).
    var onChangeHeard: ((ChangeNotice) -> Void)?

    /// Streams here per activity: the activity's subject is listened to while any.
    private var interest: [String: Int] = [:]
    private var feedSubscribed = false
    /// When the last feed reader left (the feed subject is kept a little for the next one).
    private var feedIdleSince: Double?
    private var wakeScheduled = false
    private var checkTimer: Timer?
    private var checking = false
    /// What the last check found newer in the database: repaired at the next check if no
    /// message brought it meanwhile (a message may simply still be on its way).
    private var suspects: [String: Int64] = [:]
    private var feedSuspect: Int64?
    /// Seconds a feed subject is kept after its last reader left.
    static let feedLinger = 10.0
    /// Tests only (`DISPATCH_TEST_CARRIER_MUTE=1`): commit but never announce, as a process
    /// killed between its commit and its message would; the repairs must deliver anyway.
    private let mute = Subprocess.environment("DISPATCH_TEST_CARRIER_MUTE") == "1"

    init(loop: EventLoop, settings: CarrierSettings, db: Database, conninfo: String, streams: StreamService, feeds: FeedService,
         runsSequencer: Bool, log: Logger, name: String) {
        self.loop = loop
        self.settings = settings
        self.db = db
        self.streams = streams
        self.feeds = feeds
        self.log = log
        metrics = CarrierMetrics()
        subjects = CarrierSubjects(prefix: settings.subjectPrefix)
        client = NATSClient(loop: loop, servers: settings.servers, name: name, log: log)
        sequencer = runsSequencer ? Sequencer(loop: loop, conninfo: conninfo, log: log, metrics: metrics) : nil
    }

    func start() throws {
        client.onMessage = { [unowned self] subject, payload in self.received(subject, payload) }
        client.onStatus = { [unowned self] status in self.statusChanged(status) }
        client.onDropped = { [unowned self] reason in
            self.metrics.dropped += 1
            self.log.warning("carrier.dropped", [("reason", reason)])
            self.resyncAll(.dropped)
        }
        streams.watch = { [unowned self] id in self.watch(id) }
        streams.unwatch = { [unowned self] id in self.unwatch(id) }
        feeds.onFirstFeed = { [unowned self] in self.feedOpened() }
        feeds.onLastFeedClosed = { [unowned self] in self.feedIdleSince = Clock.monotonic() }
        feeds.awaitNumbering = { [unowned self] done in self.awaitNumbering(done) }
        if let sequencer {
            sequencer.announce = { [unowned self] message in self.publish(self.subjects.feed, message) }
            sequencer.onLeading = { [unowned self] leading in
                if leading { self.client.subscribe(self.subjects.sequencer) } else { self.client.unsubscribe(self.subjects.sequencer) }
            }
        }
        try client.start()
        sequencer?.start()
        checkTimer = loop.timer(after: settings.checkSeconds, repeating: true) { [unowned self] in self.check() }
        log.info("carrier.nats", [("servers", settings.servers.joined(separator: ",")), ("prefix", settings.subjectPrefix),
                                  ("sequencer_candidate", sequencer != nil)])
    }

    func close() {
        checkTimer?.cancel()
        checkTimer = nil
        sequencer?.stop()
        client.close()
        metrics.up = false
    }

    // MARK: - Out

    /// This worker committed a change: whoever follows the activity hears it, and the
    /// sequencer is woken (once per loop turn, however many changes the batch held).
    func committed(activityID: String, seq: Int64, event: String, json: String) {
        guard !mute else { return }
        publish(subjects.activity(activityID), CarrierMessage.encode(.init(activityID: activityID, seq: seq, event: event, json: json)))
        guard !wakeScheduled else { return }
        wakeScheduled = true
        loop.soon { [weak self] in
            guard let self else { return }
            self.wakeScheduled = false
            if let sequencer = self.sequencer, sequencer.isLeader { sequencer.woken() } else { self.publish(self.subjects.sequencer, []) }
        }
    }

    private func publish(_ subject: String, _ payload: [UInt8]) {
        if client.publish(subject, payload) {
            metrics.messagesOut += 1
            metrics.bytesOut += payload.count
        } else {
            metrics.dropped += 1
        }
    }

    // MARK: - In

    private func received(_ subject: String, _ payload: [UInt8]) {
        metrics.messagesIn += 1
        metrics.bytesIn += payload.count
        if subject == subjects.feed {
            guard let a = CarrierMessage.decodeAnnouncement(payload) else {
                return log.warning("carrier.malformed", [("subject", "feed"), ("bytes", payload.count)])
            }
            if log.enabled(.debug) { log.debug("carrier.announcement", [("after", a.after), ("through", a.through), ("changes", a.changes.count)]) }
            feeds.announced(a)
        } else if subject == subjects.sequencer {
            sequencer?.woken()
        } else if let id = subjects.activityID(inSubject: subject) {
            guard let c = CarrierMessage.decodeChange(payload), c.activityID == id else {
                return log.warning("carrier.malformed", [("subject", "activity"), ("bytes", payload.count)])
            }
            if c.event == ActivityEvent.cancelRequested { onCancelRequested?() }
            let notice = ChangeNotice(position: 0, activityID: c.activityID, seq: c.seq, event: c.event, json: c.json)
            onChangeHeard?(notice)
            streams.notified(notice)
        }
    }

    private func statusChanged(_ status: NATSClient.Status) {
        switch status {
        case .connected, .reconnected:
            let first = status == .connected
            metrics.up = true
            if !first { metrics.reconnects += 1 }
            log.info("carrier.up", [("reconnect", !first)])
            // Whatever was published while this client was away is lost to it.
            resyncAll(.reconnect)
        case .disconnected:
            metrics.up = false
            log.warning("carrier.down", [("effect", "streams and feeds follow PostgreSQL every \(settings.checkSeconds) s until NATS is back")])
        case .closed:
            metrics.up = false
        }
    }

    private func resyncAll(_ why: CarrierRepair) {
        guard streams.openStreams > 0 || feeds.openFeeds > 0 else { return }
        metrics.repairs[why, default: 0] += 1
        streams.listenRestored()
        feeds.listenRestored()
    }

    // MARK: - Interest

    private func watch(_ id: String) {
        let n = interest[id, default: 0]
        interest[id] = n + 1
        if n == 0 {
            client.subscribe(subjects.activity(id))
            metrics.subscriptions += 1
        }
    }

    private func unwatch(_ id: String) {
        guard let n = interest[id] else { return }
        if n > 1 { interest[id] = n - 1; return }
        interest[id] = nil
        suspects[id] = nil
        client.unsubscribe(subjects.activity(id))
        metrics.subscriptions -= 1
    }

    private func feedOpened() {
        feedIdleSince = nil
        guard !feedSubscribed else { return }
        feedSubscribed = true
        client.subscribe(subjects.feed)
        metrics.subscriptions += 1
    }

    // MARK: - A feed's first read

    /// Calls `done` once every change committed before now has its feed position (the rows
    /// waiting now are numbered), or after `numberingWait` seconds (no sequencer: its changes
    /// then follow the feed's `synced` as live changes, still in order). Under load a pass
    /// runs every few milliseconds, so this costs a feed a few milliseconds.
    func awaitNumbering(_ done: @escaping () -> Void) {
        db.read(CarrierSQL.waiting) { [weak self] result in
            guard let self, case .success(let r) = result, !r.rows.isEmpty else { return done() }
            let ids = r.rows.compactMap { $0["activity_id"] }, seqs = r.rows.compactMap { $0.int64("seq") }
            self.poll(ids, seqs, until: Clock.monotonic() + NATSCarrier.numberingWait, done)
        }
    }

    static let numberingWait = 2.0

    private func poll(_ ids: [String], _ seqs: [Int64], until deadline: Double, _ done: @escaping () -> Void) {
        guard Clock.monotonic() < deadline else { return done() }
        loop.timer(after: 0.01) { [weak self] in
            guard let self else { return done() }
            self.db.read(CarrierSQL.stillWaiting(ids, seqs)) { [weak self] result in
                guard let self, case .success(let r) = result, (r.first?.int64("n") ?? 0) > 0 else { return done() }
                self.poll(ids, seqs, until: deadline, done)
            }
        }
    }

    // MARK: - The check against the database

    /// Finds changes PostgreSQL holds that no message brought: for each followed activity its
    /// newest seq, for the feed the newest position. What was already newer at the previous
    /// check and still is now was lost, and is read; while NATS is down nothing is on its
    /// way, so what the check finds is read at once.
    private func check() {
        if feedSubscribed, let idle = feedIdleSince, Clock.monotonic() - idle >= NATSCarrier.feedLinger {
            feedSubscribed = false
            feedIdleSince = nil
            client.unsubscribe(subjects.feed)
            metrics.subscriptions -= 1
            feeds.carrierDetached()
            feedSuspect = nil
        }
        guard !checking, db.reader.isReady else { return }
        let carrierDown = !client.isConnected
        let topics = streams.syncedTopics
        var held: [String: Int64] = [:]
        for t in topics { held[t.topic] = t.seq }
        // Suspects from the last check that no message has brought since.
        for (id, seq) in suspects {
            if let have = held[id], have < seq {
                metrics.repairs[.check, default: 0] += 1
                streams.behind(id, seq: seq)
            }
        }
        suspects = [:]
        if let suspect = feedSuspect, let head = feeds.head, head < suspect, feeds.openFeeds > 0 {
            metrics.repairs[.check, default: 0] += 1
            feeds.announced(CarrierMessage.Announcement(after: suspect, changes: []))
        }
        feedSuspect = nil
        let wantsFeed = feedSubscribed && feeds.openFeeds > 0
        guard !topics.isEmpty || wantsFeed else { return }
        checking = true
        db.read(CarrierSQL.newer(topics, feed: wantsFeed)) { [weak self] result in
            guard let self else { return }
            self.checking = false
            guard case .success(let r) = result else { return }
            for row in r.rows {
                guard let seq = row.int64("seq") else { continue }
                if let id = row["activity_id"] {
                    if carrierDown { self.metrics.repairs[.check, default: 0] += 1; self.streams.behind(id, seq: seq) } else { self.suspects[id] = seq }
                } else if let head = self.feeds.head, seq > head {
                    // The feed row: `seq` holds the newest position.
                    if carrierDown {
                        self.metrics.repairs[.check, default: 0] += 1
                        self.feeds.announced(CarrierMessage.Announcement(after: seq, changes: []))
                    } else {
                        self.feedSuspect = seq
                    }
                }
            }
        }
    }
}

/// The carrier's statements.
enum CarrierSQL {
    /// The committed changes still without a feed position (few: the sequencer's backlog).
    static let waiting = PGQuery("SELECT activity_id, seq FROM activity_events WHERE position IS NULL LIMIT 10000",
                                 name: "carrier_waiting")

    /// How many of these changes are still without a position.
    static func stillWaiting(_ ids: [String], _ seqs: [Int64]) -> PGQuery {
        PGQuery("""
            SELECT count(*) AS n FROM unnest($1::text[], $2::bigint[]) AS c(activity_id, seq)
            JOIN activity_events e ON e.activity_id = c.activity_id AND e.seq = c.seq AND e.position IS NULL
            """, [PGArray.text(ids), PGArray.numbers(seqs)], name: "carrier_still_waiting")
    }

    /// The check (one statement: what it reads comes from one snapshot).

    /// The followed activities whose stored seq is newer than the one held, and (with `feed`)
    /// one row without an activity id whose `seq` is the newest feed position.
    static func newer(_ topics: [(topic: String, seq: Int64)], feed: Bool) -> PGQuery {
        PGQuery("""
            SELECT a.activity_id, a.seq
            FROM unnest($1::text[], $2::bigint[]) AS c(activity_id, seq)
            JOIN activities a ON a.activity_id = c.activity_id AND a.seq > c.seq
            UNION ALL
            SELECT NULL, coalesce(max(position), 0) FROM activity_events WHERE $3::boolean HAVING $3::boolean
            """, [PGArray.text(topics.map(\.topic)), PGArray.numbers(topics.map(\.seq)), feed ? "true" : "false"],
            name: "carrier_check")
    }
}
