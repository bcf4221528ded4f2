#if canImport(Glibc)
import Glibc
#endif
import DispatchCore
import DispatchSystem
import DispatchCLIKit

/// A failure below HTTP: the name, the connection or the bytes.
struct TransportError: Error {
    var message: String
    /// Worth a retry: refused, reset, timed out, cut short, name service temporarily failing.
    var transient: Bool
}

/// One HTTP/1.1 exchange over a plain non-blocking POSIX socket (`Connection: close`).
/// Every wait goes through poll() with a deadline, so nothing blocks forever.
final class HTTPConnection {
    private let fd: Int32
    private var parser = HTTPResponseParser()
    private var eof = false

    private init(fd: Int32) { self.fd = fd }
    deinit { close(fd) }

    /// Resolves `endpoint.host` with getaddrinfo and connects to the first address that answers.
    static func connect(to endpoint: CLIEndpoint, timeout: Double) throws(TransportError) -> HTTPConnection {
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_flags = AI_ADDRCONFIG | AI_NUMERICSERV
        var list: UnsafeMutablePointer<addrinfo>?
        let rc = getaddrinfo(endpoint.host, String(endpoint.port), &hints, &list)
        guard rc == 0, let first = list else {
            let text = gai_strerror(rc).map { String(cString: $0) } ?? "error \(rc)"
            throw TransportError(message: "cannot resolve \(endpoint.host): \(text)", transient: rc == EAI_AGAIN)
        }
        defer { freeaddrinfo(first) }
        let deadline = Clock.monotonic() + timeout
        var lastError = "no address"
        var node: UnsafeMutablePointer<addrinfo>? = first
        while let ai = node {
            node = ai.pointee.ai_next
            let fd = socket(ai.pointee.ai_family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
            guard fd >= 0 else { lastError = System.errorText(errno); continue }
            var one: Int32 = 1
            setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
            if Glibc.connect(fd, ai.pointee.ai_addr, ai.pointee.ai_addrlen) == 0 {
                return HTTPConnection(fd: fd)
            }
            guard errno == EINPROGRESS else { lastError = System.errorText(errno); close(fd); continue }
            switch wait(fd: fd, events: Int16(POLLOUT), deadline: deadline) {
            case .ready:
                var err: Int32 = 0
                var len = socklen_t(MemoryLayout<Int32>.size)
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len)
                if err == 0 { return HTTPConnection(fd: fd) }
                lastError = System.errorText(err)
            case .timedOut:
                lastError = "connection timed out"
            case .interrupted:
                close(fd)
                throw TransportError(message: "interrupted", transient: false)
            }
            close(fd)
        }
        throw TransportError(message: "cannot connect to \(endpoint.display): \(lastError)", transient: true)
    }

    enum WaitResult { case ready, timedOut, interrupted }

    /// poll() for one fd until `deadline`; EINTR from a signal we handle ends the wait.
    static func wait(fd: Int32, events: Int16, deadline: Double) -> WaitResult {
        while true {
            let remaining = deadline - Clock.monotonic()
            if remaining <= 0 { return .timedOut }
            var pfd = pollfd(fd: fd, events: events, revents: 0)
            let n = poll(&pfd, 1, Int32(min(remaining * 1000, 1_000_000).rounded(.up)))
            if n > 0 { return .ready }
            if n == 0 { return .timedOut }
            if errno == EINTR {
                if System.interrupted() { return .interrupted }
                continue
            }
            return .ready  // let the following read/write report the error
        }
    }

    func send(_ bytes: [UInt8], deadline: Double) throws(TransportError) {
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { raw in
                Glibc.send(fd, raw.baseAddress! + offset, raw.count - offset, Int32(MSG_NOSIGNAL))
            }
            if n >= 0 { offset += n; continue }
            let e = errno
            if e == EINTR { continue }
            guard e == EAGAIN || e == EWOULDBLOCK else {
                throw TransportError(message: "send failed: \(System.errorText(e))", transient: true)
            }
            switch HTTPConnection.wait(fd: fd, events: Int16(POLLOUT), deadline: deadline) {
            case .ready: continue
            case .timedOut: throw TransportError(message: "timed out sending the request", transient: true)
            case .interrupted: throw TransportError(message: "interrupted", transient: false)
            }
        }
    }

    /// Waits at most until `deadline` for bytes and returns the parser's events: `nil` when the
    /// wait timed out with nothing new, `[]` when bytes arrived that completed nothing.
    func readEvents(until deadline: Double) throws(TransportError) -> [HTTPResponseEvent]? {
        if eof { return [] }
        switch HTTPConnection.wait(fd: fd, events: Int16(POLLIN), deadline: deadline) {
        case .ready: break
        case .timedOut: return nil
        case .interrupted: throw TransportError(message: "interrupted", transient: false)
        }
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        let n = buffer.withUnsafeMutableBytes { raw in recv(fd, raw.baseAddress!, raw.count, 0) }
        do {
            if n > 0 { return try parser.feed(buffer[..<n]) }
            if n == 0 {
                eof = true
                return try parser.finish()
            }
        } catch {
            throw TransportError(message: error.truncated ? error.message : "bad answer from the server: \(error.message)",
                                 transient: error.truncated)
        }
        let e = errno
        if e == EINTR || e == EAGAIN || e == EWOULDBLOCK { return [] }
        throw TransportError(message: "receive failed: \(System.errorText(e))", transient: true)
    }

    /// One complete request and its buffered answer, within `timeout` seconds.
    static func exchange(endpoint: CLIEndpoint, request: [UInt8], timeout: Double) throws(TransportError) -> HTTPResponse {
        let deadline = Clock.monotonic() + timeout
        let conn = try connect(to: endpoint, timeout: timeout)
        try conn.send(request, deadline: deadline)
        var head: HTTPResponseHead?
        var body: [UInt8] = []
        while true {
            guard let events = try conn.readEvents(until: deadline) else {
                throw TransportError(message: "timed out waiting for the server's answer", transient: true)
            }
            for event in events {
                switch event {
                case .head(let h): head = h
                case .body(let b):
                    body.append(contentsOf: b)
                    if body.count > 4 * 1024 * 1024 { throw TransportError(message: "answer too large", transient: false) }
                case .end:
                    guard let head else { throw TransportError(message: "answer without a head", transient: true) }
                    return HTTPResponse(head: head, body: body)
                }
            }
            if conn.eof && events.isEmpty {
                throw TransportError(message: "connection closed before the answer was complete", transient: true)
            }
        }
    }
}
