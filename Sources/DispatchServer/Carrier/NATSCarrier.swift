import DispatchCore
import DispatchIO
import DispatchSystem
import Glibc

/// Wake-ups between server processes over NATS (contract §10), for one worker.
///
/// NATS carries hints, never the truth. After its commit a worker publishes on the activity's
/// subject only "this activity changed, seq ≥ N", and wakes its server's numbering pass;
/// whichever server numbers positions publishes only "positions up to P exist". A worker that
/// hears a hint reads the change from PostgreSQL (one statement for all the hints of a turn)
/// and sends what it read. So a message copied off the wire and altered, or made up, changes
/// nothing any client sees: at worst it costs a read. No snapshot crosses NATS.
///
/// NATS is at-most-once, so it is not trusted for completeness either: a periodic check
/// against the database finds what a lost hint did not bring (a process killed between its
/// commit and its message, a partition) within a few seconds; a lost connection, dropped
/// messages or a carrier that stops delivering (the liveness probe) re-read everything held.
final class NATSCarrier: Carrier, StreamInterest, FeedInterest, SequencerDelegate, NATSClientDelegate {
    let loop: LoopScheduling
    let client: CarrierClient
    let subjects: CarrierSubjects
    let settings: CarrierSettings
    let db: Database
    /// What a hint reaches here (the streams and feeds it wakes).
    let changes: HeardChanges
    var streams: StreamService { changes.streams }
    var feeds: FeedService { changes.feeds }
    let log: Logger
    let metrics: CarrierMetrics
    /// This server's numbering passes (worker 0 of each server).
    let sequencer: Sequencer?

    /// Streams here per activity: the activity's subject is listened to while any.
    private var interest: [String: Int] = [:]
    private var feedSubscribed = false
    /// When the last feed reader left (the feed subject is kept a little for the next one).
    private var feedIdleSince: Double?
    private var wakeScheduled = false
    private var timers: [Timer] = []
    private var checking = false
    /// What the last check found newer in the database: repaired at the next check if no
    /// hint brought it meanwhile (a hint may simply still be on its way).
    private var suspects: [String: Int64] = [:]
    private var feedSuspect: Int64?
    /// The retention horizon last read: when it moves, pruned ids may be used again.
    private var horizon: Int64?
    private var probe = CarrierProbe()
    /// This process's probe subject and the nonce its probes carry.
    private let probeSubject: String
    private let probeNonce = UInt64.random(in: 1...UInt64.max)
    /// Seconds a feed subject is kept after its last reader left.
    static let feedLinger = 10.0
    /// Tests only (`DISPATCH_TEST_CARRIER_MUTE=1`): commit but never announce, as a process
    /// killed between its commit and its message would; the repairs must deliver anyway.
    private let mute = Subprocess.environment("DISPATCH_TEST_CARRIER_MUTE") == "1"

    /// `server`: what names this server among all (its numbering pass's wake-up subject);
    /// `name`: this worker's (its probe's subject). `sequencer`: this server's numbering passes
    /// (worker 0), sharing `metrics`.
    init(loop: LoopScheduling, client: CarrierClient, settings: CarrierSettings, db: Database, changes: HeardChanges,
         sequencer: Sequencer?, metrics: CarrierMetrics, server: String, log: Logger, name: String) {
        self.loop = loop
        self.client = client
        self.settings = settings
        self.db = db
        self.changes = changes
        self.sequencer = sequencer
        self.metrics = metrics
        self.log = log
        subjects = CarrierSubjects(prefix: settings.subjectPrefix)
        sequencerSubject = subjects.sequencer + "." + CarrierSubjects.token(server)
        probeSubject = subjects.probe(CarrierSubjects.token(name))
    }

    /// The carrier of a worker of dispatchd: libnats on its loop, and (worker 0) the passes'
    /// own PostgreSQL session.
    static func make(loop: EventLoop, settings: CarrierSettings, db: Database, conninfo: String, changes: HeardChanges,
                     runsSequencer: Bool, server: String, log: Logger, name: String) -> NATSCarrier {
        var options = NATSClient.Options()
        options.pingInterval = 1
        let client = NATSClient(loop: loop, servers: settings.servers, name: name, log: log, options: options, security: settings.security)
        let metrics = CarrierMetrics()
        let sequencer = runsSequencer
            ? Sequencer(loop: loop, session: PGConnection(loop: loop, conninfo: conninfo, name: "sequencer", log: log), log: log, metrics: metrics)
            : nil
        return NATSCarrier(loop: loop, client: client, settings: settings, db: db, changes: changes, sequencer: sequencer,
                           metrics: metrics, server: server, log: log, name: name)
    }

    /// Wakes this server's numbering pass.
    private let sequencerSubject: String

    func start() throws(SystemError) {
        client.delegate = self
        streams.interest = self
        feeds.interest = self
        client.subscribe(subjects.starts)
        client.subscribe(probeSubject)
        if let sequencer {
            sequencer.delegate = self
            client.subscribe(sequencerSubject)
        }
        try client.start()
        sequencer?.start()
        timers.append(loop.timer(after: settings.checkSeconds, repeating: true) { [unowned self] in self.check() })
        timers.append(loop.timer(after: probe.settings.interval / 2, repeating: true) { [unowned self] in
            self.perform(self.probe.tick(now: self.loop.now))
        })
        log.info("carrier.nats", [("servers", settings.servers.map(NATSClient.redacted).joined(separator: ",")),
                                  ("prefix", settings.subjectPrefix), ("numbers_positions", sequencer != nil),
                                  ("trusts", "nothing: hints only, every change is read from PostgreSQL")])
    }

    func close() {
        for t in timers { t.cancel() }
        timers = []
        sequencer?.stop()
        client.close()
        metrics.up = false
    }

    /// Whether hints arrive: connected, and the probes come back.
    var isDelivering: Bool { client.isConnected && !probe.isStalled }

    /// What `/readyz` says: a carrier that is connected but silent, or that refuses this
    /// server's credentials, is a fault to see; NATS merely down (restarting, failing over) is
    /// not, since streams and feeds follow PostgreSQL meanwhile.
    var isHealthy: Bool { !probe.isStalled && !client.credentialsRefused }

    // MARK: - Out

    /// NATS carries hints; positions come from the sequencer after the commit.
    var numbering: FeedNumbering { .bySequencer }

    /// Changes do not travel through NOTIFY with this carrier.
    var channels: [String] { [] }

    func notified(channel: String, payload: String) {}

    /// The LISTEN session (key revocations only here) came back: re-read what is held, as
    /// after any loss.
    func listening(restored: Bool) {
        if restored { changes.resync() }
    }

    func listenLost() {}

    /// This worker committed a change: its own streams have it at once; whoever follows the
    /// activity elsewhere is told where to look, and this server's numbering pass is woken
    /// (once per loop turn, however many changes).
    func committed(_ event: ActivityEvent, json: [UInt8]) {
        changes.committedHere(event, json: json)
        announce(activityID: event.snapshot.activityId, seq: event.seq, event: event.name.rawValue)
    }

    /// The hint of a commit, without its snapshot.
    func announce(activityID: String, seq: Int64, event: String) {
        guard !mute else { return }
        publish(subjects.activity(activityID), CarrierMessage.encode(.init(seq: seq, event: event)))
        if seq == 1 { publish(subjects.starts, Array(activityID.utf8)) }
        guard !wakeScheduled else { return }
        wakeScheduled = true
        loop.soon { [weak self] in
            guard let self else { return }
            self.wakeScheduled = false
            if let sequencer = self.sequencer { sequencer.woken() } else { self.publish(self.sequencerSubject, []) }
        }
    }

    /// This server's numbering pass gave positions up to `through`: every feed reader is told.
    func positionsNumbered(through: Int64) {
        publish(subjects.feed, CarrierMessage.feedHint(through: through))
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

    func natsDropped(_ reason: String) {
        metrics.dropped += 1
        log.warning("carrier.dropped", [("reason", reason)])
        resyncAll(.dropped)
    }

    func natsReceived(_ subject: String, _ payload: [UInt8]) {
        metrics.messagesIn += 1
        metrics.bytesIn += payload.count
        if subject == subjects.feed {
            guard let through = CarrierMessage.decodeFeedHint(payload) else { return malformed("feed", payload) }
            changes.positionsExist(through: through)
        } else if subject == sequencerSubject {
            sequencer?.woken()
        } else if subject == subjects.starts {
            let id = String(decoding: payload, as: UTF8.self)
            guard Validation.isValidActivityID(id) else { return malformed("starts", payload) }
            changes.started(id)
        } else if subject == probeSubject {
            let parts = payload.split(separator: UInt8(ascii: " "))
            guard parts.count == 2, UInt64(String(decoding: parts[1], as: UTF8.self)) == probeNonce,
                  let n = UInt64(String(decoding: parts[0], as: UTF8.self)) else { return malformed("probe", payload) }
            perform(probe.heard(n, now: loop.now))
            metrics.probeRoundTrip = probe.lastRoundTrip
        } else if let id = subjects.activityID(inSubject: subject) {
            guard let hint = CarrierMessage.decodeActivityHint(payload) else { return malformed("activity", payload) }
            changes.hinted(id, seq: hint.seq, event: hint.event)
        }
    }

    private func malformed(_ kind: String, _ payload: [UInt8]) {
        metrics.malformed += 1
        log.warning("carrier.malformed", [("subject", kind), ("bytes", payload.count)])
    }

    func natsStatusChanged(_ status: NATSClient.Status) {
        switch status {
        case .connected, .reconnected:
            let first = status == .connected
            metrics.up = true
            if !first { metrics.reconnects += 1 }
            log.info("carrier.up", [("reconnect", !first)])
            perform(probe.connected(now: loop.now))
            // Whatever was published while this client was away is lost to it.
            resyncAll(.reconnect)
        case .disconnected:
            metrics.up = false
            probe.disconnected()
            log.warning("carrier.down", [("effect", "streams and feeds follow PostgreSQL every \(settings.checkSeconds) s until NATS is back")])
        case .closed:
            metrics.up = false
            probe.disconnected()
        }
    }

    private func perform(_ actions: [CarrierProbe.Action]) {
        for action in actions {
            switch action {
            case .send(let n):
                publish(probeSubject, Array("\(n) \(probeNonce)".utf8))
            case .stalled:
                metrics.stalled = true
                metrics.stalls += 1
                log.warning("carrier.stalled", [("carrier", "nats"), ("server", client.connectedServer.map(NATSClient.redacted) ?? "-"),
                                                ("effect", "streams and feeds follow PostgreSQL until its probes come back")])
                // The library's pings (every second) and its write deadline drop a server that
                // stopped answering and fail over; meanwhile the check reads at once.
                resyncAll(.stalled)
            case .recovered:
                metrics.stalled = false
                log.info("carrier.recovered", [("carrier", "nats")])
            }
        }
    }

    private func resyncAll(_ why: CarrierRepair) {
        guard streams.openStreams > 0 || feeds.openFeeds > 0 else { return }
        metrics.repairs[why, default: 0] += 1
        changes.resync()
    }

    // MARK: - Interest

    func watch(_ id: String) {
        let n = interest[id, default: 0]
        interest[id] = n + 1
        if n == 0 {
            client.subscribe(subjects.activity(id))
            metrics.subscriptions += 1
        }
    }

    func unwatch(_ id: String) {
        guard let n = interest[id] else { return }
        if n > 1 { interest[id] = n - 1; return }
        interest[id] = nil
        suspects[id] = nil
        client.unsubscribe(subjects.activity(id))
        metrics.subscriptions -= 1
    }

    func feedsClosed() { feedIdleSince = loop.now }

    func feedOpened() {
        feedIdleSince = nil
        guard !feedSubscribed else { return }
        feedSubscribed = true
        client.subscribe(subjects.feed)
        metrics.subscriptions += 1
    }

    // MARK: - A feed's first read

    /// Calls `done` once every change committed before now has its feed position (the rows
    /// waiting now are numbered), or after `numberingWait` seconds (its changes then follow
    /// the feed's `synced` as live changes, still in order). Under load a pass runs every few
    /// milliseconds, so this costs a feed a few milliseconds.
    func awaitNumbering(_ done: @escaping () -> Void) {
        db.read(CarrierSQL.waiting) { [weak self] result in
            guard let self, case .success(let r) = result, !r.rows.isEmpty else { return done() }
            let ids = r.rows.compactMap { $0["activity_id"] }, seqs = r.rows.compactMap { $0.int64("seq") }
            self.poll(ids, seqs, until: self.loop.now + NATSCarrier.numberingWait, done)
        }
    }

    static let numberingWait = 2.0

    private func poll(_ ids: [String], _ seqs: [Int64], until deadline: Double, _ done: @escaping () -> Void) {
        guard loop.now < deadline else { return done() }
        loop.timer(after: 0.01) { [weak self] in
            guard let self else { return done() }
            self.db.read(CarrierSQL.stillWaiting(ids, seqs)) { [weak self] result in
                guard let self, case .success(let r) = result, (r.first?.int64("n") ?? 0) > 0 else { return done() }
                self.poll(ids, seqs, until: deadline, done)
            }
        }
    }

    // MARK: - The check against the database

    /// Finds changes PostgreSQL holds that no hint brought: for each followed activity its
    /// newest seq, for the feed the newest position. What was already newer at the previous
    /// check and still is now was lost, and is read; while NATS is down or stalled nothing is
    /// on its way, so what the check finds is read at once. Also watches the retention
    /// horizon: once it moves, final events held in memory may belong to pruned ids.
    private func check() {
        if feedSubscribed, let idle = feedIdleSince, loop.now - idle >= NATSCarrier.feedLinger {
            feedSubscribed = false
            feedIdleSince = nil
            client.unsubscribe(subjects.feed)
            metrics.subscriptions -= 1
            feeds.carrierDetached()
            feedSuspect = nil
        }
        guard !checking, db.reader.isReady else { return }
        let carrierDown = !isDelivering
        let topics = streams.syncedTopics
        var held: [String: Int64] = [:]
        for t in topics { held[t.topic] = t.seq }
        // Suspects from the last check that no hint has brought since.
        for (id, seq) in suspects {
            if let have = held[id], have < seq {
                metrics.repairs[.check, default: 0] += 1
                streams.hinted(id, seq: seq)
            }
        }
        suspects = [:]
        if let suspect = feedSuspect, let head = feeds.head, head < suspect, feeds.openFeeds > 0 {
            metrics.repairs[.check, default: 0] += 1
            feeds.hinted(position: suspect)
        }
        feedSuspect = nil
        let wantsFeed = feedSubscribed && feeds.openFeeds > 0
        checking = true
        db.read(CarrierSQL.newer(topics, feed: wantsFeed)) { [weak self] result in
            guard let self else { return }
            self.checking = false
            guard case .success(let r) = result else { return }
            for row in r.rows {
                guard let seq = row.int64("seq") else { continue }
                switch row["kind"] {
                case "activity":
                    guard let id = row["activity_id"] else { continue }
                    if carrierDown { self.metrics.repairs[.check, default: 0] += 1; self.streams.hinted(id, seq: seq) } else { self.suspects[id] = seq }
                case "feed":
                    guard let head = self.feeds.head, seq > head else { continue }
                    if carrierDown {
                        self.metrics.repairs[.check, default: 0] += 1
                        self.feeds.hinted(position: seq)
                    } else {
                        self.feedSuspect = seq
                    }
                case "horizon":
                    if let h = self.horizon, seq != h { self.streams.forgetAllFinished() }
                    self.horizon = seq
                default:
                    continue
                }
            }
        }
    }
}

/// The carrier's statements.
enum CarrierSQL {
    /// The committed changes still without a feed position (few: the passes' backlog).
    static let waiting = PGQuery("SELECT activity_id, seq FROM activity_events WHERE position IS NULL LIMIT 10000",
                                 name: "carrier_waiting")

    /// How many of these changes are still without a position.
    static func stillWaiting(_ ids: [String], _ seqs: [Int64]) -> PGQuery {
        PGQuery("""
            SELECT count(*) AS n FROM unnest($1::text[], $2::bigint[]) AS c(activity_id, seq)
            CROSS JOIN LATERAL (SELECT 1 FROM activity_events e
                                WHERE e.activity_id = c.activity_id AND e.seq = c.seq AND e.position IS NULL LIMIT 1) e
            """, [PGArray.text(ids), PGArray.numbers(seqs)], name: "carrier_still_waiting")
    }

    /// The check, in one statement (what it reads comes from one snapshot): the followed
    /// activities whose stored seq is newer than the one held; with `feed`, the newest feed
    /// position; and the retention horizon.
    static func newer(_ topics: [(topic: String, seq: Int64)], feed: Bool) -> PGQuery {
        PGQuery("""
            SELECT 'activity' AS kind, a.activity_id, a.seq
            FROM unnest($1::text[], $2::bigint[]) AS c(activity_id, seq)
            CROSS JOIN LATERAL (SELECT a.activity_id, a.seq FROM activities a
                                WHERE a.activity_id = c.activity_id AND a.seq > c.seq LIMIT 1) a
            UNION ALL
            SELECT 'feed', NULL, coalesce(max(position), 0) FROM activity_events WHERE $3::boolean HAVING $3::boolean
            UNION ALL
            SELECT 'horizon', NULL, position FROM feed_horizon
            """, [PGArray.text(topics.map(\.topic)), PGArray.numbers(topics.map(\.seq)), feed ? "true" : "false"],
            name: "carrier_check")
    }
}

/// What the carrier needs of its NATS client: `NATSClient` in dispatchd, an in-memory fake in
/// tests (`NATSCarrierShellTests`).
protocol CarrierClient: AnyObject {
    var delegate: NATSClientDelegate? { get set }
    var isConnected: Bool { get }
    var credentialsRefused: Bool { get }
    var connectedServer: String? { get }
    func start() throws(SystemError)
    func close()
    @discardableResult func publish(_ subject: String, _ payload: [UInt8]) -> Bool
    func subscribe(_ subject: String)
    func unsubscribe(_ subject: String)
}

extension NATSClient: CarrierClient {}
