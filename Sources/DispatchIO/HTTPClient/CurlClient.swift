import DispatchCore
import DispatchSystem
import CCurl
import CLibevent
import Glibc

/// An asynchronous HTTP client: libcurl's multi-socket interface driven by our libevent loop
/// (the shape of curl's docs/examples/hiperfifo.c). Carries APNs pushes (many HTTP/2 streams
/// on one connection) and webhooks (any public http or https URL).
///
/// Single-threaded: use it on its loop's thread only. Completions always run on a later turn
/// of the loop, never inside `send` and never while curl is in the middle of a call, and each
/// exactly once. `close()` must be called before the last reference goes away.
/// What sends HTTP requests for a shell: `CurlClient` in the server, a scripted sender in
/// shells' unit tests. `completion` runs exactly once; `close` cancels what is unanswered.
public protocol HTTPRequestSending: AnyObject {
    func send(_ request: CurlClient.Request, completion: @escaping CurlClient.Completion)
    func close()
}

public final class CurlClient: HTTPRequestSending {
    public typealias Completion = (Result<Response, HTTPClientFailure>) -> Void

    public let options: Options
    private let loop: EventLoop
    private var multi: UnsafeMutableRawPointer?
    private var timerEvent: OpaquePointer?
    /// One libevent event per socket curl asked us to watch.
    private var socketEvents: [curl_socket_t: (event: OpaquePointer, what: Int32)] = [:]
    /// Every request handed to curl and not yet reported, by easy handle.
    private var transfers: [UnsafeMutableRawPointer: CurlTransfer] = [:]
    /// Requests waiting for room under `Options.maxInFlight`, oldest first from `queueHead`.
    private var queue: [(request: Request, completion: Completion, deadline: Double)] = []
    private var queueHead = 0
    /// The priority of the client's events now: `Options.priority`, lowered while answers flood.
    private var urgency: UrgencyGovernor

    /// Sockets open now (connections, and connection attempts in progress).
    public private(set) var openConnections = 0
    /// Sockets opened since the client started.
    public private(set) var connectionsOpened = 0
    /// Times every connection was replaced after a request timed out (`Options.replaceAfterTimeout`).
    public private(set) var connectionsReplaced = 0
    /// Times idle connections were sent a PING (`Options.pingIdleSeconds`), and replaced because
    /// one sent nothing back in time, or because they sat idle too long.
    public private(set) var pingsSent = 0
    public private(set) var replacedUnansweredPing = 0
    public private(set) var replacedIdle = 0
    /// Idle connections get PINGs (`Options.pingIdleSeconds` set and libcurl can).
    public let pinging: Bool
    /// Seconds a connection may sit idle and be reused, as applied (0: curl's default).
    let maxIdleSeconds: Int
    /// When to PING or replace idle connections, and the timer that asks it.
    private var upkeep: ConnectionUpkeep?
    private var upkeepTimer: OpaquePointer?
    /// The easy handle `curl_easy_upkeep` is called with (briefly added to the multi handle).
    private var upkeepHandle: UnsafeMutableRawPointer?
    /// Sockets curl opened and has not closed.
    private var sockets: Set<curl_socket_t> = []
    /// A request timed out since the connections were last replaced.
    private var suspect = false
    /// Connections the SSRF check refused since the client started.
    public private(set) var refusedConnections = 0
    public private(set) var closed = false
    /// Requests handed to curl and not yet completed.
    public var inFlight: Int { transfers.count }
    /// Requests waiting for room under `Options.maxInFlight`.
    public var queued: Int { queue.count - queueHead }

    /// The libcurl this process runs with (not the headers it was built with).
    public static let libcurlVersion: String = {
        _ = CurlClient.globalInit
        guard let info = curl_version_info(CURLVERSION_FIRST), let v = info.pointee.version else { return "unknown" }
        return String(cString: v)
    }()

    /// Whether libcurl can send an HTTP/2 PING on an idle connection: no release can yet.
    /// Before 8.10, curl_easy_upkeep reaches only the connections of its own handle's
    /// curl_easy_perform, never a multi handle's. From 8.10 it reaches the connections of the
    /// cache its handle uses (a shared one, or that of the multi handle it is in) and submits a
    /// PING on each, but the frame stays in the connection's send buffer (lib/http2.c
    /// `http2_send_ping` only hands it to nghttp2, whose send callback buffers it; nothing
    /// flushes an idle connection): it leaves with the connection's next request, or when the
    /// connection is closed. Checked with 8.14.1 (`CurlIdlePingTests` watches for the day it
    /// changes). So idle connections are replaced (`Options.pingIdleSeconds`).
    public static let canPingIdleConnections = false

    /// curl_global_init is not thread-safe and must run once per process, before any handle.
    private static let globalInit: Void = {
        let code = dispatch_curl_global_init()
        precondition(code == CURLE_OK, "curl_global_init failed: \(code.rawValue)")
    }()

    public init(loop: EventLoop, options: Options = Options()) {
        _ = CurlClient.globalInit
        self.loop = loop
        self.options = options
        urgency = UrgencyGovernor(preferred: options.priority)
        pinging = options.pingIdleSeconds > 0 && options.pingAvailable
        var maxIdle = Double(options.maxIdleSeconds)
        if options.pingIdleSeconds > 0 && !pinging {
            // No PING: what it would check is done by replacing the connection instead.
            maxIdle = maxIdle > 0 ? min(maxIdle, options.pingIdleSeconds) : options.pingIdleSeconds
        }
        maxIdleSeconds = maxIdle > 0 ? max(1, Int(maxIdle.rounded(.up))) : 0
        if pinging || maxIdle > 0 {
            upkeep = ConnectionUpkeep(pingInterval: pinging ? options.pingIdleSeconds : 0, answerTimeout: options.pingAnswerSeconds,
                                      maxIdle: maxIdle, now: Clock.monotonic())
        }
        multi = makeMulti()
        let me = Unmanaged.passUnretained(self).toOpaque()
        timerEvent = event_new(loop.base, -1, 0, { _, _, arg in
            Unmanaged<CurlClient>.fromOpaque(arg!).takeUnretainedValue().drive(CURL_SOCKET_TIMEOUT, 0)
        }, me)
        if let timerEvent { event_priority_set(timerEvent, urgency.priority.rawValue) }
        if let upkeep {
            if pinging, let h = curl_easy_init() {
                // We decide when to PING (`ConnectionUpkeep`): curl is to send one on every
                // connection whenever asked.
                _ = dispatch_curl_easy_setopt_long(h, CURLOPT_UPKEEP_INTERVAL_MS, 1)
                _ = dispatch_curl_easy_setopt_long(h, CURLOPT_NOSIGNAL, 1)
                upkeepHandle = h
            }
            upkeepTimer = event_new(loop.base, -1, Int16(EV_PERSIST), { _, _, arg in
                Unmanaged<CurlClient>.fromOpaque(arg!).takeUnretainedValue().upkeepTick()
            }, me)
            if let upkeepTimer {
                let period = upkeep.tickInterval
                var tv = timeval(tv_sec: Int(period), tv_usec: Int((period - period.rounded(.down)) * 1_000_000))
                event_add(upkeepTimer, &tv)
            }
        }
    }

    /// A multi handle with the client's callbacks and limits.
    private func makeMulti() -> UnsafeMutableRawPointer {
        guard let m = curl_multi_init() else { fatalError("curl_multi_init failed") }
        let me = Unmanaged.passUnretained(self).toOpaque()
        _ = dispatch_curl_multi_setopt_socket(m) { _, fd, what, arg, _ in
            Unmanaged<CurlClient>.fromOpaque(arg!).takeUnretainedValue().watch(fd, what)
            return 0
        }
        _ = dispatch_curl_multi_setopt_ptr(m, CURLMOPT_SOCKETDATA, me)
        _ = dispatch_curl_multi_setopt_timer(m) { _, ms, arg in
            Unmanaged<CurlClient>.fromOpaque(arg!).takeUnretainedValue().armTimer(ms)
            return 0
        }
        _ = dispatch_curl_multi_setopt_ptr(m, CURLMOPT_TIMERDATA, me)
        _ = dispatch_curl_multi_setopt_long(m, CURLMOPT_PIPELINING, options.multiplex ? Int(CURLPIPE_MULTIPLEX) : 0)
        _ = dispatch_curl_multi_setopt_long(m, CURLMOPT_MAX_HOST_CONNECTIONS, options.maxHostConnections)
        _ = dispatch_curl_multi_setopt_long(m, CURLMOPT_MAX_TOTAL_CONNECTIONS, options.maxTotalConnections)
        _ = dispatch_curl_multi_setopt_long(m, CURLMOPT_MAX_CONCURRENT_STREAMS, options.maxConcurrentStreams)
        return m
    }

    /// Closes every connection (nothing is in flight) and starts over with a new multi handle:
    /// the next request connects afresh (`Options.replaceAfterTimeout`, `ConnectionUpkeep`).
    @discardableResult
    private func replaceConnections() -> Bool {
        guard let old = multi, transfers.isEmpty else { return false }
        // Closes the cached connections: curl reports their sockets removed and closed.
        curl_multi_cleanup(old)
        for (_, watched) in socketEvents { event_free(watched.event) }
        socketEvents.removeAll()
        if let timerEvent { event_del(timerEvent) }
        multi = makeMulti()
        upkeep?.replaced(now: Clock.monotonic())
        return true
    }

    // MARK: - Idle connections (PING, replacement)

    /// The upkeep timer: PINGs idle connections, or replaces them, as `ConnectionUpkeep` says.
    private func upkeepTick() {
        guard !closed, var machine = upkeep else { return }
        var pending: [Int32: Int] = [:]
        for fd in sockets {
            // Bytes the kernel holds for curl: an idle connection is not read until it is used,
            // so a PING's ACK (or anything else the peer sent) shows here.
            var n: Int32 = 0
            pending[fd] = ioctl(fd, UInt(FIONREAD), &n) == 0 ? Int(n) : 0
        }
        let action = machine.tick(now: Clock.monotonic(), pending: pending)
        upkeep = machine
        switch action {
        case .none:
            break
        case .ping:
            ping()
        case .replace(let reason):
            guard replaceConnections() else { return }
            switch reason {
            case .unansweredPing: replacedUnansweredPing += 1
            case .idle: replacedIdle += 1
            }
        }
    }

    /// Asks curl for an HTTP/2 PING on every connection of the multi handle: curl_easy_upkeep
    /// reaches the connections of the multi handle its easy handle is in (libcurl 8.10+), so the
    /// handle joins it for the call and leaves before curl could start it. (A shared connection
    /// cache, CURLSH with CURL_LOCK_DATA_CONNECT, would reach them too, but curl 8.14 applies
    /// CURLMOPT_MAX_HOST_CONNECTIONS only to a multi handle's own cache: a burst would open a
    /// connection per stream APNs allows before the first push authenticated.) Only used where
    /// the PING is really written (`canPingIdleConnections`).
    private func ping() {
        guard let multi, let h = upkeepHandle else { return }
        guard curl_multi_add_handle(multi, h) == CURLM_OK else { return }
        if curl_easy_upkeep(h) == CURLE_OK { pingsSent += 1 }
        curl_multi_remove_handle(multi, h)
    }

    deinit {
        precondition(closed, "CurlClient released without close(): its events and curl handles would leak")
    }

    // MARK: - Requests

    /// Sends `request`; `completion` runs exactly once, on a later turn of the loop. Past
    /// `Options.maxInFlight` the request waits its turn; its timeout counts from now.
    public func send(_ request: Request, completion: @escaping Completion) {
        guard !closed else {
            return fail(completion, HTTPClientFailure(.cancelled, message: "client closed"))
        }
        if options.maxInFlight > 0 && (transfers.count >= options.maxInFlight || queued > 0) {
            queue.append((request, completion, Clock.monotonic() + request.timeout))
            return
        }
        start(request, completion: completion)
    }

    /// Hands `request` to curl.
    private func start(_ request: Request, completion: @escaping Completion) {
        if suspect && transfers.isEmpty {
            suspect = false
            if replaceConnections() { connectionsReplaced += 1 }
        }
        guard let multi else {
            return fail(completion, HTTPClientFailure(.cancelled, message: "client closed"))
        }
        guard let easy = curl_easy_init() else {
            return fail(completion, HTTPClientFailure(.other, message: "curl_easy_init failed"))
        }
        let transfer = CurlTransfer(easy: easy, client: self, completion: completion)
        if let problem = transfer.configure(request, options: options) {
            transfer.release()
            return fail(completion, problem)
        }
        // Adding only schedules the transfer (curl asks for a timer); nothing completes here.
        let code = curl_multi_add_handle(multi, easy)
        guard code == CURLM_OK else {
            transfer.release()
            return fail(completion, HTTPClientFailure(.other, message: "curl_multi_add_handle: " + String(cString: curl_multi_strerror(code))))
        }
        transfers[easy] = transfer
        upkeep?.busy()
    }

    private func fail(_ completion: @escaping Completion, _ failure: HTTPClientFailure) {
        loop.soon { completion(.failure(failure)) }
    }

    /// Starts queued requests while there is room; those whose deadline passed while they
    /// waited fail as timed out (added to `expired`, for the caller to complete).
    private func startQueued(expired: inout [(Completion, Result<Response, HTTPClientFailure>)]) {
        let now = Clock.monotonic()
        while queued > 0 && transfers.count < options.maxInFlight {
            var (request, completion, deadline) = queue[queueHead]
            queueHead += 1
            if deadline <= now {
                expired.append((completion, .failure(HTTPClientFailure(.timeout, message: "timed out waiting for a free stream"))))
            } else {
                request.timeout = deadline - now
                start(request, completion: completion)
            }
        }
        if queueHead == queue.count {
            queue.removeAll(keepingCapacity: true)
            queueHead = 0
        } else if queueHead > 1024 && queueHead * 2 > queue.count {
            queue.removeFirst(queueHead)
            queueHead = 0
        }
    }

    /// Cancels every request in flight or queued (each completes with `.cancelled` on a later turn),
    /// closes all connections and frees curl's and libevent's resources. Safe to call twice,
    /// and from a completion.
    public func close() {
        guard !closed else { return }
        closed = true
        let cancelled = transfers.values
        transfers.removeAll()
        if let multi {
            for t in cancelled {
                curl_multi_remove_handle(multi, t.easy)
                t.release()
            }
            // Closes the cached connections: curl reports their sockets removed and closed.
            curl_multi_cleanup(multi)
        }
        multi = nil
        for (_, watched) in socketEvents { event_free(watched.event) }
        socketEvents.removeAll()
        if let timerEvent { event_free(timerEvent) }
        timerEvent = nil
        if let upkeepTimer { event_free(upkeepTimer) }
        upkeepTimer = nil
        if let upkeepHandle { curl_easy_cleanup(upkeepHandle) }
        upkeepHandle = nil
        upkeep = nil
        let failure = HTTPClientFailure(.cancelled, message: "client closed")
        let completions = cancelled.map(\.completion) + queue[queueHead...].map(\.completion)
        queue.removeAll()
        queueHead = 0
        if !completions.isEmpty {
            loop.soon { for c in completions { c(.failure(failure)) } }
        }
    }

    // MARK: - Driving curl from libevent

    /// CURLMOPT_SOCKETFUNCTION: watch `fd` for what curl wants, or stop watching it.
    private func watch(_ fd: curl_socket_t, _ what: Int32) {
        if let old = socketEvents[fd] {
            if old.what == what { return }
            // Freeing an event from inside its own callback is fine in libevent 2.1.
            event_free(old.event)
            socketEvents[fd] = nil
        }
        guard what != CURL_POLL_REMOVE, what != CURL_POLL_NONE else { return }
        var flags = EV_PERSIST
        if what & CURL_POLL_IN != 0 { flags |= EV_READ }
        if what & CURL_POLL_OUT != 0 { flags |= EV_WRITE }
        guard let event = event_new(loop.base, fd, Int16(flags), { fd, events, arg in
            var action: Int32 = 0
            if Int32(events) & EV_READ != 0 { action |= CURL_CSELECT_IN }
            if Int32(events) & EV_WRITE != 0 { action |= CURL_CSELECT_OUT }
            Unmanaged<CurlClient>.fromOpaque(arg!).takeUnretainedValue().drive(fd, action)
        }, Unmanaged.passUnretained(self).toOpaque()) else { return }
        event_priority_set(event, urgency.priority.rawValue)
        event_add(event, nil)
        socketEvents[fd] = (event, what)
    }

    /// CURLMOPT_TIMERFUNCTION: -1 deletes the timer; 0 fires it on the next turn, never here.
    private func armTimer(_ ms: Int) {
        guard let timerEvent else { return }
        if ms < 0 {
            event_del(timerEvent)
            return
        }
        var tv = timeval(tv_sec: ms / 1000, tv_usec: (ms % 1000) * 1000)
        event_add(timerEvent, &tv)
    }

    /// Lets curl act on a ready socket (or on its timer), then reports finished transfers.
    private func drive(_ fd: curl_socket_t, _ action: Int32) {
        guard let multi else { return }
        var running: Int32 = 0
        _ = curl_multi_socket_action(multi, fd, action, &running)
        reportFinished()
    }

    /// Collects what curl finished, frees the handles, and only then runs the completions, so
    /// a completion may call `send` or `close` freely.
    private func reportFinished() {
        var finished: [(CurlClient.Completion, Result<Response, HTTPClientFailure>)] = []
        var left: Int32 = 0
        while let multi, let message = curl_multi_info_read(multi, &left) {
            guard message.pointee.msg == CURLMSG_DONE, let easy = message.pointee.easy_handle else { continue }
            let code = message.pointee.data.result
            guard let transfer = transfers.removeValue(forKey: easy) else { continue }
            let result = transfer.outcome(code)
            if options.replaceAfterTimeout, case .failure(let f) = result, f.kind == .timeout { suspect = true }
            curl_multi_remove_handle(multi, easy)
            transfer.release()
            finished.append((transfer.completion, result))
        }
        // Queued requests go first, before completions can send more.
        if !closed && options.maxInFlight > 0 { startQueued(expired: &finished) }
        if transfers.isEmpty { upkeep?.idle(now: Clock.monotonic()) }
        if urgency.turn(completed: finished.count) {
            // An event that is ready right now keeps its priority until it has run.
            if let timerEvent { event_priority_set(timerEvent, urgency.priority.rawValue) }
            for (_, watched) in socketEvents { event_priority_set(watched.event, urgency.priority.rawValue) }
        }
        for (completion, result) in finished { completion(result) }
    }

    // MARK: - Sockets (curl's open and close callbacks)

    /// CURLOPT_OPENSOCKETFUNCTION: the SSRF check on the resolved address, then the socket.
    func openSocket(for transfer: CurlTransfer, _ address: UnsafeMutablePointer<curl_sockaddr>) -> curl_socket_t {
        let a = address.pointee
        guard let bytes = CurlClient.addressBytes(dispatch_curl_sockaddr(address), family: a.family) else {
            transfer.refused.append("(address family \(a.family))")
            refusedConnections += 1
            return CURL_SOCKET_BAD
        }
        if !options.allowPrivateAddresses {
            let kind = AddressClass.classify(bytes)
            if !kind.isPublic {
                transfer.refused.append("\(CurlClient.format(bytes)) (\(kind.rawValue))")
                refusedConnections += 1
                return CURL_SOCKET_BAD
            }
        }
        let fd = socket(a.family, a.socktype | Int32(SOCK_CLOEXEC.rawValue), a.protocol)
        guard fd >= 0 else { return CURL_SOCKET_BAD }
        openConnections += 1
        connectionsOpened += 1
        sockets.insert(fd)
        if options.tcpUserTimeout > 0 {
            // A connection that died silently (a middlebox forgot it) would otherwise take
            // every multiplexed request's deadline in turn: curl times out streams, not the
            // connection. With this, unacknowledged data kills the connection, curl sees an
            // error and the next request opens a new one.
            var ms = UInt32(options.tcpUserTimeout * 1000)
            _ = setsockopt(fd, Int32(IPPROTO_TCP), TCP_USER_TIMEOUT, &ms, socklen_t(MemoryLayout<UInt32>.size))
        }
        return fd
    }

    /// CURLOPT_CLOSESOCKETFUNCTION: curl no longer closes the socket itself.
    func closeSocket(_ fd: curl_socket_t) -> Int32 {
        // An event still registered for a closed descriptor would confuse epoll's bookkeeping
        // when the number is reused.
        if let watched = socketEvents.removeValue(forKey: fd) { event_free(watched.event) }
        openConnections -= 1
        sockets.remove(fd)
        return Glibc.close(fd)
    }

    static func addressBytes(_ sa: UnsafePointer<sockaddr>, family: Int32) -> [UInt8]? {
        switch family {
        case AF_INET:
            return sa.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { p in
                withUnsafeBytes(of: p.pointee.sin_addr) { Array($0) }
            }
        case AF_INET6:
            return sa.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { p in
                withUnsafeBytes(of: p.pointee.sin6_addr) { Array($0) }
            }
        default:
            return nil
        }
    }

    static func format(_ bytes: [UInt8]) -> String {
        var text = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
        let family = bytes.count == 4 ? AF_INET : AF_INET6
        _ = bytes.withUnsafeBytes { inet_ntop(family, $0.baseAddress, &text, socklen_t(text.count)) }
        return text.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
    }
}
