import CLibevent
import CNats
import DispatchSystem
import Glibc

/// A NATS connection for one worker's loop: publish, per-subject interest, and everything the
/// library reports handed to the loop's thread.
///
/// Threads (the design decision): the library runs its own I/O threads (read loop, flusher,
/// reconnect) and one shared delivery thread (`natsOptions_UseGlobalMessageDelivery`, so a
/// worker holding 10,000 subscriptions does not start 10,000 threads). Its libevent adapter was
/// not used: it attaches and detaches sockets from its reconnect thread, which would need
/// `evthread_use_pthreads()` and so a lock around every libevent call of every worker, while
/// message handlers would still run on the library's threads. Instead every message, status
/// and error goes through one `NATSMailbox` (a locked queue and an eventfd the loop watches)
/// and is delivered on the loop in batches of `Options.batch` per turn, so libevent stays
/// single-threaded and every piece of Dispatch state stays on the loop. Publishing from the
/// loop is the library's thread-safe `natsConnection_Publish`: it appends to the library's
/// buffer, which its flusher thread writes (only when that buffer is full does the call
/// write to the socket itself).
///
/// Core NATS is at-most-once: after `.reconnected`, or `onDropped`, messages may be missing
/// and the caller repairs from the database.
public final class NATSClient {
    public enum Status: Equatable, Sendable { case connected, disconnected, reconnected, closed }

    /// How the client proves itself to the servers and checks them, as a production NATS
    /// deployment asks: a user and password or a token in the URLs (`nats://user:pass@host:4222`,
    /// `nats://token@host:4222`), a credentials file (JWT and NKey seed), and TLS (`tls://`
    /// URLs, or any URL with a CA file) with the CA that signed the servers' certificates and,
    /// when the servers verify clients, a client certificate and key. Secrets are never logged.
    public struct Security: Equatable, Sendable {
        public var credentialsFile: String?
        public var caFile: String?
        public var certFile: String?
        public var keyFile: String?

        public init(credentialsFile: String? = nil, caFile: String? = nil, certFile: String? = nil, keyFile: String? = nil) {
            self.credentialsFile = credentialsFile
            self.caFile = caFile
            self.certFile = certFile
            self.keyFile = keyFile
        }
    }

    /// Counted since `start()`. In and out as the library counts them (in: before any drop).
    public struct Figures: Equatable, Sendable {
        public var messagesIn = 0, messagesOut = 0, bytesIn = 0, bytesOut = 0
        /// Received but never handed to `onMessage`: past a subscription's pending limit in the
        /// library, or past the hand-off queue's limit.
        public var dropped = 0
        public var reconnects = 0
        /// `publish` calls that returned false (no connection object, or the buffer was full).
        public var publishFailed = 0
        public init() {}
    }

    public struct Options: Sendable {
        /// Per subscription in the library, and for the hand-off queue to the loop as a whole.
        public var pendingMessages = 65_536
        public var pendingBytes = 64 << 20
        /// Between two attempts on the same server, plus up to `reconnectJitter`.
        public var reconnectWait = 0.25
        public var reconnectJitter = 0.1
        /// Bytes published while disconnected that the library keeps to send on reconnect.
        public var reconnectBuffer = 8 << 20
        /// Per connection attempt; `start()` waits this long per unreachable (not refusing)
        /// server before it retries in the background.
        public var connectTimeout = 1.0
        /// A half-open (or stalled) connection is noticed after about `pingInterval` × 2.
        public var pingInterval = 5.0
        /// A write to the server that makes no progress for this long fails and the client
        /// reconnects, so a stalled server never blocks a thread (the loop's included) for
        /// longer; 0 would leave the socket blocking.
        public var writeDeadline = 0.25
        /// Publishing skips (and counts) a message while this many bytes wait to be written:
        /// the library would otherwise write them on the caller's thread, the loop's.
        public var maxBuffered = 192 << 10
        /// Longest wait between two rounds of reconnect attempts (doubling from
        /// `reconnectWait`), e.g. while the servers refuse this client's credentials.
        public var maxReconnectWait = 8.0
        /// Whether this connection receives what it publishes itself (NATS's default).
        public var echo = true
        /// Try the servers in a random order (spreads clients over a cluster); false: in the
        /// order given, e.g. a node's own NATS server first.
        public var randomize = true
        /// Events handed to the callbacks per turn of the loop.
        public var batch = 256
        public init() {}
    }

    public let name: String
    public let servers: [String]
    public let security: Security
    private let loop: EventLoop
    private let log: Logger
    private let options: Options

    /// Told of messages, status changes and drops, on the loop's thread only.
    public weak var delegate: NATSClientDelegate?

    /// As the loop has seen it: true from a successful connect or the `.connected` or
    /// `.reconnected` it delivered, false from `.disconnected` / `.closed`.
    public private(set) var isConnected = false

    private var connection: OpaquePointer?
    private var mailbox: NATSMailbox?
    private var event: OpaquePointer?
    private var statistics: OpaquePointer?
    /// Subject → (id, library subscription). The id travels with each message, so one that
    /// was already queued when its subscription went is not delivered.
    private var subscriptions: [String: (id: Int, sub: OpaquePointer)] = [:]
    private var pendingSubjects: Set<String> = []
    private var liveIDs: Set<Int> = []
    private var nextID = 0
    /// Drops counted by subscriptions since removed.
    private var retiredDrops = 0
    private var publishFailed = 0
    private var draining = false
    private var closed = false
    /// The library gave the connection up for good (it does so when the servers refuse the
    /// credentials at the first connect): why, and the attempts to start over since.
    public private(set) var lastFailure: String?
    private var restarts = 0
    private var restartTimer: Timer?

    /// servers: nats:// or tls:// URLs of one cluster (the client fails over between them).
    public init(loop: EventLoop, servers: [String], name: String, log: Logger, options: Options = Options(), security: Security = Security()) {
        self.loop = loop
        self.servers = servers
        self.security = security
        self.name = name
        self.log = log
        self.options = options
    }

    deinit { close() }

    /// The library's globals, once per process; never closed (other clients may still run).
    private static let libraryOpened: Bool = nats_Open(-1) == NATS_OK

    /// Starts connecting; never blocks the loop for long and never throws when the servers are
    /// merely down (it keeps retrying in the background: NATS being down must not stop
    /// dispatchd from starting). Throws on a bad URL or bad options.
    public func start() throws(SystemError) {
        guard !closed, connection == nil else { return }
        guard Self.libraryOpened else { throw SystemError("the NATS library did not initialise") }
        guard !servers.isEmpty else { throw SystemError("no NATS server URL") }
        for url in servers where !Self.plausible(url) {
            throw SystemError("NATS server URL \(Self.redacted(url)) is not nats://host:port or tls://host:port")
        }
        let mailbox = try NATSMailbox(maxMessages: options.pendingMessages, maxBytes: options.pendingBytes)
        mailbox.reconnectBase = options.reconnectWait
        mailbox.reconnectMax = options.maxReconnectWait
        var opts: OpaquePointer?
        guard natsOptions_Create(&opts) == NATS_OK, let opts else { throw SystemError("cannot create NATS options") }
        defer { natsOptions_Destroy(opts) }
        // The connection's callbacks share one retain of the box; `closed` is always the last
        // of them (posted after the library joined its connection threads).
        let box = Unmanaged.passRetained(mailbox).toOpaque()
        var s = configure(opts, box)
        guard s == NATS_OK else {
            Unmanaged<NATSMailbox>.fromOpaque(box).release()
            throw SystemError("NATS options: " + Self.text(s))
        }
        var nc: OpaquePointer?
        s = natsConnection_Connect(&nc, opts)
        guard s == NATS_OK || s == NATS_NOT_YET_CONNECTED, let nc else {
            // The box's retain stays with the library (a few bytes and an eventfd, once): when
            // it fails to start its reconnect thread it still posts `closed` with the box.
            throw SystemError("NATS connect to \(servers.map(Self.redacted).joined(separator: ",")): " + Self.text(s))
        }
        connection = nc
        self.mailbox = mailbox
        var stats: OpaquePointer?
        if natsStatistics_Create(&stats) == NATS_OK { statistics = stats }
        event = event_new(loop.base, mailbox.fd, Int16(EV_READ | EV_PERSIST), { _, _, arg in
            // Held for the batch: a callback may drop the owner's last reference to the client.
            let client = Unmanaged<NATSClient>.fromOpaque(arg!).takeUnretainedValue()
            withExtendedLifetime(client) { client.drain() }
        }, Unmanaged.passUnretained(self).toOpaque())
        if let event { event_add(event, nil) }
        if s == NATS_OK {
            isConnected = true
            mailbox.post(.status(.connected))
        } else {
            lastFailure = lastError ?? Self.text(s)
            log.warning("nats.connecting", [("client", name), ("servers", servers.map(Self.redacted).joined(separator: ",")),
                                             ("reason", lastFailure ?? "-")])
        }
        // Subscriptions asked for before start() are made now.
        let early = pendingSubjects.sorted()
        pendingSubjects = []
        for subject in early { subscribe(subject) }
    }

    private func configure(_ opts: OpaquePointer, _ box: UnsafeMutableRawPointer) -> natsStatus {
        var cURLs = servers.map { strdup($0) }
        defer { for p in cURLs { free(p) } }
        let steps: [() -> natsStatus] = [
            { cURLs.withUnsafeMutableBufferPointer { buf in
                buf.baseAddress!.withMemoryRebound(to: UnsafePointer<CChar>?.self, capacity: buf.count) {
                    natsOptions_SetServers(opts, $0, Int32(buf.count))
                } } },
            { natsOptions_SetName(opts, self.name) },
            { natsOptions_SetNoRandomize(opts, !self.options.randomize) },
            { natsOptions_SetTimeout(opts, Int64(self.options.connectTimeout * 1000)) },
            { natsOptions_SetAllowReconnect(opts, true) },
            { natsOptions_SetMaxReconnect(opts, -1) },
            { natsOptions_SetReconnectWait(opts, Int64(self.options.reconnectWait * 1000)) },
            { natsOptions_SetReconnectJitter(opts, Int64(self.options.reconnectJitter * 1000), Int64(self.options.reconnectJitter * 1000)) },
            { natsOptions_SetReconnectBufSize(opts, Int32(clamping: self.options.reconnectBuffer)) },
            { natsOptions_SetMaxPendingMsgs(opts, Int32(clamping: self.options.pendingMessages)) },
            { natsOptions_SetPingInterval(opts, Int64(self.options.pingInterval * 1000)) },
            { natsOptions_SetMaxPingsOut(opts, 2) },
            { natsOptions_SetWriteDeadline(opts, Int64(self.options.writeDeadline * 1000)) },
            { natsOptions_SetCustomReconnectDelay(opts, { _, attempts, box in
                // Every URL failed `attempts` times in a row (down, or refusing the credentials):
                // wait longer each round, with jitter, up to the maximum.
                let limits = NATSClient.backoff(box)
                let wait = min(limits.max, limits.base * Double(1 << min(max(Int(attempts) - 1, 0), 10)))
                return Int64((wait * Double.random(in: 0.8...1.2)) * 1000)
            }, box) },
            { natsOptions_SetIOBufSize(opts, 256 << 10) },
            { natsOptions_SetNoEcho(opts, !self.options.echo) },
            { natsOptions_UseGlobalMessageDelivery(opts, true) },
            { natsOptions_SetRetryOnFailedConnect(opts, true, { _, box in
                NATSClient.post(box, .status(.connected))
            }, box) },
            { natsOptions_SetDisconnectedCB(opts, { _, box in NATSClient.post(box, .status(.disconnected)) }, box) },
            { natsOptions_SetReconnectedCB(opts, { _, box in NATSClient.post(box, .status(.reconnected)) }, box) },
            { natsOptions_SetClosedCB(opts, { _, box in
                NATSClient.post(box, .status(.closed))
                Unmanaged<NATSMailbox>.fromOpaque(box!).release()
            }, box) },
            { natsOptions_SetErrorHandler(opts, { _, _, err, box in
                NATSClient.post(box, .dropped(err == NATS_SLOW_CONSUMER ? "slow consumer: a subscription's pending limit was reached"
                                                                  : "nats error: " + NATSClient.text(err)))
            }, box) },
        ]
        for step in steps {
            let s = step()
            if s != NATS_OK { return s }
        }
        if let creds = security.credentialsFile {
            let s = natsOptions_SetUserCredentialsFromFiles(opts, creds, nil)
            if s != NATS_OK { return s }
        }
        if security.caFile != nil || servers.contains(where: { $0.lowercased().hasPrefix("tls://") }) {
            var s = natsOptions_SetSecure(opts, true)
            if s != NATS_OK { return s }
            let ca = security.caFile ?? NATSClient.systemCAs
            s = natsOptions_LoadCATrustedCertificates(opts, ca)
            if s != NATS_OK { return s }
            if let cert = security.certFile, let key = security.keyFile {
                s = natsOptions_LoadCertificatesChain(opts, cert, key)
                if s != NATS_OK { return s }
            }
        }
        return NATS_OK
    }

    /// The system's CA bundle (Debian's ca-certificates), for tls:// without a CA file.
    static let systemCAs = "/etc/ssl/certs/ca-certificates.crt"

    /// The reconnect backoff's bounds, read by the library's thread (immutable once set).
    private static func backoff(_ box: UnsafeMutableRawPointer?) -> (base: Double, max: Double) {
        guard let box else { return (0.25, 8) }
        let m = Unmanaged<NATSMailbox>.fromOpaque(box).takeUnretainedValue()
        return (m.reconnectBase, m.reconnectMax)
    }

    /// A URL as it may be logged: user, password or token replaced by `***`.
    public static func redacted(_ url: String) -> String {
        guard let at = url.lastIndex(of: "@") else { return url }
        let start = schemeEnd(Substring(url)) ?? url.startIndex
        guard start <= at else { return url }
        return String(url[..<start]) + "***" + String(url[at...])
    }

    /// Where what follows `scheme://` begins, or nil without a scheme.
    static func schemeEnd(_ s: Substring) -> Substring.Index? {
        var i = s.startIndex
        while i < s.endIndex {
            if s[i...].hasPrefix("://") { return s.index(i, offsetBy: 3) }
            if s[i] == "/" || s[i] == "@" { return nil }
            i = s.index(after: i)
        }
        return nil
    }

    /// Whether the servers refused this client's credentials at its last attempt (it keeps
    /// trying, with backoff: the operator may fix them on the servers' side).
    public var credentialsRefused: Bool {
        guard !isConnected, let e = (lastFailure ?? lastError)?.lowercased() else { return false }
        return e.contains("authorization") || e.contains("authentication") || e.contains("auth")
    }

    /// The library's last error on this connection (e.g. "Authorization Violation"), if any.
    public var lastError: String? {
        guard let connection else { return nil }
        var text: UnsafePointer<CChar>?
        let s = natsConnection_GetLastError(connection, &text)
        guard s != NATS_OK, let text else { return nil }
        return String(cString: text)
    }

    /// From the library's threads.
    private static func post(_ box: UnsafeMutableRawPointer?, _ event: NATSEvent) {
        guard let box else { return }
        Unmanaged<NATSMailbox>.fromOpaque(box).takeUnretainedValue().post(event)
    }

    static func text(_ s: natsStatus) -> String {
        natsStatus_GetText(s).map { String(cString: $0) } ?? "status \(s.rawValue)"
    }

    /// `DISPATCH_NATS_URL`'s value: comma-separated nats:// (or tls://) URLs of one cluster.
    public static func servers(fromSetting value: String) throws(SystemError) -> [String] {
        let urls = value.split(separator: ",").map { part -> String in
            var s = part
            while s.first?.isWhitespace == true { s = s.dropFirst() }
            while s.last?.isWhitespace == true { s = s.dropLast() }
            return String(s)
        }.filter { !$0.isEmpty }
        guard !urls.isEmpty else { throw SystemError("no NATS server URL in \"\(value)\"") }
        for url in urls where !plausible(url) { throw SystemError("NATS server URL \(redacted(url)) is not nats://host:port or tls://host:port") }
        return urls
    }

    /// nats://host:port or tls://host:port (or host:port, the library's shorthand), with
    /// optional credentials before an `@`, port in range.
    static func plausible(_ url: String) -> Bool {
        var rest = Substring(url)
        if rest.lowercased().hasPrefix("nats://") || rest.lowercased().hasPrefix("tls://") {
            rest = rest[schemeEnd(rest)!...]
        } else if rest.contains("://") { return false }
        if let at = rest.lastIndex(of: "@") { rest = rest[rest.index(after: at)...] }
        guard let colon = rest.lastIndex(of: ":"), colon != rest.startIndex,
              let port = Int(rest[rest.index(after: colon)...]), (1...65535).contains(port) else { return false }
        return !rest[..<colon].contains(where: { $0 == " " || $0 == "/" || $0 == "," })
    }

    /// Fire-and-forget; false (and counted) when it could not be buffered.
    @discardableResult
    public func publish(_ subject: String, _ payload: [UInt8]) -> Bool {
        guard let connection, !closed, payload.count <= Int(Int32.max) else { publishFailed += 1; return false }
        // A server that stopped reading: skip rather than let the library write on this thread.
        if Int(natsConnection_Buffered(connection)) + payload.count > options.maxBuffered { publishFailed += 1; return false }
        let s = payload.withUnsafeBytes { natsConnection_Publish(connection, subject, $0.baseAddress, Int32($0.count)) }
        if s != NATS_OK { publishFailed += 1; return false }
        return true
    }

    /// Idempotent per subject; the library restores interest after a reconnect. Before
    /// start() the subject is remembered and subscribed by start().
    public func subscribe(_ subject: String) {
        guard !closed, subscriptions[subject] == nil else { return }
        guard let connection, let mailbox else { pendingSubjects.insert(subject); return }
        nextID += 1
        let id = nextID
        // One retain per subscription, given back by its completion callback: the library calls
        // that after the last call of the message handler, whichever thread closes it.
        let tag = Unmanaged.passRetained(NATSSubscriptionTag(mailbox: mailbox, id: id)).toOpaque()
        var sub: OpaquePointer?
        let s = natsConnection_Subscribe(&sub, connection, subject, { _, _, msg, tag in
            guard let msg, let tag else { return }
            let box = Unmanaged<NATSSubscriptionTag>.fromOpaque(tag).takeUnretainedValue()
            let subject = String(cString: natsMsg_GetSubject(msg))
            let n = Int(natsMsg_GetDataLength(msg))
            var payload: [UInt8] = []
            if n > 0, let data = natsMsg_GetData(msg) { payload = Array(UnsafeRawBufferPointer(start: data, count: n)) }
            natsMsg_Destroy(msg)
            box.mailbox.post(.message(subscription: box.id, subject: subject, payload: payload))
        }, tag)
        guard s == NATS_OK, let sub else {
            Unmanaged<NATSSubscriptionTag>.fromOpaque(tag).release()
            log.error("nats.subscribe_failed", [("client", name), ("subject", subject), ("reason", Self.text(s))])
            // Kept as wanted: a connection started over (after the library closed this one) subscribes it.
            pendingSubjects.insert(subject)
            mailbox.post(.dropped("cannot subscribe to \(subject): " + Self.text(s)))
            return
        }
        if natsSubscription_SetOnCompleteCB(sub, { tag in
            Unmanaged<NATSSubscriptionTag>.fromOpaque(tag!).release()
        }, tag) != NATS_OK {
            // Only a closed subscription refuses; the handler may still run once, so the
            // retain stays (a few bytes) rather than risk a freed box.
            log.warning("nats.subscription_closed_early", [("client", name), ("subject", subject)])
        }
        natsSubscription_SetPendingLimits(sub, Int32(clamping: options.pendingMessages), Int32(clamping: options.pendingBytes))
        subscriptions[subject] = (id: id, sub: sub)
        liveIDs.insert(id)
    }

    public func unsubscribe(_ subject: String) {
        pendingSubjects.remove(subject)
        guard let entry = subscriptions.removeValue(forKey: subject) else { return }
        liveIDs.remove(entry.id)
        retiredDrops += Self.dropped(entry.sub)
        natsSubscription_Unsubscribe(entry.sub)
        natsSubscription_Destroy(entry.sub)
    }

    /// The subjects this client holds interest in.
    public var subjects: [String] { (Array(subscriptions.keys) + pendingSubjects).sorted() }

    public var figures: Figures {
        var f = Figures()
        f.publishFailed = publishFailed
        f.dropped = retiredDrops + (mailbox?.refusedCount ?? 0)
        for entry in subscriptions.values { f.dropped += Self.dropped(entry.sub) }
        if let connection, let statistics, natsConnection_GetStats(connection, statistics) == NATS_OK {
            var inMsgs: UInt64 = 0, inBytes: UInt64 = 0, outMsgs: UInt64 = 0, outBytes: UInt64 = 0, reconnects: UInt64 = 0
            natsStatistics_GetCounts(statistics, &inMsgs, &inBytes, &outMsgs, &outBytes, &reconnects)
            f.messagesIn = Int(inMsgs); f.bytesIn = Int(inBytes)
            f.messagesOut = Int(outMsgs); f.bytesOut = Int(outBytes)
            f.reconnects = Int(reconnects)
        }
        return f
    }

    private static func dropped(_ sub: OpaquePointer) -> Int {
        var n: Int64 = 0
        return natsSubscription_GetDropped(sub, &n) == NATS_OK ? Int(n) : 0
    }

    /// On the loop: one batch from the mailbox.
    private func drain() {
        guard let mailbox, !closed else { return }
        draining = true
        for event in mailbox.take(options.batch) {
            if closed { break }
            switch event {
            case .message(let id, let subject, let payload):
                if liveIDs.contains(id) { delegate?.natsReceived(subject, payload) }
            case .status(let status):
                deliver(status)
            case .dropped(let reason):
                log.warning("nats.dropped", [("client", name), ("reason", reason)])
                delegate?.natsDropped(reason)
            }
        }
        draining = false
        if closed { freeEvent() }
    }

    private func deliver(_ status: Status) {
        switch status {
        case .connected, .reconnected:
            isConnected = true
            log.info(status == .connected ? "nats.connected" : "nats.reconnected", [("client", name), ("url", connectedServer.map(Self.redacted) ?? "")])
        case .disconnected:
            isConnected = false
            log.warning("nats.disconnected", [("client", name), ("error", lastError ?? "-")])
        case .closed:
            isConnected = false
            lastFailure = lastFailure ?? lastError ?? "connection closed"
            log.warning("nats.closed", [("client", name), ("error", lastFailure ?? "-")])
            scheduleRestart()
        }
        if status != .closed && status != .disconnected {
            lastFailure = nil
            restarts = 0
        }
        delegate?.natsStatusChanged(status)
    }

    /// The library closed the connection by itself (refused credentials, or its reconnects
    /// gave up): start a new one after a backoff that doubles up to `maxReconnectWait`, with
    /// the same interest, until it is accepted or `close()` is called.
    private func scheduleRestart() {
        guard !closed, restartTimer == nil else { return }
        let wait = min(options.maxReconnectWait, options.reconnectWait * Double(1 << min(restarts, 10))) * Double.random(in: 0.8...1.2)
        restarts += 1
        log.info("nats.restart_scheduled", [("client", name), ("in_s", (wait * 100).rounded() / 100), ("attempt", restarts)])
        restartTimer = loop.timer(after: wait) { [weak self] in
            guard let self else { return }
            self.restartTimer = nil
            self.restart()
        }
    }

    private func restart() {
        guard !closed else { return }
        let subjects = Set(subscriptions.keys).union(pendingSubjects)
        tearDown()
        pendingSubjects = subjects
        do {
            try start()
        } catch {
            lastFailure = error.message
            scheduleRestart()
        }
    }

    /// Frees the connection (closed by the library, or by `close`: `closing` closes it first),
    /// keeping this client usable for `start()` unless `close` was called.
    private func tearDown(closing: Bool = false) {
        mailbox?.shutDown()
        if let event { event_del(event) }
        if !draining { freeEvent() }
        if let connection {
            if closing { natsConnection_Close(connection) }
            for entry in subscriptions.values {
                retiredDrops += Self.dropped(entry.sub)
                natsSubscription_Destroy(entry.sub)
            }
            natsConnection_Destroy(connection)
        }
        subscriptions = [:]
        liveIDs = []
        connection = nil
        if let statistics { natsStatistics_Destroy(statistics) }
        statistics = nil
        mailbox = nil
    }

    /// The URL of the server the library is connected to now (nil while it is not), as the
    /// library knows it (it may be one the cluster advertised rather than one of `servers`).
    public var connectedServer: String? {
        guard let connection, !closed else { return nil }
        var buf = [CChar](repeating: 0, count: 256)
        guard natsConnection_GetConnectedUrl(connection, &buf, buf.count) == NATS_OK, buf[0] != 0 else { return nil }
        return String(decoding: buf.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// Safe to call twice, and from inside the delegate's calls; after it no call comes.
    /// Waits for the library's connection threads to stop (and up to 0.5 s for a flush).
    public func close() {
        guard !closed else { return }
        closed = true
        restartTimer?.cancel()
        restartTimer = nil
        delegate = nil
        isConnected = false
        tearDown(closing: true)
    }

    private func freeEvent() {
        if let event { event_free(event) }
        event = nil
    }
}

/// The closure of one subscription's handler: where its messages go, and which subscription
/// they came from.
final class NATSSubscriptionTag: Sendable {
    let mailbox: NATSMailbox
    let id: Int
    init(mailbox: NATSMailbox, id: Int) {
        self.mailbox = mailbox
        self.id = id
    }
}

/// What a NATS client tells its owner (the carrier), on the loop's thread only.
public protocol NATSClientDelegate: AnyObject {
    func natsReceived(_ subject: String, _ payload: [UInt8])
    func natsStatusChanged(_ status: NATSClient.Status)
    /// Messages were dropped for this client (slow consumer, or any async error): the owner
    /// resyncs from the database.
    func natsDropped(_ reason: String)
}
