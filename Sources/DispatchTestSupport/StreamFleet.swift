import DispatchCore
import DispatchSystem
import Glibc

/// Many SSE subscribers in one test, pumped together with poll(2), each reconnecting like an
/// `EventSource`: after its stream ends it waits the server's last `retry:` and comes back with
/// `Last-Event-ID`. Every event a subscriber saw is kept, across its reconnects.
public final class StreamFleet: @unchecked Sendable {
    public final class Subscriber: @unchecked Sendable {
        public let path: String
        public fileprivate(set) var events: [SSEEvent] = []
        /// Every `retry:` value received, in order.
        public fileprivate(set) var retries: [Int] = []
        /// When each connection (the first and every reconnect) was made, monotonic seconds.
        public fileprivate(set) var connectedAt: [Double] = []
        /// The server answered 204: nothing more will come.
        public fileprivate(set) var finished = false
        fileprivate var socket: TestSocket?
        fileprivate var http = HTTPResponseParser()
        fileprivate var sse = SSEParser()
        fileprivate var status = 0
        fileprivate var reconnectAt: Double?

        init(path: String) { self.path = path }

        public var ids: [Int64] { events.compactMap { $0.id.flatMap { Int64($0) } } }
        public var lastID: Int64? { ids.last }
        public var connected: Bool { socket != nil }
    }

    public let port: Int
    public let token: String?
    public private(set) var subscribers: [Subscriber] = []
    /// Reconnect when a stream ends (false: stay disconnected).
    public var reconnect = true

    public init(port: Int, token: String?) {
        self.port = port
        self.token = token
    }

    /// Adds subscribers to `path`, connected now (or as soon as the server takes them).
    public func add(_ count: Int, path: String, lastEventID: Int64? = nil) {
        for _ in 0..<count {
            let s = Subscriber(path: path)
            subscribers.append(s)
            connect(s, lastEventID: lastEventID)
        }
    }

    private func connect(_ s: Subscriber, lastEventID: Int64?) {
        s.http = HTTPResponseParser()
        s.sse = SSEParser()
        s.status = 0
        s.reconnectAt = nil
        // A refused connection is retried after the last `retry:`, like an EventSource.
        let later = Clock.monotonic() + Double(s.retries.last ?? 3000) / 1000
        guard let sock = try? TestSocket.connect(port: port) else {
            s.reconnectAt = later
            return
        }
        var headers = [("Accept", "text/event-stream")]
        if let token { headers.append(("Authorization", "Bearer \(token)")) }
        if let id = lastEventID ?? s.lastID { headers.append(("Last-Event-ID", String(id))) }
        do { try sock.send(HTTPRequestEncoder.encode(method: "GET", target: s.path, host: "127.0.0.1", headers: headers, close: false)) } catch {
            sock.close()
            s.reconnectAt = later
            return
        }
        s.socket = sock
        s.connectedAt.append(Clock.monotonic())
    }

    private func ended(_ s: Subscriber) {
        s.socket?.close()
        s.socket = nil
        if s.status == 204 { s.finished = true; return }
        guard reconnect else { return }
        s.reconnectAt = Clock.monotonic() + Double(s.retries.last ?? 3000) / 1000
    }

    /// Pumps every connection until `until` holds or `timeout` passes; returns `until`'s value.
    @discardableResult
    public func pump(timeout: Double, until: () -> Bool = { false }) -> Bool {
        let deadline = Clock.monotonic() + timeout
        var buffer = [UInt8](repeating: 0, count: 65536)
        while !until() {
            let now = Clock.monotonic()
            if now >= deadline { return false }
            for s in subscribers where s.socket == nil && !s.finished {
                if let at = s.reconnectAt, at <= now { connect(s, lastEventID: nil) }
            }
            let live = subscribers.filter { $0.socket != nil }
            var fds = live.map { pollfd(fd: $0.socket!.fd, events: Int16(POLLIN), revents: 0) }
            if fds.isEmpty {
                usleep(20_000)
                continue
            }
            guard poll(&fds, nfds_t(fds.count), 50) > 0 else { continue }
            for (i, s) in live.enumerated() where fds[i].revents != 0 {
                let got = recv(fds[i].fd, &buffer, buffer.count, Int32(MSG_DONTWAIT))
                if got > 0 {
                    consume(s, Array(buffer[0..<got]))
                } else if got == 0 || (errno != EAGAIN && errno != EINTR) {
                    ended(s)
                }
            }
        }
        return true
    }

    private func consume(_ s: Subscriber, _ bytes: [UInt8]) {
        guard let parts = try? s.http.feed(bytes) else { return ended(s) }
        for part in parts {
            switch part {
            case .head(let head):
                s.status = head.status
            case .body(let body) where s.status == 200:
                for e in s.sse.feed(body) { s.events.append(e) }
                if let r = s.sse.retryMilliseconds, s.retries.last != r { s.retries.append(r) }
            case .body:
                break
            case .end:
                return ended(s)
            }
        }
    }

    public func closeAll() {
        for s in subscribers { s.socket?.close(); s.socket = nil }
    }

    deinit { closeAll() }
}
