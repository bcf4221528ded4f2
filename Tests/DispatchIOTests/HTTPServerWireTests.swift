import DispatchCore
import DispatchSystem
import Glibc
import XCTest
@testable import DispatchIO

/// The HTTP/1.1 layer on a real loop and loopback sockets, byte for byte on the wire: every
/// behaviour it promises (keep-alive, pipelining, chunked bodies, 100-continue, HTTP/1.0, HEAD,
/// refusals and limits, deadlines, streams). In this process, so `make test-asan` sees every
/// buffer the layer allocates and frees.
final class HTTPServerWireTests: XCTestCase {
    var loop: EventLoop!
    var server: HTTPServer!
    var port = 0
    var streams: [HTTPStream] = []
    let recorder = Recorder()

    final class Recorder: HTTPStreamDelegate {
        var peerClosed: [Int] = []
        var drained: [Int] = []
        func streamPeerClosed(_ tag: Int) { peerClosed.append(tag) }
        func streamDrained(_ tag: Int) { drained.append(tag) }
    }

    func start(_ configure: (inout HTTPLimits) -> Void = { _ in }) throws {
        loop = EventLoop()
        var limits = HTTPLimits()
        limits.maxBodyBytes = 1024
        configure(&limits)
        server = HTTPServer(loop: loop, limits: limits)
        try server.listen(host: "127.0.0.1", port: 0, reusePort: false)
        port = try XCTUnwrap(server.boundPort())
        server.handler = { [unowned self] req in self.handle(req) }
    }

    override func tearDown() {
        for s in streams where s.isOpen { s.abort() }
        if loop != nil { run(for: 0.05) }
        streams.removeAll()
        server = nil
        loop = nil
    }

    func handle(_ req: HTTPRequest) {
        if handleWhole(req) { return }
        switch req.path ?? "" {
        case "/text":
            req.respond(status: 200, headers: [("X-Method", req.method?.rawValue ?? "other")], body: Array("some text".utf8))
        case "/later":
            loop.timer(after: 0.1) { req.respond(status: 200, body: Array("later".utf8)) }
        case "/stream":
            let s = HTTPStream(loop: loop)
            s.delegate = recorder
            s.tag = streams.count
            streams.append(s)
            s.attach(req)
            s.begin(headers: [("Content-Type", "text/event-stream")], writeTimeout: 1)
            _ = s.write(StreamPayload(Array("data: one\n\n".utf8)), maxBacklog: 1 << 20)
        case "/finished":
            // Head, frame and end within the handler: collected while the read is handled.
            let s = HTTPStream(loop: loop)
            s.attach(req)
            s.begin(headers: [("Content-Type", "text/event-stream")], writeTimeout: 1)
            _ = s.write(StreamPayload(Array("data: last\n\n".utf8)), maxBacklog: 1 << 20)
            s.end()
        case "/param":
            req.respond(status: 200, headers: [("X-Param", req.queryParameter("access_token") ?? "nil")], body: [])
        case "/big":
            req.respond(status: 200, body: [UInt8](repeating: UInt8(ascii: "x"), count: 200_000))
        default:
            let q = req.query.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: "&")
            req.respond(status: 200, headers: [("X-Method", req.method?.rawValue ?? "other"), ("X-Path", req.path ?? "nil"), ("X-Query", q),
                                               ("X-Echo", req.headerValues("x-echo").joined(separator: "|"))],
                        body: req.body())
        }
    }

    // MARK: - A client

    func connect() throws -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = in_port_t(UInt16(port).bigEndian)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        let r = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        XCTAssertEqual(r, 0)
        return fd
    }

    func send(_ fd: Int32, _ text: String) { send(fd, Array(text.utf8)) }
    func send(_ fd: Int32, _ bytes: [UInt8]) {
        var off = 0
        while off < bytes.count {
            let n = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + off, $0.count - off, Int32(MSG_NOSIGNAL | MSG_DONTWAIT)) }
            if n > 0 { off += n } else if errno == EAGAIN { run(for: 0.01) } else { return }
        }
    }

    /// Runs the loop for `seconds`.
    func run(for seconds: Double) {
        let stop = loop.timer(after: seconds) { [loop] in loop!.stop() }
        loop.run()
        stop.cancel()
    }

    /// Runs the loop, reading `fd` without blocking, until `done` holds for what was read (or
    /// the peer closed, or `timeout`). Returns the text and whether the server closed.
    @discardableResult
    func read(_ fd: Int32, timeout: Double = 5, until done: @escaping (String) -> Bool = { _ in false }) -> (text: String, closed: Bool) {
        var text = "", closed = false
        var buf = [UInt8](repeating: 0, count: 65536)
        let deadline = Clock.monotonic() + timeout
        let poll = loop.timer(after: 0.005, repeating: true) { [loop] in
            while true {
                let n = recv(fd, &buf, buf.count, Int32(MSG_DONTWAIT))
                if n > 0 { text += String(decoding: buf[..<n], as: UTF8.self); continue }
                if n == 0 || (n < 0 && errno != EAGAIN) { closed = true }
                break
            }
            if closed || done(text) || Clock.monotonic() > deadline { loop!.stop() }
        }
        loop.run()
        poll.cancel()
        return (text, closed)
    }

    func answers(_ text: String) -> Int { text.components(separatedBy: "HTTP/1.").count - 1 }

    // MARK: - Keep-alive, pipelining, versions

    func testKeepAliveServesSeveralRequestsOnOneConnection() throws {
        try start()
        let fd = try connect()
        defer { close(fd) }
        for i in 0..<3 {
            send(fd, "GET /echo?i=\(i)&name=a+b%21 HTTP/1.1\r\nHost: x\r\nX-Echo: \(i)\r\n\r\n")
            let r = read(fd) { $0.contains("\r\n\r\n") }
            XCTAssertTrue(r.text.hasPrefix("HTTP/1.1 200 OK\r\n"), r.text)
            XCTAssertTrue(r.text.contains("X-Query: i=\(i)&name=a b!\r\n"), r.text)
            XCTAssertTrue(r.text.contains("X-Echo: \(i)\r\n"), r.text)
            XCTAssertTrue(r.text.contains("Content-Length: 0\r\n"), r.text)
            XCTAssertTrue(r.text.contains("\r\nDate: "), r.text)
            XCTAssertFalse(r.closed)
        }
        XCTAssertEqual(server.connectionsOpen, 1)
    }

    /// `queryParameter` (one name read from the bytes, a status stream's `access_token` and
    /// `lastEventId`) gives what `query[name]` gives, over generated targets full of the cases
    /// that differ: repeats, `+`, `%XX` (good, broken, at the end), empty names and values,
    /// parameters without `=`, non-ASCII and invalid UTF-8 bytes, canonically equivalent
    /// names (a Kelvin sign `%E2%84%AA` is `K`); then once on the wire.
    func testOneQueryParameterIsReadAsTheDictionaryReadsIt() throws {
        let pieces: [[UInt8]] = ["a", "b", "K", "_", "access_token", "lastEventId", "=", "=", "&", "&", "+", "%", "%2", "%41",
                                 "%2B", "%3D", "%26", "%E2%84%AA", "%C3%A9", "e%CC%81", "\u{E9}", "%FF", "%zz", "1", "x y"].map { Array($0.utf8) }
            + [[0xFF], [0xC3], [0xE2, 0x84, 0xAA]]
        let keys: [[UInt8]] = ["a", "b", "K", "%E2%84%AA", "%4B", "access_token", "access%5Ftoken", "lastEventId", "%C3%A9", "e%CC%81",
                               "\u{E9}", "a+b", "a%20b", "%2B", "%3D", "%26", "", "%", "a%3Db"].map { Array($0.utf8) }
        let names = ["a", "b", "K", "ab", "a b", "+", "access_token", "lastEventId", "\u{E9}", "=", "%", "", "a=b", "&"]
        var rng = SplitMix(seed: 34)
        var checked = 0, found = 0
        for _ in 0..<20_000 {
            var q: [UInt8] = []
            for _ in 0..<Int(rng.next() % 6) {
                if !q.isEmpty || rng.next() % 4 == 0 { q += rng.next() % 4 == 0 ? Array("&&".utf8) : Array("&".utf8) }
                if rng.next() % 2 == 0 {
                    q += keys[Int(rng.next() % UInt64(keys.count))]
                } else {
                    for _ in 0..<Int(rng.next() % 4) { q += pieces[Int(rng.next() % UInt64(pieces.count))] }
                }
                if rng.next() % 8 != 0 { q.append(UInt8(ascii: "=")) }
                for _ in 0..<Int(rng.next() % 4) { q += pieces[Int(rng.next() % UInt64(pieces.count))] }
            }
            let dictionary = HTTPRequest.queryDictionary(q[...])
            for name in names {
                let got = HTTPRequest.queryParameter(name, in: q[...])
                XCTAssertEqual(got, dictionary[name], "\(name) in \(q)")
                checked += 1
                if got != nil { found += 1 }
            }
        }
        XCTAssertGreaterThan(found, checked / 20, "the corpus finds names often enough to compare values")
        XCTAssertNil(HTTPRequest.queryParameter("a", in: nil))
        XCTAssertEqual(HTTPRequest.queryParameter("K", in: Array("%E2%84%AA=kelvin&K=k".utf8)[...]), "kelvin")
        XCTAssertEqual(HTTPRequest.queryParameter("a", in: Array("a&a=&a=2".utf8)[...]), "")

        try start()
        let fd = try connect()
        defer { close(fd) }
        send(fd, "GET /param?x=1&access_token=se+cr%2Bt&access_token=no HTTP/1.1\r\nHost: x\r\n\r\n")
        let r = read(fd) { $0.contains("\r\n\r\n") }
        XCTAssertTrue(r.text.contains("X-Param: se cr+t\r\n"), r.text)
    }

    func testPipelinedRequestsAreAnsweredInOrder() throws {
        try start()
        let fd = try connect()
        defer { close(fd) }
        send(fd, "GET /later HTTP/1.1\r\nHost: x\r\n\r\nGET /echo?n=2 HTTP/1.1\r\nHost: x\r\n\r\nPOST /echo HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc")
        let r = read(fd) { self.answers($0) == 3 && $0.hasSuffix("abc") }
        let later = try XCTUnwrap(r.text.range(of: "later")), second = try XCTUnwrap(r.text.range(of: "X-Query: n=2"))
        XCTAssertLessThan(later.lowerBound, second.lowerBound, r.text)
        XCTAssertTrue(r.text.hasSuffix("abc"), r.text)
    }

    func testHTTP10IsAnsweredAsHTTP10AndClosedUnlessKeptAlive() throws {
        try start()
        let a = try connect()
        defer { close(a) }
        send(a, "GET /echo HTTP/1.0\r\n\r\n")
        let r = read(a)
        XCTAssertTrue(r.text.hasPrefix("HTTP/1.0 200 OK\r\n"), r.text)
        XCTAssertTrue(r.closed, "HTTP/1.0 closes after its answer")
        let b = try connect()
        defer { close(b) }
        send(b, "GET /echo HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        let k = read(b, timeout: 1) { $0.contains("\r\n\r\n") }
        XCTAssertTrue(k.text.contains("Connection: keep-alive\r\n"), k.text)
        XCTAssertFalse(k.closed)
    }

    func testHEADGetsTheHeadersOnlyAndTheConnectionGoesOn() throws {
        try start()
        let fd = try connect()
        defer { close(fd) }
        send(fd, "HEAD /text HTTP/1.1\r\nHost: x\r\n\r\nPOST /echo HTTP/1.1\r\nContent-Length: 2\r\n\r\nok")
        let r = read(fd) { self.answers($0) == 2 && $0.hasSuffix("ok") }
        XCTAssertTrue(r.text.hasPrefix("HTTP/1.1 200 OK\r\n"), r.text)
        XCTAssertTrue(r.text.contains("X-Method: HEAD"), r.text)
        XCTAssertTrue(r.text.contains("Content-Length: 9\r\n"), "the length of the body it would have: \(r.text)")
        XCTAssertFalse(r.text.contains("some text"), "no body after HEAD: \(r.text)")
        XCTAssertEqual(answers(r.text), 2, r.text)
        XCTAssertTrue(r.text.hasSuffix("\r\n\r\nok"), r.text)
    }

    func testConnectionCloseIsHonoured() throws {
        try start()
        let fd = try connect()
        defer { close(fd) }
        send(fd, "GET /echo HTTP/1.1\r\nConnection: close\r\n\r\n")
        let r = read(fd)
        XCTAssertTrue(r.text.contains("Connection: close\r\n"), r.text)
        XCTAssertTrue(r.closed)
    }

    // MARK: - Bodies

    func testAChunkedBodyIsDecodedAndTheNextRequestFollows() throws {
        try start()
        let fd = try connect()
        defer { close(fd) }
        send(fd, "POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n")
        send(fd, "GET /echo?after=1 HTTP/1.1\r\n\r\n")
        let r = read(fd) { $0.contains("after=1") }
        XCTAssertTrue(r.text.contains("Content-Length: 11\r\n"), r.text)
        XCTAssertTrue(r.text.contains("hello world"), r.text)
        XCTAssertTrue(r.text.contains("X-Query: after=1"), r.text)
    }

    func testAChunkedBodyArrivingInPiecesAndOneTooLarge() throws {
        try start()
        let fd = try connect()
        defer { close(fd) }
        for piece in ["POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3", "\r\nab", "c\r\n", "0\r", "\n\r\n"] {
            send(fd, piece)
            run(for: 0.02)
        }
        let pieces = read(fd) { $0.hasSuffix("abc") }
        XCTAssertTrue(pieces.text.hasSuffix("\r\n\r\nabc"), "\(pieces)")
        let big = try connect()
        defer { close(big) }
        send(big, "POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n800\r\n" + String(repeating: "x", count: 2048) + "\r\n0\r\n\r\n")
        let r = read(big)
        XCTAssertTrue(r.text.hasPrefix("HTTP/1.1 413 "), r.text)
        XCTAssertTrue(r.text.contains(#"{"error":{"code":"body_too_large""#), r.text)
        XCTAssertTrue(r.closed)
    }

    func testExpect100ContinueIsAnsweredBeforeTheBody() throws {
        try start()
        let fd = try connect()
        defer { close(fd) }
        send(fd, "POST /echo HTTP/1.1\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
        let first = read(fd) { $0.contains("\r\n\r\n") }
        XCTAssertEqual(first.text, "HTTP/1.1 100 Continue\r\n\r\n")
        send(fd, "body")
        let r = read(fd) { $0.hasSuffix("body") }
        XCTAssertTrue(r.text.hasPrefix("HTTP/1.1 200 OK"), r.text)
        // A body too large is refused at once, without 100 Continue and without reading it.
        send(fd, "POST /echo HTTP/1.1\r\nContent-Length: 5000\r\nExpect: 100-continue\r\n\r\n")
        let big = read(fd)
        XCTAssertTrue(big.text.hasPrefix("HTTP/1.1 413 "), big.text)
        XCTAssertTrue(big.closed)
    }

    // MARK: - Refusals

    func refused(_ request: [UInt8], _ status: Int, _ code: String, file: StaticString = #filePath, line: UInt = #line) throws {
        let fd = try connect()
        defer { close(fd) }
        send(fd, request)
        let r = read(fd)
        XCTAssertTrue(r.text.hasPrefix("HTTP/1.1 \(status) "), "\(status): \(r.text.prefix(200))", file: file, line: line)
        XCTAssertTrue(r.text.contains(#"{"error":{"code":"\#(code)""#), r.text, file: file, line: line)
        XCTAssertTrue(r.text.contains("Connection: close\r\n"), file: file, line: line)
        XCTAssertTrue(r.closed, "closed after \(status)", file: file, line: line)
        XCTAssertEqual(answers(r.text), 1, "nothing after the refusal is answered: \(r.text)", file: file, line: line)
    }

    func testSmugglingAndFramingAttemptsAreRefusedAndClosed() throws {
        try start()
        let smuggled = "GET /echo?smuggled=1 HTTP/1.1\r\n\r\n"
        try refused(Array(("POST /echo HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled).utf8), 400, "invalid_request")
        try refused(Array(("POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + smuggled).utf8), 400, "invalid_request")
        try refused(Array(("POST /echo HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 30\r\n\r\nabc" + smuggled).utf8), 400, "invalid_request")
        try refused(Array("POST /echo HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n".utf8), 400, "invalid_request")
        try refused(Array("POST /echo HTTP/1.1\r\nContent-Length: -1\r\n\r\n".utf8), 400, "invalid_request")
        try refused(Array("GET /echo HTTP/1.1\r\nX-Folded: a\r\n b\r\n\r\n".utf8), 400, "invalid_request")
        // Identical duplicates are one length.
        let fd = try connect()
        defer { close(fd) }
        send(fd, "POST /echo HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc")
        XCTAssertTrue(read(fd) { $0.hasSuffix("abc") }.text.hasPrefix("HTTP/1.1 200 OK"))
    }

    func testGarbageAndTLSHandshakesAreRefusedAndClosed() throws {
        try start()
        try refused(Array("HELLO WORLD\r\n\r\n".utf8), 400, "invalid_request")
        try refused(Array("BREW /echo HTTP/1.1\r\n\r\n".utf8), 501, "not_implemented")
        try refused(Array("GET /echo\r\n\r\n".utf8), 400, "invalid_request")
        try refused([UInt8](repeating: 0, count: 4096), 400, "invalid_request")
        // A TLS ClientHello's first bytes: a handshake record.
        try refused([0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xFC, 0x03, 0x03] + [UInt8](repeating: 0x41, count: 64), 400, "invalid_request")
    }

    func testOversizedHeadersTargetsAndBodiesAreRefused() throws {
        try start()
        try refused(Array(("GET /echo HTTP/1.1\r\nX-Big: " + String(repeating: "b", count: 9000) + "\r\n\r\n").utf8), 431, "headers_too_large")
        try refused(Array(("GET /echo HTTP/1.1\r\n" + (0..<400).map { "X-\($0): v\r\n" }.joined() + "\r\n").utf8), 431, "headers_too_large")
        try refused(Array(("GET /" + String(repeating: "a", count: 5000) + " HTTP/1.1\r\n\r\n").utf8), 414, "uri_too_long")
        try refused(Array(("GET /" + String(repeating: "a", count: 20000)).utf8), 414, "uri_too_long")
        // The body is refused from its length, before a byte of it is sent.
        try refused(Array("POST /echo HTTP/1.1\r\nContent-Length: 1025\r\n\r\n".utf8), 413, "body_too_large")
        try refused(Array("POST /echo HTTP/1.1\r\nContent-Length: 5\r\nExpect: teapot\r\n\r\n".utf8), 417, "expectation_failed")
    }

    // MARK: - Deadlines and the connection guard

    func testAHalfSentRequestIsClosedByTheReadTimeoutAndTheDeadline() throws {
        try start { $0.requestTimeoutSeconds = 0.6; $0.connections = ConnectionPolicy(requestDeadline: 100, maxPendingPerClient: 100, pendingGrace: 100) }
        let silent = try connect()
        defer { close(silent) }
        send(silent, "GET /echo HTTP/1.1\r\nHost")
        let t0 = Clock.monotonic()
        XCTAssertTrue(read(silent, timeout: 5).closed)
        XCTAssertLessThan(Clock.monotonic() - t0, 2.5)
        // Trickling a header line every 0.3 s defeats a read timeout, not the request deadline.
        server = nil
        try start { $0.requestTimeoutSeconds = 10; $0.connections = ConnectionPolicy(requestDeadline: 1, maxPendingPerClient: 100, pendingGrace: 100) }
        let trickle = try connect()
        defer { close(trickle) }
        send(trickle, "GET /echo HTTP/1.1\r\n")
        var closed = false
        let start = Clock.monotonic()
        while !closed && Clock.monotonic() - start < 5 {
            send(trickle, "X-A: b\r\n")
            closed = read(trickle, timeout: 0.3).closed
        }
        XCTAssertTrue(closed)
        XCTAssertEqual(server.connectionsCut, 1)
    }

    func testThePerAddressCapCutsTheNewestPendingConnections() throws {
        try start { $0.connections = ConnectionPolicy(requestDeadline: 100, maxPendingPerClient: 2, pendingGrace: 0) }
        let fds = try (0..<5).map { _ in try connect() }
        defer { for fd in fds { close(fd) } }
        run(for: 0.05)
        XCTAssertEqual(server.connectionsOpen, 5)
        run(for: 0.7)
        XCTAssertEqual(server.connectionsCut, 3)
        XCTAssertEqual(server.connectionsOpen, 2)
        XCTAssertTrue(read(fds[4], timeout: 1).closed, "the newest is cut")
        send(fds[0], "GET /echo HTTP/1.1\r\n\r\n")
        XCTAssertTrue(read(fds[0]) { $0.contains("\r\n\r\n") }.text.hasPrefix("HTTP/1.1 200"), "the oldest is kept")
    }

    func testStopListeningRefusesNewConnectionsOnly() throws {
        try start()
        let before = try connect()
        defer { close(before) }
        run(for: 0.05)
        server.stopListening()
        send(before, "GET /echo HTTP/1.1\r\n\r\n")
        XCTAssertTrue(read(before) { $0.contains("\r\n\r\n") }.text.hasPrefix("HTTP/1.1 200"))
        XCTAssertEqual(server.connectionsOpen, 1)
    }

    // MARK: - Streams

    func testAStreamIsChunkedFramesThatEndAndTheConnectionGoesOn() throws {
        try start()
        let fd = try connect()
        defer { close(fd) }
        send(fd, "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        let head = read(fd) { $0.hasSuffix("data: one\n\n\r\n") }
        XCTAssertTrue(head.text.hasPrefix("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"), head.text)
        XCTAssertTrue(head.text.hasSuffix("\r\n\r\nb\r\ndata: one\n\n\r\n"), head.text)
        let s = try XCTUnwrap(streams.first)
        XCTAssertEqual(s.write(StreamPayload(Array("data: two\n\n".utf8)), maxBacklog: 1024), .written)
        s.end()
        XCTAssertTrue(read(fd) { $0.hasSuffix("0\r\n\r\n") }.text.hasSuffix("b\r\ndata: two\n\n\r\n0\r\n\r\n"))
        send(fd, "GET /echo?next=1 HTTP/1.1\r\n\r\n")
        XCTAssertTrue(read(fd) { $0.contains("\r\n\r\n") }.text.contains("X-Query: next=1"))
        XCTAssertEqual(recorder.peerClosed, [], "an ended stream is not told of a close")
    }

    /// What a read's requests answer goes out together at the end of the read; a large answer
    /// is sent at once, and the order of pipelined answers holds either way.
    func testAnswersCollectedDuringAReadGoOutWholeAndInOrder() throws {
        try start()
        let fd = try connect()
        defer { close(fd) }
        send(fd, "GET /finished HTTP/1.1\r\nHost: x\r\n\r\nGET /big HTTP/1.1\r\n\r\nGET /finished HTTP/1.1\r\n\r\nGET /echo?n=4 HTTP/1.1\r\n\r\n")
        let r = read(fd) { $0.contains("X-Query: n=4") && $0.hasSuffix("\r\n\r\n") }
        XCTAssertFalse(r.closed)
        XCTAssertEqual(answers(r.text), 4, String(r.text.prefix(400)))
        let stream = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
        XCTAssertTrue(r.text.hasPrefix(stream), String(r.text.prefix(400)))
        let parts = r.text.components(separatedBy: "HTTP/1.1 200 OK\r\n")
        XCTAssertEqual(parts.count, 5)
        XCTAssertTrue(parts[1].hasSuffix("\r\n\r\nc\r\ndata: last\n\n\r\n0\r\n\r\n"), parts[1])
        XCTAssertTrue(parts[2].contains("Content-Length: 200000\r\n") && parts[2].hasSuffix(String(repeating: "x", count: 200_000)))
        XCTAssertTrue(parts[3].hasSuffix("c\r\ndata: last\n\n\r\n0\r\n\r\n"), parts[3])
        XCTAssertTrue(parts[4].contains("X-Query: n=4"), parts[4])
        XCTAssertEqual(server.connectionsOpen, 1)
    }

    func testAnHTTP10StreamIsRawAndEndsWithTheClose() throws {
        try start()
        let fd = try connect()
        defer { close(fd) }
        send(fd, "GET /stream HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        XCTAssertTrue(read(fd) { $0.hasSuffix("data: one\n\n") }.text.hasSuffix("\r\n\r\ndata: one\n\n"))
        streams[0].end()
        let r = read(fd)
        XCTAssertTrue(r.closed)
        XCTAssertFalse(r.text.contains("0\r\n\r\n"), r.text)
    }

    func testAClientLeavingAStreamIsNoticedOnce() throws {
        try start()
        let fd = try connect()
        send(fd, "GET /stream HTTP/1.1\r\n\r\n")
        read(fd) { $0.hasSuffix("data: one\n\n\r\n") }
        close(fd)
        run(for: 0.1)
        XCTAssertEqual(recorder.peerClosed, [0])
        XCTAssertFalse(streams[0].isOpen)
        XCTAssertEqual(server.connectionsOpen, 0)
        XCTAssertEqual(streams[0].write(StreamPayload(Array("x".utf8)), maxBacklog: 10), .failed)
    }

    func testAStreamWhoseClientReadsNothingIsCutAtItsWriteDeadline() throws {
        try start()
        let fd = try connect()
        defer { close(fd) }
        var small: Int32 = 4096
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, socklen_t(MemoryLayout<Int32>.size))
        send(fd, "GET /stream HTTP/1.1\r\n\r\n")
        run(for: 0.1)
        let s = try XCTUnwrap(streams.first)
        let frame = StreamPayload([UInt8](repeating: 0x61, count: 16 * 1024))
        var results: [HTTPStream.WriteResult] = []
        for _ in 0..<200 { results.append(s.write(frame, maxBacklog: 256 * 1024)) }
        XCTAssertTrue(results.contains(.queued))
        XCTAssertTrue(results.contains(.backlogExceeded), "the backlog cap holds")
        XCTAssertGreaterThan(s.backlog, 0)
        run(for: 2.2)
        XCTAssertEqual(recorder.peerClosed, [0], "cut by its 1 s write deadline")
        XCTAssertEqual(server.connectionsCut, 1)
    }

    func testAbortClosesWithoutTellingTheDelegate() throws {
        try start()
        let fd = try connect()
        defer { close(fd) }
        send(fd, "GET /stream HTTP/1.1\r\n\r\n")
        read(fd) { $0.hasSuffix("data: one\n\n\r\n") }
        streams[0].abort()
        XCTAssertTrue(read(fd).closed)
        XCTAssertEqual(recorder.peerClosed, [])
        XCTAssertEqual(server.connectionsOpen, 0)
    }
}

/// A small seeded generator (SplitMix64): the same corpus every run.
struct SplitMix {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
