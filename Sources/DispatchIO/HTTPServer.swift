import CLibevent
import DispatchCore
import DispatchSystem
import Glibc

/// Limits on everything a client controls at the HTTP layer.
public struct HTTPLimits: Sendable {
    public var maxHeaderBytes = 8 * 1024
    /// evhttp refuses larger bodies itself (from Content-Length, before reading them); routes
    /// enforce their own, smaller limit with a JSON answer.
    public var maxBodyBytes = 64 * 1024
    /// Read inactivity while a request is being received, and idle keep-alive.
    public var requestTimeoutSeconds: Double = 10
    public var backlog: Int32 = 4096
    /// A stream whose client accepts no bytes for this long is closed.
    public var streamWriteTimeoutSeconds: Double = 60
    public init() {}
}

/// evhttp with the pitfalls measured on this platform handled: a large listen backlog, header
/// and body limits, a read deadline, and an accept loop that backs off when out of descriptors.
public final class HTTPServer {
    public let loop: EventLoop
    let http: OpaquePointer
    public let limits: HTTPLimits
    private var listeners: [OpaquePointer] = []
    public var handler: (HTTPRequest) -> Void = { $0.respond(status: 404, body: []) }

    public init(loop: EventLoop, limits: HTTPLimits) {
        self.loop = loop
        self.limits = limits
        guard let http = evhttp_new(loop.base) else { fatalError("evhttp_new failed") }
        self.http = http
        evhttp_set_max_headers_size(http, limits.maxHeaderBytes)
        evhttp_set_max_body_size(http, limits.maxBodyBytes)
        var tv = timeval(seconds: limits.requestTimeoutSeconds)
        evhttp_set_timeout_tv(http, &tv)
        evhttp_set_default_content_type(http, "application/json")
        let methods = EVHTTP_REQ_GET.rawValue | EVHTTP_REQ_POST.rawValue | EVHTTP_REQ_HEAD.rawValue
            | EVHTTP_REQ_PUT.rawValue | EVHTTP_REQ_DELETE.rawValue | EVHTTP_REQ_OPTIONS.rawValue | EVHTTP_REQ_PATCH.rawValue
        evhttp_set_allowed_methods(http, UInt16(methods))
        evhttp_set_gencb(http, { req, arg in
            guard let req else { return }
            let server = Unmanaged<HTTPServer>.fromOpaque(arg!).takeUnretainedValue()
            server.handler(HTTPRequest(req))
        }, Unmanaged.passUnretained(self).toOpaque())
    }

    deinit { evhttp_free(http) }

    /// Binds `host:port` (IPv4 or IPv6 literal). With `reusePort`, several processes share it.
    public func listen(host: String, port: Int, reusePort: Bool) throws {
        var storage = sockaddr_storage()
        var length: socklen_t = 0
        var in4 = sockaddr_in()
        var in6 = sockaddr_in6()
        if inet_pton(AF_INET, host, &in4.sin_addr) == 1 {
            in4.sin_family = sa_family_t(AF_INET)
            in4.sin_port = in_port_t(UInt16(port).bigEndian)
            withUnsafeBytes(of: in4) { src in withUnsafeMutableBytes(of: &storage) { $0.copyMemory(from: src) } }
            length = socklen_t(MemoryLayout<sockaddr_in>.size)
        } else if inet_pton(AF_INET6, host.trimmingBrackets, &in6.sin6_addr) == 1 {
            in6.sin6_family = sa_family_t(AF_INET6)
            in6.sin6_port = in_port_t(UInt16(port).bigEndian)
            withUnsafeBytes(of: in6) { src in withUnsafeMutableBytes(of: &storage) { $0.copyMemory(from: src) } }
            length = socklen_t(MemoryLayout<sockaddr_in6>.size)
        } else {
            throw SystemError("listen address \(host) is not an IP address")
        }
        var flags = UInt32(LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC)
        if reusePort { flags |= UInt32(LEV_OPT_REUSEABLE_PORT) }
        let listener = withUnsafePointer(to: &storage) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                evconnlistener_new_bind(loop.base, nil, nil, flags, limits.backlog, $0, Int32(length))
            }
        }
        guard let listener else {
            throw SystemError("cannot listen on \(host):\(port)", errno: errno)
        }
        evconnlistener_set_error_cb(listener, { lev, _ in
            // Out of descriptors (EMFILE): pause accepting for a second instead of spinning.
            guard let lev else { return }
            evconnlistener_disable(lev)
            var tv = timeval(tv_sec: 1, tv_usec: 0)
            event_base_once(evconnlistener_get_base(lev), -1, Int16(EV_TIMEOUT), { _, _, arg in
                evconnlistener_enable(OpaquePointer(arg))
            }, UnsafeMutableRawPointer(lev), &tv)
        })
        guard evhttp_bind_listener(http, listener) != nil else {
            evconnlistener_free(listener)
            throw SystemError("cannot attach listener on \(host):\(port)")
        }
        listeners.append(listener)
    }

    /// The port actually bound (after listening on port 0).
    public func boundPort() -> Int? {
        guard let l = listeners.first else { return nil }
        var storage = sockaddr_storage()
        var len = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let fd = evconnlistener_get_fd(l)
        let r = withUnsafeMutablePointer(to: &storage) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) } }
        guard r == 0 else { return nil }
        if storage.ss_family == sa_family_t(AF_INET) {
            return withUnsafeBytes(of: storage) { Int(UInt16(bigEndian: $0.load(as: sockaddr_in.self).sin_port)) }
        }
        return withUnsafeBytes(of: storage) { Int(UInt16(bigEndian: $0.load(as: sockaddr_in6.self).sin6_port)) }
    }

    /// Stops accepting new connections (shutdown); established ones carry on.
    public func stopListening() {
        for l in listeners { evconnlistener_disable(l) }
    }
}

extension String {
    var trimmingBrackets: String {
        hasPrefix("[") && hasSuffix("]") ? String(dropFirst().dropLast()) : self
    }
}

/// One HTTP request as evhttp parsed it.
public final class HTTPRequest {
    public let raw: UnsafeMutablePointer<evhttp_request>

    init(_ raw: UnsafeMutablePointer<evhttp_request>) { self.raw = raw }

    /// The request's method; nil for one the API does not speak.
    public var method: HTTPMethod? {
        switch evhttp_request_get_command(raw) {
        case EVHTTP_REQ_GET: return .get
        case EVHTTP_REQ_POST: return .post
        case EVHTTP_REQ_HEAD: return .head
        case EVHTTP_REQ_PUT: return .put
        case EVHTTP_REQ_DELETE: return .delete
        case EVHTTP_REQ_OPTIONS: return .options
        case EVHTTP_REQ_PATCH: return .patch
        default: return nil
        }
    }

    /// The path, percent-decoded, or nil if it decodes to something with NUL or invalid UTF-8.
    public lazy var path: String? = {
        guard let uri = evhttp_request_get_evhttp_uri(raw), let p = evhttp_uri_get_path(uri) else { return "/" }
        var size = 0
        guard let decoded = evhttp_uridecode(p, 0, &size) else { return nil }
        defer { free(decoded) }
        let bytes = UnsafeRawBufferPointer(start: decoded, count: size)
        guard !bytes.contains(0) else { return nil }
        return String(validating: bytes, as: UTF8.self)
    }()

    /// Query parameters, decoded; the first value wins for repeated names.
    public lazy var query: [String: String] = {
        guard let uri = evhttp_request_get_evhttp_uri(raw), let q = evhttp_uri_get_query(uri) else { return [:] }
        var headers = evkeyvalq()
        headers.tqh_first = nil
        headers.tqh_last = withUnsafeMutablePointer(to: &headers.tqh_first) { $0 }
        guard evhttp_parse_query_str(q, &headers) == 0 else { evhttp_clear_headers(&headers); return [:] }
        var out: [String: String] = [:]
        var item = headers.tqh_first
        while let kv = item {
            let k = String(cString: kv.pointee.key), v = String(cString: kv.pointee.value)
            if out[k] == nil { out[k] = v }
            item = kv.pointee.next.tqe_next
        }
        evhttp_clear_headers(&headers)
        return out
    }()

    public func header(_ name: String) -> String? {
        guard let h = evhttp_find_header(evhttp_request_get_input_headers(raw), name) else { return nil }
        return String(cString: h)
    }

    /// Every value of a header the request carries, in order.
    public func headerValues(_ name: String) -> [String] {
        var out: [String] = []
        var item = evhttp_request_get_input_headers(raw).pointee.tqh_first
        while let kv = item {
            if strcasecmp(kv.pointee.key, name) == 0 { out.append(String(cString: kv.pointee.value)) }
            item = kv.pointee.next.tqe_next
        }
        return out
    }

    public func body() -> [UInt8] {
        guard let buf = evhttp_request_get_input_buffer(raw) else { return [] }
        let n = evbuffer_get_length(buf)
        guard n > 0 else { return [] }
        var out = [UInt8](repeating: 0, count: n)
        _ = out.withUnsafeMutableBytes { evbuffer_copyout(buf, $0.baseAddress, n) }
        return out
    }

    public func respond(status: Int, headers: [(String, String)] = [], body: [UInt8]) {
        let out = evhttp_request_get_output_headers(raw)
        for (k, v) in headers { evhttp_add_header(out, k, v) }
        let buf = evbuffer_new()
        // evhttp 2.1 sends a body even after HEAD, which a keep-alive client would read as the
        // start of the next answer: HEAD gets the headers only.
        if !body.isEmpty && evhttp_request_get_command(raw) != EVHTTP_REQ_HEAD {
            body.withUnsafeBytes { _ = evbuffer_add(buf, $0.baseAddress, $0.count) }
        }
        evhttp_send_reply(raw, Int32(status), HTTPRequest.reason(status), buf)
        evbuffer_free(buf)
    }

    public static func reason(_ status: Int) -> String {
        switch status {
        case 200: return "OK"
        case 201: return "Created"
        case 202: return "Accepted"
        case 204: return "No Content"
        case 400: return "Bad Request"
        case 401: return "Unauthorized"
        case 403: return "Forbidden"
        case 404: return "Not Found"
        case 405: return "Method Not Allowed"
        case 409: return "Conflict"
        case 413: return "Payload Too Large"
        case 415: return "Unsupported Media Type"
        case 429: return "Too Many Requests"
        case 500: return "Internal Server Error"
        case 503: return "Service Unavailable"
        default: return "Status"
        }
    }
}

/// Bytes written to many streams, framed once as an HTTP/1.1 chunk; an HTTP/1.0 stream (no
/// chunking) is sent the same bytes without the chunk's size line and trailing CRLF.
public final class StreamPayload {
    public let chunked: [UInt8]
    let plainStart: Int

    public init(_ plain: [UInt8]) {
        var c = Array(String(plain.count, radix: 16).utf8)
        c.append(contentsOf: [0x0D, 0x0A])
        plainStart = c.count
        c.append(contentsOf: plain)
        c.append(contentsOf: [0x0D, 0x0A])
        chunked = c
    }

    /// Bytes on the wire when chunked.
    public var size: Int { chunked.count }

    func withBytes<R>(chunked isChunked: Bool, _ body: (UnsafeRawBufferPointer) -> R) -> R {
        chunked.withUnsafeBytes { raw in
            body(isChunked ? raw : UnsafeRawBufferPointer(rebasing: raw[plainStart..<(raw.count - 2)]))
        }
    }
}

public protocol HTTPStreamDelegate: AnyObject {
    func streamPeerClosed(_ tag: Int)
    func streamDrained(_ tag: Int)
}

/// A long-lived streamed response (SSE). Writes go straight to the socket while its buffer is
/// empty and queue in the connection's output buffer otherwise. Exactly one of `end`, `abort`,
/// or the peer closing ends it; after that the evhttp pointers are never touched again.
public final class HTTPStream {
    public enum WriteResult { case written, queued, backlogExceeded, failed }

    private let loop: EventLoop
    private var request: UnsafeMutablePointer<evhttp_request>?
    private var connection: OpaquePointer?
    private var output: OpaquePointer?
    private var fd: Int32 = -1
    private var chunked = true
    private var aborting = false
    /// Runs once when the peer goes away (FIN, RST, write timeout); not after end or abort.
    /// Told when the peer goes away and when queued output drained below `drainMark`
    /// (a delegate and a tag rather than closures: two fewer allocations per stream).
    public weak var delegate: HTTPStreamDelegate?
    public var tag = 0
    public var drainMark = 32 * 1024
    private var drainEntry: OpaquePointer?
    private var drainScheduled = false
    public private(set) var isOpen = false

    private let requestTimeout: Double

    public init(loop: EventLoop, requestTimeout: Double = HTTPLimits().requestTimeoutSeconds) {
        self.loop = loop
        self.requestTimeout = requestTimeout
    }

    /// The connection's close callback points at this object: it must be ended first.
    deinit { precondition(connection == nil, "HTTPStream released while its connection is open") }

    /// Watches the request's connection from now on, before anything is answered: a client
    /// that leaves while its stream waits for the database is noticed too.
    public func attach(_ req: HTTPRequest) {
        let raw = req.raw
        request = raw
        let conn = evhttp_request_get_connection(raw)
        connection = conn
        evhttp_connection_set_closecb(conn, { _, arg in
            let stream = Unmanaged<HTTPStream>.fromOpaque(arg!).takeUnretainedValue()
            stream.peerClosed()
        }, Unmanaged.passUnretained(self).toOpaque())
        isOpen = true
    }

    public private(set) var started = false

    /// Sends the status line and headers, and takes over the connection's timeouts.
    public func begin(headers: [(String, String)], writeTimeout: Double, maxInputBuffer: Int = 4096) {
        guard isOpen, !aborting, !started, let raw = request, let conn = connection else { return }
        if raw.pointee.major == 1 && raw.pointee.minor == 0 {
            // HTTP/1.0 has no chunking: the stream is framed by closing the connection, so a
            // keep-alive request must not make evhttp announce an empty body.
            evhttp_remove_header(evhttp_request_get_input_headers(raw), "Connection")
        }
        let out = evhttp_request_get_output_headers(raw)
        for (k, v) in headers { evhttp_add_header(out, k, v) }
        evhttp_send_reply_start(raw, 200, "OK")
        started = true
        // The status line and headers are on the wire now: a long-lived stream need not keep
        // them, nor the parsed URI, in memory (evhttp_request_free frees only what is set).
        evhttp_clear_headers(evhttp_request_get_input_headers(raw))
        evhttp_clear_headers(out)
        if let uri = raw.pointee.uri_elems { evhttp_uri_free(uri); raw.pointee.uri_elems = nil }
        if let uri = raw.pointee.uri { free(uri); raw.pointee.uri = nil }
        if let line = raw.pointee.response_code_line { free(line); raw.pointee.response_code_line = nil }
        chunked = raw.pointee.chunked != 0
        let bev = evhttp_connection_get_bufferevent(conn)
        output = bufferevent_get_output(bev)
        fd = Int32(bufferevent_getfd(bev))
        var wtv = timeval(seconds: writeTimeout)
        bufferevent_set_timeouts(bev, nil, &wtv)
        // A fixed kernel send buffer: events are small, and without it autotuning lets a
        // reader that stopped reading park megabytes in the kernel before our cap sees it.
        drainEntry = evbuffer_add_cb(output, { _, info, arg in
            guard let info, info.pointee.n_deleted > 0 else { return }
            Unmanaged<HTTPStream>.fromOpaque(arg!).takeUnretainedValue().drained()
        }, Unmanaged.passUnretained(self).toOpaque())
        var sndbuf: Int32 = 64 * 1024
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, socklen_t(MemoryLayout<Int32>.size))
        bufferevent_setwatermark(bev, Int16(EV_READ), 0, maxInputBuffer)
    }

    /// Answers with a plain response instead of a stream (204, or an error before streaming).
    public func respond(status: Int, headers: [(String, String)] = [], body: [UInt8]) {
        guard isOpen, !aborting, !started, let raw = request, let conn = connection else { return }
        evhttp_connection_set_closecb(conn, nil, nil)
        forget()
        HTTPRequest(raw).respond(status: status, headers: headers, body: body)
    }

    private func peerClosed() {
        let wasAborting = aborting
        // A reply still in progress when the peer leaves is detached from its connection by
        // evhttp and then never freed by it: free it here, once libevent is done with it.
        if let r = request, evhttp_request_get_connection(r) == nil {
            loop.soon { evhttp_request_free(r) }
        }
        forget()
        if !wasAborting { delegate?.streamPeerClosed(tag) }
        delegate = nil
    }

    private func drained() {
        guard !drainScheduled, delegate != nil, backlog < drainMark else { return }
        drainScheduled = true
        loop.soon { [weak self] in
            guard let self else { return }
            self.drainScheduled = false
            if self.isOpen { self.delegate?.streamDrained(self.tag) }
        }
    }

    private func forget() {
        if let output, let drainEntry { evbuffer_remove_cb_entry(output, drainEntry) }
        drainEntry = nil
        isOpen = false
        started = false
        request = nil
        connection = nil
        output = nil
        fd = -1
    }

    /// Bytes waiting in user space for this client.
    public var backlog: Int { output.map { evbuffer_get_length($0) } ?? 0 }

    public func write(_ payload: StreamPayload, maxBacklog: Int) -> WriteResult {
        guard isOpen, !aborting, let output else { return .failed }
        let fd = self.fd
        return payload.withBytes(chunked: chunked) { bytes in
            if evbuffer_get_length(output) == 0 {
                let n = send(fd, bytes.baseAddress, bytes.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT))
                if n == bytes.count { return .written }
                if n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR { return .failed }
                let sent = max(n, 0)
                evbuffer_add(output, bytes.baseAddress! + sent, bytes.count - sent)
                return .queued
            }
            if evbuffer_get_length(output) + bytes.count > maxBacklog { return .backlogExceeded }
            evbuffer_add(output, bytes.baseAddress, bytes.count)
            return .queued
        }
    }

    /// Ends the response cleanly (terminal chunk); the connection may serve further requests.
    public func end() {
        guard isOpen, !aborting, started, let request, let connection else { return }
        evhttp_connection_set_closecb(connection, nil, nil)
        // The connection may serve further requests: give it back its request deadline and
        // an unlimited read watermark, which the stream had changed.
        let bev = evhttp_connection_get_bufferevent(connection)
        var tv = timeval(seconds: requestTimeout)
        bufferevent_set_timeouts(bev, &tv, &tv)
        bufferevent_setwatermark(bev, Int16(EV_READ), 0, 0)
        forget()
        evhttp_send_reply_end(request)
    }

    /// Drops the connection on a later loop turn (never inside a libevent callback).
    public func abort() {
        guard isOpen, !aborting else { return }
        aborting = true
        loop.soon { [self] in
            guard let connection else { return }  // the peer closed first: libevent freed it
            evhttp_connection_set_closecb(connection, nil, nil)
            forget()
            evhttp_connection_free(connection)
        }
    }
}
