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
    /// Worker 0 of each server: the cancel webhook sender and the stale sweeper.
    private var webhooks: WebhookService?
    private var staleSweeper: StaleSweeper?
    private var timers: [Timer] = []
    private var shuttingDown = false
    private var listenEstablished = false
    /// The supervisor that started this worker; if it dies (even by SIGKILL), so does the worker.
    var supervisor: pid_t?

    public init(config: ServerConfig, conninfo: String, index: Int, log: Logger) {
        self.config = config
        self.index = index
        self.log = log
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
    }

    /// Binds, connects, and runs the loop until SIGTERM/SIGINT.
    public func run() throws {
        signal(SIGPIPE, SIG_IGN)
        for a in config.listen {
            try http.listen(host: a.host, port: a.port, reusePort: true)
        }
        http.handler = { [unowned self] req in self.api.handle(req) }
        api.isReady = { [unowned self] in self.isReady }
        api.onKeyRevoked = { [unowned self] id in self.keyRevoked(id) }
        publisher.onCommitted = { [unowned self] event, json, _ in
            if event.name == ActivityEvent.cancelRequested { self.webhooks?.kick() }
            self.streams.committed(activityID: event.snapshot.activityId, seq: event.seq, name: event.name,
                                   json: String(decoding: json, as: UTF8.self))
        }
        db.writer.onReady = { [unowned self] in self.publisher.writerReady() }
        wireListener()
        db.start()
        listener.start()
        if index == 0 {
            // One worker prunes; concurrent servers doing the same is harmless.
            let retention = config.retentionDays * 86_400
            timers.append(loop.timer(after: min(600, retention / 4), repeating: true) { [unowned self] in self.prune() })
            startCancelAndStale()
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
                // NOTIFYs sent while the session was down are lost: catch up from history, and
                // end the streams of keys revoked meanwhile.
                if restored {
                    self.streams.listenRestored()
                    self.closeStreamsOfRevokedKeys()
                }
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
            if channel == Channel.keys {
                self.auth.invalidateAll()
                if let id = Int64(payload) { self.keyRevoked(id) }
                return
            }
            guard let notice = ChangeNotice(payload: payload) else {
                return self.log.warning("notify.malformed", [("payload_bytes", payload.utf8.count)])
            }
            if notice.event == ActivityEvent.cancelRequested { self.webhooks?.kick() }
            self.streams.notified(notice)
        }
    }

    /// A revoked key ends every stream it holds here.
    private func keyRevoked(_ id: Int64) {
        streams.closeStreams(ofKey: id)
        log.info("keys.revoked_streams_closed", [("key_id", id)])
    }

    private func closeStreamsOfRevokedKeys() {
        let held = streams.keysWithStreams
        guard !held.isEmpty else { return }
        db.read(KeySQL.revoked(among: held)) { [weak self] result in
            guard let self, case .success(let r) = result else { return }
            for row in r.rows { if let id = row.int64("id") { self.keyRevoked(id) } }
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
        staleSweeper?.stop()
        webhooks?.stop()
        loop.timer(after: 0.3) { [unowned self] in
            self.db.close()
            self.listener.close()
            self.loop.stop()
        }
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
        let sender = WebhookService(loop: loop, db: db, secret: secret, allowPrivateAddresses: config.webhookAllowPrivate, log: log, metrics: metrics)
        sender.start()
        webhooks = sender
    }

    private func prune() {
        guard db.isReady else { return }
        let cutoff = Clock.nowMilliseconds() - Int64(config.retentionDays * 86_400_000)
        publisher.activities.prune(endedBefore: cutoff) { [log] n in
            if n > 0 { log.info("retention.pruned", [("activities", n)]) }
        }
    }

    var isReady: Bool { db.isReady && listener.isReady && listenEstablished }
}
