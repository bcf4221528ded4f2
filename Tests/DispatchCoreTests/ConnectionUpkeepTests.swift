import XCTest
@testable import DispatchCore

/// `ConnectionUpkeep`: when idle connections get a PING, and when they are replaced.
final class ConnectionUpkeepTests: XCTestCase {
    enum Step {
        /// A request started, or the last one finished.
        case busy, idle(Double)
        /// A tick at a time with each socket's waiting bytes, and the action expected.
        case tick(Double, [Int32: Int], ConnectionUpkeep.Action)
        case replaced(Double)
    }

    func run(_ name: String, ping: Double = 10, answer: Double = 2, maxIdle: Double = 600, _ steps: [Step],
             file: StaticString = #filePath, line: UInt = #line) {
        var u = ConnectionUpkeep(pingInterval: ping, answerTimeout: answer, maxIdle: maxIdle, now: 0)
        for (i, step) in steps.enumerated() {
            switch step {
            case .busy: u.busy()
            case .idle(let t): u.idle(now: t)
            case .replaced(let t): u.replaced(now: t)
            case .tick(let t, let pending, let expected):
                XCTAssertEqual(u.tick(now: t, pending: pending), expected, "\(name), step \(i) at \(t)", file: file, line: line)
            }
        }
    }

    func testTable() {
        let one: [Int32: Int] = [7: 0]
        run("no PING before the interval", [.tick(9.9, one, .none), .tick(10, one, .ping)])
        run("no connection, nothing to PING", [.tick(10, [:], .none), .tick(700, [:], .none)])
        run("answered: bytes arrived, PING again an interval later",
            [.tick(10, one, .ping), .tick(10.5, [7: 17], .none), .tick(19.9, [7: 17], .none), .tick(20, [7: 17], .ping),
             .tick(21, [7: 34], .none), .tick(30, [7: 34], .ping)])
        run("unanswered: replaced once the answer time passed",
            [.tick(10, one, .ping), .tick(11.9, one, .none), .tick(12, one, .replace(.unansweredPing)), .tick(13, one, .none)])
        run("an old answer still waiting does not count for a new PING",
            [.tick(10, one, .ping), .tick(11, [7: 17], .none), .tick(20, [7: 17], .ping), .tick(22, [7: 17], .replace(.unansweredPing))])
        run("one of two connections silent: replaced",
            [.tick(10, [3: 0, 4: 0], .ping), .tick(12, [3: 17, 4: 0], .replace(.unansweredPing))])
        run("the silent connection closed meanwhile: nothing to wait for",
            [.tick(10, [3: 0, 4: 0], .ping), .tick(12, [3: 17], .none)])
        run("a request meanwhile forgets the PING; the next one waits a full interval of quiet",
            [.tick(10, one, .ping), .busy, .tick(13, one, .none), .idle(14), .tick(23.9, one, .none), .tick(24, one, .ping)])
        run("busy: never PINGed", [.busy, .tick(10, one, .none), .tick(1000, one, .none)])
        run("idle since a request finished", [.busy, .idle(5), .tick(14.9, one, .none), .tick(15, one, .ping)])
        run("idle() while idle keeps the first time", [.idle(5), .tick(10, one, .ping)])
        run("safety net: replaced after maxIdle although every PING was answered", ping: 10, maxIdle: 25,
            [.tick(10, one, .ping), .tick(11, [7: 17], .none), .tick(20, [7: 17], .ping), .tick(21, [7: 34], .none),
             .tick(25, [7: 34], .replace(.idle)), .tick(26, [:], .none)])
        run("no PING (old libcurl): replaced after maxIdle", ping: 0, maxIdle: 15,
            [.tick(10, one, .none), .tick(14.9, one, .none), .tick(15, one, .replace(.idle)), .tick(29, one, .none), .tick(30, one, .replace(.idle))])
        run("replaced by the shell (a timeout): no answer awaited, the quiet counts anew",
            [.tick(10, one, .ping), .replaced(11), .tick(13, one, .none), .tick(20.9, one, .none), .tick(21, one, .ping)])
    }

    func testTickIntervalIsAFractionOfTheShortestPeriod() {
        XCTAssertEqual(ConnectionUpkeep(pingInterval: 15, answerTimeout: 5, maxIdle: 600, now: 0).tickInterval, 1)
        XCTAssertEqual(ConnectionUpkeep(pingInterval: 1, answerTimeout: 0.5, maxIdle: 600, now: 0).tickInterval, 0.125)
        XCTAssertEqual(ConnectionUpkeep(pingInterval: 0, answerTimeout: 5, maxIdle: 2, now: 0).tickInterval, 0.5)
    }
}
