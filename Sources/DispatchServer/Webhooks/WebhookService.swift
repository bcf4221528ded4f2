import DispatchCore
import DispatchCrypto
import DispatchIO
import DispatchSystem

/// The shell of `WebhookSender`: claims outbox rows on the worker's reader session, signs each
/// attempt when it is sent (`Dispatch-Signature: t=<now>,v1=<HMAC-SHA256("t.body")>`), POSTs it
/// over libcurl in the event loop, and marks the row. One per server process (worker 0); several
/// servers share the outbox safely (see WebhookSQL).
final class WebhookService {
    /// Seconds per attempt, connecting included (DISPATCH_WEBHOOK_TIMEOUT, default 10). The
    /// connect and the wait for the answer's first byte each get less, so a receiver that
    /// accepts and never answers frees its slot before the whole deadline.
    let attemptTimeout: Double
    /// Deliveries in flight at once per owning key, and per destination (host and port).
    static let perKey = 8
    static let perHost = 4

    let loop: LoopScheduling
    let db: Database
    let log: Logger
    let metrics: Metrics
    private let secret: [UInt8]
    private let client: HTTPRequestSending
    private var machine: WebhookSender
    private var timers: [Timer] = []
    private var rng = SystemRandomNumberGenerator()

    /// Days finished deliveries are kept (the activities' retention).
    let retentionDays: Double

    /// `makeClient` builds the HTTP client from the options webhooks need (`CurlClient` on the
    /// worker's loop; a scripted sender in unit tests).
    init(loop: LoopScheduling, db: Database, secret: String, allowPrivateAddresses: Bool, retentionDays: Double, log: Logger, metrics: Metrics,
         attemptTimeout: Double = 10, makeClient: (CurlClient.Options) -> HTTPRequestSending) {
        self.retentionDays = retentionDays
        self.attemptTimeout = attemptTimeout
        machine = WebhookSender(perKey: WebhookService.perKey, perHost: WebhookService.perHost)
        self.loop = loop
        self.db = db
        self.secret = Array(secret.utf8)
        self.log = log
        self.metrics = metrics
        var options = CurlClient.Options.webhooks
        options.allowPrivateAddresses = allowPrivateAddresses
        options.connectTimeout = min(5, attemptTimeout / 2)
        options.stallTimeout = max(1, Int((attemptTimeout * 0.6).rounded(.down)))
        options.maxHostConnections = WebhookService.perHost
        options.userAgent = "dispatch-webhook"
        client = makeClient(options)
    }

    /// Polls for due rows every `interval` seconds (a cancel on this server, or NOTIFY of one on
    /// another, calls `kick` so a new request does not wait for the poll).
    func start(interval: Double = 1) {
        timers.append(loop.timer(after: interval, repeating: true) { [weak self] in self?.kick() })
        timers.append(loop.timer(after: 0.1) { [weak self] in self?.countPending() })
        timers.append(loop.timer(after: 10, repeating: true) { [weak self] in self?.countPending() })
        timers.append(loop.timer(after: 600, repeating: true) { [weak self] in self?.prune() })
    }

    private func prune() {
        guard db.reader.isReady else { return }
        db.read(WebhookSQL.prune(olderThanDays: retentionDays)) { [log] result in
            if case .success(let r) = result, r.affectedRows > 0 { log.info("webhook.pruned", [("deliveries", r.affectedRows)]) }
        }
    }

    func kick() {
        guard db.reader.isReady else { return }
        perform(machine.tick())
    }

    /// Gives unanswered claims back (while the database session still runs) and closes the client.
    func stop() {
        for t in timers { t.cancel() }
        timers.removeAll()
        perform(machine.stop())
        client.close()
    }

    private func perform(_ actions: [WebhookSender.Action]) {
        for action in actions {
            switch action {
            case .claim(let limit):
                let claim = WebhookSQL.claim(limit: limit, perKey: machine.perKey, perHost: machine.perHost,
                                             busyKeys: machine.busyKeys, busyHosts: machine.busyHosts, lease: attemptTimeout + 20)
                db.read(claim) { [weak self] result in
                    guard let self else { return }
                    switch result {
                    case .success(let r):
                        self.perform(self.machine.claimed(r.rows.compactMap(WebhookSQL.delivery), now: self.loop.now))
                    case .failure(let e):
                        self.log.warning("webhook.claim_failed", [("error", e.message)])
                        self.perform(self.machine.claimFailed())
                    }
                }
            case .send(let d):
                send(d)
            case .markDelivered(let d, let status):
                count(.delivered)
                log.info("webhook.delivered", [("delivery", d.deliveryID), ("activity", d.activityID), ("attempt", d.attempt), ("status", status)])
                mark(d, WebhookSQL.delivered(d, status: status))
            case .markRetry(let d, let after, let status):
                count(.retried)
                log.info("webhook.retry", [("delivery", d.deliveryID), ("activity", d.activityID), ("attempt", d.attempt),
                                           ("status", WebhookSender.loggable(status)), ("after_s", Int(after.rounded(.up)))])
                mark(d, WebhookSQL.retry(d, after: after, status: status))
            case .markFailed(let d, let status, let reason):
                count(reason == .refused ? .refused : .failed)
                log.warning(reason == .refused ? "webhook.refused" : "webhook.failed",
                            [("delivery", d.deliveryID), ("activity", d.activityID), ("attempt", d.attempt), ("status", status)])
                mark(d, WebhookSQL.failed(d, status: status))
            case .release(let ds):
                db.read(WebhookSQL.release(ds)) { _ in }
            }
        }
    }

    private func send(_ d: WebhookDelivery) {
        let t = Clock.nowMilliseconds() / 1000
        let mac = HMACSHA256.hex(key: secret, message: Array(CancelWebhook.signedText(timestamp: t, body: d.body).utf8))
        let request = CurlClient.Request(url: d.url, method: "POST", headers: [
            ("Content-Type", "application/json"),
            ("Dispatch-Signature", CancelWebhook.signatureHeader(timestamp: t, hexMAC: mac)),
            ("Dispatch-Delivery", d.deliveryID),
        ], body: Array(d.body.utf8), timeout: attemptTimeout)
        client.send(request) { [weak self] result in
            guard let self else { return }
            let answer: WebhookAnswer
            switch result {
            case .success(let response):
                answer = .status(response.status)
            case .failure(let f):
                switch f.kind {
                case .cancelled: return  // stopping: `stop` gave the claim back
                case .refusedAddress: answer = .refused(f.message)
                case .invalidRequest: answer = .invalid(f.message)
                case .retryOnNewConnection, .timeout, .connect, .tls, .other: answer = .transient("\(f.kind.rawValue): \(f.message)")
                }
            }
            self.perform(self.machine.answered(d.rowID, answer, now: self.loop.now, random: Double.random(in: 0..<1, using: &self.rng)))
        }
    }

    private func mark(_ d: WebhookDelivery, _ query: PGQuery) {
        db.read(query) { [weak self] result in
            guard let self else { return }
            if case .failure(let e) = result {
                // The claim's lease brings the row back: at least once, never lost.
                self.log.warning("webhook.mark_failed", [("delivery", d.deliveryID), ("error", e.message)])
            }
            self.perform(self.machine.marked(d.rowID))
        }
    }

    private func count(_ result: WebhookResult) {
        metrics.webhookDeliveries[result, default: 0] += 1
    }

    private func countPending() {
        guard db.reader.isReady else { return }
        db.read(WebhookSQL.pendingCount) { [weak self] result in
            if case .success(let r) = result, let n = r.first?.int("pending") { self?.metrics.webhookOutboxPending = n }
        }
    }
}

/// The deployment's webhook signing secret: `DISPATCH_WEBHOOK_SECRET`, or for the embedded
/// default (no DATABASE_URL) one generated once under the data dir. With an external database
/// and no secret there is none: webhooks wait in the outbox (see docs/webhooks.md).
enum WebhookSecret {
    static let fileName = "webhook-secret"

    static func path(_ config: ServerConfig) -> String { Files.absolutePath(config.dataDir) + "/" + fileName }

    /// Creates the embedded default's secret when missing (the supervisor, before any worker).
    static func ensure(_ config: ServerConfig) throws -> String? {
        if let s = config.webhookSecret { return s }
        guard config.databaseURL == nil else { return nil }
        var rng = SystemRandomNumberGenerator()
        return try Files.readOrCreateSecret(path(config)) { "whsec_" + RandomID.secret(using: &rng).dropFirst(4) }
    }

    /// The secret a worker signs with (reads, never creates).
    static func resolve(_ config: ServerConfig) -> String? {
        if let s = config.webhookSecret { return s }
        guard config.databaseURL == nil, let text = Files.read(path(config))?.trimmingNewlines, !text.isEmpty else { return nil }
        return text
    }
}
