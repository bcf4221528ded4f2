import CLibevent
import DispatchCore
import DispatchSystem
import Glibc

/// Watches every client connection from its accept, for what evhttp 2.1 cannot do itself: a
/// whole-request deadline (its timeout is per read, so a header line every few seconds keeps
/// a connection forever) and a per-address cap on connections that have not completed a
/// request. The decisions are `ConnectionPolicy`'s; a connection is cut by shutting its socket
/// down, so evhttp frees it on its own path.
///
/// Ownership: the guard creates each connection's bufferevent (evhttp's bevcb) and holds a
/// reference on it until evhttp closes the connection (its close callback) or, for one that
/// never completed a request, until the sweep sees evhttp dropped it. So a pointer the guard
/// holds is never freed under it.
final class ConnectionGuard {
    /// Kept small: one per open connection, so 50k streams hold 50k of these.
    struct Tracked {
        var evcon: OpaquePointer?
        var since: Double
        var requests: Int32 = 0
        /// A request arrived and is not answered yet.
        var answering = false
        /// Weak, not unowned: its owner may free the stream during `peerClosed()`, and the
        /// strong reference a weak load yields keeps it alive until that call returns.
        weak var stream: HTTPStream?
    }

    private let loop: LoopScheduling
    var policy: ConnectionPolicy
    private var tracked: [OpaquePointer: Tracked] = [:]
    private var sweeper: Timer?
    private(set) var cut = 0

    init(loop: LoopScheduling, policy: ConnectionPolicy) {
        self.loop = loop
        self.policy = policy
        sweeper = loop.timer(after: 0.5, repeating: true) { [weak self] in self?.sweep() }
    }

    var count: Int { tracked.count }

    /// evhttp asks for a new connection's bufferevent (no socket yet).
    func newConnection(base: OpaquePointer) -> OpaquePointer? {
        guard let bev = bufferevent_socket_new(base, -1, Int32(BEV_OPT_CLOSE_ON_FREE.rawValue)) else { return nil }
        bufferevent_incref(bev)
        tracked[bev] = Tracked(since: loop.now)
        return bev
    }

    /// A request arrived complete on `evcon`: the server holds it until it answers; watch for
    /// the connection's close.
    func requestCompleted(_ evcon: OpaquePointer, closed: @escaping @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Void,
                          arg: UnsafeMutableRawPointer) {
        guard let bev = evhttp_connection_get_bufferevent(evcon), tracked[bev] != nil else { return }
        if tracked[bev]?.evcon == nil { evhttp_connection_set_closecb(evcon, closed, arg) }
        tracked[bev]?.evcon = evcon
        tracked[bev]?.requests += 1
        tracked[bev]?.answering = true
    }

    /// The server answered on `evcon`: the next request's deadline starts now.
    func answered(_ evcon: OpaquePointer) {
        guard let bev = evhttp_connection_get_bufferevent(evcon) else { return }
        tracked[bev]?.answering = false
        tracked[bev]?.since = loop.now
    }

    /// A stream took the connection over (never cut here), or gave it back (keep-alive).
    func setStream(_ stream: HTTPStream?, on evcon: OpaquePointer) {
        guard let bev = evhttp_connection_get_bufferevent(evcon) else { return }
        tracked[bev]?.stream = stream
        tracked[bev]?.answering = false
        if stream == nil { tracked[bev]?.since = loop.now }
    }

    /// evhttp is closing `evcon` (its close callback): tell its stream, drop our reference.
    func connectionClosing(_ evcon: OpaquePointer) {
        guard let bev = evhttp_connection_get_bufferevent(evcon), let t = tracked.removeValue(forKey: bev) else { return }
        t.stream?.peerClosed()
        // evhttp still holds its own reference and frees the bufferevent right after this.
        bufferevent_decref(bev)
    }

    private func sweep() {
        let now = loop.now
        var snapshot: [ConnectionPolicy.Connection] = []
        var dropped: [OpaquePointer] = []
        for (bev, t) in tracked {
            // Held connections (a request being answered, a stream) are never cut: skip them
            // before any work, there may be tens of thousands.
            if t.answering || t.stream != nil { continue }
            // evhttp dropped a connection that never completed a request (no close callback
            // was set for it): our reference is the last one.
            if t.requests == 0 && LibeventInternals.evhttpDroppedConnection(bev) {
                dropped.append(bev)
                continue
            }
            // Only connections still waiting for their first request count against the
            // per-address cap, so only they need their peer's address.
            let peer = t.requests == 0 ? ConnectionGuard.peerAddress(Int32(bufferevent_getfd(bev))) : nil
            snapshot.append(.init(id: Int(bitPattern: UnsafeRawPointer(bev)), peer: peer, since: t.since,
                                  requestsCompleted: Int(t.requests), held: false))
        }
        // Changed after the walk: a change during it would copy the whole table.
        for bev in dropped {
            tracked[bev] = nil
            bufferevent_decref(bev)
        }
        for id in policy.connectionsToCut(snapshot, now: now) {
            guard let raw = UnsafeRawPointer(bitPattern: id) else { continue }
            let fd = Int32(bufferevent_getfd(OpaquePointer(raw)))
            if fd >= 0 { shutdown(fd, Int32(SHUT_RDWR)) }
            cut += 1
        }
    }

    /// Stops sweeping and gives back every reference (the server is being freed).
    func close() {
        sweeper?.cancel()
        sweeper = nil
        for (bev, _) in tracked { bufferevent_decref(bev) }
        tracked.removeAll()
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
