import DispatchBlockingHTTP
import DispatchSystem
import DispatchCore
import DispatchIO
import Glibc

/// A small blocking HTTP/1.1 client over real sockets, for tests.
public struct HTTPClient: Sendable {
    public let host: String
    public let port: Int
    public var token: String?

    public init(host: String = "127.0.0.1", port: Int, token: String? = nil) {
        self.host = host
        self.port = port
        self.token = token
    }

    public struct Response: Sendable {
        public var status: Int
        /// Names lower-cased; of a repeated field, the last value.
        public var headers: [String: String]
        public var body: [UInt8]

        public init(status: Int, headers: [String: String], body: [UInt8]) {
            self.status = status
            self.headers = headers
            self.body = body
        }

        public init(_ response: HTTPResponse) {
            self.init(status: response.head.status, headers: Dictionary(response.head.headers, uniquingKeysWith: { $1 }),
                      body: response.body)
        }

        public var text: String { String(decoding: body, as: UTF8.self) }
        public var json: JSONValue? { try? JSONParser.parse(body) }
        public var errorCode: String? {
            if case .string(let c)? = json?["error"]?["code"] { return c }
            return nil
        }
    }

    public func request(_ method: String, _ path: String, json: String? = nil, headers: [String: String] = [:]) throws -> Response {
        var h = headers
        if let token, h["Authorization"] == nil { h["Authorization"] = "Bearer \(token)" }
        if json != nil, h["Content-Type"] == nil { h["Content-Type"] = "application/json" }
        let body: [UInt8]? = json != nil || method == "POST" ? Array((json ?? "").utf8) : nil
        let request = HTTPRequestEncoder.encode(method: method, target: path, host: "\(host):\(port)", headers: h.map { ($0.key, $0.value) },
                                                body: body)
        do {
            return Response(try HTTP1Connection.exchange(host: host, port: port, request: request, timeout: 30,
                                                         isHeadRequest: method == "HEAD", maxBody: .max))
        } catch {
            throw TestError("\(method) \(path): \(error.message)")
        }
    }

    public func post(_ path: String, _ json: String, headers: [String: String] = [:]) throws -> Response {
        try request("POST", path, json: json, headers: headers)
    }

    public func get(_ path: String, headers: [String: String] = [:]) throws -> Response {
        try request("GET", path, headers: headers)
    }

    /// Parses a whole response, read until the server closed the connection.
    public static func parse(_ raw: [UInt8], isHeadRequest: Bool = false) throws -> Response {
        do {
            return Response(try HTTPResponseParser.response(in: raw[...], isHeadRequest: isHeadRequest).response)
        } catch {
            throw TestError("bad response (\(raw.count) bytes): \(error.message)")
        }
    }
}

/// Whether something accepts TCP connections on 127.0.0.1:`port` at the moment of the call.
public func isListening(_ port: Int) -> Bool {
    (try? TestSocket.connect(port: port)) != nil
}

/// A raw TCP socket for tests: connect, send, read with timeouts, close or reset.
public final class TestSocket: @unchecked Sendable {
    public let fd: Int32
    private var closed = false

    init(fd: Int32) { self.fd = fd }

    public static func connect(host: String = "127.0.0.1", port: Int) throws -> TestSocket {
        do {
            return TestSocket(fd: try TCPStream.connectBlocking(host: host, port: port, timeout: 10))
        } catch {
            throw TestError(error.message)
        }
    }

    public func send(_ bytes: [UInt8]) throws {
        var sent = 0
        while sent < bytes.count {
            let n = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + sent, $0.count - sent, Int32(MSG_NOSIGNAL)) }
            guard n > 0 else { throw TestError("send: \(String(cString: strerror(errno)))") }
            sent += n
        }
    }

    public func send(_ text: String) throws { try send(Array(text.utf8)) }

    /// Reads what arrives within `timeout` seconds; [] on EOF. Throws on timeout with nothing.
    public func read(timeout: Double) throws -> [UInt8]? {
        var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        let r = poll(&p, 1, Int32(timeout * 1000))
        if r == 0 { return nil }
        var buf = [UInt8](repeating: 0, count: 65536)
        let n = recv(fd, &buf, buf.count, 0)
        if n <= 0 { return [] }
        return Array(buf[0..<n])
    }

    /// Reads until EOF (or `timeout` seconds in all).
    public func readAll(timeout: Double) throws -> [UInt8] {
        var out: [UInt8] = []
        let deadline = Clock.monotonic() + timeout
        while Clock.monotonic() < deadline {
            guard let chunk = try read(timeout: max(0.01, deadline - Clock.monotonic())) else { continue }
            if chunk.isEmpty { return out }
            out.append(contentsOf: chunk)
        }
        throw TestError("timed out reading (got \(out.count) bytes)")
    }

    public func close() {
        guard !closed else { return }
        closed = true
        Glibc.close(fd)
    }

    /// Closes with RST instead of FIN (SO_LINGER 0), as a crashed client would.
    public func reset() {
        var l = linger(l_onoff: 1, l_linger: 0)
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, socklen_t(MemoryLayout<linger>.size))
        close()
    }

    /// Makes the kernel receive buffer small, so a reader that stops reading backs up fast.
    public func shrinkReceiveBuffer(_ bytes: Int32 = 4096) {
        var v = bytes
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, socklen_t(MemoryLayout<Int32>.size))
    }

    deinit { close() }
}

/// A status-stream client: sends the GET, then parses SSE events as they arrive.
public final class SSEClient: @unchecked Sendable {
    public let socket: TestSocket
    public private(set) var status = 0
    public private(set) var headers: [String: String] = [:]
    public private(set) var events: [SSEEvent] = []
    public private(set) var ended = false
    public private(set) var heartbeats = 0
    /// The Last-Event-ID the request sent (a resume), if any.
    public let lastEventID: Int64?
    private var http = HTTPResponseParser()
    private var parser = SSEParser()

    public init(port: Int, path: String, token: String?, lastEventID: Int64? = nil, smallBuffer: Bool = false) throws {
        socket = try TestSocket.connect(port: port)
        self.lastEventID = lastEventID
        if smallBuffer { socket.shrinkReceiveBuffer() }
        var headers = [("Accept", "text/event-stream")]
        if let token { headers.append(("Authorization", "Bearer \(token)")) }
        if let lastEventID { headers.append(("Last-Event-ID", String(lastEventID))) }
        try socket.send(HTTPRequestEncoder.encode(method: "GET", target: path, host: "127.0.0.1", headers: headers, close: false))
    }

    /// Pumps the socket for up to `timeout` seconds, or until `until` holds.
    @discardableResult
    public func pump(timeout: Double, until: (SSEClient) -> Bool = { _ in false }) throws -> Bool {
        let deadline = Clock.monotonic() + timeout
        while !until(self) {
            if ended { return until(self) }
            let left = deadline - Clock.monotonic()
            if left <= 0 { return false }
            guard let chunk = try socket.read(timeout: min(left, 0.5)) else { continue }
            if chunk.isEmpty { ended = true; continue }
            consume(chunk)
        }
        return true
    }

    /// Waits for `count` events (in all) or the end of the stream.
    public func waitForEvents(_ count: Int, timeout: Double = 20) throws -> [SSEEvent] {
        try pump(timeout: timeout) { $0.events.count >= count || $0.ended }
        return events
    }

    public func waitForEnd(timeout: Double = 20) throws -> Bool {
        try pump(timeout: timeout) { $0.ended }
    }

    public var ids: [Int64] { events.compactMap { $0.id.flatMap { Int64($0) } } }

    private func consume(_ chunk: [UInt8]) {
        let parts: [HTTPResponseEvent]
        do {
            parts = try http.feed(chunk)
        } catch {
            ended = true
            return
        }
        for part in parts {
            switch part {
            case .head(let head):
                status = head.status
                headers = Dictionary(head.headers, uniquingKeysWith: { $1 })
                if status != 200 { ended = true }
            case .body(let bytes):
                feed(bytes)
            case .end:
                ended = true
            }
        }
    }

    private func feed(_ bytes: [UInt8]) {
        let before = parser.commentCount
        events.append(contentsOf: parser.feed(bytes))
        heartbeats += parser.commentCount - before
    }

    public func close() { socket.close() }
    public func reset() { socket.reset() }
}

/// One kept-alive connection, for tests that need several requests to reach the same server
/// process (a connection stays with the worker that accepted it).
public final class KeepAliveConnection: @unchecked Sendable {
    public let socket: TestSocket
    private var pending: [UInt8] = []

    public init(port: Int) throws { socket = try TestSocket.connect(port: port) }

    public func request(_ method: String, _ path: String, token: String?, json: String? = nil) throws -> HTTPClient.Response {
        var headers: [(String, String)] = []
        if let token { headers.append(("Authorization", "Bearer \(token)")) }
        let hasBody = json != nil || method == "POST"
        if hasBody { headers.append(("Content-Type", "application/json")) }
        try socket.send(HTTPRequestEncoder.encode(method: method, target: path, host: "127.0.0.1", headers: headers,
                                                  body: hasBody ? Array((json ?? "").utf8) : nil, close: false))
        var parser = HTTPResponseParser(isHeadRequest: method == "HEAD")
        var headOut: HTTPResponseHead?
        var bodyOut: [UInt8] = []
        let deadline = Clock.monotonic() + 30
        while true {
            var consumed = 0
            if !pending.isEmpty {
                consumed = try pending.withUnsafeBytes { raw in
                    try parser.feed(raw) { part in
                        switch part {
                        case .head(let h): headOut = h
                        case .body(let b): bodyOut.append(contentsOf: b)
                        case .end: break
                        }
                    }
                }
                pending.removeFirst(consumed)
            }
            if parser.isComplete, let h = headOut {
                return HTTPClient.Response(status: h.status, headers: Dictionary(h.headers, uniquingKeysWith: { a, _ in a }), body: bodyOut)
            }
            guard Clock.monotonic() < deadline else { throw TestError("no complete answer on a kept-alive connection") }
            guard let chunk = try socket.read(timeout: 1) else { continue }
            if chunk.isEmpty { throw TestError("the server closed a kept-alive connection") }
            pending.append(contentsOf: chunk)
        }
    }

    public func close() { socket.close() }
}
