import DispatchSystem
import DispatchCore
import DispatchIO
import DispatchTestSupport
import Glibc
import XCTest

extension TestServer {
    /// Starts an activity and returns its id.
    @discardableResult
    func startActivity(_ id: String, state: String = "processing", extra: String = "") throws -> HTTPClient.Response {
        let r = try client.post("/v1/activities/start", #"{"activityId":"\#(id)","taskName":"Job \#(id)","state":"\#(state)"\#(extra)}"#)
        XCTAssertEqual(r.status, 201, r.text)
        return r
    }

    @discardableResult
    func update(_ id: String, _ json: String = #"{"progress":0.5}"#) throws -> HTTPClient.Response {
        try client.post("/v1/activities/\(id)/update", json)
    }

    @discardableResult
    func end(_ id: String, _ json: String = "{}") throws -> HTTPClient.Response {
        try client.post("/v1/activities/\(id)/end", json)
    }

    func stream(_ id: String, lastEventID: Int64? = nil, smallBuffer: Bool = false) throws -> SSEClient {
        try SSEClient(port: port, path: "/v1/activities/\(id)/status", token: adminKey, lastEventID: lastEventID, smallBuffer: smallBuffer)
    }

    /// A figure from /metrics, summed over its samples whose labels contain `labels`.
    func metric(_ name: String, labels: String = "") throws -> Double {
        let text = try HTTPClient(port: port).get("/metrics").text
        var sum = 0.0
        // The server-wide series: `name value` or `name{labels} value` (per-worker `worker=` series
        // are kept only for process figures; they would count twice).
        for line in text.split(separator: "\n") where (line.hasPrefix(name + "{") || line.hasPrefix(name + " "))
            && !line.contains("worker=\"") && (labels.isEmpty || line.contains(labels)) {
            if let v = line.split(separator: " ").last.flatMap({ Double($0) }) { sum += v }
        }
        return sum
    }

    func seq(_ id: String) throws -> Int64? {
        if case .number(let n)? = try client.get("/v1/activities/\(id)").json?["seq"] { return Int64(n) }
        return nil
    }
}

func waitUntil(_ timeout: Double = 10, _ condition: () throws -> Bool) rethrows -> Bool {
    let deadline = Clock.monotonic() + timeout
    while Clock.monotonic() < deadline {
        if try condition() { return true }
        usleep(50_000)
    }
    return try condition()
}

/// `waitUntil` for a test whose streams must keep reading meanwhile, as real readers do: a
/// client that stops reading while thousands of changes are published is cut off as a slow
/// client once its backlog passes the cap, which a test must not mistake for a lost change.
func keepReading(_ clients: [SSEClient], timeout: Double, until condition: () throws -> Bool) throws -> Bool {
    let deadline = Clock.monotonic() + timeout
    while Clock.monotonic() < deadline {
        if try condition() { return true }
        for c in clients { _ = try c.pump(timeout: 0.01) }
    }
    return try condition()
}

/// Ids a client saw must be consecutive after its first one.
func assertConsecutive(_ ids: [Int64], from first: Int64? = nil, through last: Int64? = nil, file: StaticString = #filePath, line: UInt = #line) {
    guard let start = ids.first else { XCTFail("no events", file: file, line: line); return }
    if let first { XCTAssertEqual(start, first, "first id", file: file, line: line) }
    XCTAssertEqual(ids, Array(start..<(start + Int64(ids.count))), "ids not consecutive: \(ids)", file: file, line: line)
    if let last { XCTAssertEqual(ids.last, last, "last id", file: file, line: line) }
}

/// One fake APNs for a test class (started on first use, stopped in the class's tearDown),
/// with no scripts and no records at the start of each test.
final class ClassFakeAPNs: @unchecked Sendable {
    private var fake: FakeAPNs?

    func fresh() throws -> FakeAPNs {
        if fake == nil { fake = try FakeAPNs.start() }
        let f = fake!
        try f.resetBehavior()
        try f.clearRequests()
        return f
    }

    func stop() {
        fake?.stop()
        fake = nil
    }
}

/// A random device or activity token: `bytes` bytes as lowercase hex.
func randomToken(bytes: Int = 32) -> String {
    var g = SystemRandomNumberGenerator()
    return (0..<bytes).map { _ in String(format: "%02x", UInt8.random(in: 0...255, using: &g)) }.joined()
}

/// Waits until neither push outbox holds a push still to make or in flight: every push the
/// changes committed so far asked for has been answered, so what the fake APNs holds then is
/// all it will get for them. (Pushes are marked in the commit's own transaction: a wrong one
/// would be a row here first.) Instead of a pause that leaves "room for a wrong push".
func waitForPushesSettled(_ s: TestServer, file: StaticString = #filePath, line: UInt = #line) throws {
    let pending = """
        SELECT (SELECT count(*) FROM push_outbox WHERE wanted_seq > sent_seq AND NOT failed)
             + (SELECT count(*) FROM push_activity_outbox WHERE wanted_seq > sent_seq)
        """
    let settled = try waitUntil(15) { (try TestPostgres.shared().sql(s.conninfo, pending).first?.first ?? nil) == "0" }
    XCTAssertTrue(settled, "the push outboxes settled", file: file, line: line)
}

/// Returns once the millisecond clock has moved on (at most a millisecond): a change made
/// after it gets a later `updated_ms` than one made before it, on this machine's clock.
func waitForNextMillisecond() {
    let now = Clock.nowMilliseconds()
    while Clock.nowMilliseconds() <= now { sched_yield() }
}
