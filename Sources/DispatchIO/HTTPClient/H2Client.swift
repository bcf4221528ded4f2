import DispatchCore
import DispatchSystem
import CTLS
import CNghttp2

/// The APNs client: HTTP/2 over TLS on our libevent loop, with nghttp2 for the framing and
/// OpenSSL through libevent's TLS bufferevents. Many requests run as streams of one connection
/// per host (`Options.maxHostConnections`), as many at once as the server's
/// SETTINGS_MAX_CONCURRENT_STREAMS allows, the rest queued here. Unlike libcurl it can PING an
/// idle connection, and so finds a peer that went away silently before a push waits on it
/// (`ConnectionUpkeep`).
///
/// A request the server did not process (its stream refused, or above a GOAWAY's last stream
/// id) is sent again on a connection that takes new streams, at most `Options.maxAttempts`
/// times; one that may have been processed fails with `.retryOnNewConnection`, for the caller
/// to decide. Errors have the kinds `CurlClient` gives (`HTTPClientFailure.Kind`).
///
/// Single-threaded: use it on its loop's thread only. Completions run exactly once, never
/// inside `send` and never while nghttp2 or OpenSSL is in the middle of a call. `close()` must
/// be called before the last reference goes away.
public final class H2Client: HTTPRequestSending {
    public typealias Completion = CurlClient.Completion

    public struct Options: Sendable {
        /// A PEM file of extra trusted CAs (the system's store stays trusted).
        public var caFile: String?
        /// Seconds to resolve, connect and finish the TLS handshake.
        public var connectTimeout: Double = 5
        /// Connections per host (at least 1): another opens only when every one is full.
        public var maxHostConnections = 1
        /// Streams run at once on one connection, below the server's own limit.
        public var maxConcurrentStreams = 1000
        /// Bytes of an answer's body kept; the rest is read and discarded.
        public var maxResponseBytes = 4096
        /// Times a request the server did not process is sent (refused stream, GOAWAY).
        public var maxAttempts = 3
        /// Seconds of quiet after which, and between which, an idle connection gets a PING;
        /// 0: never.
        public var pingIdleSeconds: Double = 0
        /// Seconds a PING has to be acknowledged before its connection is closed.
        public var pingAnswerSeconds: Double = 5
        /// Seconds sent data may stay unacknowledged before the kernel drops the connection
        /// (TCP_USER_TIMEOUT); 0 leaves the kernel's default.
        public var tcpUserTimeout: Double = 20
        /// Of the client's connections on the loop, set when each is made. Not lowered during a
        /// flood as `CurlClient` does (`UrgencyGovernor`): libevent cannot move a bufferevent's
        /// deferred callback that is already queued to another priority (it is then never run,
        /// and the loop spins).
        public var priority = EventPriority.normal

        public init() {}

        /// APNs: one connection per host (Apple's advice; a burst waits for the first
        /// connection rather than opening more), answers handled before the turn's other
        /// ready work, an idle connection PINGed every `idleSeconds` and closed when the PING
        /// goes unanswered for min(`idleSeconds` / 2, 5) s, at least 0.5 s.
        public static func apns(caFile: String? = nil, idleSeconds: Int = 15) -> Options {
            var o = Options()
            o.caFile = caFile
            o.pingIdleSeconds = Double(idleSeconds)
            o.pingAnswerSeconds = min(max(Double(idleSeconds) / 2, 0.5), 5)
            o.maxHostConnections = 1
            o.priority = .urgent
            return o
        }
    }

    /// The connections of one host and the requests waiting for a stream on them.
    final class Pool {
        let host: String
        let port: Int
        var connections: [H2Connection] = []
        var queue: [H2Exchange] = []
        var queueHead = 0
        init(host: String, port: Int) { self.host = host; self.port = port }
        var waiting: Int { queue.count - queueHead }
    }

    public let options: Options
    let loop: EventLoop
    let tls: OpaquePointer?
    /// Why no TLS connection can be made (the CA file did not load), if so.
    let tlsProblem: String?
    /// Resolves host names without blocking the loop (nil: libevent's blocking getaddrinfo).
    private(set) var dns: OpaquePointer?
    let callbacks: OpaquePointer?
    private var pools: [String: Pool] = [:]
    private var finished: [(Completion, Result<CurlClient.Response, HTTPClientFailure>)] = []
    private var flushScheduled = false
    private var tickTimer: Timer?

    /// Connections open or being opened now.
    public internal(set) var openConnections = 0
    /// Connections opened (attempted) since the client started.
    public internal(set) var connectionsOpened = 0
    /// PINGs sent, on idle connections and after timeouts.
    public internal(set) var pingsSent = 0
    /// Connections closed because a PING went unanswered, by why it was sent.
    public internal(set) var replaced: [ConnectionUpkeep.Reason: Int] = [:]
    /// GOAWAY frames received.
    public internal(set) var goaways = 0
    /// Requests sent again because the server had not processed them.
    public internal(set) var resent = 0
    public private(set) var closed = false

    /// Requests on a stream now.
    public var inFlight: Int { pools.values.reduce(0) { $0 + $1.connections.reduce(0) { $0 + $1.streams.count } } }
    /// Requests waiting for a stream.
    public var queued: Int { pools.values.reduce(0) { $0 + $1.waiting } }

    public init(loop: EventLoop, options: Options = Options()) {
        self.loop = loop
        self.options = options
        let (ctx, problem) = H2Client.makeTLSContext(caFile: options.caFile)
        tls = ctx
        tlsProblem = problem
        dns = evdns_base_new(loop.base, EVDNS_BASE_INITIALIZE_NAMESERVERS)
        callbacks = H2Connection.makeCallbacks()
        let upkeep = ConnectionUpkeep(pingInterval: options.pingIdleSeconds, answerTimeout: options.pingAnswerSeconds, now: 0)
        tickTimer = loop.timer(after: min(0.1, upkeep.tickInterval), repeating: true) { [unowned self] in self.tick() }
    }

    deinit {
        precondition(closed, "H2Client released without close(): its connections and events would leak")
    }

    /// TLS 1.2 or later, ALPN h2, peers verified against the system's store and `caFile`.
    static func makeTLSContext(caFile: String?) -> (OpaquePointer?, String?) {
        guard let ctx = SSL_CTX_new(TLS_client_method()) else { return (nil, "SSL_CTX_new failed") }
        _ = dispatch_ssl_ctx_min_tls12(ctx)
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nil)
        _ = SSL_CTX_set_default_verify_paths(ctx)
        let alpn: [UInt8] = [2, 0x68, 0x32]  // "h2"
        _ = SSL_CTX_set_alpn_protos(ctx, alpn, UInt32(alpn.count))
        if let caFile, SSL_CTX_load_verify_locations(ctx, caFile, nil) != 1 {
            ERR_clear_error()
            return (ctx, "cannot load the CA file \(caFile)")
        }
        return (ctx, nil)
    }

    // MARK: - Requests

    /// Sends `request`; `completion` runs exactly once, on a later turn of the loop.
    public func send(_ request: CurlClient.Request, completion: @escaping Completion) {
        guard !closed else {
            return failSoon(completion, HTTPClientFailure(.cancelled, message: "client closed"))
        }
        let head: HTTP2RequestHead
        switch HTTP2RequestHead.make(method: request.method, url: request.url, headers: request.headers, bodyLength: request.body.count) {
        case .success(let h): head = h
        case .failure(let problem): return failSoon(completion, HTTPClientFailure(.invalidRequest, message: problem.reason))
        }
        if let tlsProblem { return failSoon(completion, HTTPClientFailure(.tls, message: tlsProblem)) }
        let exchange = H2Exchange(request: request, head: head, completion: completion,
                                  deadline: Clock.monotonic() + request.timeout)
        let pool = pools[head.authority] ?? {
            let p = Pool(host: head.host, port: head.port)
            pools[head.authority] = p
            return p
        }()
        pool.queue.append(exchange)
        dispatch(pool)
        scheduleFlush()
    }

    private func failSoon(_ completion: @escaping Completion, _ failure: HTTPClientFailure) {
        finished.append((completion, .failure(failure)))
        scheduleFlush()
    }

    private func scheduleFlush() {
        guard !finished.isEmpty, !flushScheduled else { return }
        flushScheduled = true
        loop.soon { [self] in
            flushScheduled = false
            runFinished()
        }
    }

    /// Completes `exchange` (once); its completion runs at the end of the current I/O step.
    func complete(_ exchange: H2Exchange, _ result: Result<CurlClient.Response, HTTPClientFailure>) {
        guard !exchange.done else { return }
        exchange.done = true
        finished.append((exchange.completion, result))
    }

    /// `exchange` was not processed by the server: queue it again for a connection that takes
    /// new streams, unless it was tried `maxAttempts` times.
    func resend(_ exchange: H2Exchange, why: String) {
        guard !exchange.done else { return }
        exchange.attempts += 1
        guard exchange.attempts < options.maxAttempts, !closed, let pool = pools[exchange.head.authority] else {
            return complete(exchange, .failure(HTTPClientFailure(.retryOnNewConnection, message: why)))
        }
        resent += 1
        exchange.reset()
        pool.queue.append(exchange)
    }

    /// Hands waiting requests to connections with room, and opens a connection when none has.
    private func dispatch(_ pool: Pool) {
        guard !closed else { return }
        var used: [H2Connection] = []
        while pool.waiting > 0 {
            guard let conn = pool.connections.first(where: { $0.canTake }) else { break }
            let exchange = pool.queue[pool.queueHead]
            pool.queueHead += 1
            if exchange.done { continue }
            if conn.submit(exchange) {
                if used.last !== conn { used.append(conn) }
            } else {
                complete(exchange, .failure(HTTPClientFailure(.other, message: "nghttp2 refused the request")))
            }
        }
        if pool.queueHead == pool.queue.count {
            pool.queue.removeAll(keepingCapacity: true)
            pool.queueHead = 0
        } else if pool.queueHead > 1024 && pool.queueHead * 2 > pool.queue.count {
            pool.queue.removeFirst(pool.queueHead)
            pool.queueHead = 0
        }
        for conn in used { conn.flush() }
        let usable = pool.connections.filter { !$0.draining }
        if pool.waiting > 0 && !usable.contains(where: { $0.state == .connecting })
            && usable.count < max(1, options.maxHostConnections) {
            open(pool)
        }
    }

    private func open(_ pool: Pool) {
        let conn = H2Connection(client: self, pool: pool, now: Clock.monotonic())
        pool.connections.append(conn)
        openConnections += 1
        connectionsOpened += 1
        if let failure = conn.start() { connectionFailed(conn, failure) }
    }

    // MARK: - What connections report

    /// A connection could not be made: requests waiting for it fail with `failure` unless
    /// another connection of the host can take them.
    func connectionFailed(_ conn: H2Connection, _ failure: HTTPClientFailure) {
        let pool = conn.pool
        for exchange in drop(conn) { complete(exchange, .failure(failure)) }
        guard !pool.connections.contains(where: { !$0.draining }) else { return }
        while pool.waiting > 0 {
            complete(pool.queue[pool.queueHead], .failure(failure))
            pool.queueHead += 1
        }
        pool.queue.removeAll(keepingCapacity: true)
        pool.queueHead = 0
    }

    /// An open connection ended: streams the server never processed are sent again, the
    /// others fail with `.retryOnNewConnection` (they may have been processed).
    func connectionLost(_ conn: H2Connection, _ why: String) {
        let lastProcessed = conn.goawayLastStream
        for exchange in drop(conn) {
            if exchange.streamID > lastProcessed {
                resend(exchange, why: why)
            } else {
                complete(exchange, .failure(HTTPClientFailure(.retryOnNewConnection, message: why)))
            }
        }
    }

    /// Closes `conn` and forgets it; what was in flight on it is the caller's to settle.
    private func drop(_ conn: H2Connection) -> [H2Exchange] {
        conn.pool.connections.removeAll { $0 === conn }
        let left = conn.close()
        openConnections -= 1
        return left
    }

    /// The end of every I/O step (socket, timer): waiting requests go to connections with
    /// room, then the completions run, the client's own state settled first (a completion may
    /// call `send` or `close`).
    func afterIO() {
        for pool in pools.values { dispatch(pool) }
        runFinished()
    }

    private func runFinished() {
        guard !finished.isEmpty else { return }
        let done = finished
        finished.removeAll()
        for (completion, result) in done { completion(result) }
    }

    // MARK: - Time: request deadlines, connect deadlines, PINGs

    private func tick() {
        guard !closed else { return }
        let now = Clock.monotonic()
        for pool in pools.values {
            for i in pool.queueHead..<pool.queue.count where pool.queue[i].deadline <= now {
                complete(pool.queue[i], .failure(HTTPClientFailure(.timeout, message: "timed out waiting for a stream")))
            }
            for conn in pool.connections {
                switch conn.state {
                case .connecting:
                    if now >= conn.connectDeadline {
                        connectionFailed(conn, HTTPClientFailure(.connect, message: "connecting to \(pool.host):\(pool.port) timed out after \(options.connectTimeout) s"))
                    }
                case .open:
                    for exchange in conn.streams.values where !exchange.done && exchange.deadline <= now {
                        complete(exchange, .failure(HTTPClientFailure(.timeout, message: "no answer within \(exchange.request.timeout) s")))
                        conn.cancel(exchange)
                        if conn.upkeep.requestTimedOut(now: now) == .ping { conn.ping() }
                    }
                    switch conn.upkeep.tick(now: now) {
                    case .none:
                        break
                    case .ping:
                        conn.ping()
                    case .close(let reason):
                        replaced[reason, default: 0] += 1
                        connectionLost(conn, "the connection did not answer a PING within \(options.pingAnswerSeconds) s")
                    }
                    conn.flush()
                case .closed:
                    break
                }
            }
        }
        afterIO()
    }

    // MARK: - Closing

    /// Cancels every request in flight or queued (each completes with `.cancelled` on a later
    /// turn), closes every connection and frees what the client holds. Safe to call twice, and
    /// from a completion.
    public func close() {
        guard !closed else { return }
        closed = true
        tickTimer?.cancel()
        tickTimer = nil
        let failure = HTTPClientFailure(.cancelled, message: "client closed")
        for pool in pools.values {
            for conn in pool.connections {
                for exchange in drop(conn) { complete(exchange, .failure(failure)) }
            }
            for exchange in pool.queue[pool.queueHead...] { complete(exchange, .failure(failure)) }
            pool.queue.removeAll()
            pool.queueHead = 0
        }
        pools.removeAll()
        if let dns { evdns_base_free(dns, 0) }
        dns = nil
        if let tls { SSL_CTX_free(tls) }
        if let callbacks { nghttp2_session_callbacks_del(callbacks) }
        scheduleFlush()
    }
}

/// One request: what it sends, and what came back so far. Retained by its pool's queue or its
/// connection's streams; nghttp2 reaches it through the stream's user data.
final class H2Exchange {
    let request: CurlClient.Request
    let head: HTTP2RequestHead
    let completion: CurlClient.Completion
    let deadline: Double
    var attempts = 0
    var done = false
    var streamID: Int32 = 0
    /// Body bytes handed to nghttp2.
    var sent = 0
    var status = 0
    var headers: [(String, String)] = []
    var headerBytes = 0
    var body: [UInt8] = []
    var bodyTruncated = false

    /// Header bytes kept per answer; a server can send any number of them.
    static let maxHeaderBytes = 32 * 1024

    init(request: CurlClient.Request, head: HTTP2RequestHead, completion: @escaping CurlClient.Completion, deadline: Double) {
        self.request = request
        self.head = head
        self.completion = completion
        self.deadline = deadline
    }

    /// Forgets an attempt, before the request is sent again.
    func reset() {
        streamID = 0
        sent = 0
        status = 0
        headers = []
        headerBytes = 0
        body = []
        bodyTruncated = false
    }

    func header(name: String, value: String) {
        if name == ":status" {
            // A final answer after an informational one: forget the first.
            status = Int(value) ?? 0
            headers.removeAll()
            headerBytes = 0
            return
        }
        guard !name.hasPrefix(":"), headerBytes + name.utf8.count + value.utf8.count <= H2Exchange.maxHeaderBytes else { return }
        headerBytes += name.utf8.count + value.utf8.count
        headers.append((name, value))
    }

    func receive(_ bytes: UnsafeBufferPointer<UInt8>, limit: Int) {
        let room = limit - body.count
        if bytes.count > room { bodyTruncated = true }
        if room > 0 { body.append(contentsOf: bytes.prefix(room)) }
    }

    var response: CurlClient.Response {
        CurlClient.Response(status: status, httpVersion: "2", headers: headers, body: body, bodyTruncated: bodyTruncated)
    }
}
