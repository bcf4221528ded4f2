import XCTest
@testable import DispatchCore

/// `ConnectionUpkeep`: when a connection gets an HTTP/2 PING, and when it is given up.
final class ConnectionUpkeepTests: XCTestCase {
    enum Step {
        /// A stream opened, or the last one closed.
        case busy, idle(Double)
        /// The PING's ACK arrived.
        case ack
        /// A request timed out at a time, and the action expected.
        case timedOut(Double, ConnectionUpkeep.Action)
        /// A tick at a time, and the action expected.
        case tick(Double, ConnectionUpkeep.Action)
    }

    func run(_ name: String, ping: Double = 10, answer: Double = 2, _ steps: [Step],
             file: StaticString = #filePath, line: UInt = #line) {
        var u = ConnectionUpkeep(pingInterval: ping, answerTimeout: answer, now: 0)
        for (i, step) in steps.enumerated() {
            switch step {
            case .busy: u.busy()
            case .idle(let t): u.idle(now: t)
            case .ack: u.acknowledged()
            case .timedOut(let t, let expected):
                XCTAssertEqual(u.requestTimedOut(now: t), expected, "\(name), step \(i) at \(t)", file: file, line: line)
            case .tick(let t, let expected):
                XCTAssertEqual(u.tick(now: t), expected, "\(name), step \(i) at \(t)", file: file, line: line)
            }
        }
    }

    func testTable() {
        run("no PING before the interval", [.tick(9.9, .none), .tick(10, .ping)])
        run("answered: stays open, PINGed again an interval after the last PING",
            [.tick(10, .ping), .ack, .tick(12, .none), .tick(19.9, .none), .tick(20, .ping), .ack, .tick(30, .ping), .ack,
             .tick(1000, .ping)])
        run("unanswered: closed once the answer time passed",
            [.tick(10, .ping), .tick(11.9, .none), .tick(12, .close(.unansweredPing))])
        run("a late ACK still counts before the deadline", [.tick(10, .ping), .tick(11.5, .none), .ack, .tick(12, .none)])
        run("busy: never PINGed for quiet", [.busy, .tick(10, .none), .tick(1000, .none)])
        run("idle since the last stream closed", [.busy, .idle(5), .tick(14.9, .none), .tick(15, .ping)])
        run("idle() while idle keeps the first time", [.idle(5), .tick(10, .ping)])
        run("a PING out when streams open is still awaited",
            [.tick(10, .ping), .busy, .tick(11, .none), .tick(12, .close(.unansweredPing))])
        run("busy after an answered PING: the quiet counts from the last stream",
            [.tick(10, .ping), .ack, .busy, .tick(25, .none), .idle(26), .tick(35.9, .none), .tick(36, .ping)])
        run("a timeout PINGs at once, busy or not, and closes when unanswered",
            [.busy, .timedOut(3, .ping), .tick(4, .none), .tick(5, .close(.timeout))])
        run("a timeout PING answered: the connection stays",
            [.busy, .timedOut(3, .ping), .ack, .tick(5, .none), .tick(100, .none)])
        run("a second timeout while a PING is out sends no second PING",
            [.busy, .timedOut(3, .ping), .timedOut(3.5, .none), .tick(5, .close(.timeout))])
        run("a timeout while an idle PING is out keeps the idle reason",
            [.tick(10, .ping), .timedOut(11, .none), .tick(12, .close(.unansweredPing))])
        run("no idle PING when the interval is 0", ping: 0,
            [.tick(10, .none), .tick(10_000, .none), .timedOut(10_001, .ping), .tick(10_003, .close(.timeout))])
    }

    func testTickIntervalIsAFractionOfTheShortestPeriod() {
        XCTAssertEqual(ConnectionUpkeep(pingInterval: 15, answerTimeout: 5, now: 0).tickInterval, 1)
        XCTAssertEqual(ConnectionUpkeep(pingInterval: 1, answerTimeout: 0.5, now: 0).tickInterval, 0.125)
        XCTAssertEqual(ConnectionUpkeep(pingInterval: 0, answerTimeout: 2, now: 0).tickInterval, 0.5)
    }
}
