import DispatchIO
import XCTest

/// Timers on the real libevent loop.
final class EventLoopTimerTests: XCTestCase {
    /// A deadline computed as `until - now` is just past when the clock moved between the check
    /// and the subtraction: the timer is due at once. Such a timer once never fired (a negative
    /// interval was taken for "no timeout"), and a feed's paced queue waited on it for good: the
    /// rare feed stall of round 4's hunt.
    func testATimerWhoseDeadlineIsAlreadyPastFiresOnTheNextTurn() {
        let loop = EventLoop()
        var fired: [String] = []
        loop.timer(after: -0.000_001) { fired.append("just past") }
        loop.timer(after: -5) { fired.append("long past") }
        loop.timer(after: 0) { fired.append("now") }
        let stop = loop.timer(after: 0.2) { loop.stop() }
        loop.run()
        stop.cancel()
        XCTAssertEqual(fired.sorted(), ["just past", "long past", "now"])
    }

    func testACancelledTimerNeverFires() {
        let loop = EventLoop()
        var fired = false
        let t = loop.timer(after: 0.01) { fired = true }
        t.cancel()
        t.cancel()
        let stop = loop.timer(after: 0.1) { loop.stop() }
        loop.run()
        stop.cancel()
        XCTAssertFalse(fired)
    }
}
