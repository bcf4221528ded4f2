import DispatchSystem
import DispatchCore
import DispatchTestSupport
import Foundation
import XCTest

/// Runs dispatch-bench from the repository root, its results JSON going to a temporary file:
/// its exit status, everything it printed, and the JSON it wrote (nil when none).
func runBench(_ arguments: [String]) throws -> (status: Int32, text: String, result: JSONValue?) {
    let json = NSTemporaryDirectory() + "bench-smoke-\(getpid())-\(UInt32.random(in: 0...UInt32.max)).json"
    defer { try? FileManager.default.removeItem(atPath: json) }
    let bench = Process()
    bench.executableURL = URL(fileURLWithPath: TestPaths.binary("dispatch-bench"))
    bench.currentDirectoryURL = URL(fileURLWithPath: TestPaths.repositoryRoot)
    bench.arguments = arguments + ["--json", json]
    let output = Pipe()
    bench.standardOutput = output
    bench.standardError = output
    try bench.run()
    let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
    bench.waitUntilExit()
    let result = (try? Data(contentsOf: URL(fileURLWithPath: json))).flatMap { try? JSONParser.parse(Array($0)) }
    return (bench.terminationStatus, text, result)
}

/// Runs the benchmark in smoke mode (a few hundred streams, seconds long) against a real
/// dispatchd: every scenario must finish with no lost, duplicated or failed event or stream.
final class BenchSmokeTests: XCTestCase {
    func testSmokeRunAgainstDispatchLosesNothing() throws {
        let server = try TestServer.start()
        defer { server.stop() }
        let (status, text, written) = try runBench(["run", "--smoke", "--only", "dispatch",
                                                   "--dispatch-port", String(server.port), "--key", server.adminKey])
        XCTAssertEqual(status, 0, text)
        guard let result = written else { return XCTFail("no results JSON\n\(text)") }

        guard case .object(let checks)? = result["checks"]?["dispatch"] else { return XCTFail("no checks\n\(text)") }
        for (name, value) in checks { XCTAssertEqual(value, .number(0), "\(name)\n\(text)") }
        guard case .array(let figures)? = result["figures"] else { return XCTFail("no figures\n\(text)") }
        let names = Set(figures.compactMap { f -> String? in
            if case .string(let s)? = f["scenario"], case .string(let m)? = f["figure"] { return "\(s.split(separator: " ")[0]) \(m)" }
            return nil
        })
        for expected in ["idle connect rate", "fanout last receipt p50", "throughput publishes/s",
                         "throughput deliveries/s", "throughput publish->receipt p50", "terminal finished streams/s",
                         "batch changes/s", "batch change->receipt p50"] {
            XCTAssertTrue(names.contains(expected), "missing figure \(expected)\n\(text)")
        }
        // Events really flowed: a run that delivered nothing would pass the loss checks vacuously.
        let deliveries = figures.first { $0["figure"] == .string("deliveries/s") }?["dispatch"]
        if case .number(let d)? = deliveries { XCTAssertGreaterThan(d, 0) } else { XCTFail("no deliveries\n\(text)") }
    }
}

/// The restart storm, the replay storm and the nodes scenario in smoke sizes, each against
/// dispatchd processes the bench starts itself (it restarts them, weighs them, and runs two
/// of them on one PostgreSQL): every stream resumes after the restart and catches up, the
/// replay readers get every event, and nothing is lost or duplicated anywhere.
final class BenchStormSmokeTests: XCTestCase {
    func testRestartReplayAndNodesLoseNothing() throws {
        // Twice: a second repetition must not reuse the first one's activities (it did, and
        // every stream of its multi-node runs counted what the earlier run published as lost).
        let (status, text, written) = try runBench(["run", "--smoke", "--only", "dispatch", "--scenarios", "restart,replay,nodes",
                                                   "--storm-repeats", "2", "--dispatchd", TestPaths.binary("dispatchd")])
        XCTAssertEqual(status, 0, text)
        guard let result = written else { return XCTFail("no results JSON\n\(text)") }
        XCTAssertEqual(result["problems"], .array([]), text)
        guard case .object(let checks)? = result["checks"]?["dispatch"] else { return XCTFail("no checks\n\(text)") }
        for (name, value) in checks { XCTAssertEqual(value, .number(0), "\(name)\n\(text)") }
        guard case .array(let figures)? = result["figures"] else { return XCTFail("no figures\n\(text)") }
        func value(_ scenario: String, _ figure: String) -> Double? {
            let f = figures.first {
                if case .string(let s)? = $0["scenario"], s.hasPrefix(scenario), $0["figure"] == .string(figure) { return true }
                return false
            }
            if case .number(let v)? = f?["dispatch"] { return v }
            return nil
        }
        // Every stream came back and caught up; none lost or duplicated an event.
        XCTAssertNotNil(value("restart", "all resumed and caught up"), text)
        XCTAssertEqual(value("restart", "events lost"), 0, text)
        XCTAssertEqual(value("restart", "events duplicated"), 0, text)
        XCTAssertNotNil(value("replay", "readers have everything"), text)
        XCTAssertNotNil(value("replay", "RSS growth, +50 stalled"), text)
        XCTAssertGreaterThan(value("cross-node", "deliveries/s") ?? 0, 0, text)
        XCTAssertGreaterThan(value("2 nodes", "deliveries/s") ?? 0, 0, text)
    }
}

/// The feed scenario in smoke sizes (1,000 activities over 4 keys, 20 readers) against a
/// dispatchd the bench starts: every reader reaches `synced`, and the point reads are measured
/// idle and while the feeds load.
final class BenchFeedSmokeTests: XCTestCase {
    func testFeedReadersAllSyncWhilePointReadsAreMeasured() throws {
        let (status, text, written) = try runBench(["run", "--smoke", "--only", "dispatch", "--scenarios", "feed",
                                                   "--dispatchd", TestPaths.binary("dispatchd")])
        XCTAssertEqual(status, 0, text)
        guard let result = written else { return XCTFail("no results JSON\n\(text)") }
        XCTAssertEqual(result["problems"], .array([]), text)
        guard case .array(let figures)? = result["figures"] else { return XCTFail("no figures\n\(text)") }
        func value(_ figure: String) -> Double? {
            let f = figures.first { $0["scenario"] == .string("feed 1k/20") && $0["figure"] == .string(figure) }
            if case .number(let v)? = f?["dispatch"] { return v }
            return nil
        }
        XCTAssertGreaterThan(value("all readers synced") ?? 0, 0, text)
        XCTAssertNotNil(value("point read p99 idle"), text)
        XCTAssertNotNil(value("point read p99 loaded"), text)
        XCTAssertNotNil(value("RSS growth"), text)
    }
}

/// The nodes scenario over NATS in smoke sizes: a nats-server per node, clustered, started by
/// the bench; then every nats-server killed mid-publishing and started again. Events flow
/// across nodes through NATS, and after the outage every stream catches up with nothing lost,
/// duplicated or reordered.
final class BenchNATSSmokeTests: XCTestCase {
    func testNodesOverNATSAndCarrierOutageLoseNothing() throws {
        let (status, text, written) = try runBench(["run", "--smoke", "--only", "dispatch", "--scenarios", "nodes",
                                                   "--node-carriers", "nats", "--dispatchd", TestPaths.binary("dispatchd")])
        XCTAssertEqual(status, 0, text)
        guard let result = written else { return XCTFail("no results JSON\n\(text)") }
        XCTAssertEqual(result["problems"], .array([]), text)
        guard case .object(let checks)? = result["checks"]?["dispatch"] else { return XCTFail("no checks\n\(text)") }
        for (name, value) in checks { XCTAssertEqual(value, .number(0), "\(name)\n\(text)") }
        guard case .array(let figures)? = result["figures"] else { return XCTFail("no figures\n\(text)") }
        func value(_ scenario: String, _ figure: String) -> Double? {
            let f = figures.first {
                if case .string(let s)? = $0["scenario"], s.hasPrefix(scenario), $0["figure"] == .string(figure) { return true }
                return false
            }
            if case .number(let v)? = f?["dispatch"] { return v }
            return nil
        }
        XCTAssertGreaterThan(value("cross-node nats", "deliveries/s") ?? 0, 0, text)
        XCTAssertGreaterThan(value("2 nodes nats", "NATS messages/s") ?? 0, 0, text)
        XCTAssertNotNil(value("outage nats", "catch-up after NATS back"), text)
        XCTAssertEqual(value("outage nats", "events lost"), 0, text)
        XCTAssertEqual(value("outage nats", "events duplicated/reordered"), 0, text)
    }
}

/// The push bench in smoke mode against the fake APNs: pushes flow, nothing fails.
final class PushBenchSmokeTests: XCTestCase {
    func testPushSmokeRunDeliversEveryPush() throws {
        let (status, text, written) = try runBench(["push", "--smoke", "--apns", "fake", "--no-throughput",
                                                   "--dispatchd", TestPaths.binary("dispatchd")])
        XCTAssertEqual(status, 0, text)
        guard let result = written else { return XCTFail("no results JSON\n\(text)") }
        XCTAssertEqual(result["problems"], .array([]), text)
        guard case .array(let figures)? = result["figures"] else { return XCTFail("no figures\n\(text)") }
        func value(_ figure: String) -> Double? {
            if case .number(let v)? = figures.first(where: { $0["figure"] == .string(figure) })?["value"] { return v }
            return nil
        }
        XCTAssertGreaterThan(value("pushes/s sustained") ?? 0, 0, text)
        XCTAssertNotNil(value("commit->APNs answer p50"), text)
        XCTAssertNotNil(value("publish->APNs received p50"), text)
        // Broadcast vs tokens: the channel costs one push per change (its scenario comes first).
        XCTAssertEqual(value("pushes per change"), 1, text)
    }
}
