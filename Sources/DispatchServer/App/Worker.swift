import DispatchCore
import DispatchIO
import DispatchSystem
import Glibc

/// One server process, wired: an event loop with its HTTP server, its database sessions, its
/// LISTEN session and its streams. Several workers share the port (SO_REUSEPORT).
public final class Worker {
    let config: ServerConfig
    let log: Logger
    let index: Int
    let loop = EventLoop()
    let http: HTTPServer
    let db: Database
    let listener: PGConnection
    let publisher: Publisher
    let streams: StreamService
    let feeds: FeedService
    let auth: Auth
    let api: API
    let metrics: Metrics
    /// Worker 0 of each server: the cancel webhook sender and the stale sweeper.
    private var webhooks: WebhookService?
    private var staleSweeper: StaleSweeper?
    /// Seals device tokens; nil without a token key (no devices API then).
    let vault: TokenVault?
    /// The Live Activity push sender, when APNs is configured.
    private(set) var push: PushService?
    /// How changes travel between processes: NATS when configured, else LISTEN/NOTIFY.
    private(set) var carrier: Carrier!
    private let conninfo: String
    private var timers: [Timer] = []
    private var shuttingDown = false
    private var listenEstablished = false
    private var databaseReadOnly = false
    private var accepting = false
    private var listenFailure: Error?
    /// The supervisor that started this worker; if it dies (even by SIGKILL), so does the worker.
    var supervisor: pid_t?
    /// Where the workers of this server share their states (nil: this is the only worker).
    var stateDir: String?

    public init(config: ServerConfig, conninfo: String, index: Int, log: Logger) {
        self.config = config
        self.index = index
        self.log = log
        self.conninfo = conninfo
        metrics = Metrics(worker: index, machines: MachineLabels(enabled: config.metricsMachineLabel, limit: config.metricsMachineLimit))
        var limits = HTTPLimits()
        limits.streamWriteTimeoutSeconds = max(60, config.heartbeatSeconds * 4)
        limits.connections = ConnectionPolicy(requestDeadline: config.requestDeadlineSeconds, maxPendingPerClient: config.maxPendingPerClient)
        http = HTTPServer(loop: loop, limits: limits)
        metrics.connectionsCut = { [http] in http.connectionsCut }
        metrics.connectionsOpen = { [http] in http.connectionsOpen }
        db = Database(loop: loop, conninfo: conninfo, log: log, metrics: metrics, timeout: config.dbTimeoutSeconds)
        listener = PGConnection(loop: loop, conninfo: conninfo, name: "listener", log: log, timeout: config.dbTimeoutSeconds)
        metrics.carrierUp = { [listener] in listener.isReady }
        publisher = Publisher(loop: loop, db: db, log: log, metrics: metrics, defaultStaleAfter: config.staleAfterSeconds, now: Clock.nowMilliseconds)
        publisher.commitWindowMs = Int64(config.commitWindowMs)
        publisher.maxLivePerKey = config.limits.maxLivePerKey
        publisher.maxFinishedPerKey = config.limits.maxFinishedPerKey
        streams = StreamService(loop: loop, activities: publisher.activities, metrics: metrics, log: log,
                                settings: .init(heartbeatSeconds: config.heartbeatSeconds, maxBacklog: config.streamBacklogBytes,
                                                writeTimeout: limits.streamWriteTimeoutSeconds))
        feeds = FeedService(loop: loop, repository: FeedRepository(db: db), metrics: metrics, log: log, settings: streams.settings)
        // One budget for the server, each worker holding its share.
        let memory = ReplayMemory(loop: loop, limit: config.replayMemoryBytes / max(1, config.workers), metrics: metrics)
        memory.disconnect = [.status: { [unowned streams] in streams.close($0, reason: .slowClient) },
                             .feed: { [unowned feeds] in feeds.close($0, reason: .slowClient) }]
        streams.memory = memory
        feeds.memory = memory
        auth = Auth(db: db, loop: loop, log: log, publishRate: config.publishRatePerSecond)
        api = API(config: config, log: log, metrics: metrics, db: db, publisher: publisher, streams: streams, feeds: feeds, auth: auth)
        vault = config.tokenKey.map { TokenVault(key: $0) }
        if let vault { api.devices = DevicesContext(vault: vault, pushes: config.apns != nil, limits: config.limits) }
        let changes = HeardChanges(publisher: publisher, streams: streams, feeds: feeds)
        if let settings = config.carrier {
            let c = NATSCarrier.make(loop: loop, settings: settings, db: db, conninfo: conninfo, changes: changes,
                                // Tests only: a server that commits but never numbers (a carrier switch test).
                                runsSequencer: index == 0 && Subprocess.environment("DISPATCH_TEST_SEQUENCER_OFF") != "1",
                                server: Worker.serverName(workers: config.workers), log: log,
                                name: "dispatchd-w\(index)-\(getpid())")
            metrics.carrier = c.metrics
            carrier = c
        } else {
            carrier = NotifyCarrier(loop: loop, db: db, listener: listener, changes: changes, metrics: metrics, log: log)
        }
        publisher.numbering = carrier.numbering
        changes.delegate = self
    }

    /// Binds, connects, and runs the loop until SIGTERM/SIGINT.
    public func run() throws {
        signal(SIGPIPE, SIG_IGN)
        http.handler = { [unowned self] req in self.api.handle(req) }
        api.readiness = { [unowned self] in self.serverReadiness() }
        api.serverMetrics = { [unowned self] in self.serverMetrics() }
        if let stateDir {
            timers.append(loop.timer(after: 1, repeating: true) { [unowned self] in self.publishState(stateDir) })
        }
        api.onKeyRevoked = { [unowned self] id in self.keyRevoked(id) }
        publisher.delegate = self
        try carrier.start()
        db.writer.onReady = { [unowned self] in
            self.publisher.writerReady()
            self.acceptWhenReady()
        }
        db.writer.onLost = { [unowned self] _ in self.publisher.writerLost() }
        wireListener()
        try startPush()
        db.start()
        listener.start()
        if index == 0 {
            // One worker prunes; concurrent servers doing the same is harmless.
            let retention = min(config.retentionDays, config.limits.deviceRetentionDays) * 86_400
            timers.append(loop.timer(after: min(600, retention / 4), repeating: true) { [unowned self] in self.prune() })
            startCancelAndStale()
            timers.append(loop.timer(after: Worker.liveCountSeconds, repeating: true) { [unowned self] in self.countLive() })
        }
        if let supervisor {
            timers.append(loop.timer(after: 1, repeating: true) { [unowned self] in
                if getppid() != supervisor {
                    self.log.warning("worker.orphaned", [("supervisor", supervisor)])
                    self.shutdown()
                }
            })
        }
        timers.append(loop.timer(after: 5, repeating: true) { [unowned self] in self.probeWritable() })
        // Streams end within 2 s of their key's revocation or their session's end (contract §7).
        timers.append(loop.timer(after: 1, repeating: true) { [unowned self] in self.api.recheckStreamAuthority() })
        db.reader.onReady = { [unowned self] in
            self.probeWritable()
            if self.index == 0 { self.countLive() }
            self.acceptWhenReady()
        }
        db.feedReader.onReady = { [unowned self] in
            self.db.feedReader.execute([Database.feedSessionSetup]) { _ in }
            self.acceptWhenReady()
        }
        timers.append(loop.onSignal(SIGTERM) { [unowned self] in self.shutdown() })
        timers.append(loop.onSignal(SIGINT) { [unowned self] in self.shutdown() })
        timers.append(loop.onSignal(SIGUSR1) { [unowned self] in self.feeds.dumpState() })
        timers.append(loop.onSignal(SIGHUP) { [log] in log.info("signal.hangup_ignored", [("why", "no reload: restart to apply new settings")]) })
        log.info("worker.started", [("heartbeat_s", config.heartbeatSeconds)])
        loop.run()
        if let failure = listenFailure { throw failure }
        for t in timers { t.cancel() }
        log.info("worker.stopped")
    }

    private func wireListener() {
        listener.onReady = { [unowned self] in
            // Key revocations travel through NOTIFY whatever the carrier.
            let channels = [Channel.keys] + self.carrier.channels
            self.listener.execute(channels.map { PGQuery("LISTEN \($0)") }) { result in
                guard case .success = result else { return }
                let restored = self.listenEstablished
                self.listenEstablished = true
                self.metrics.dbConnected = true
                self.auth.invalidateAll()
                // NOTIFYs sent while the session was down are lost: the carrier has what it
                // carried re-read, and the streams of keys revoked meanwhile end.
                self.carrier.listening(restored: restored)
                if restored { self.closeStreamsOfRevokedKeys() }
                self.log.info("listen.ready", [("resync", restored)])
                self.acceptWhenReady()
            }
        }
        listener.onLost = { [unowned self] reason in
            self.metrics.dbConnected = false
            self.metrics.dbReconnects += 1
            self.carrier.listenLost()
            guard !self.shuttingDown else { return }
            self.log.warning("listen.lost", [("error", reason)])
        }
        listener.onNotify = { [unowned self] channel, payload in
            self.metrics.notifyReceived += 1
            if channel == Channel.keys {
                self.auth.invalidateAll()
                if let id = Int64(payload) { self.keyRevoked(id) }
                return
            }
            self.carrier.notified(channel: channel, payload: payload)
        }
    }

    /// Starts listening once every database session is up: with SO_REUSEPORT the kernel hands
    /// connections to any listening worker, so one that cannot answer yet must not listen.
    private func acceptWhenReady() {
        guard !accepting, isReady, !shuttingDown else { return }
        accepting = true
        do {
            for a in config.listen { try http.listen(host: a.host, port: a.port, reusePort: true) }
        } catch {
            log.error("worker.listen_failed", [("error", "\(error)")])
            listenFailure = error
            return shutdown()
        }
        let addresses = config.listen.map { "\($0.host):\(http.boundPort() ?? $0.port)" }.joined(separator: ",")
        log.info("worker.listening", [("listen", addresses)])
        if let stateDir { publishState(stateDir) } else { SystemdNotify.send("READY=1\nSTATUS=serving") }
    }

    /// A revoked key ends every stream it holds here.
    private func keyRevoked(_ id: Int64) {
        streams.closeStreams(ofKey: id)
        feeds.closeStreams(ofKey: id)
        log.info("keys.revoked_streams_closed", [("key_id", id)])
    }

    private func closeStreamsOfRevokedKeys() {
        let held = Array(Set(streams.keysWithStreams + feeds.keysWithStreams))
        guard !held.isEmpty else { return }
        db.read(KeySQL.revoked(among: held)) { [weak self] result in
            guard let self, case .success(let r) = result else { return }
            for row in r.rows { if let id = row.int64("id") { self.keyRevoked(id) } }
        }
    }

    /// Stops accepting, ends every stream (each told when to come back), answers the publishes
    /// in flight, then leaves the loop; whatever is left at DISPATCH_SHUTDOWN_TIMEOUT is cut.
    func shutdown() {
        guard !shuttingDown else { return }
        shuttingDown = true
        api.isShuttingDown = true
        let started = Clock.monotonic()
        log.info("worker.shutdown", [("streams", streams.openStreams), ("feeds", feeds.openFeeds)])
        if stateDir == nil { SystemdNotify.send("STOPPING=1") }
        http.stopListening()
        let (streamCount, feedCount) = (streams.openStreams, feeds.openFeeds)
        streams.shutdown(alongside: feedCount)
        feeds.shutdown(alongside: streamCount)
        streams.memory?.shutdown()
        auth.stop()
        staleSweeper?.stop()
        webhooks?.stop()
        push?.shutdown()
        func finish() {
            publisher.stop()
            carrier.close()
            push?.close()
            db.close()
            listener.close()
            loop.stop()
        }
        // Give the streams' last bytes and the publishes in flight their time, then go.
        timers.append(loop.timer(after: 0.1, repeating: true) { [unowned self] in
            let late = Clock.monotonic() - started >= self.config.shutdownTimeoutSeconds
            guard late || (self.publisher.isIdle && Clock.monotonic() - started >= 0.3) else { return }
            if late { self.log.warning("worker.shutdown_timeout", [("after_s", self.config.shutdownTimeoutSeconds)]) }
            finish()
        })
    }

    /// Contract §5.3-5.4: one sender and one sweeper per server process; both are safe with
    /// any number of servers on one database.
    private func startCancelAndStale() {
        let sweeper = StaleSweeper(loop: loop, db: db, publisher: publisher, log: log, metrics: metrics, now: Clock.nowMilliseconds)
        sweeper.start()
        staleSweeper = sweeper
        guard let secret = WebhookSecret.resolve(config) else {
            return log.warning("webhooks.disabled", [("why", "no DISPATCH_WEBHOOK_SECRET"), ("effect", "cancel webhooks wait in the outbox")])
        }
        let sender = WebhookService(loop: loop, db: db, secret: secret, allowPrivateAddresses: config.webhookAllowPrivate,
                                    retentionDays: config.retentionDays, log: log, metrics: metrics, attemptTimeout: config.webhookTimeoutSeconds,
                                    makeClient: { [loop] in CurlClient(loop: loop, options: $0) })
        sender.start()
        webhooks = sender
    }

    private func prune() {
        guard db.isReady else { return }
        let cutoff = Clock.nowMilliseconds() - Int64(config.retentionDays * 86_400_000)
        publisher.activities.prune(endedBefore: cutoff) { [log] n in
            if n > 0 { log.info("retention.pruned", [("activities", n)]) }
        }
        if vault != nil {
            let devicesAfter = Int64(config.limits.deviceRetentionDays * 86_400)
            db.read(DeviceRepository.retention(nowMs: Clock.nowMilliseconds(), deviceRetentionS: devicesAfter),
                    timeout: db.backgroundTimeout) { [log] result in
                guard case .success(let r) = result, let row = r.first else { return }
                let tokens = row.int("tokens") ?? 0, rows = row.int("rows") ?? 0, devices = row.int("devices") ?? 0
                if tokens + rows + devices > 0 {
                    log.info("retention.push_pruned", [("activity_tokens", tokens), ("outbox_rows", rows), ("devices", devices)])
                }
            }
        }
    }

    /// With APNs configured: the sender, and the publisher marking the outbox for it.
    private func startPush() throws {
        guard let apns = config.apns, let vault else { return }
        // Its claims, reads and marks are small and a push waits on each: handled before the
        // turn's other ready work, as its APNs connection's answers are.
        let sender = PushService(loop: loop, driver: LibpqDriver(loop: loop, priority: .urgent), conninfo: conninfo, settings: apns, signer: try apns.loadSigner(),
                                 vault: vault, dismissalSeconds: config.pushDismissalSeconds, leaseSeconds: config.pushLeaseSeconds, log: log,
                                 makeClient: { [loop] in H2Client(loop: loop, options: $0) })
        push = sender
        metrics.push = sender.metrics
        publisher.pushes = true
        api.devices?.kick = { [unowned sender] in sender.kick() }
        sender.start()
    }

    var isReady: Bool { db.isReady && listener.isReady && listenEstablished }

    /// What names this server among all, for the NATS carrier's wake-ups of its numbering pass:
    /// host name and the supervisor's pid (the worker's own when it runs alone).
    static func serverName(workers: Int) -> String {
        var buffer = [CChar](repeating: 0, count: 256)
        let host = gethostname(&buffer, buffer.count - 1) == 0
            ? String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self) : "host"
        return "\(host):\(workers > 1 ? getppid() : getpid())"
    }

    /// Seconds between two counts of the live activities for `/metrics` (one grouped query).
    static let liveCountSeconds = 10.0

    private func countLive() {
        guard db.reader.isReady else { return }
        db.read(PGQuery(metrics.jobs.liveQuery, name: "metrics_live")) { [weak self] result in
            guard let self, case .success(let r) = result else { return }
            self.metrics.jobs.counted(r.rows.compactMap { row in
                guard let state = row["state"], let n = row.int("n") else { return nil }
                return (state, row["machine"], n)
            })
        }
    }

    // MARK: - The whole server's figures

    /// This worker's state for its siblings: readiness and metrics, every second.
    private func publishState(_ dir: String) {
        WorkerState(index: index, pid: getpid(), readiness: readiness, at: Clock.nowMilliseconds(),
                    metrics: metrics.render(process: ProcessFigures.current())).write(to: dir)
    }

    /// Ready when every worker is: a sibling whose state is missing or older than 3 s is not.
    func serverReadiness() -> (Readiness, worker: Int?) {
        guard readiness == .ready else { return (readiness, index) }
        guard let stateDir else { return (.ready, nil) }
        let states = WorkerState.read(stateDir, count: config.workers, now: Clock.nowMilliseconds(), freshness: 3)
        for i in 0..<config.workers where i != index {
            guard let s = states[i] else { return (.databaseUnavailable, i) }
            if s.readiness != .ready { return (s.readiness, i) }
        }
        return (.ready, nil)
    }

    /// Every worker's figures summed (this one's live, the others' from their last second).
    func serverMetrics() -> String {
        let own = metrics.render(process: ProcessFigures.current())
        guard let stateDir else { return MetricsMerge.merge([own]) }
        let others = WorkerState.read(stateDir, count: config.workers, now: Clock.nowMilliseconds(), freshness: 5)
            .filter { $0.key != index }.sorted { $0.key < $1.key }.map(\.value.metrics)
        return MetricsMerge.merge([own] + others)
    }

    var readiness: Readiness {
        guard isReady else { return .databaseUnavailable }
        if publisher.writesRefused || databaseReadOnly { return .writesRefused }
        return carrier.isHealthy ? .ready : .carrierUnavailable
    }

    /// Asks the database every few seconds whether it would refuse writes (a read-only
    /// setting, a standby); a refused publish says so at once (out of space).
    private func probeWritable() {
        guard db.reader.isReady else { return }
        db.read(Database.writableProbe) { [weak self] result in
            guard let self, case .success(let r) = result else { return }
            let readOnly = r.first?.bool("read_only") ?? false
            if readOnly != self.databaseReadOnly {
                self.log.warning("database.writable", [("writable", !readOnly)])
                if !readOnly { self.publisher.writesRefused = false }
            }
            self.databaseReadOnly = readOnly
        }
    }
}

extension Worker: PublisherDelegate, CarrierDelegate {
    /// After each commit here, before the publisher is answered.
    func publisherCommitted(_ event: ActivityEvent, json: [UInt8]) {
        metrics.jobs.committed(event)
        if event.name == .cancelRequested { webhooks?.kick() }
        carrier.committed(event, json: json)
    }

    func publisherMarkedPushes() { push?.kick() }

    func carrierHeardCancelRequest() { webhooks?.kick() }
}
