// CCurl, CLibevent: their shims include <sys/socket.h> textually, so one of them owns SOCK_STREAM
// and friends (which one depends on the build mode): import both.
import CCurl
import CLibevent
import CPicoHTTPParser
import DispatchCore
import DispatchSystem
import Glibc

/// Limits on everything a client controls at the HTTP layer.
public struct HTTPLimits: Sendable {
    /// The request line and headers together (431 above it).
    public var maxHeaderBytes = 8 * 1024
    /// The request target (414 above it).
    public var maxTargetBytes = 4 * 1024
    /// Refused from the Content-Length, before reading it (413); routes enforce their own,
    /// smaller limit with the same answer.
    public var maxBodyBytes = 64 * 1024
    /// Paths whose bodies may be larger: `POST /v1/changes` takes 1 MiB (the margin above it
    /// keeps a body a little over 1 MiB answered by the route's own JSON error).
    public var largeBodies = ["/v1/changes": 2 * 1024 * 1024]
    /// Read inactivity while a request is being received, and idle keep-alive.
    public var requestTimeoutSeconds: Double = 10
    public var backlog: Int32 = 4096
    /// A stream whose client accepts no bytes for this long is closed.
    public var streamWriteTimeoutSeconds: Double = 60
    /// The whole-request deadline and the per-address cap on connections without a request.
    public var connections = ConnectionPolicy()
    public init() {}

    var framing: HTTPFraming.Limits {
        HTTPFraming.Limits(maxHeadBytes: maxHeaderBytes, maxTargetBytes: maxTargetBytes, maxBodyBytes: maxBodyBytes, largeBodies: largeBodies)
    }
}

/// The HTTP/1.1 server: a lean layer on the worker's libevent loop. Each listening socket and
/// each connection is one plain persistent `event`, registered once (nothing is re-armed per
/// request); a connection reads into a buffer drawn from a pool only while it has unparsed
/// bytes, parses with picohttpparser, decides framing and limits with `HTTPFraming` (pure),
/// and writes every answer as one byte array built once (`HTTPConnection`).
///
/// It also watches every connection (`sweep`, twice a second): read inactivity
/// (`requestTimeoutSeconds`), the whole-request deadline and the per-address cap
/// (`ConnectionPolicy`), and the write deadline of answers and streams.
public final class HTTPServer {
    public let loop: EventLoop
    public let limits: HTTPLimits
    let framing: HTTPFraming.Limits
    private var listeners: [(fd: Int32, event: OpaquePointer)] = []
    private var acceptPaused = false
    /// Every open connection; each knows its index here (removal swaps the last one in).
    private(set) var connections: [HTTPConnection] = []
    private var sweeper: Timer?
    let pool = ReadBufferPool()
    /// Where the parser puts a head's headers (one request is parsed at a time).
    static let maxHeaders = 100
    let headerScratch = UnsafeMutablePointer<phr_header>.allocate(capacity: HTTPServer.maxHeaders)
    public var handler: (HTTPRequest) -> Void = { $0.respond(status: 404, body: []) }
    /// Connections cut by the request deadline, the per-address cap or a timeout (metrics).
    public private(set) var connectionsCut = 0
    public var connectionsOpen: Int { connections.count }
    /// The `Date` header's text, rebuilt once a second.
    private var dateSecond = 0
    private var dateLine: [UInt8] = []

    public init(loop: EventLoop, limits: HTTPLimits) {
        self.loop = loop
        self.limits = limits
        framing = limits.framing
        sweeper = loop.timer(after: 0.5, repeating: true) { [weak self] in self?.sweep() }
    }

    deinit {
        headerScratch.deallocate()
        sweeper?.cancel()
        for c in connections { c.close(notify: false) }
        for l in listeners {
            event_free(l.event)
            Glibc.close(l.fd)
        }
    }

    /// SO_SNDBUF of every connection (the kernel doubles it for its bookkeeping).
    static let sendBufferBytes: Int32 = 64 * 1024

    /// Binds `host:port` (IPv4 or IPv6 literal). With `reusePort`, several processes share it.
    public func listen(host: String, port: Int, reusePort: Bool) throws {
        let address = try SocketAddress(host: host, port: port)
        let family = address.withSockaddr { sa, _ in Int32(sa.pointee.sa_family) }
        let fd = socket(family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw SystemError("cannot listen on \(host):\(port)", errno: errno) }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        if reusePort { setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, socklen_t(MemoryLayout<Int32>.size)) }
        // Linux gives each accepted socket these two of its listener's settings: set once here,
        // not once per connection. No delay: an event goes out when written. A fixed send
        // buffer: events and answers are small, and with autotuning a reader that stopped
        // reading could park megabytes in the kernel before the stream's cap sees them.
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        var sendBuffer = HTTPServer.sendBufferBytes
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sendBuffer, socklen_t(MemoryLayout<Int32>.size))
        let bound = address.withSockaddr { sa, length in bind(fd, sa, length) }
        guard bound == 0, Glibc.listen(fd, limits.backlog) == 0 else {
            let e = errno
            Glibc.close(fd)
            throw SystemError("cannot listen on \(host):\(port)", errno: e)
        }
        let me = Unmanaged.passUnretained(self).toOpaque()
        guard let event = event_new(loop.base, fd, Int16(EV_READ | EV_PERSIST), { fd, _, arg in
            Unmanaged<HTTPServer>.fromOpaque(arg!).takeUnretainedValue().acceptReady(fd)
        }, me) else {
            Glibc.close(fd)
            throw SystemError("cannot listen on \(host):\(port): event_new failed")
        }
        event_add(event, nil)
        listeners.append((fd, event))
    }

    /// Accepts what is waiting, a bounded number per turn so one busy listener cannot starve
    /// the loop. Out of descriptors (EMFILE), accepting pauses for a second instead of spinning.
    private func acceptReady(_ lfd: Int32) {
        for _ in 0..<64 {
            let fd = sys_accept4(lfd, nil, nil, Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue))
            if fd < 0 {
                switch errno {
                case EINTR, ECONNABORTED, EPROTO: continue
                case EMFILE, ENFILE, ENOBUFS, ENOMEM: pauseAccepting()
                default: break
                }
                return
            }
            let c = HTTPConnection(server: self, fd: fd, index: connections.count, now: loop.now)
            guard c.register() else {
                Glibc.close(fd)
                continue
            }
            connections.append(c)
        }
    }

    private func pauseAccepting() {
        guard !acceptPaused else { return }
        acceptPaused = true
        for l in listeners { event_del(l.event) }
        loop.timer(after: 1) { [weak self] in
            guard let self, self.acceptPaused else { return }
            self.acceptPaused = false
            for l in self.listeners { event_add(l.event, nil) }
        }
    }

    /// The port actually bound (after listening on port 0).
    public func boundPort() -> Int? {
        guard let l = listeners.first else { return nil }
        return PortReservation.boundPort(l.fd)
    }

    /// Stops accepting new connections (shutdown); established ones carry on.
    public func stopListening() {
        acceptPaused = false
        for l in listeners { event_del(l.event) }
    }

    /// A connection closed: drop it from the table (swapping the last one into its place).
    func forget(_ c: HTTPConnection) {
        let i = c.index
        guard i >= 0, i < connections.count, connections[i] === c else { return }
        let last = connections.removeLast()
        if i < connections.count {
            connections[i] = last
            last.index = i
        }
        c.index = -1
    }

    // MARK: - Deadlines

    func sweep() {
        let now = loop.now
        var snapshot: [ConnectionPolicy.Connection] = []
        var late: [HTTPConnection] = []
        for (i, c) in connections.enumerated() {
            switch c.watch(now: now, limits: limits) {
            case .fine: continue
            case .late: late.append(c)
            case .waiting(let since, let requests):
                // Only connections still waiting for their first request, past the grace of a
                // connect burst, count against the per-address cap: only they need the address.
                let peer = requests == 0 && now - since >= limits.connections.pendingGrace ? HTTPServer.peerAddress(c.fd) : nil
                snapshot.append(.init(id: i, peer: peer, since: since, requestsCompleted: requests, held: false))
            }
        }
        // Closed after the walk: closing changes the table.
        var cut = late
        if !snapshot.isEmpty {
            for id in limits.connections.connectionsToCut(snapshot, now: now) where id < connections.count { cut.append(connections[id]) }
        }
        for c in cut where c.isOpen {
            connectionsCut += 1
            c.close(notify: true)
        }
    }

    // MARK: - Answers

    /// `Date: …\r\n`, the same bytes for every answer within a second.
    var dateHeader: [UInt8] {
        var t = time(nil)
        if Int(t) != dateSecond || dateLine.isEmpty {
            dateSecond = Int(t)
            var tmv = tm()
            gmtime_r(&t, &tmv)
            var buf = [CChar](repeating: 0, count: 64)
            let n = strftime(&buf, buf.count, "Date: %a, %d %b %Y %H:%M:%S GMT\r\n", &tmv)
            dateLine = buf[..<n].map { UInt8(bitPattern: $0) }
        }
        return dateLine
    }

    static func peerAddress(_ fd: Int32) -> String? {
        guard fd >= 0 else { return nil }
        var storage = sockaddr_storage()
        var len = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let r = withUnsafeMutablePointer(to: &storage) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getpeername(fd, $0, &len) } }
        guard r == 0 else { return nil }
        var text = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
        let ok: Bool = withUnsafeBytes(of: storage) { raw in
            if storage.ss_family == sa_family_t(AF_INET) {
                var a = raw.load(as: sockaddr_in.self).sin_addr
                return inet_ntop(AF_INET, &a, &text, socklen_t(text.count)) != nil
            }
            var a = raw.load(as: sockaddr_in6.self).sin6_addr
            return inet_ntop(AF_INET6, &a, &text, socklen_t(text.count)) != nil
        }
        return ok ? String(decoding: text.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self) : nil
    }
}

/// Read buffers for connections that have unparsed bytes: a connection takes one when bytes
/// arrive and gives it back once everything in it is parsed, so an idle keep-alive connection
/// or a stream holds none. Buffers of the standard size are kept for reuse (up to `keep`).
final class ReadBufferPool {
    static let size = 16 * 1024
    private var free: [UnsafeMutableRawPointer] = []
    let keep = 256
    private(set) var outstanding = 0

    func take() -> UnsafeMutableRawPointer {
        outstanding += 1
        return free.popLast() ?? UnsafeMutableRawPointer.allocate(byteCount: ReadBufferPool.size, alignment: 16)
    }

    /// `capacity`: the buffer's size now (a body may have grown it past the standard size).
    func give(_ p: UnsafeMutableRawPointer, capacity: Int) {
        outstanding -= 1
        if capacity == ReadBufferPool.size && free.count < keep { free.append(p) } else { p.deallocate() }
    }

    deinit { for p in free { p.deallocate() } }
}

/// accept4(2): Swift's Glibc module leaves out the GNU declarations. One call accepts a
/// connection non-blocking and close-on-exec (two fcntl calls fewer per connect).
@_silgen_name("accept4")
func sys_accept4(_ fd: Int32, _ address: UnsafeMutableRawPointer?, _ length: UnsafeMutablePointer<UInt32>?, _ flags: Int32) -> Int32
