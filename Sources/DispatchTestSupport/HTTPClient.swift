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
        public var headers: [String: String]
        public var body: [UInt8]
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
        let body = Array((json ?? "").utf8)
        var req = "\(method) \(path) HTTP/1.1\r\nHost: \(host):\(port)\r\nConnection: close\r\n"
        for (k, v) in h { req += "\(k): \(v)\r\n" }
        if json != nil || method == "POST" { req += "Content-Length: \(body.count)\r\n" }
        req += "\r\n"
        let sock = try TestSocket.connect(host: host, port: port)
        defer { sock.close() }
        try sock.send(Array(req.utf8) + body)
        let raw = try sock.readAll(timeout: 30)
        return try HTTPClient.parse(raw)
    }

    public func post(_ path: String, _ json: String, headers: [String: String] = [:]) throws -> Response {
        try request("POST", path, json: json, headers: headers)
    }

    public func get(_ path: String, headers: [String: String] = [:]) throws -> Response {
        try request("GET", path, headers: headers)
    }

    static func parse(_ raw: [UInt8]) throws -> Response {
        guard let end = find(raw, [13, 10, 13, 10]) else { throw TestError("no complete response header (\(raw.count) bytes)") }
        let head = String(decoding: raw[0..<end], as: UTF8.self).split(separator: "\r\n").map(String.init)
        guard let statusLine = head.first, statusLine.split(separator: " ").count >= 2, let status = Int(statusLine.split(separator: " ")[1]) else {
            throw TestError("bad status line")
        }
        var headers: [String: String] = [:]
        for line in head.dropFirst() {
            if let c = line.firstIndex(of: ":") {
                headers[line[..<c].lowercased()] = String(line[line.index(after: c)...]).trimmingCharacters
            }
        }
        var body = Array(raw[(end + 4)...])
        if headers["transfer-encoding"]?.lowercased() == "chunked" { body = dechunk(body) }
        return Response(status: status, headers: headers, body: body)
    }

    public static func dechunk(_ b: [UInt8]) -> [UInt8] {
        var out: [UInt8] = []
        var i = 0
        while i < b.count {
            guard let lineEnd = find(Array(b[i...]), [13, 10]) else { break }
            let sizeText = String(decoding: b[i..<(i + lineEnd)], as: UTF8.self)
            guard let size = Int(sizeText.split(separator: ";")[0], radix: 16) else { break }
            i += lineEnd + 2
            if size == 0 { break }
            guard i + size <= b.count else { out.append(contentsOf: b[i...]); break }
            out.append(contentsOf: b[i..<(i + size)])
            i += size + 2
        }
        return out
    }

    static func find(_ hay: [UInt8], _ needle: [UInt8]) -> Int? {
        guard hay.count >= needle.count else { return nil }
        for i in 0...(hay.count - needle.count) where hay[i] == needle[0] {
            if Array(hay[i..<(i + needle.count)]) == needle { return i }
        }
        return nil
    }
}

extension String {
    var trimmingCharacters: String {
        String(drop { $0 == " " || $0 == "\t" }.reversed().drop { $0 == " " || $0 == "\t" }.reversed())
    }
}

/// A raw TCP socket for tests: connect, send, read with timeouts, close or reset.
public final class TestSocket: @unchecked Sendable {
    public let fd: Int32
    private var closed = false

    init(fd: Int32) { self.fd = fd }

    public static func connect(host: String = "127.0.0.1", port: Int) throws -> TestSocket {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw TestError("socket: \(String(cString: strerror(errno)))") }
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr(host)
        addr.sin_port = in_port_t(UInt16(port).bigEndian)
        let r = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        guard r == 0 else {
            let e = String(cString: strerror(errno))
            Glibc.close(fd)
            throw TestError("connect to \(host):\(port): \(e)")
        }
        return TestSocket(fd: fd)
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
    private var parser = SSEParser()
    private var buffer: [UInt8] = []
    private var headerDone = false
    private var chunked = false

    public init(port: Int, path: String, token: String?, lastEventID: Int64? = nil, smallBuffer: Bool = false) throws {
        socket = try TestSocket.connect(port: port)
        if smallBuffer { socket.shrinkReceiveBuffer() }
        var req = "GET \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
        if let token { req += "Authorization: Bearer \(token)\r\n" }
        if let lastEventID { req += "Last-Event-ID: \(lastEventID)\r\n" }
        req += "\r\n"
        try socket.send(req)
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
        buffer.append(contentsOf: chunk)
        if !headerDone {
            guard let end = HTTPClient.find(buffer, [13, 10, 13, 10]) else { return }
            let head = String(decoding: buffer[0..<end], as: UTF8.self).split(separator: "\r\n").map(String.init)
            status = Int(head.first?.split(separator: " ")[1] ?? "0") ?? 0
            for line in head.dropFirst() {
                if let c = line.firstIndex(of: ":") { headers[line[..<c].lowercased()] = String(line[line.index(after: c)...]).trimmingCharacters }
            }
            chunked = headers["transfer-encoding"]?.lowercased() == "chunked"
            headerDone = true
            buffer.removeFirst(end + 4)
            if status != 200 { ended = true }
        }
        if chunked {
            // Decode complete chunks only; keep a partial one for later.
            while let lineEnd = HTTPClient.find(buffer, [13, 10]) {
                let sizeText = String(decoding: buffer[0..<lineEnd], as: UTF8.self)
                guard let size = Int(sizeText, radix: 16) else { ended = true; return }
                if size == 0 { ended = true; buffer.removeAll(); return }
                guard buffer.count >= lineEnd + 2 + size + 2 else { return }
                feed(Array(buffer[(lineEnd + 2)..<(lineEnd + 2 + size)]))
                buffer.removeFirst(lineEnd + 2 + size + 2)
            }
        } else {
            feed(buffer)
            buffer.removeAll()
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
