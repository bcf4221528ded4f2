import DispatchHarness
import DispatchIO
import XCTest

/// The two loop fakes shells are tested on (`ManualLoop`, `SimulatedLoop`) share one timer
/// queue: each case runs on both, and both must fire timers as libevent does.
final class LoopFakeTests: XCTestCase {
    /// What a test needs of either fake.
    struct Fake {
        let name: String
        let loop: LoopScheduling
        let advance: (Double) -> Void
    }

    func fakes() -> [Fake] {
        let manual = ManualLoop()
        let simulated = SimulatedLoop()
        return [Fake(name: "ManualLoop", loop: manual, advance: manual.advance(by:)),
                Fake(name: "SimulatedLoop", loop: simulated, advance: simulated.advance(by:))]
    }

    func testTimersFireInDueOrderAndTimersDueTogetherInTheOrderTheyWereMade() {
        for f in fakes() {
            var fired: [String] = []
            let late = f.loop.timer(after: 0.3) { fired.append("late") }
            let a = f.loop.timer(after: 0.1) { fired.append("a") }
            let b = f.loop.timer(after: 0.1) { fired.append("b") }
            f.advance(0.05)
            XCTAssertEqual(fired, [], f.name)
            f.advance(0.3)
            XCTAssertEqual(fired, ["a", "b", "late"], f.name)
            _ = (late, a, b)
        }
    }

    func testARepeatingTimerFiresEveryIntervalUntilCancelled() {
        for f in fakes() {
            var count = 0
            let t = f.loop.timer(after: 0.1, repeating: true) { count += 1 }
            f.advance(0.35)
            XCTAssertEqual(count, 3, f.name)
            t.cancel()
            f.advance(1)
            XCTAssertEqual(count, 3, f.name)
        }
    }

    func testAOneShotHoldsItselfButARepeatingTimerItsOwnerReleasedNeverFires() {
        for f in fakes() {
            var fired: [String] = []
            f.loop.timer(after: 0.1) { fired.append("one-shot") }
            do { _ = f.loop.timer(after: 0.1, repeating: true) { fired.append("released") } }
            f.advance(1)
            XCTAssertEqual(fired, ["one-shot"], f.name)
        }
    }

    func testATimerMadeByATimerIsDueFromWhenItWasMadeAndWorkItDefersRunsBeforeTheNextTimer() {
        for f in fakes() {
            var fired: [String] = []
            var held: [AnyObject] = []
            let outer = f.loop.timer(after: 0.1) {
                fired.append("outer")
                f.loop.soon { fired.append("deferred") }
                held.append(f.loop.timer(after: 0.1) { fired.append("inner") })
            }
            let other = f.loop.timer(after: 0.15) { fired.append("other") }
            f.advance(0.18)
            XCTAssertEqual(fired, ["outer", "deferred", "other"], f.name)
            f.advance(0.05)
            XCTAssertEqual(fired, ["outer", "deferred", "other", "inner"], f.name)
            _ = (outer, other, held)
        }
    }
}
