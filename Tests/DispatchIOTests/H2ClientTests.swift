@testable import DispatchIO
import DispatchCore
import DispatchSystem
import DispatchTestSupport
import Glibc
import XCTest

/// H2Client against the fake APNs (fake_apns.py: Apple's rules, one stream until a request
/// authenticated, counts the PING frames it receives, can go silent or send GOAWAY).
final class H2ClientTests: XCTestCase {
    var fake: FakeAPNs!
    var loop: EventLoop!
    var clients: [H2Client] = []
    var jwt = ""

    override func setUpWithError() throws {
        fake = try FakeAPNs.start()
        loop = EventLoop()
        jwt = try fake.providerToken()
    }

    override func tearDown() {
        for c in clients { c.close() }
        clients = []
        if let loop { spin(loop, 0.01) }
        fake?.stop()
        fake = nil
        loop = nil
    }

    func client(idle: Int = 15, caFile: String? = nil, _ adjust: (inout H2Client.Options) -> Void = { _ in }) -> H2Client {
        var o = H2Client.Options.apns(caFile: caFile ?? fake.pki + "/ca.pem", idleSeconds: idle)
        adjust(&o)
        let c = H2Client(loop: loop, options: o)
        clients.append(c)
        return c
    }

    static func token(_ i: Int) -> String { String(format: "%064x", i) }

    func push(_ i: Int = 1, timeout: Double = 10, authorized: Bool = true) -> CurlClient.Request {
        var headers = [("apns-topic", FakeAPNs.topic + ".push-type.liveactivity"), ("apns-push-type", "liveactivity"),
                       ("apns-priority", "5"), ("apns-expiration", "0"), ("content-type", "application/json")]
        if authorized { headers.insert(("authorization", "bearer " + jwt), at: 0) }
        let state = #"{"state":"processing","progress":0.5,"status":null,"attempt":1,"seq":\#(i),"updatedAt":1,"cancelRequested":false}"#
        return .init(url: "https://127.0.0.1:\(fake.port)/3/device/" + Self.token(i), headers: headers,
                     body: Array(#"{"aps":{"event":"update","timestamp":\#(i),"content-state":\#(state)}}"#.utf8), timeout: timeout)
    }

    /// Sends one request and runs the loop until it is answered.
    func result(_ c: H2Client, _ request: CurlClient.Request, file: StaticString = #filePath, line: UInt = #line) -> Result<CurlClient.Response, HTTPClientFailure>? {
        var result: Result<CurlClient.Response, HTTPClientFailure>?
        c.send(request) { result = $0 }
        XCTAssertTrue(runLoop(loop, timeout: 20) { result != nil }, "completed", file: file, line: line)
        return result
    }

    func answered(_ c: H2Client, _ i: Int = 1, file: StaticString = #filePath, line: UInt = #line) {
        let r = result(c, push(i), file: file, line: line)
        XCTAssertEqual(try r?.get().status, 200, "\(String(describing: r))", file: file, line: line)
    }

    func testRequestAndAnswer() throws {
        let c = client()
        let r = try XCTUnwrap(result(c, push(7))).get()
        XCTAssertEqual(r.status, 200)
        XCTAssertEqual(r.httpVersion, "2")
        XCTAssertNotNil(r.header("apns-id"))
        let seen = try fake.requests()
        XCTAssertEqual(seen.count, 1)
        XCTAssertEqual(seen.first?.token, Self.token(7))
        XCTAssertEqual(seen.first?.seq, 7)
        XCTAssertEqual(seen.first?.headers["apns-priority"], "5")

        // A refusal: status, headers and the JSON body, as CurlClient gave them.
        let refused = try XCTUnwrap(result(c, push(8, authorized: false))).get()
        XCTAssertEqual(refused.status, 403)
        XCTAssertEqual(refused.header("content-type"), "application/json")
        XCTAssertTrue(String(decoding: refused.body, as: UTF8.self).contains("MissingProviderToken"), String(decoding: refused.body, as: UTF8.self))
        XCTAssertEqual(c.connectionsOpened, 1, "both on one connection")
        XCTAssertEqual(c.openConnections, 1)
    }

    func testAnswerBodyIsBounded() throws {
        let c = client { $0.maxResponseBytes = 5 }
        let r = try XCTUnwrap(result(c, push(1, authorized: false))).get()
        XCTAssertEqual(r.status, 403)
        XCTAssertEqual(r.body.count, 5)
        XCTAssertTrue(r.bodyTruncated)
    }

    /// A burst: one connection, one stream until the first request authenticated (the fake
    /// refuses more, as APNs does), then many streams at once on it; none refused.
    func testManyConcurrentStreamsOnOneConnection() throws {
        try fake.script(token: "*", respond: [], otherwise: #"{"action":"delay","seconds":0.3,"status":200}"#)
        let c = client()
        let tally = Tally()
        for i in 0..<300 { c.send(push(i), completion: tally.completion(i)) }
        XCTAssertTrue(runLoop(loop, timeout: 30) { tally.calls == 300 }, "\(tally.calls) of 300")
        XCTAssertEqual(tally.duplicates, 0)
        XCTAssertEqual(tally.failures.count, 0, "\(tally.failures.prefix(3))")
        XCTAssertTrue(tally.successes.allSatisfy { $0.status == 200 })
        XCTAssertEqual(c.connectionsOpened, 1)
        XCTAssertEqual(try fake.stat("connectionsOpened"), 1)
        XCTAssertEqual(try fake.stat("refusedStreams"), 0)
        // 300 answers each delayed 0.3 s took far less than 300 × 0.3 s: they were in flight together.
        let seen = try fake.requests()
        let times = seen.map(\.time)
        XCTAssertLessThan(try XCTUnwrap(times.max()) - XCTUnwrap(times.min()), 30)
        XCTAssertEqual(Set(seen.map(\.connection)).count, 1)
    }

    /// GOAWAY: the streams the server did not process are sent again on a new connection;
    /// the one that sent GOAWAY takes no new stream.
    func testGoAwayResendsUnprocessedRequestsOnANewConnection() throws {
        let c = client()
        answered(c, 1)
        try fake.script(token: Self.token(2), respond: [#"{"action":"goaway"}"#])
        let tally = Tally()
        for i in 2..<12 { c.send(push(i), completion: tally.completion(i)) }
        XCTAssertTrue(runLoop(loop, timeout: 20) { tally.calls == 10 }, "\(tally.calls) of 10")
        XCTAssertEqual(tally.failures.count, 0, "\(tally.failures.prefix(3))")
        XCTAssertTrue(tally.successes.allSatisfy { $0.status == 200 })
        XCTAssertEqual(c.goaways, 1)
        XCTAssertGreaterThanOrEqual(c.resent, 1)
        XCTAssertEqual(c.connectionsOpened, 2)
        let second = try fake.requests(token: Self.token(2))
        XCTAssertEqual(second.count, 2, "sent on the first connection, GOAWAY, sent again")
        XCTAssertNotEqual(second.first?.connection, second.last?.connection)
        XCTAssertTrue(runLoop(loop, timeout: 5) { c.openConnections == 1 }, "the GOAWAY connection closed")
    }

    /// A peer that stops answering (no FIN): the idle connection gets a PING (the fake counts
    /// it), no ACK comes, the connection is closed; the next push goes on a new one at once.
    func testSilentPeerGetsAPINGAndIsReplacedBeforeTheNextPush() throws {
        let c = client(idle: 1)
        answered(c, 1)
        try fake.silenceAll()
        XCTAssertTrue(runLoop(loop, timeout: 10) { c.replaced[.unansweredPing] == 1 && c.openConnections == 0 }, "replaced")
        XCTAssertGreaterThanOrEqual(c.pingsSent, 1)
        XCTAssertGreaterThanOrEqual(try fake.stat("pings"), 1, "the PING reached the peer")
        let started = Clock.monotonic()
        answered(c, 2)
        XCTAssertLessThan(Clock.monotonic() - started, 5, "not the push's deadline")
        XCTAssertEqual(c.connectionsOpened, 2)
    }

    /// A peer that answers its PINGs keeps its connection, however long it idles.
    func testAnsweringPeerKeepsItsConnectionAndGetsPINGs() throws {
        let c = client(idle: 1)
        answered(c, 1)
        var pings = 0
        XCTAssertTrue(runLoop(loop, timeout: 15) { pings = (try? self.fake.stat("pings")) ?? 0; return pings >= 3 }, "\(pings) PINGs")
        XCTAssertEqual(c.replaced, [:])
        XCTAssertEqual(c.openConnections, 1)
        answered(c, 2)
        XCTAssertEqual(c.connectionsOpened, 1)
        XCTAssertEqual(Set(try fake.requests().map(\.connection)).count, 1)
    }

    /// A push that times out: `.timeout`; its connection gets a PING at once and, answering,
    /// stays for the next push.
    func testRequestTimeoutPINGsItsConnection() throws {
        try fake.script(token: Self.token(2), respond: [#"{"action":"delay","seconds":5,"status":200}"#])
        let c = client()
        answered(c, 1)
        let r = result(c, push(2, timeout: 0.5))
        XCTAssertEqual(r?.failure?.kind, .timeout, "\(String(describing: r))")
        XCTAssertTrue(runLoop(loop, timeout: 5) { c.pingsSent >= 1 })
        answered(c, 3)
        XCTAssertEqual(c.connectionsOpened, 1)
        XCTAssertEqual(c.replaced, [:])
    }

    /// A push that times out on a silent peer: the PING goes unanswered, the connection is
    /// closed, the next push gets a new one.
    func testTimeoutOnASilentPeerReplacesTheConnection() throws {
        let c = client()
        answered(c, 1)
        try fake.silenceAll()
        let r = result(c, push(2, timeout: 0.5))
        XCTAssertEqual(r?.failure?.kind, .timeout)
        XCTAssertTrue(runLoop(loop, timeout: 10) { c.replaced[.timeout] == 1 && c.openConnections == 0 }, "replaced")
        answered(c, 3)
        XCTAssertEqual(c.connectionsOpened, 2)
    }

    /// A certificate from a CA the client does not trust: a clear TLS error, nothing sent.
    func testWrongCAIsAClearTLSError() throws {
        let other = makeTempDir("other-ca")
        defer { _ = Subprocess.run(["rm", "-rf", other]) }
        let root = "\(#filePath)".split(separator: "/").dropLast(3).joined(separator: "/")
        XCTAssertEqual(Subprocess.run(["/bin/sh", "/" + root + "/Tests/tools/make_test_pki.sh", other]).status, 0)
        let c = client(caFile: other + "/ca.pem")
        let r = result(c, push(1))
        XCTAssertEqual(r?.failure?.kind, .tls, "\(String(describing: r))")
        XCTAssertTrue(r?.failure?.message.contains("certificate") ?? false, "\(String(describing: r))")
        XCTAssertEqual(try fake.stat("total"), 0)
        XCTAssertEqual(c.openConnections, 0)
    }

    func testUnreadableCAFileIsATLSError() {
        let c = client(caFile: "/nonexistent/ca.pem")
        XCTAssertEqual(result(c, push(1))?.failure?.kind, .tls)
    }

    func testNothingListeningIsAConnectError() throws {
        let port = try TestServer.freePort()
        let c = client()
        var request = push(1)
        request.url = "https://127.0.0.1:\(port)/3/device/" + Self.token(1)
        let r = result(c, request)
        XCTAssertEqual(r?.failure?.kind, .connect, "\(String(describing: r))")
        XCTAssertEqual(c.openConnections, 0)
    }

    /// A connect that never completes (a listener that never accepts): the connect timeout.
    func testConnectTimeout() throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        _ = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        XCTAssertEqual(listen(fd, 0), 0)
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) } }
        let port = Int(UInt16(bigEndian: addr.sin_port))
        // TCP completes in the kernel's backlog; the TLS handshake never gets an answer.
        let c = client { $0.connectTimeout = 0.5 }
        var request = push(1, timeout: 10)
        request.url = "https://127.0.0.1:\(port)/3/device/" + Self.token(1)
        let started = Clock.monotonic()
        let r = result(c, request)
        XCTAssertEqual(r?.failure?.kind, .connect, "\(String(describing: r))")
        XCTAssertLessThan(Clock.monotonic() - started, 5)
    }

    /// The connection dropped with the request on it: it may have been processed, so it fails
    /// for the caller to retry (PushService does), and the next request gets a new connection.
    func testDroppedConnectionIsRetryable() throws {
        let c = client()
        answered(c, 1)
        try fake.script(token: Self.token(2), respond: [#"{"action":"drop"}"#])
        XCTAssertEqual(result(c, push(2))?.failure?.kind, .retryOnNewConnection)
        answered(c, 3)
        XCTAssertEqual(c.connectionsOpened, 2)
    }

    func testInvalidRequestsAreRefusedBeforeSending() throws {
        let c = client()
        var plain = push(1)
        plain.url = "http://127.0.0.1:\(fake.port)/3/device/" + Self.token(1)
        XCTAssertEqual(result(c, plain)?.failure?.kind, .invalidRequest)
        var injected = push(1)
        injected.headers.append(("x-a", "b\r\nc: d"))
        XCTAssertEqual(result(c, injected)?.failure?.kind, .invalidRequest)
        XCTAssertEqual(c.connectionsOpened, 0)
    }

    /// Completions never run inside `send` or `close`; `close` cancels each request once.
    func testCompletionsRunLaterAndCloseCancelsOnce() throws {
        try fake.script(token: "*", respond: [], otherwise: #"{"action":"delay","seconds":5,"status":200}"#)
        let c = client()
        let tally = Tally()
        for i in 0..<20 { c.send(push(i), completion: tally.completion(i)) }
        XCTAssertEqual(tally.calls, 0, "none inside send")
        spin(loop, 0.3)
        c.close()
        XCTAssertEqual(tally.calls, 0, "none inside close")
        XCTAssertTrue(runLoop(loop, timeout: 5) { tally.calls == 20 })
        spin(loop, 0.1)
        XCTAssertEqual(tally.calls, 20)
        XCTAssertEqual(tally.duplicates, 0)
        XCTAssertTrue(tally.failures.allSatisfy { $0.kind == .cancelled })
        XCTAssertEqual(c.openConnections, 0)
        c.close()
        XCTAssertEqual(result(c, push(1))?.failure?.kind, .cancelled, "sent to a closed client")
    }

    /// A completion may send again and close the client.
    func testCompletionMaySendAndClose() throws {
        let c = client()
        var second: Result<CurlClient.Response, HTTPClientFailure>?
        var third: Result<CurlClient.Response, HTTPClientFailure>?
        c.send(push(1)) { [self] _ in
            c.send(push(2)) { r in
                second = r
                c.close()
            }
        }
        XCTAssertTrue(runLoop(loop, timeout: 10) { second != nil })
        XCTAssertEqual(try second?.get().status, 200)
        c.send(push(3)) { third = $0 }
        XCTAssertTrue(runLoop(loop, timeout: 5) { third != nil })
        XCTAssertEqual(third?.failure?.kind, .cancelled)
    }
}
