@testable import DispatchIO
import DispatchSystem
import Glibc
import XCTest

/// H2Client against a real nginx (HTTP/2 over TLS, a CA made by the test): the APNs shape
/// (one connection, many streams) under load, a server killed, GOAWAY under load.
final class H2ClientNginxTests: XCTestCase {
    var nginx: NginxH2Server!
    var loop: EventLoop!
    var clients: [H2Client] = []

    override func setUpWithError() throws {
        nginx = try NginxH2Server()
        loop = EventLoop()
    }

    override func tearDown() {
        for c in clients { c.close() }
        clients = []
        spin(loop, 0.01)
        nginx?.stop()
        // XCTest keeps test case objects until the run ends: drop what they hold.
        nginx = nil
        loop = nil
    }

    func client(_ server: NginxH2Server? = nil) -> H2Client {
        let c = H2Client(loop: loop, options: .apns(caFile: (server ?? nginx).caFile))
        clients.append(c)
        return c
    }

    func push(_ i: Int) -> CurlClient.Request {
        .init(url: nginx.url("/3/device/\(i)"),
              headers: [("apns-topic", "com.example.push-type.liveactivity"), ("apns-push-type", "liveactivity"),
                        ("content-type", "application/json")],
              body: Array(#"{"aps":{"event":"update","timestamp":\#(i)}}"#.utf8))
    }

    /// nginx's connection serial numbers seen in the answers.
    func connections(_ responses: [CurlClient.Response]) -> Set<Substring> {
        Set(responses.compactMap { r in
            r.text.split(separator: ":").last.map { $0.dropLast() }
        })
    }

    func testThousandAtOnceShareOneConnection() throws {
        let c = client()
        let tally = Tally()
        for i in 0..<1000 { c.send(push(i), completion: tally.completion(i)) }
        XCTAssertTrue(runLoop(loop, timeout: 30) { tally.calls == 1000 }, "\(tally.calls) of 1000 completed")
        XCTAssertEqual(tally.duplicates, 0)
        XCTAssertEqual(tally.failures.count, 0, "\(tally.failures.prefix(3))")
        XCTAssertTrue(tally.successes.allSatisfy { $0.status == 200 && $0.httpVersion == "2" })
        XCTAssertEqual(c.connectionsOpened, 1)
        XCTAssertEqual(c.openConnections, 1)
        XCTAssertEqual(connections(tally.successes).count, 1, "\(connections(tally.successes))")
    }

    /// Requests per second over one connection, `window` in flight at a time.
    func testThroughput() throws {
        let o = H2Client.Options.apns(caFile: nginx.caFile)
        let c = H2Client(loop: loop, options: o)
        clients.append(c)
        let total = Int(ProcessInfoLite.env("H2_BENCH_REQUESTS") ?? "") ?? 20_000
        let window = Int(ProcessInfoLite.env("H2_BENCH_WINDOW") ?? "") ?? 1000
        // Warm up: the connection and TLS handshake are not what we measure.
        var warm: Result<CurlClient.Response, HTTPClientFailure>?
        c.send(push(0)) { warm = $0 }
        runLoop(loop, timeout: 10) { warm != nil }
        XCTAssertEqual(try warm?.get().status, 200)

        var sent = 0, done = 0, failed = 0
        func next() {
            let i = sent
            sent += 1
            c.send(push(i)) { r in
                done += 1
                if case .failure = r { failed += 1 }
                if sent < total { next() }
            }
        }
        let started = Clock.monotonic()
        let cpuStarted = cpuSeconds()
        let serverCPUStarted = nginx.cpuSeconds()
        for _ in 0..<min(window, total) { next() }
        XCTAssertTrue(runLoop(loop, timeout: 120) { done == total })
        let elapsed = Clock.monotonic() - started
        let cpu = cpuSeconds() - cpuStarted
        let serverCPU = nginx.cpuSeconds() - serverCPUStarted
        let rate = Double(done) / elapsed
        // CPU per request is the steadier figure on a shared machine; nginx runs on the other core.
        print("H2Client throughput: \(done) requests, window \(window), \(Int(rate)) requests/s over \(c.connectionsOpened) connection(s), client CPU \(Int(cpu / Double(done) * 1e6)) µs/request (\(Int(cpu / elapsed * 100))% of a core), nginx CPU \(Int(serverCPU / Double(done) * 1e6)) µs/request (\(Int(serverCPU / elapsed * 100))%), \(failed) failed")
        XCTAssertEqual(failed, 0)
        XCTAssertEqual(c.connectionsOpened, 1)
    }

    /// nginx killed with requests in flight: they fail as retryable; after a restart a resend
    /// succeeds at once, on a new connection (the dead one is not reused).
    func testServerKilledMidFlight() throws {
        let c = client()
        var first: Result<CurlClient.Response, HTTPClientFailure>?
        c.send(push(0)) { first = $0 }
        runLoop(loop, timeout: 10) { first != nil }
        XCTAssertEqual(try first?.get().status, 200)

        let tally = Tally()
        for i in 0..<50 { c.send(.init(url: nginx.url("/hang"), timeout: 30), completion: tally.completion(i)) }
        spin(loop, 0.5)
        XCTAssertEqual(tally.calls, 0)
        nginx.kill9()
        XCTAssertTrue(runLoop(loop, timeout: 10) { tally.calls == 50 }, "\(tally.calls) of 50 completed")
        XCTAssertEqual(tally.duplicates, 0)
        let kinds = Set(tally.failures.map(\.kind))
        XCTAssertTrue(kinds.contains(.retryOnNewConnection) && kinds.isSubset(of: [.retryOnNewConnection, .connect]),
                      "\(Set(tally.failures.map(\.description)))")
        XCTAssertEqual(c.openConnections, 0)

        let openedBefore = c.connectionsOpened
        try nginx.start()
        let again = Tally()
        for i in 0..<100 { c.send(push(i), completion: again.completion(i)) }
        XCTAssertTrue(runLoop(loop, timeout: 10) { again.calls == 100 })
        XCTAssertEqual(again.failures.count, 0, "\(again.failures.prefix(3))")
        XCTAssertEqual(c.connectionsOpened, openedBefore + 1, "one new connection for the resends")
        XCTAssertEqual(c.openConnections, 1)
        XCTAssertEqual(connections(again.successes).count, 1)
    }

    /// GOAWAY under load (nginx ends a connection after 100 requests, 1,000 sent at once):
    /// every push gets through. The client moves streams past the GOAWAY's last stream id to a
    /// new connection by itself (up to `maxAttempts`); anything it fails must be retryable.
    func testGoawayUnderLoadLosesNothing() throws {
        let goaway = try NginxH2Server(maxRequestsPerConnection: 100)
        defer { goaway.stop() }
        let c = client(goaway)
        let total = 1000
        var ok = 0, retried = 0, other: [HTTPClientFailure] = []
        func send(_ i: Int) {
            c.send(.init(url: goaway.url("/3/device/\(i)"), body: Array("{}".utf8))) { r in
                switch r {
                case .success(let response):
                    XCTAssertEqual(response.status, 200)
                    ok += 1
                case .failure(let f) where f.kind == .retryOnNewConnection && retried < 10 * total:
                    retried += 1
                    send(i)
                case .failure(let f):
                    other.append(f)
                }
            }
        }
        for i in 0..<total { send(i) }
        XCTAssertTrue(runLoop(loop, timeout: 60) { ok + other.count == total }, "ok \(ok) retried \(retried)")
        XCTAssertEqual(other.count, 0, "\(other.prefix(3))")
        print("GOAWAY every 100 requests: \(total) pushes, \(c.resent) resent by the client, \(retried) by the caller, \(c.connectionsOpened) connections")
        XCTAssertGreaterThanOrEqual(c.connectionsOpened, total / 100)
    }

    /// close() with requests in flight and queued: each completion runs once, later, as cancelled.
    func testCloseWithRequestsInFlight() throws {
        let c = client()
        let tally = Tally()
        for i in 0..<20 { c.send(.init(url: nginx.url("/hang"), timeout: 30), completion: tally.completion(i)) }
        for i in 20..<500 { c.send(push(i), completion: tally.completion(i)) }
        spin(loop, 0.3)
        let answered = tally.calls
        XCTAssertGreaterThan(answered, 0)
        c.close()
        XCTAssertEqual(tally.calls, answered, "no completion inside close()")
        XCTAssertTrue(runLoop(loop, timeout: 5) { tally.calls == 500 })
        spin(loop, 0.1)
        XCTAssertEqual(tally.calls, 500)
        XCTAssertEqual(tally.duplicates, 0)
        XCTAssertTrue(tally.failures.allSatisfy { $0.kind == .cancelled })
        XCTAssertGreaterThanOrEqual(tally.failures.count, 20)
        XCTAssertEqual(c.openConnections, 0)
        c.close()

        // Closing before the loop ever ran.
        let d = client()
        let early = Tally()
        for i in 0..<10 { d.send(push(i), completion: early.completion(i)) }
        d.close()
        XCTAssertTrue(runLoop(loop, timeout: 5) { early.calls == 10 })
        XCTAssertTrue(early.failures.allSatisfy { $0.kind == .cancelled })
    }

    /// A server answering before it read a body larger than its flow-control window: the
    /// answer completes at once (nghttp2 stops sending the closed stream's body).
    func testEarlyAnswerToALargeBody() throws {
        let c = client()
        var result: Result<CurlClient.Response, HTTPClientFailure>?
        let started = Clock.monotonic(), cpu = cpuSeconds()
        c.send(.init(url: nginx.url("/early"), body: [UInt8](repeating: 0x61, count: 1_000_000), timeout: 3)) { result = $0 }
        runLoop(loop, timeout: 10) { result != nil }
        let r = try XCTUnwrap(result).get()
        XCTAssertEqual(r.status, 200)
        XCTAssertEqual(r.httpVersion, "2")
        XCTAssertLessThan(Clock.monotonic() - started, 1)
        XCTAssertLessThan(cpuSeconds() - cpu, 0.5)
    }

    func testUntrustedCertificateIsATLSFailure() throws {
        let c = H2Client(loop: loop, options: .apns())
        clients.append(c)
        var result: Result<CurlClient.Response, HTTPClientFailure>?
        c.send(push(1)) { result = $0 }
        runLoop(loop, timeout: 10) { result != nil }
        XCTAssertEqual(result?.failure?.kind, .tls, "\(String(describing: result))")
    }
}
