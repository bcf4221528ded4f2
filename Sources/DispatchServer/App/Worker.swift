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
    let auth: Auth
    let api: API
    let metrics: Metrics
    /// Seals device tokens; nil without a token key (no devices API then).
    let vault: TokenVault?
    /// The Live Activity push sender, when APNs is configured.
    private(set) var push: PushService?
    private let conninfo: String
    private var timers: [Timer] = []
    private var shuttingDown = false
    private var listenEstablished = false
    /// The supervisor that started this worker; if it dies (even by SIGKILL), so does the worker.
    var supervisor: pid_t?

    public init(config: ServerConfig, conninfo: String, index: Int, log: Logger) {
        self.config = config
        self.index = index
        self.log = log
        self.conninfo = conninfo
        metrics = Metrics(worker: index)
        var limits = HTTPLimits()
        limits.streamWriteTimeoutSeconds = max(60, config.heartbeatSeconds * 4)
        http = HTTPServer(loop: loop, limits: limits)
        db = Database(loop: loop, conninfo: conninfo, log: log, metrics: metrics)
        listener = PGConnection(loop: loop, conninfo: conninfo, name: "listener", log: log)
        publisher = Publisher(db: db, log: log, metrics: metrics, defaultStaleAfter: config.staleAfterSeconds, now: Clock.nowMilliseconds)
        streams = StreamService(loop: loop, activities: publisher.activities, publisher: publisher, metrics: metrics, log: log,
                                settings: .init(heartbeatSeconds: config.heartbeatSeconds, maxBacklog: config.streamBacklogBytes,
                                                writeTimeout: limits.streamWriteTimeoutSeconds))
        auth = Auth(db: db, loop: loop, log: log, publishRate: config.publishRatePerSecond)
        api = API(config: config, log: log, metrics: metrics, db: db, publisher: publisher, streams: streams, auth: auth)
        vault = config.tokenKey.map { TokenVault(key: $0) }
        if let vault { api.devices = DevicesContext(vault: vault, pushes: config.apns != nil) }
    }

    /// Binds, connects, and runs the loop until SIGTERM/SIGINT.
    public func run() throws {
        signal(SIGPIPE, SIG_IGN)
        for a in config.listen {
            try http.listen(host: a.host, port: a.port, reusePort: true)
        }
        http.handler = { [unowned self] req in self.api.handle(req) }
        api.isReady = { [unowned self] in self.isReady }
        publisher.onCommitted = { [unowned self] event, json, _ in
            self.streams.committed(activityID: event.snapshot.activityId, seq: event.seq, name: event.name,
                                   json: String(decoding: json, as: UTF8.self))
        }
        db.writer.onReady = { [unowned self] in self.publisher.writerReady() }
        wireListener()
        try startPush()
        db.start()
        listener.start()
        if index == 0 {
            // One worker prunes; concurrent servers doing the same is harmless.
            let retention = config.retentionDays * 86_400
            timers.append(loop.timer(after: min(600, retention / 4), repeating: true) { [unowned self] in self.prune() })
        }
        if let supervisor {
            timers.append(loop.timer(after: 1, repeating: true) { [unowned self] in
                if getppid() != supervisor {
                    self.log.warning("worker.orphaned", [("supervisor", supervisor)])
                    self.shutdown()
                }
            })
        }
        timers.append(loop.onSignal(SIGTERM) { [unowned self] in self.shutdown() })
        timers.append(loop.onSignal(SIGINT) { [unowned self] in self.shutdown() })
        let addresses = config.listen.map { "\($0.host):\(http.boundPort() ?? $0.port)" }.joined(separator: ",")
        log.info("worker.listening", [("listen", addresses), ("heartbeat_s", config.heartbeatSeconds)])
        loop.run()
        for t in timers { t.cancel() }
        log.info("worker.stopped")
    }

    private func wireListener() {
        listener.onReady = { [unowned self] in
            self.listener.execute([PGQuery("LISTEN \(Channel.events)"), PGQuery("LISTEN \(Channel.keys)")]) { result in
                guard case .success = result else { return }
                let restored = self.listenEstablished
                self.listenEstablished = true
                self.metrics.dbConnected = true
                self.auth.invalidateAll()
                // NOTIFYs sent while the session was down are lost: catch up from history.
                if restored { self.streams.listenRestored() }
                self.log.info("listen.ready", [("resync", restored)])
            }
        }
        listener.onLost = { [unowned self] reason in
            self.metrics.dbConnected = false
            self.metrics.dbReconnects += 1
            guard !self.shuttingDown else { return }
            self.log.warning("listen.lost", [("error", reason)])
        }
        listener.onNotify = { [unowned self] channel, payload in
            self.metrics.notifyReceived += 1
            if channel == Channel.keys { self.auth.invalidateAll(); return }
            guard let notice = ChangeNotice(payload: payload) else {
                return self.log.warning("notify.malformed", [("payload_bytes", payload.utf8.count)])
            }
            self.streams.notified(notice)
        }
    }

    /// Stops accepting, ends every stream, lets pending answers flush, then leaves the loop.
    func shutdown() {
        guard !shuttingDown else { return }
        shuttingDown = true
        api.isShuttingDown = true
        log.info("worker.shutdown", [("streams", streams.openStreams)])
        http.stopListening()
        streams.shutdown()
        auth.flushUsed()
        push?.shutdown()
        loop.timer(after: 0.3) { [unowned self] in
            self.push?.close()
            self.db.close()
            self.listener.close()
            self.loop.stop()
        }
    }

    private func prune() {
        guard db.isReady else { return }
        let cutoff = Clock.nowMilliseconds() - Int64(config.retentionDays * 86_400_000)
        publisher.activities.prune(endedBefore: cutoff) { [log] n in
            if n > 0 { log.info("retention.pruned", [("activities", n)]) }
        }
        if vault != nil {
            db.read(DeviceRepository.retention(nowMs: Clock.nowMilliseconds())) { [log] result in
                guard case .success(let r) = result, let row = r.first else { return }
                let tokens = row.int("tokens") ?? 0, rows = row.int("rows") ?? 0
                if tokens + rows > 0 { log.info("retention.push_pruned", [("activity_tokens", tokens), ("outbox_rows", rows)]) }
            }
        }
    }

    /// With APNs configured: the sender, and the publisher marking the outbox for it.
    private func startPush() throws {
        guard let apns = config.apns, let vault else { return }
        let sender = PushService(loop: loop, conninfo: conninfo, settings: apns, signer: try apns.loadSigner(), vault: vault,
                                 dismissalSeconds: config.pushDismissalSeconds, leaseSeconds: config.pushLeaseSeconds, log: log)
        push = sender
        metrics.push = sender.metrics
        publisher.pushes = true
        publisher.onPushesMarked = { [unowned sender] in sender.kick() }
        api.devices?.kick = { [unowned sender] in sender.kick() }
        sender.start()
    }

    var isReady: Bool { db.isReady && listener.isReady && listenEstablished }
}
