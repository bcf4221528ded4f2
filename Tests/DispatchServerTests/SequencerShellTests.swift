import DispatchCore
import DispatchHarness
import DispatchIO
import XCTest
@testable import DispatchServer

/// The numbering passes' shell in one process: its session on a scripted libpq driver, time on
/// a manual loop. What it sends, what it announces, and its failure paths (a lock held by
/// another server, a lost session mid-pass, a refused statement, a stop).
final class SequencerShellTests: XCTestCase {
    var loop: ManualLoop!
    var session: ScriptedSession!
    var sequencer: Sequencer!
    var metrics: CarrierMetrics!
    var announced: [Int64] = []

    override func setUp() {
        loop = ManualLoop()
        session = ScriptedSession()
        metrics = CarrierMetrics()
        let pg = PGConnection(loop: loop, driver: session.driver, conninfo: "scripted", name: "sequencer", log: Logger(level: .error))
        sequencer = Sequencer(loop: loop, session: pg, log: Logger(level: .error), metrics: metrics,
                              settings: .init(pollInterval: 0.2, busyRetry: 0.02, batch: 100))
        sequencer.delegate = self
        sequencer.start()
        session.driver.socketReady()
        loop.runSoon()
    }

    override func tearDown() {
        sequencer.stop()
        loop.runSoon()
        XCTAssertEqual(session.driver.violations, [])
    }

    /// Answers the session's set-up: the timeouts, and whether commit times are recorded.
    func answerSetup(ordered: Bool = true) {
        XCTAssertTrue(session.answerNext { name, _ in
            name == "sequencer_order" ? PGResult(columns: ["ordered"], rows: [[ordered ? "t" : "f"]]) : PGResult()
        })
        loop.runSoon()
    }

    /// Answers the pass that waits: whether the lock was got, how many rows, the newest.
    func answerPass(got: Bool, n: Int = 0, through: Int64? = nil) {
        XCTAssertTrue(session.answerNext { name, _ in
            switch name {
            case "sequencer_lock": return PGResult(columns: ["got"], rows: [[got ? "t" : "f"]])
            default: return PGResult(columns: ["n", "through", "got"], rows: [[String(n), through.map { String($0) }, got ? "t" : "f"]])
            }
        }, "a pass was waiting")
        loop.runSoon()
    }

    func testTheSessionLosesAHungClientsLockAndPassesFollowCommitOrder() {
        XCTAssertTrue(session.driver.sent.contains(.execute(sql: "SET idle_in_transaction_session_timeout = '2s'", params: [])),
                      "a client that stops mid-pass loses its transaction and its lock")
        XCTAssertTrue(session.driver.sent.contains(.execute(sql: "SET statement_timeout = '2s'", params: [])))
        answerSetup(ordered: true)
        XCTAssertEqual(session.pending, ["sequencer_lock", "sequencer_pass_commit_order"], "a pass at once, in commit order")
        answerPass(got: true, n: 3, through: 42)
        XCTAssertEqual(announced, [42])
        XCTAssertEqual(metrics.positionsNumbered, 3)
    }

    func testWithoutCommitTimesPassesOrderByWriteTime() {
        answerSetup(ordered: false)
        XCTAssertEqual(session.pending, ["sequencer_lock", "sequencer_pass"])
    }

    func testALockHeldByAnotherServerAnnouncesNothingAndIsTriedAgainSoon() {
        answerSetup()
        answerPass(got: false)
        XCTAssertEqual(announced, [])
        XCTAssertEqual(metrics.sequencerBusy, 1)
        XCTAssertEqual(session.pending, [], "holds nothing, waits for nothing")
        loop.advance(by: 0.15)
        XCTAssertEqual(session.pending, ["sequencer_lock", "sequencer_pass_commit_order"], "tried again within the busy retries")
        answerPass(got: true, n: 0)
        XCTAssertEqual(announced, [], "nothing numbered, nothing said")
    }

    func testAWakeUpDuringAPassRunsOneMoreAfterIt() {
        answerSetup()
        sequencer.woken()
        sequencer.woken()
        XCTAssertEqual(session.pending.count, 2, "one pass in flight at a time")
        answerPass(got: true, n: 1, through: 7)
        XCTAssertEqual(session.pending, ["sequencer_lock", "sequencer_pass_commit_order"], "the wake-ups' pass")
        answerPass(got: true, n: 2, through: 9)
        XCTAssertEqual(announced, [7, 9])
        XCTAssertEqual(session.pending, [])
    }

    func testASessionLostMidPassAnnouncesNothingAndStartsOverOnTheNewSession() {
        answerSetup()
        XCTAssertEqual(session.pending.count, 2)
        session.connectionLost()
        loop.runSoon()
        XCTAssertEqual(announced, [], "a pass whose answer never came announced nothing")
        sequencer.woken()
        XCTAssertEqual(session.pending, [], "no pass on a lost session")
        loop.advance(by: 5)
        session.driver.socketReady()
        loop.runSoon()
        answerSetup()
        answerPass(got: true, n: 1, through: 50)
        XCTAssertEqual(announced, [50])
    }

    func testARefusedPassIsRetriedAfterThePoll() {
        answerSetup()
        XCTAssertTrue(session.answerNext { name, _ in
            name == "sequencer_lock" ? PGResult(columns: ["got"], rows: [["t"]]) : PGResult.failure("canceling statement due to statement timeout")
        })
        loop.runSoon()
        XCTAssertEqual(announced, [])
        loop.advance(by: 0.1)
        XCTAssertEqual(session.pending, [])
        loop.advance(by: 0.15)
        XCTAssertEqual(session.pending, ["sequencer_lock", "sequencer_pass_commit_order"])
    }

    func testAfterStopNoTimerSendsAnything() {
        answerSetup()
        answerPass(got: true, n: 0)
        sequencer.stop()
        let sent = session.driver.sent.count
        loop.advance(by: 5)
        XCTAssertEqual(session.driver.sent.count, sent)
    }
}

extension SequencerShellTests: SequencerDelegate {
    func positionsNumbered(through: Int64) { announced.append(through) }
}
