@testable import PGCore
import DispatchCore
import XCTest

/// The connection's life as a table: each input and the actions it must produce.
final class ConnectionMachineTests: XCTestCase {
    typealias Machine = PGConnectionMachine<String>

    func render(_ actions: [Machine.Action]) -> [String] {
        actions.map { a in
            switch a {
            case .connect: return "connect"
            case .becomeReady: return "ready"
            case .send(let cmds): return "send \(cmds.count)"
            case .complete(let c, let rs, _): return "complete \(c) \(rs.count)"
            case .fail(let cs, let e): return "fail \(cs.joined(separator: ",")): \(e.message)"
            case .closeConnection: return "close"
            case .reportLost(let why): return "lost: \(why)"
            case .scheduleReconnect(let after, _): return "reconnect in \(after)"
            }
        }
    }

    func testConnectThenReadyThenQuery() {
        var m = Machine()
        XCTAssertEqual(render(m.start(now: 0)), ["connect"])
        XCTAssertEqual(render(m.execute([PGQuery("x")], completion: "early", now: 0)), ["fail early: the database connection is not ready"])
        XCTAssertEqual(render(m.connected()), ["ready"])
        XCTAssertTrue(m.isReady)
        XCTAssertEqual(render(m.execute([PGQuery("x")], completion: "q", now: 0)), ["send 2"])
        XCTAssertEqual(render(m.received(.result(PGResult()), now: 0) + m.received(.endOfQuery, now: 0) + m.received(.sync, now: 0)),
                       ["complete q 1"])
    }

    func testFailedConnectsBackOffExponentiallyAndResetAfterSuccess() {
        var m = Machine(backoff: Backoff(initial: 0.1, maximum: 0.4))
        _ = m.start(now: 0)
        XCTAssertEqual(render(m.connectFailed("refused")), ["close", "reconnect in 0.1"])
        XCTAssertEqual(render(m.reconnectDue(now: 0)), ["connect"])
        XCTAssertEqual(render(m.connectFailed("refused")), ["close", "reconnect in 0.2"])
        _ = m.reconnectDue(now: 0)
        XCTAssertEqual(render(m.connectFailed("refused")), ["close", "reconnect in 0.4"])
        _ = m.reconnectDue(now: 0)
        XCTAssertEqual(render(m.connectFailed("refused")), ["close", "reconnect in 0.4"], "capped")
        _ = m.reconnectDue(now: 0)
        _ = m.connected()
        XCTAssertEqual(render(m.connectionLost("reset")), ["close", "lost: reset", "reconnect in 0.1"], "reset after a success")
    }

    /// A lost connection mid-batch: the socket is closed first, then every query in flight
    /// fails in order, then the owner hears of the loss, then a reconnect is scheduled.
    func testALostConnectionMidBatch() {
        var m = Machine()
        _ = m.start(now: 0); _ = m.connected()
        _ = m.execute([PGQuery("a"), PGQuery("b")], completion: "one", now: 0)
        _ = m.execute([PGQuery("c")], completion: "two", now: 0)
        _ = m.received(.result(PGResult()), now: 0)
        XCTAssertEqual(render(m.connectionLost("server closed the connection")),
                       ["close", "fail one,two: server closed the connection", "lost: server closed the connection", "reconnect in 0.1"])
        XCTAssertEqual(m.state, .backingOff)
        XCTAssertEqual(render(m.received(.sync, now: 0)), [], "late input after the loss is ignored")
        XCTAssertEqual(render(m.connectionLost("again")), [], "lost once")
    }

    /// A server answer the pipeline cannot place closes the connection like a loss.
    func testAProtocolViolationClosesTheConnection() {
        var m = Machine()
        _ = m.start(now: 0); _ = m.connected()
        _ = m.execute([PGQuery("a")], completion: "q", now: 0)
        let actions = render(m.received(.sync, now: 0))
        XCTAssertEqual(actions.first, "close")
        XCTAssertEqual(actions.dropFirst().first?.hasPrefix("fail q: protocol violation"), true, "\(actions)")
        XCTAssertEqual(m.state, .backingOff)
    }

    func testCloseFailsWhatIsInFlightAndStopsReconnecting() {
        var m = Machine()
        _ = m.start(now: 0); _ = m.connected()
        _ = m.execute([PGQuery("a")], completion: "q", now: 0)
        XCTAssertEqual(render(m.close()), ["close", "fail q: the database connection was closed"])
        XCTAssertEqual(render(m.reconnectDue(now: 0)), [])
        XCTAssertEqual(render(m.connectionLost("x")), [])
        XCTAssertEqual(render(m.execute([PGQuery("a")], completion: "late", now: 0)), ["fail late: the database connection is not ready"])
    }

    func testCloseWhileBackingOffHasNothingToClose() {
        var m = Machine()
        _ = m.start(now: 0)
        _ = m.connectFailed("refused")
        XCTAssertEqual(render(m.close()), [])
        XCTAssertEqual(m.state, .closed)
    }

    // MARK: - Deadlines (contract §6, DISPATCH_DB_TIMEOUT)

    /// A server that stops answering mid-batch: nothing happens before the deadline; at it the
    /// caller fails, the socket closes, the owner hears of it, and a reconnect is scheduled.
    func testABatchPastItsDeadlineDropsTheConnection() {
        var m = Machine(timeout: 5)
        _ = m.start(now: 0); _ = m.connected()
        _ = m.execute([PGQuery("a")], completion: "q", now: 10)
        XCTAssertEqual(render(m.tick(now: 14.9)), [])
        XCTAssertFalse(m.isOverdue(now: 14.9))
        XCTAssertTrue(m.isOverdue(now: 15))
        XCTAssertEqual(render(m.tick(now: 15)), ["close", "fail q: no answer from the database within 5 s",
                                                 "lost: no answer from the database within 5 s", "reconnect in 0.1"])
        XCTAssertEqual(m.state, .backingOff)
        XCTAssertFalse(m.isOverdue(now: 20), "nothing in flight after the drop")
        XCTAssertEqual(render(m.received(.sync, now: 16)), [], "a late answer is ignored")
    }

    /// An answer in time leaves nothing to expire.
    func testABatchAnsweredInTimeNeverExpires() {
        var m = Machine(timeout: 5)
        _ = m.start(now: 0); _ = m.connected()
        _ = m.execute([PGQuery("a")], completion: "q", now: 0)
        XCTAssertEqual(render(m.received(.result(PGResult()), now: 1) + m.received(.endOfQuery, now: 1) + m.received(.sync, now: 1)),
                       ["complete q 1"])
        XCTAssertEqual(render(m.tick(now: 100)), [])
        XCTAssertEqual(m.state, .ready)
    }

    /// Background work with a longer deadline at the head: a caller queued behind it is
    /// answered at its own deadline, the connection stays (the server is working), and the
    /// abandoned batch's late answer completes nobody.
    func testACallerBehindALongBatchIsAnsweredAtItsDeadlineWithoutADrop() {
        var m = Machine(timeout: 5)
        _ = m.start(now: 0); _ = m.connected()
        _ = m.execute([PGQuery("prune")], completion: "retention", now: 0, timeout: 60)
        _ = m.execute([PGQuery("read")], completion: "caller", now: 1)
        XCTAssertEqual(render(m.tick(now: 6)), ["fail caller: no answer from the database within 5 s"])
        XCTAssertTrue(m.isOverdue(now: 6), "the abandoned batch is still owed")
        XCTAssertEqual(render(m.tick(now: 7)), [], "failed once")
        let done = [PipelineQueue<String>.Input.result(PGResult()), .endOfQuery, .sync, .result(PGResult()), .endOfQuery, .sync]
            .flatMap { m.received($0, now: 8) }
        XCTAssertEqual(render(done), ["complete retention 1"])
        XCTAssertFalse(m.isOverdue(now: 8))
        XCTAssertEqual(render(m.tick(now: 61)), [], "nothing left in flight")
    }

    /// The head past its own longer deadline: the server stopped answering after all.
    func testALongBatchPastItsOwnDeadlineDropsTheConnection() {
        var m = Machine(timeout: 5)
        _ = m.start(now: 0); _ = m.connected()
        _ = m.execute([PGQuery("prune")], completion: "retention", now: 0, timeout: 60)
        _ = m.execute([PGQuery("read")], completion: "caller", now: 1)
        _ = m.tick(now: 6)
        XCTAssertEqual(render(m.tick(now: 60)), ["close", "fail retention: no answer from the database within 5 s",
                                                 "lost: no answer from the database within 5 s", "reconnect in 0.1"],
                       "the caller already had its answer")
    }

    /// A connection attempt that hears nothing (a stuck server accepts the socket, then
    /// never answers the startup packet) gives up at the deadline and tries again later.
    func testAConnectAttemptPastItsDeadlineStartsOver() {
        var m = Machine(timeout: 2)
        _ = m.start(now: 0)
        XCTAssertEqual(render(m.tick(now: 1.9)), [])
        XCTAssertEqual(render(m.tick(now: 2)), ["close", "reconnect in 0.1"])
        XCTAssertEqual(render(m.reconnectDue(now: 2.1)), ["connect"])
        XCTAssertEqual(render(m.tick(now: 4.0)), [], "each attempt gets its own deadline")
        XCTAssertEqual(render(m.tick(now: 4.1)), ["close", "reconnect in 0.2"])
    }

    func testTicksDoNothingWhenIdleBackingOffOrClosed() {
        var m = Machine(timeout: 1)
        XCTAssertEqual(render(m.tick(now: 100)), [])
        _ = m.start(now: 0); _ = m.connectFailed("refused")
        XCTAssertEqual(render(m.tick(now: 100)), [])
        _ = m.close()
        XCTAssertEqual(render(m.tick(now: 200)), [])
    }
}
