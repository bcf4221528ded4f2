@testable import DispatchIO
import CCurl
import DispatchSystem
import DispatchTestSupport
import Glibc
import XCTest

/// CurlClient's idle HTTP/2 connections against the fake APNs (which counts the PING frames it
/// receives and can stop answering, as a peer gone without a FIN): replaced once idle, before
/// the next request needs them; and what libcurl does with an upkeep PING.
final class CurlIdlePingTests: XCTestCase {
    var fake: FakeAPNs!
    var loop: EventLoop!
    var clients: [CurlClient] = []

    override func setUpWithError() throws {
        fake = try FakeAPNs.start()
        loop = EventLoop()
    }

    override func tearDown() {
        for c in clients { c.close() }
        clients = []
        if let loop { spin(loop, 0.01) }
        fake?.stop()
        fake = nil
        loop = nil
    }

    func client(idle: Int = 1, pingAvailable: Bool = CurlClient.canPingIdleConnections) -> CurlClient {
        var o = CurlClient.Options.apns(caFile: fake.pki + "/ca.pem", idleSeconds: idle)
        o.pingAvailable = pingAvailable
        let c = CurlClient(loop: loop, options: o)
        clients.append(c)
        return c
    }

    /// Any request: the fake's answer (a refusal: no provider token) comes over the connection
    /// like a push's.
    func request() -> CurlClient.Request {
        .init(url: "https://127.0.0.1:\(fake.port)/3/device/" + String(repeating: "ab", count: 32),
              headers: [("apns-topic", FakeAPNs.topic + ".push-type.liveactivity"), ("apns-push-type", "liveactivity")],
              body: Array(#"{"aps":{}}"#.utf8), timeout: 10)
    }

    /// Sends one request and runs the loop until it is answered; the seconds it took.
    @discardableResult
    func answered(_ c: CurlClient, file: StaticString = #filePath, line: UInt = #line) -> Double {
        var result: Result<CurlClient.Response, HTTPClientFailure>?
        let started = Clock.monotonic()
        c.send(request()) { result = $0 }
        XCTAssertTrue(runLoop(loop, timeout: 15) { result != nil }, "answered", file: file, line: line)
        if case .failure(let f)? = result { XCTFail("\(f)", file: file, line: line) }
        return Clock.monotonic() - started
    }

    func pings() throws -> Int { try fake.stat("pings") }

    /// What libcurl does with curl_easy_upkeep's HTTP/2 PING on an idle connection (the reason
    /// `CurlClient.canPingIdleConnections` is false): the frame is queued, not written. The
    /// peer sees no PING while the connection sits idle, so the client, waiting for an answer
    /// that cannot come, replaces the connection; the PING leaves only as the connection
    /// closes. When a libcurl writes it at once, this test fails: then PING can be turned on.
    func testUpkeepPINGWaitsInLibcurlsBufferWhileTheConnectionIsIdle() throws {
        guard let info = curl_version_info(CURLVERSION_FIRST), info.pointee.version_num >= 0x080A00 else {
            throw XCTSkip("libcurl \(CurlClient.libcurlVersion): curl_easy_upkeep does not reach a multi handle's connections before 8.10")
        }
        let c = client(idle: 1, pingAvailable: true)
        XCTAssertTrue(c.pinging)
        answered(c)
        XCTAssertTrue(runLoop(loop, timeout: 10) { c.pingsSent >= 1 }, "curl_easy_upkeep called")
        // Absence cannot be waited for: 0.3 s is far more than a loopback PING and its count
        // take, and less than the 0.5 s the client gives the answer.
        spin(loop, 0.3)
        XCTAssertEqual(c.openConnections, 1)
        XCTAssertEqual(try pings(), 0, "no PING frame while idle")
        XCTAssertTrue(runLoop(loop, timeout: 10) { c.replacedUnansweredPing == 1 || c.openConnections == 0 }, "replaced")
        XCTAssertEqual(c.replacedUnansweredPing, 1, "no answer came: the PING never left")
        // The closed connection flushed what it held, the PING included.
        var seen = 0
        XCTAssertTrue(waitFor(5) { seen = (try? self.pings()) ?? 0; return seen >= 1 }, "the queued PING left with the close")
        XCTAssertEqual(seen, c.pingsSent, "one PING frame per upkeep, all sent at the close")
    }

    /// Without PING (no libcurl can send one on an idle connection), a connection idle
    /// `pingIdleSeconds` is closed by the client before the next request needs it, even when
    /// its peer stopped answering (no FIN), and the next request goes on a new one at once.
    func testIdleConnectionWhosePeerStoppedAnsweringIsReplacedBeforeTheNextRequest() throws {
        let c = client(idle: 1)
        XCTAssertFalse(c.pinging)
        answered(c)
        try fake.silenceAll()
        XCTAssertTrue(runLoop(loop, timeout: 10) { c.replacedIdle == 1 && c.openConnections == 0 }, "replaced once idle 1 s")
        XCTAssertEqual(c.pingsSent, 0)
        XCTAssertEqual(try pings(), 0, "no PING frame")
        XCTAssertLessThan(answered(c), 3)
        XCTAssertEqual(c.connectionsOpened, 2)
    }
}
