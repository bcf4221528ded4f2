@testable import DispatchIO
import DispatchSystem
import Glibc
import DispatchTestSupport
import XCTest

/// CurlClient over plain HTTP/1.1 against a real python3 http.server.
final class CurlHTTP1Tests: XCTestCase {
    var server: PythonHTTPServer!
    var loop: EventLoop!
    var clients: [CurlClient] = []

    override func setUpWithError() throws {
        server = try PythonHTTPServer()
        loop = EventLoop()
    }

    override func tearDown() {
        for c in clients { c.close() }
        clients = []
        spin(loop, 0.01)
        server?.stop()
        // XCTest keeps test case objects until the run ends: drop what they hold.
        server = nil
        loop = nil
    }

    func client(allowPrivate: Bool = true, maxResponseBytes: Int = 4096) -> CurlClient {
        var o = CurlClient.Options()
        o.allowPrivateAddresses = allowPrivate
        o.maxResponseBytes = maxResponseBytes
        o.userAgent = "dispatch-test"
        let c = CurlClient(loop: loop, options: o)
        clients.append(c)
        return c
    }

    /// Sends one request and runs the loop until it completes.
    func fetch(_ c: CurlClient, _ request: CurlClient.Request, timeout: Double = 10) -> Result<CurlClient.Response, HTTPClientFailure>? {
        var result: Result<CurlClient.Response, HTTPClientFailure>?
        c.send(request) { result = $0 }
        runLoop(loop, timeout: timeout) { result != nil }
        return result
    }

    func testStatusHeadersAndBody() throws {
        let c = client()
        let r = try XCTUnwrap(fetch(c, .init(url: server.url("/echo"), headers: [("X-Test", "yes")], body: Array("hello".utf8)))).get()
        XCTAssertEqual(r.status, 200)
        XCTAssertEqual(r.httpVersion, "1.1")
        XCTAssertEqual(r.text, "hello")
        XCTAssertEqual(r.header("x-echo-method"), "POST")
        XCTAssertEqual(r.header("X-Echo-Test"), "yes")
        XCTAssertEqual(r.header("x-echo-agent"), "dispatch-test")
        XCTAssertFalse(r.bodyTruncated)
        XCTAssertTrue(r.headers.allSatisfy { $0.0 == $0.0.lowercased() }, "\(r.headers)")
        XCTAssertTrue(r.headers.contains { $0.0 == "content-length" && $0.1 == "5" }, "\(r.headers)")

        // A body above curl's 1 KiB threshold is sent without an Expect: 100-continue pause.
        let big = [UInt8](repeating: 0x61, count: 50_000)
        let r2 = try XCTUnwrap(fetch(c, .init(url: server.url("/echo"), method: "PUT", body: big))).get()
        XCTAssertEqual(r2.header("x-echo-method"), "PUT")
        XCTAssertEqual(r2.header("x-echo-expect"), "none")
        XCTAssertEqual(r2.body.count, 4096)
        XCTAssertTrue(r2.bodyTruncated)

        let r3 = try XCTUnwrap(fetch(c, .init(url: server.url("/echo"), method: "GET"))).get()
        XCTAssertEqual(r3.header("x-echo-method"), "GET")
        XCTAssertEqual(r3.body, [])

        // Keep-alive: all three went over one connection.
        XCTAssertEqual(c.connectionsOpened, 1)
        XCTAssertEqual(c.openConnections, 1)
        XCTAssertEqual(c.inFlight, 0)
    }

    /// A body is copied at send time: changing or dropping the caller's array changes nothing.
    func testBodyIsCopied() throws {
        let c = client()
        var body = Array("original".utf8)
        var result: Result<CurlClient.Response, HTTPClientFailure>?
        c.send(.init(url: server.url("/echo"), body: body)) { result = $0 }
        body = Array("changed!".utf8)
        runLoop(loop, timeout: 10) { result != nil }
        XCTAssertEqual(try XCTUnwrap(result).get().text, "original")
        _ = body
    }

    func testAnswerBodyIsCappedAt4KiB() throws {
        let c = client()
        let r = try XCTUnwrap(fetch(c, .init(url: server.url("/big"), method: "GET"))).get()
        XCTAssertEqual(r.status, 200)
        XCTAssertEqual(r.body.count, 4096)
        XCTAssertTrue(r.bodyTruncated)
        XCTAssertEqual(r.header("content-length"), "100000")
        // The rest was read and dropped: the connection is clean and reused.
        let again = try XCTUnwrap(fetch(c, .init(url: server.url("/echo"), body: [1, 2, 3]))).get()
        XCTAssertEqual(again.body, [1, 2, 3])
        XCTAssertEqual(c.connectionsOpened, 1)
    }

    func testDeadline() throws {
        let c = client()
        let started = Clock.monotonic()
        let f = try XCTUnwrap(fetch(c, .init(url: server.url("/hang"), timeout: 1))?.failure)
        let elapsed = Clock.monotonic() - started
        XCTAssertEqual(f.kind, .timeout, f.description)
        XCTAssertGreaterThanOrEqual(elapsed, 0.9)
        XCTAssertLessThan(elapsed, 3)
        XCTAssertEqual(c.inFlight, 0)
        // The timed-out connection is closed, not reused with a half-read answer.
        spin(loop, 0.05)
        XCTAssertEqual(c.openConnections, 0)
    }

    func testDefaultTimeoutIsTenSeconds() {
        XCTAssertEqual(CurlClient.Request(url: "http://example.com").timeout, 10)
        XCTAssertEqual(CurlClient.Request(url: "http://example.com").method, "POST")
        XCTAssertEqual(CurlClient.Options().maxResponseBytes, 4096)
    }

    func testRedirectIsNotFollowed() throws {
        let c = client()
        let r = try XCTUnwrap(fetch(c, .init(url: server.url("/redirect")))).get()
        XCTAssertEqual(r.status, 302)
        XCTAssertEqual(r.header("location"), "/echo")
    }

    func testPrivateAddressesRefusedUnlessAllowed() throws {
        let strict = client(allowPrivate: false)
        let f = try XCTUnwrap(fetch(strict, .init(url: server.url("/echo")))?.failure)
        XCTAssertEqual(f.kind, .refusedAddress, f.description)
        XCTAssertTrue(f.message.contains("127.0.0.1"), f.message)
        XCTAssertTrue(f.message.contains("loopback"), f.message)
        // A name that resolves to loopback is refused too: the check is on the resolved address.
        let byName = try XCTUnwrap(fetch(strict, .init(url: server.url("/echo", host: "localhost")))?.failure)
        XCTAssertEqual(byName.kind, .refusedAddress, byName.description)
        let v6 = try XCTUnwrap(fetch(strict, .init(url: "http://[::1]:\(server.port)/echo"))?.failure)
        XCTAssertEqual(v6.kind, .refusedAddress, v6.description)
        let mapped = try XCTUnwrap(fetch(strict, .init(url: "http://[::ffff:127.0.0.1]:\(server.port)/echo"))?.failure)
        XCTAssertEqual(mapped.kind, .refusedAddress, mapped.description)
        XCTAssertEqual(strict.connectionsOpened, 0)
        XCTAssertGreaterThanOrEqual(strict.refusedConnections, 4)

        let open = client(allowPrivate: true)
        XCTAssertEqual(try XCTUnwrap(fetch(open, .init(url: server.url("/echo")))).get().status, 200)
    }

    func testDroppedConnectionIsRetryable() throws {
        let c = client()
        // Closed with no answer (GOT_NOTHING), reset (RECV_ERROR), closed mid-body (PARTIAL_FILE).
        for (path, code) in [("/drop", 52), ("/reset", 56), ("/partial", 18)] {
            let f = try XCTUnwrap(fetch(c, .init(url: server.url(path)))?.failure, path)
            XCTAssertEqual(f.kind, .retryOnNewConnection, "\(path): \(f)")
            XCTAssertEqual(f.curlCode, code, "\(path): \(f)")
            // The next request gets a working connection.
            XCTAssertEqual(try XCTUnwrap(fetch(c, .init(url: server.url("/echo")))).get().status, 200, path)
        }
        XCTAssertEqual(c.openConnections, 1)
    }

    func testConnectAndRequestErrors() throws {
        let c = client()
        let refused = try XCTUnwrap(fetch(c, .init(url: "http://127.0.0.1:\(try TestServer.freePort())/"))?.failure)
        XCTAssertEqual(refused.kind, .connect, refused.description)
        let noHost = try XCTUnwrap(fetch(c, .init(url: "http://no-such-host.invalid/"))?.failure)
        XCTAssertEqual(noHost.kind, .connect, noHost.description)
        let ftp = try XCTUnwrap(fetch(c, .init(url: "ftp://127.0.0.1/"))?.failure)
        XCTAssertEqual(ftp.kind, .invalidRequest, ftp.description)
        let file = try XCTUnwrap(fetch(c, .init(url: "file:///etc/passwd"))?.failure)
        XCTAssertEqual(file.kind, .invalidRequest, file.description)
        let malformed = try XCTUnwrap(fetch(c, .init(url: "http://exa mple.com/"))?.failure)
        XCTAssertEqual(malformed.kind, .invalidRequest, malformed.description)
        let injected = try XCTUnwrap(fetch(c, .init(url: server.url("/echo"), headers: [("X-Test", "a\r\nX-Evil: 1")]))?.failure)
        XCTAssertEqual(injected.kind, .invalidRequest, injected.description)
        let badMethod = try XCTUnwrap(fetch(c, .init(url: server.url("/echo"), method: "GET /x HTTP/1.1\r\n"))?.failure)
        XCTAssertEqual(badMethod.kind, .invalidRequest, badMethod.description)
        XCTAssertEqual(c.inFlight, 0)
    }

    /// Completions never run inside `send`, even when the request fails at once.
    func testCompletionsRunOnALaterTurn() {
        let c = client()
        var order: [String] = []
        c.send(.init(url: "ftp://x/")) { _ in order.append("invalid") }
        c.send(.init(url: server.url("/echo"))) { _ in order.append("answered") }
        order.append("sent")
        runLoop(loop, timeout: 10) { order.count == 3 }
        XCTAssertEqual(order.first, "sent")
        c.close()
        c.send(.init(url: server.url("/echo"))) { r in order.append("after close: \(r.failure?.kind.rawValue ?? "ok")") }
        order.append("sent after close")
        runLoop(loop, timeout: 5) { order.count == 5 }
        XCTAssertEqual(Array(order.suffix(2)), ["sent after close", "after close: cancelled"])
    }

    /// Past maxInFlight requests wait in order; a queued request's timeout counts from send.
    func testQueueBeyondMaxInFlight() {
        var o = CurlClient.Options()
        o.allowPrivateAddresses = true
        o.maxInFlight = 1
        let c = CurlClient(loop: loop, options: o)
        clients.append(c)
        var order: [String] = []
        let started = Clock.monotonic()
        var expiredAt = 0.0
        c.send(.init(url: server.url("/hang"), timeout: 1)) { r in order.append("hang:\(r.failure?.kind.rawValue ?? "ok")") }
        c.send(.init(url: server.url("/echo"), timeout: 0.5)) { r in
            expiredAt = Clock.monotonic() - started
            order.append("short:\(r.failure?.kind.rawValue ?? "ok")")
        }
        c.send(.init(url: server.url("/echo"), timeout: 5)) { r in order.append("long:\(r.failure?.kind.rawValue ?? "ok")") }
        XCTAssertEqual(c.inFlight, 1)
        XCTAssertEqual(c.queued, 2)
        runLoop(loop, timeout: 10) { order.count == 3 }
        XCTAssertEqual(order, ["hang:timeout", "short:timeout", "long:ok"])
        XCTAssertLessThan(expiredAt, 1.5)
        XCTAssertEqual(c.queued, 0)

        // close() cancels queued requests too.
        var cancelled = 0
        for _ in 0..<3 { c.send(.init(url: server.url("/hang"))) { r in if r.failure?.kind == .cancelled { cancelled += 1 } } }
        XCTAssertEqual(c.queued, 2)
        c.close()
        runLoop(loop, timeout: 5) { cancelled == 3 }
        XCTAssertEqual(cancelled, 3)
        XCTAssertEqual(c.queued, 0)
    }

    /// A completion may send the next request and close the client.
    func testCompletionMaySendAndClose() {
        let c = client()
        var steps: [Int] = []
        c.send(.init(url: server.url("/echo"))) { _ in
            steps.append(1)
            c.send(.init(url: self.server.url("/echo"))) { _ in
                steps.append(2)
                c.send(.init(url: self.server.url("/hang"))) { r in steps.append(r.failure?.kind == .cancelled ? 4 : -1) }
                c.close()
                steps.append(3)
            }
        }
        runLoop(loop, timeout: 10) { steps.count == 4 }
        XCTAssertEqual(steps, [1, 2, 3, 4])
        XCTAssertTrue(c.closed)
        XCTAssertEqual(c.openConnections, 0)
    }

    /// A server that answers before reading a body larger than its HTTP/2 window makes curl
    /// 7.88 spin (100% CPU until the deadline: it waits to send the rest of a stream that is
    /// already closed). Webhooks go to anyone's server, so they use HTTP/1.1, where the same
    /// answer completes at once.
    func testWebhooksUseHTTP1SoAnEarlyAnswerDoesNotSpin() throws {
        let nginx = try NginxH2Server()
        defer { nginx.stop() }
        var o = CurlClient.Options.webhooks
        o.allowPrivateAddresses = true
        o.caFile = nginx.caFile
        let c = CurlClient(loop: loop, options: o)
        clients.append(c)
        var result: Result<CurlClient.Response, HTTPClientFailure>?
        let started = Clock.monotonic(), cpu = cpuSeconds()
        c.send(.init(url: nginx.url("/early"), body: [UInt8](repeating: 0x61, count: 1_000_000), timeout: 3)) { result = $0 }
        runLoop(loop, timeout: 10) { result != nil }
        let r = try XCTUnwrap(result).get()
        XCTAssertEqual(r.status, 200)
        XCTAssertEqual(r.httpVersion, "1.1")
        XCTAssertLessThan(Clock.monotonic() - started, 1)
        XCTAssertLessThan(cpuSeconds() - cpu, 0.5)
    }
}
