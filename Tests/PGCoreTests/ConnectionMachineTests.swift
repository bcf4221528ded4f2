@testable import PGCore
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
        XCTAssertEqual(render(m.start()), ["connect"])
        XCTAssertEqual(render(m.execute([PGQuery("x")], completion: "early", now: 0)), ["fail early: the database connection is not ready"])
        XCTAssertEqual(render(m.connected()), ["ready"])
        XCTAssertTrue(m.isReady)
        XCTAssertEqual(render(m.execute([PGQuery("x")], completion: "q", now: 0)), ["send 2"])
        XCTAssertEqual(render(m.received(.result(PGResult()), now: 0) + m.received(.endOfQuery, now: 0) + m.received(.sync, now: 0)),
                       ["complete q 1"])
    }

    func testFailedConnectsBackOffExponentiallyAndResetAfterSuccess() {
        var m = Machine(backoff: Backoff(initial: 0.1, maximum: 0.4))
        _ = m.start()
        XCTAssertEqual(render(m.connectFailed("refused")), ["close", "reconnect in 0.1"])
        XCTAssertEqual(render(m.reconnectDue()), ["connect"])
        XCTAssertEqual(render(m.connectFailed("refused")), ["close", "reconnect in 0.2"])
        _ = m.reconnectDue()
        XCTAssertEqual(render(m.connectFailed("refused")), ["close", "reconnect in 0.4"])
        _ = m.reconnectDue()
        XCTAssertEqual(render(m.connectFailed("refused")), ["close", "reconnect in 0.4"], "capped")
        _ = m.reconnectDue()
        _ = m.connected()
        XCTAssertEqual(render(m.connectionLost("reset")), ["close", "lost: reset", "reconnect in 0.1"], "reset after a success")
    }

    /// A lost connection mid-batch: the socket is closed first, then every query in flight
    /// fails in order, then the owner hears of the loss, then a reconnect is scheduled.
    func testALostConnectionMidBatch() {
        var m = Machine()
        _ = m.start(); _ = m.connected()
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
        _ = m.start(); _ = m.connected()
        _ = m.execute([PGQuery("a")], completion: "q", now: 0)
        let actions = render(m.received(.sync, now: 0))
        XCTAssertEqual(actions.first, "close")
        XCTAssertEqual(actions.dropFirst().first?.hasPrefix("fail q: protocol violation"), true, "\(actions)")
        XCTAssertEqual(m.state, .backingOff)
    }

    func testCloseFailsWhatIsInFlightAndStopsReconnecting() {
        var m = Machine()
        _ = m.start(); _ = m.connected()
        _ = m.execute([PGQuery("a")], completion: "q", now: 0)
        XCTAssertEqual(render(m.close()), ["close", "fail q: the database connection was closed"])
        XCTAssertEqual(render(m.reconnectDue()), [])
        XCTAssertEqual(render(m.connectionLost("x")), [])
        XCTAssertEqual(render(m.execute([PGQuery("a")], completion: "late", now: 0)), ["fail late: the database connection is not ready"])
    }

    func testCloseWhileBackingOffHasNothingToClose() {
        var m = Machine()
        _ = m.start()
        _ = m.connectFailed("refused")
        XCTAssertEqual(render(m.close()), [])
        XCTAssertEqual(m.state, .closed)
    }
}
