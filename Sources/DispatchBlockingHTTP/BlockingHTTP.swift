import DispatchCore
import DispatchSystem
import Glibc

/// A failure below HTTP: the name, the connection, TLS or the bytes.
public struct TransportError: Error, Equatable, Sendable {
    public var message: String
    /// Worth a retry: refused, reset, timed out, cut short, name service temporarily failing.
    public var transient: Bool

    public init(message: String, transient: Bool) {
        self.message = message
        self.transient = transient
    }
}

/// The bytes of one connection, whatever carries them: a plain socket (`TCPStream`), or the
/// CLI's TLS connection made by libcurl. HTTP itself (`HTTP1Connection`) is the same above either.
public protocol ByteStream: AnyObject {
    func send(_ bytes: [UInt8], deadline: Double) throws(TransportError)
    /// Waits until `deadline` for bytes and reads what is there into `buffer`.
    func receive(into buffer: inout [UInt8], deadline: Double) throws(TransportError) -> Received
}

public enum Received: Equatable, Sendable {
    case bytes(Int)
    case timedOut
    case closed
}

public enum WaitResult: Equatable, Sendable { case ready, timedOut, interrupted }

/// strerror's text, lower-cased (it goes inside a sentence).
func errorText(_ code: Int32) -> String {
    guard let s = strerror(code) else { return "error \(code)" }
    return String(cString: s).lowercased()
}

/// poll() for one fd until `deadline` (monotonic seconds); EINTR ends the wait when
/// `interrupted` says the signal was one the caller stops for (the CLI's Ctrl-C).
public func waitFor(fd: Int32, events: Int16, deadline: Double, interrupted: () -> Bool) -> WaitResult {
    while true {
        let remaining = deadline - Clock.monotonic()
        if remaining <= 0 { return .timedOut }
        var pfd = pollfd(fd: fd, events: events, revents: 0)
        let n = poll(&pfd, 1, Int32(min(remaining * 1000, 1_000_000).rounded(.up)))
        if n > 0 { return .ready }
        if n == 0 { return .timedOut }
        if errno == EINTR {
            if interrupted() { return .interrupted }
            continue
        }
        return .ready  // let the following read/write report the error
    }
}

/// A plain TCP connection: resolved with getaddrinfo (names, IPv4 and IPv6 literals), connected
/// within a deadline, non-blocking underneath so every wait has one; TCP_NODELAY, close-on-exec.
public final class TCPStream: ByteStream {
    public let fd: Int32
    private let interrupted: () -> Bool

    private init(fd: Int32, interrupted: @escaping () -> Bool) {
        self.fd = fd
        self.interrupted = interrupted
    }

    deinit { close(fd) }

    /// Connects to the first address of `host` that answers within `timeout` seconds. `display`
    /// names the server in errors (default `host:port`).
    public static func connect(host: String, port: Int, timeout: Double, display: String? = nil,
                               interrupted: @escaping () -> Bool = { false }) throws(TransportError) -> TCPStream {
        let display = display ?? "\(host.contains(":") ? "[\(host)]" : host):\(port)"
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_flags = AI_ADDRCONFIG | AI_NUMERICSERV
        var list: UnsafeMutablePointer<addrinfo>?
        let bare = host.hasPrefix("[") && host.hasSuffix("]") ? String(host.dropFirst().dropLast()) : host
        let rc = getaddrinfo(bare, String(port), &hints, &list)
        guard rc == 0, let first = list else {
            let text = gai_strerror(rc).map { String(cString: $0) } ?? "error \(rc)"
            throw TransportError(message: "cannot resolve \(host): \(text)", transient: rc == EAI_AGAIN)
        }
        defer { freeaddrinfo(first) }
        let deadline = Clock.monotonic() + timeout
        var lastError = "no address"
        var node: UnsafeMutablePointer<addrinfo>? = first
        while let ai = node {
            node = ai.pointee.ai_next
            let fd = socket(ai.pointee.ai_family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
            guard fd >= 0 else { lastError = errorText(errno); continue }
            var one: Int32 = 1
            setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
            if Glibc.connect(fd, ai.pointee.ai_addr, ai.pointee.ai_addrlen) == 0 {
                return TCPStream(fd: fd, interrupted: interrupted)
            }
            guard errno == EINPROGRESS else { lastError = errorText(errno); close(fd); continue }
            switch waitFor(fd: fd, events: Int16(POLLOUT), deadline: deadline, interrupted: interrupted) {
            case .ready:
                var err: Int32 = 0
                var len = socklen_t(MemoryLayout<Int32>.size)
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len)
                if err == 0 { return TCPStream(fd: fd, interrupted: interrupted) }
                lastError = errorText(err)
            case .timedOut:
                lastError = "connection timed out"
            case .interrupted:
                close(fd)
                throw TransportError(message: "interrupted", transient: false)
            }
            close(fd)
        }
        throw TransportError(message: "cannot connect to \(display): \(lastError)", transient: true)
    }

    /// A connected descriptor for a caller that reads and writes it itself, blocking, with
    /// `receiveTimeout` seconds as SO_RCVTIMEO when given. The caller closes it.
    public static func connectBlocking(host: String, port: Int, timeout: Double, receiveTimeout: Double? = nil) throws(TransportError) -> Int32 {
        let stream = try connect(host: host, port: port, timeout: timeout)
        let fd = dup(stream.fd)
        guard fd >= 0 else { throw TransportError(message: "dup: \(errorText(errno))", transient: false) }
        _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK)
        if let receiveTimeout {
            var tv = timeval(tv_sec: Int(receiveTimeout), tv_usec: Int((receiveTimeout - receiveTimeout.rounded(.down)) * 1e6))
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        }
        return fd
    }

    public func send(_ bytes: [UInt8], deadline: Double) throws(TransportError) {
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { raw in
                Glibc.send(fd, raw.baseAddress! + offset, raw.count - offset, Int32(MSG_NOSIGNAL))
            }
            if n >= 0 { offset += n; continue }
            let e = errno
            if e == EINTR { continue }
            guard e == EAGAIN || e == EWOULDBLOCK else {
                throw TransportError(message: "send failed: \(errorText(e))", transient: true)
            }
            switch waitFor(fd: fd, events: Int16(POLLOUT), deadline: deadline, interrupted: interrupted) {
            case .ready: continue
            case .timedOut: throw TransportError(message: "timed out sending the request", transient: true)
            case .interrupted: throw TransportError(message: "interrupted", transient: false)
            }
        }
    }

    public func receive(into buffer: inout [UInt8], deadline: Double) throws(TransportError) -> Received {
        switch waitFor(fd: fd, events: Int16(POLLIN), deadline: deadline, interrupted: interrupted) {
        case .ready: break
        case .timedOut: return .timedOut
        case .interrupted: throw TransportError(message: "interrupted", transient: false)
        }
        let n = buffer.withUnsafeMutableBytes { raw in recv(fd, raw.baseAddress!, raw.count, 0) }
        if n > 0 { return .bytes(n) }
        if n == 0 { return .closed }
        let e = errno
        if e == EINTR || e == EAGAIN || e == EWOULDBLOCK { return .bytes(0) }
        throw TransportError(message: "receive failed: \(errorText(e))", transient: true)
    }
}

/// One HTTP/1.1 exchange over a `ByteStream`, read with `HTTPResponseParser`. Every wait has
/// a deadline, so nothing blocks forever.
public final class HTTP1Connection {
    public let stream: ByteStream
    private var parser: HTTPResponseParser
    public private(set) var eof = false
    private var buffer = [UInt8](repeating: 0, count: 64 * 1024)

    public init(stream: ByteStream, isHeadRequest: Bool = false) {
        self.stream = stream
        parser = HTTPResponseParser(isHeadRequest: isHeadRequest)
    }

    public func send(_ bytes: [UInt8], deadline: Double) throws(TransportError) {
        try stream.send(bytes, deadline: deadline)
    }

    /// Waits at most until `deadline` for bytes and returns the parser's events: `nil` when the
    /// wait timed out with nothing new, `[]` when bytes arrived that completed nothing.
    public func readEvents(until deadline: Double) throws(TransportError) -> [HTTPResponseEvent]? {
        if eof { return [] }
        let received = try stream.receive(into: &buffer, deadline: deadline)
        do {
            switch received {
            case .timedOut: return nil
            case .bytes(let n): return try parser.feed(buffer[..<n])
            case .closed:
                eof = true
                return try parser.finish()
            }
        } catch {
            throw TransportError(message: error.truncated ? error.message : "bad answer from the server: \(error.message)",
                                 transient: error.truncated)
        }
    }

    /// The whole answer to a request already sent, by `deadline`; a body over `maxBody` bytes fails.
    public func response(by deadline: Double, maxBody: Int = 4 * 1024 * 1024) throws(TransportError) -> HTTPResponse {
        var head: HTTPResponseHead?
        var body: [UInt8] = []
        while true {
            guard let events = try readEvents(until: deadline) else {
                throw TransportError(message: "timed out waiting for the server's answer", transient: true)
            }
            for event in events {
                switch event {
                case .head(let h): head = h
                case .body(let b):
                    body.append(contentsOf: b)
                    if body.count > maxBody { throw TransportError(message: "answer too large", transient: false) }
                case .end:
                    guard let head else { throw TransportError(message: "answer without a head", transient: true) }
                    return HTTPResponse(head: head, body: body)
                }
            }
            if eof && events.isEmpty {
                throw TransportError(message: "connection closed before the answer was complete", transient: true)
            }
        }
    }

    /// One request (encoded with `HTTPRequestEncoder`, `Connection: close`) to host:port over
    /// plain TCP, and its answer, within `timeout` seconds in all.
    public static func exchange(host: String, port: Int, request: [UInt8], timeout: Double, isHeadRequest: Bool = false,
                                maxBody: Int = 4 * 1024 * 1024) throws(TransportError) -> HTTPResponse {
        let deadline = Clock.monotonic() + timeout
        let conn = HTTP1Connection(stream: try TCPStream.connect(host: host, port: port, timeout: timeout), isHeadRequest: isHeadRequest)
        try conn.send(request, deadline: deadline)
        return try conn.response(by: deadline, maxBody: maxBody)
    }
}
