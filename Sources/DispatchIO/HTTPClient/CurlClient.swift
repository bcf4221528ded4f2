import DispatchCore
import DispatchSystem
import CCurl
import CLibevent
import Glibc

/// An asynchronous HTTP client: libcurl's multi-socket interface driven by our libevent loop
/// (the shape of curl's docs/examples/hiperfifo.c). Carries webhooks (any public http or https
/// URL); APNs pushes go through `H2Client`, which can PING idle HTTP/2 connections.
///
/// Single-threaded: use it on its loop's thread only. Completions always run on a later turn
/// of the loop, never inside `send` and never while curl is in the middle of a call, and each
/// exactly once. `close()` must be called before the last reference goes away.
/// What sends HTTP requests for a shell: `CurlClient` or `H2Client` in the server, a scripted sender in
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
        multi = makeMulti()
        let me = Unmanaged.passUnretained(self).toOpaque()
        timerEvent = event_new(loop.base, -1, 0, { _, _, arg in
            Unmanaged<CurlClient>.fromOpaque(arg!).takeUnretainedValue().drive(CURL_SOCKET_TIMEOUT, 0)
        }, me)
        if let timerEvent { event_priority_set(timerEvent, urgency.priority.rawValue) }
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
            curl_multi_remove_handle(multi, easy)
            transfer.release()
            finished.append((transfer.completion, result))
        }
        // Queued requests go first, before completions can send more.
        if !closed && options.maxInFlight > 0 { startQueued(expired: &finished) }
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
