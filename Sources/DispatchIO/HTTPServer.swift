import CLibevent
import DispatchCore
import DispatchSystem
import Glibc

/// Limits on everything a client controls at the HTTP layer.
public struct HTTPLimits: Sendable {
    public var maxHeaderBytes = 8 * 1024
    /// evhttp refuses larger bodies itself (from Content-Length, before reading them, with its
    /// own HTML 413); routes enforce their own, smaller limit with a JSON answer: 16 KiB for a
    /// single call, 1 MiB for `POST /v1/changes` (the margin above it keeps a body a little
    /// over 1 MiB answered with the JSON error).
    public var maxBodyBytes = 2 * 1024 * 1024
    /// Read inactivity while a request is being received, and idle keep-alive.
    public var requestTimeoutSeconds: Double = 10
    public var backlog: Int32 = 4096
    /// A stream whose client accepts no bytes for this long is closed.
    public var streamWriteTimeoutSeconds: Double = 60
    /// The whole-request deadline and the per-address cap on connections without a request.
    public var connections = ConnectionPolicy()
    public init() {}
}

/// evhttp with the pitfalls measured on this platform handled: a large listen backlog, header
/// and body limits, a read deadline, and an accept loop that backs off when out of descriptors.
public final class HTTPServer {
    public let loop: EventLoop
    let http: OpaquePointer
    public let limits: HTTPLimits
    private var listeners: [OpaquePointer] = []
    let guardian: ConnectionGuard
    public var handler: (HTTPRequest) -> Void = { $0.respond(status: 404, body: []) }
    /// Connections cut by the request deadline or the per-address cap (metrics).
    public var connectionsCut: Int { guardian.cut }
    public var connectionsOpen: Int { guardian.count }

    public init(loop: EventLoop, limits: HTTPLimits) {
        self.loop = loop
        self.limits = limits
        guard let http = evhttp_new(loop.base) else { fatalError("evhttp_new failed") }
        self.http = http
        guardian = ConnectionGuard(loop: loop, policy: limits.connections)
        evhttp_set_max_headers_size(http, limits.maxHeaderBytes)
        evhttp_set_max_body_size(http, limits.maxBodyBytes)
        var tv = timeval(seconds: limits.requestTimeoutSeconds)
        evhttp_set_timeout_tv(http, &tv)
        evhttp_set_default_content_type(http, "application/json")
        let methods = EVHTTP_REQ_GET.rawValue | EVHTTP_REQ_POST.rawValue | EVHTTP_REQ_HEAD.rawValue
            | EVHTTP_REQ_PUT.rawValue | EVHTTP_REQ_DELETE.rawValue | EVHTTP_REQ_OPTIONS.rawValue | EVHTTP_REQ_PATCH.rawValue
            // TRACE and CONNECT reach the router too, which answers the contract's JSON 405
            // (evhttp itself would say 501, a server error, to a plain client mistake).
            | EVHTTP_REQ_TRACE.rawValue | EVHTTP_REQ_CONNECT.rawValue
        evhttp_set_allowed_methods(http, UInt16(methods))
        let me = Unmanaged.passUnretained(self).toOpaque()
        evhttp_set_bevcb(http, { base, arg in
            Unmanaged<HTTPServer>.fromOpaque(arg!).takeUnretainedValue().guardian.newConnection(base: base!)
        }, me)
        evhttp_set_gencb(http, { req, arg in
            guard let req else { return }
            let server = Unmanaged<HTTPServer>.fromOpaque(arg!).takeUnretainedValue()
            if let evcon = evhttp_request_get_connection(req) {
                server.guardian.requestCompleted(evcon, closed: { evcon, arg in
                    guard let evcon else { return }
                    Unmanaged<HTTPServer>.fromOpaque(arg!).takeUnretainedValue().guardian.connectionClosing(evcon)
                }, arg: arg!)
            }
            server.handler(HTTPRequest(req, server: server))
        }, me)
    }

    deinit {
        evhttp_free(http)
        guardian.close()
    }

    /// Binds `host:port` (IPv4 or IPv6 literal). With `reusePort`, several processes share it.
    public func listen(host: String, port: Int, reusePort: Bool) throws {
        let address = try SocketAddress(host: host, port: port)
        var flags = UInt32(LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC)
        if reusePort { flags |= UInt32(LEV_OPT_REUSEABLE_PORT) }
        let listener = address.withSockaddr { sa, length in
            evconnlistener_new_bind(loop.base, nil, nil, flags, limits.backlog, sa, Int32(length))
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
