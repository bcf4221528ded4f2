@testable import PGCore
import XCTest

/// The pipeline's bookkeeping driven by synthetic results, one line per input, as libpq would
/// hand them over after `PQgetResult`.
final class PipelineQueueTests: XCTestCase {
    typealias Queue = PipelineQueue<String>

    func row(_ v: String) -> PGResult { PGResult(columns: ["v"], rows: [[v]]) }

    /// Feeds inputs and returns what completed, as "batch: v1,v2" (errors as "!").
    func feed(_ q: inout Queue, _ inputs: [Queue.Input], now: Double = 1) -> [String] {
        var out: [String] = []
        for input in inputs {
            for action in q.receive(input, now: now) {
                switch action {
                case .complete(let c, let results, _):
                    out.append(c + ": " + results.map { $0.ok ? ($0.first?["v"] ?? "-") : "!" }.joined(separator: ","))
                case .protocolViolation(let why):
                    out.append("violation: " + why)
                }
            }
        }
        return out
    }

    func testOneBatchCompletesAtItsSyncWithResultsInOrder() {
        var q = Queue()
        let cmds = q.enqueue([PGQuery("SELECT 1"), PGQuery("SELECT 2")], completion: "a", now: 0)
        XCTAssertEqual(cmds, [.execute(sql: "SELECT 1", params: []), .execute(sql: "SELECT 2", params: []), .sync])
        XCTAssertTrue(q.awaitingResults)
        XCTAssertEqual(feed(&q, [.result(row("1")), .endOfQuery, .result(row("2")), .endOfQuery]), [], "nothing before the sync")
        XCTAssertEqual(feed(&q, [.sync]), ["a: 1,2"])
        XCTAssertFalse(q.awaitingResults)
        XCTAssertEqual(q.inFlightBatches, 0)
    }

    func testOverlappingBatchesCompleteInOrder() {
        var q = Queue()
        _ = q.enqueue([PGQuery("x")], completion: "a", now: 0)
        _ = q.enqueue([PGQuery("y"), PGQuery("z")], completion: "b", now: 0)
        XCTAssertEqual(q.inFlightBatches, 2)
        XCTAssertEqual(feed(&q, [.result(row("x")), .endOfQuery, .sync, .result(row("y")), .endOfQuery, .result(row("z")), .endOfQuery, .sync]),
                       ["a: x", "b: y,z"])
    }

    func testElapsedTimeIsMeasuredFromEnqueue() {
        var q = Queue()
        _ = q.enqueue([PGQuery("x")], completion: "a", now: 10)
        _ = q.receive(.result(row("x")), now: 10.5)
        _ = q.receive(.endOfQuery, now: 10.5)
        guard case .complete(_, _, let elapsed)? = q.receive(.sync, now: 12.25).first else { return XCTFail() }
        XCTAssertEqual(elapsed, 2.25)
    }

    func testNamedStatementsArePreparedOncePerConnection() {
        var q = Queue()
        let first = q.enqueue([PGQuery("SELECT $1", ["1"], name: "s"), PGQuery("SELECT $1", ["2"], name: "s")], completion: "a", now: 0)
        XCTAssertEqual(first, [.prepare(name: "s", sql: "SELECT $1", parameterCount: 1), .executePrepared(name: "s", params: ["1"]),
                               .executePrepared(name: "s", params: ["2"]), .sync])
        XCTAssertEqual(feed(&q, [.result(PGResult()), .endOfQuery, .result(row("1")), .endOfQuery, .result(row("2")), .endOfQuery, .sync]),
                       ["a: 1,2"])
        XCTAssertEqual(q.enqueue([PGQuery("SELECT $1", ["3"], name: "s")], completion: "b", now: 0),
                       [.executePrepared(name: "s", params: ["3"]), .sync])
    }

    /// A batch failing midway: the failing statement reports its error, the rest of the batch
    /// is skipped ("aborted"), the batch still completes at its sync, and the next batch runs.
    func testABatchFailingMidway() {
        var q = Queue()
        _ = q.enqueue([PGQuery("a"), PGQuery("b"), PGQuery("c")], completion: "one", now: 0)
        _ = q.enqueue([PGQuery("d")], completion: "two", now: 0)
        let failing = PGResult.failure("ERROR: duplicate key", sqlState: "23505")
        XCTAssertEqual(feed(&q, [.result(row("a")), .endOfQuery, .result(failing), .endOfQuery, .result(.aborted), .endOfQuery, .sync]),
                       ["one: a,!,!"])
        XCTAssertEqual(feed(&q, [.result(row("d")), .endOfQuery, .sync]), ["two: d"])
    }

    /// A Parse refused (or skipped after an earlier error) prepared nothing: the next batch
    /// sends it again.
    func testARefusedParseIsNotRememberedAsPrepared() {
        var q = Queue()
        _ = q.enqueue([PGQuery("bad", name: "s")], completion: "a", now: 0)
        XCTAssertEqual(feed(&q, [.result(.failure("syntax error", sqlState: "42601")), .endOfQuery, .result(.aborted), .endOfQuery, .sync]),
                       ["a: !"])
        XCTAssertFalse(q.prepared.contains("s"))
        XCTAssertEqual(q.enqueue([PGQuery("bad", name: "s")], completion: "b", now: 0).first,
                       .prepare(name: "s", sql: "bad", parameterCount: 0))
    }

    /// A lost connection mid-batch fails every batch in flight, in order, and forgets every
    /// prepared statement (a new connection has none).
    func testALostConnectionMidBatchFailsEverythingInFlight() {
        var q = Queue()
        _ = q.enqueue([PGQuery("a", name: "s")], completion: "one", now: 0)
        _ = q.enqueue([PGQuery("b")], completion: "two", now: 0)
        XCTAssertEqual(feed(&q, [.result(PGResult()), .endOfQuery, .result(row("a"))]), [])
        XCTAssertEqual(q.fail(), ["one", "two"])
        XCTAssertEqual(q.inFlightBatches, 0)
        XCTAssertFalse(q.awaitingResults)
        XCTAssertTrue(q.prepared.isEmpty)
        XCTAssertEqual(q.fail(), [], "failed once")
    }

    /// Results arriving in several reads: any split of the same input sequence completes the
    /// same batches with the same results. This is the queue's half only (it sees whole
    /// results); the split that matters, a read ending inside a result while libpq is busy,
    /// is the shell's: PGConnectionShellTests (DispatchIOTests) tests it.
    func testResultsArrivingInSeveralReads() {
        let inputs: [Queue.Input] = [.result(row("1")), .endOfQuery, .result(row("2")), .endOfQuery, .sync,
                                     .result(row("3")), .endOfQuery, .sync]
        for split in 0...inputs.count {
            var q = Queue()
            _ = q.enqueue([PGQuery("1"), PGQuery("2")], completion: "a", now: 0)
            _ = q.enqueue([PGQuery("3")], completion: "b", now: 0)
            let out = feed(&q, Array(inputs[..<split])) + feed(&q, Array(inputs[split...]))
            XCTAssertEqual(out, ["a: 1,2", "b: 3"], "split at \(split)")
        }
    }

    func testUnexpectedInputIsAProtocolViolation() {
        var q = Queue()
        XCTAssertEqual(feed(&q, [.result(row("x"))]).first?.hasPrefix("violation"), true, "nothing in flight")
        q = Queue()
        _ = q.enqueue([PGQuery("a")], completion: "a", now: 0)
        XCTAssertEqual(feed(&q, [.sync]).first?.hasPrefix("violation"), true, "sync before the statement answered")
        q = Queue()
        _ = q.enqueue([PGQuery("a")], completion: "a", now: 0)
        XCTAssertEqual(feed(&q, [.result(row("1")), .result(row("2"))]).first?.hasPrefix("violation"), true, "two results")
    }

    /// Finished batches leave nothing behind: thousands of batches with rows keep the queue's
    /// own storage bounded (the results go with the completion).
    func testFinishedBatchesAreReleased() {
        var q = Queue()
        weak var probe: PGColumns?
        for i in 0..<5000 {
            _ = q.enqueue([PGQuery("x")], completion: "b\(i)", now: 0)
            let r = PGResult(columns: ["v"], rows: Array(repeating: ["row"], count: 100))
            if i == 0 { probe = r.columns }
            _ = feed(&q, [.result(r), .endOfQuery, .sync])
        }
        XCTAssertNil(probe, "the first batch's rows are still referenced")
        XCTAssertEqual(q.inFlightBatches, 0)
        XCTAssertFalse(q.awaitingResults)
    }
}
