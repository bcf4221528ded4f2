import DispatchHarness
import DispatchIO
import XCTest

/// PGConnection's shell on a manual loop and a scripted libpq driver: no database, no socket.
/// The pipeline queue's own tests feed it whole inputs; these test what only the shell does:
/// taking results out of libpq while it is not busy, and what happens around close, a lost
/// connection and deadlines.
final class PGConnectionShellTests: XCTestCase {
    typealias Wire = ScriptedPGDriver.Wire

    var loop: ManualLoop!
    var driver: ScriptedPGDriver!
    var conn: PGConnection!
    /// What each completion received, in order: "name: rows" or "name: error …".
    var answers: [String] = []

    override func setUp() {
        loop = ManualLoop()
        driver = ScriptedPGDriver()
        conn = PGConnection(loop: loop, driver: driver, conninfo: "postgres://scripted", name: "test", log: Logger(level: .error), timeout: 2)
        answers = []
    }

    override func tearDown() {
        conn.close()
        loop.runSoon()
        XCTAssertEqual(driver.violations, [], "calls libpq would block on or refuse")
        conn = nil
    }

    func row(_ v: String) -> PGInput {
        .result(PGResult(rows: [PGRow(columns: PGColumns(["v"]), values: [v])], columns: PGColumns(["v"]), affectedRows: 1))
    }

    /// The server's whole answer to one batch of these values.
    func answer(_ values: [String]) -> [PGInput] {
        values.flatMap { [row($0), .endOfQuery] } + [.sync]
    }

    func run(_ name: String, _ values: [String], timeout: Double? = nil) {
        conn.execute(values.map { PGQuery("select \($0)") }, timeout: timeout) { [weak self] result in
            switch result {
            case .success(let rs): self?.answers.append("\(name): " + rs.map { $0.rows.first?["v"] ?? "-" }.joined(separator: ","))
            case .failure(let e): self?.answers.append("\(name): error \(e.message)")
            }
        }
    }

    func connectReady() {
        conn.start()
        XCTAssertTrue(driver.awaitingSocket)
        driver.socketReady()
        XCTAssertTrue(conn.isReady)
        XCTAssertTrue(driver.watchingReads)
    }

    // MARK: - Reads split where libpq splits them

    /// The split that matters: a read that ends inside a result leaves libpq busy. The shell
    /// must stop taking results there (PQgetResult would block the loop) and take every
    /// whole result a read brings, since no further readable event comes for bytes libpq
    /// has already consumed.
    func testAReadEndingInsideAResultWaitsForTheRestAndTakesEverythingWhole() {
        connectReady()
        run("a", ["1", "2"])
        run("b", ["3"])
        driver.arrive([.input(row("1")), .input(.endOfQuery), .partialResult])
        XCTAssertEqual(answers, [], "half of batch a is not an answer")
        XCTAssertEqual(driver.violations, [])
        // The rest of a, and all of b, in one read.
        driver.arrive((answer(["2"]).map(Wire.input)) + answer(["3"]).map(Wire.input))
        XCTAssertEqual(answers, ["a: 1,2", "b: 3"])
        XCTAssertEqual(conn.pendingBatches, 0)
    }

    /// Every way of cutting the same answer into two reads, inside a result or between
    /// two, completes the same batches with the same rows, and asks libpq for nothing while
    /// it is busy.
    func testEverySplitOfTheAnswerCompletesTheSame() {
        let whole = answer(["1", "2"]) + answer(["3"])
        for cut in 0...whole.count {
            for insideAResult in [false, true] where cut < whole.count {
                setUp()
                connectReady()
                run("a", ["1", "2"])
                run("b", ["3"])
                var first = whole[..<cut].map(Wire.input)
                if insideAResult { first.append(.partialResult) }
                driver.arrive(first)
                driver.arrive(whole[cut...].map(Wire.input))
                XCTAssertEqual(answers, ["a: 1,2", "b: 3"], "cut at \(cut), inside a result: \(insideAResult)")
                XCTAssertEqual(driver.violations, [], "cut at \(cut), inside a result: \(insideAResult)")
                tearDown()
            }
        }
        setUp()
    }

    /// Notifications come with results and after them; the results are taken first.
    func testNotificationsReadWithResultsAreDelivered() {
        var heard: [String] = []
        conn.onNotify = { heard.append("\($0):\($1)") }
        connectReady()
        run("a", ["1"])
        driver.arrive([.notification(channel: "changes", payload: "x")] + answer(["1"]).map(Wire.input)
                      + [.notification(channel: "changes", payload: "y")])
        XCTAssertEqual(answers, ["a: 1"])
        XCTAssertEqual(heard, ["changes:x", "changes:y"])
    }

    // MARK: - Close

    /// A completion that closes the connection while the same read holds the next batch's
    /// answer: that answer arrives after close, completes nothing, and its caller hears
    /// "closed" once, later.
    func testAResultAfterCloseCompletesNothing() {
        connectReady()
        conn.execute([PGQuery("select 1")]) { [weak self] _ in
            self?.answers.append("a")
            self?.conn.close()
        }
        run("b", ["2"])
        driver.arrive((answer(["1"]) + answer(["2"])).map(Wire.input))
        XCTAssertEqual(answers, ["a"])
        XCTAssertFalse(driver.isOpen)
        loop.runSoon()
        XCTAssertEqual(answers, ["a", "b: error the database connection was closed"])
        // The socket reporting input after close reaches nobody.
        driver.arrive(answer(["2"]).map(Wire.input))
        loop.advance(by: 10)
        XCTAssertEqual(answers.count, 2)
        XCTAssertEqual(driver.connects, 1, "a closed connection does not come back")
    }

    func testCloseFailsWhatIsInFlightOnceAndNeverInsideTheCall() {
        connectReady()
        run("a", ["1"])
        conn.close()
        XCTAssertEqual(answers, [], "never inside close()")
        loop.runSoon()
        XCTAssertEqual(answers, ["a: error the database connection was closed"])
        conn.close()
        loop.runSoon()
        XCTAssertEqual(answers.count, 1)
    }

    // MARK: - A lost connection

    /// The connection breaks with one batch half answered and another waiting: both fail
    /// once with the reason, the owner hears it, and a fresh connection follows the backoff.
    func testALostConnectionMidPipelineFailsEveryBatchOnceAndReconnects() {
        var lost: [String] = []
        var readies = 0
        conn.onLost = { lost.append($0) }
        conn.onReady = { readies += 1 }
        connectReady()
        run("a", ["1", "2"])
        run("b", ["3"])
        driver.arrive([.input(row("1")), .input(.endOfQuery), .partialResult])
        driver.breakConnection("server closed the connection unexpectedly")
        XCTAssertEqual(lost, ["server closed the connection unexpectedly"])
        XCTAssertFalse(conn.isReady)
        XCTAssertEqual(driver.finishes, 1)
        loop.runSoon()
        XCTAssertEqual(answers, ["a: error server closed the connection unexpectedly", "b: error server closed the connection unexpectedly"])

        // The first backoff is 0.1 s.
        loop.advance(by: 0.05)
        XCTAssertEqual(driver.connects, 1)
        loop.advance(by: 0.1)
        XCTAssertEqual(driver.connects, 2)
        driver.socketReady()
        XCTAssertTrue(conn.isReady)
        XCTAssertEqual(readies, 2)
        // A new connection has no prepared statements: a named query is prepared again.
        conn.execute([PGQuery("select 4", name: "four")]) { _ in }
        XCTAssertEqual(driver.sent.suffix(3), [.prepare(name: "four", sql: "select 4", parameterCount: 0),
                                               .executePrepared(name: "four", params: []), .sync])
    }

    func testACommandLibpqRefusesStartsOverOnAFreshConnection() {
        var lost: [String] = []
        conn.onLost = { lost.append($0) }
        connectReady()
        driver.failingSends = 1
        run("a", ["1"])
        XCTAssertEqual(lost, ["send failed: another command is already in progress"])
        loop.runSoon()
        XCTAssertEqual(answers, ["a: error send failed: another command is already in progress"])
    }

    /// Output libpq could not write at once goes when the socket takes it; a failed flush
    /// is a lost connection.
    func testOutputWaitsForAWritableSocketAndAFailedFlushIsALostConnection() {
        var lost: [String] = []
        conn.onLost = { lost.append($0) }
        connectReady()
        driver.flushScript = [.more, .done]
        run("a", ["1"])
        XCTAssertTrue(driver.awaitingWritable)
        driver.fireWritable()
        XCTAssertTrue(driver.flushScript.isEmpty, "flushed again once writable")
        driver.arrive(answer(["1"]).map(Wire.input))
        XCTAssertEqual(answers, ["a: 1"])

        driver.flushScript = [.failed]
        run("b", ["2"])
        XCTAssertEqual(lost, ["could not send data to server: Broken pipe"])
    }

    func testAConnectionRefusingPipelineModeIsDroppedAndRetried() {
        driver.refusePipelineMode = true
        conn.start()
        driver.socketReady()
        XCTAssertFalse(conn.isReady)
        XCTAssertEqual(driver.finishes, 1)
        driver.refusePipelineMode = false
        loop.advance(by: 0.1)
        driver.socketReady()
        XCTAssertTrue(conn.isReady)
    }

    // MARK: - Deadlines

    /// A connection attempt that never hears back is given up at the deadline and retried.
    func testAConnectAttemptPastItsDeadlineIsRetried() {
        driver.connectScript = [.reading]
        conn.start()
        driver.socketReady()
        XCTAssertTrue(driver.awaitingSocket, "waits to read the server's answer")
        loop.advance(by: 1.9)
        XCTAssertEqual(driver.finishes, 0)
        loop.advance(by: 0.2)
        XCTAssertEqual(driver.finishes, 1, "given up at its 2 s deadline")
        loop.advance(by: 0.1)
        XCTAssertEqual(driver.connects, 2)
        driver.socketReady()
        XCTAssertTrue(conn.isReady)
    }

    /// The batch the server works on passing its deadline means the server stopped
    /// answering: its caller hears the timeout and the connection is started over.
    func testTheOldestBatchPastItsDeadlineDropsTheConnection() {
        var missed = 0
        conn.onDeadlineMissed = { missed += 1 }
        connectReady()
        run("a", ["1"])
        loop.advance(by: 1.9)
        XCTAssertEqual(answers, [])
        XCTAssertFalse(conn.isOverdue)
        loop.advance(by: 0.2)
        XCTAssertEqual(answers, ["a: error no answer from the database within 2 s"])
        XCTAssertEqual(missed, 1)
        XCTAssertFalse(conn.isReady)
    }

    /// A later batch with a shorter deadline is abandoned: its caller hears the timeout, the
    /// connection stays, and the batch's answer, arriving after, completes nothing.
    func testAnAbandonedBatchsLateAnswerCompletesNothing() {
        connectReady()
        run("slow", ["1"], timeout: 30)
        run("quick", ["2"], timeout: 0.5)
        loop.advance(by: 1)
        XCTAssertEqual(answers, ["quick: error no answer from the database within 2 s"])
        XCTAssertTrue(conn.isReady)
        driver.arrive((answer(["1"]) + answer(["2"])).map(Wire.input))
        XCTAssertEqual(answers, ["quick: error no answer from the database within 2 s", "slow: 1"])
        XCTAssertEqual(conn.pendingBatches, 0)
    }
}
