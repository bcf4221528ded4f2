import DispatchIO
import XCTest

/// The loop's priorities: an event of `.background` runs only on a turn when nothing of
/// `.normal` is ready, whichever became ready first.
final class EventPriorityTests: XCTestCase {
    func testNormalWorkReadyLaterStillRunsBeforeBackgroundWorkReadyFirst() {
        let loop = EventLoop()
        var order: [String] = []
        loop.soon(.background) {
            order.append("background")
            loop.stop()
        }
        loop.soon {
            order.append("normal 1")
            // Made ready while the background event waits: it still goes first.
            loop.soon { order.append("normal 2") }
        }
        let guardTimer = loop.timer(after: 5) { loop.stop() }
        loop.run()
        guardTimer.cancel()
        XCTAssertEqual(order, ["normal 1", "normal 2", "background"])
    }

    func testUrgentWorkGoesBeforeNormalWorkThatWasReadyFirst() {
        let loop = EventLoop()
        var order: [String] = []
        loop.soon(.background) {
            order.append("background")
            loop.stop()
        }
        loop.soon(.normal) { order.append("normal") }
        loop.soon(.urgent) { order.append("urgent") }
        let guardTimer = loop.timer(after: 5) { loop.stop() }
        loop.run()
        guardTimer.cancel()
        XCTAssertEqual(order, ["urgent", "normal", "background"])
    }

    /// The APNs client's sockets and timer are urgent: a push's answer is handled before a
    /// turn's other ready work (webhooks, with their slow receivers, stay normal).
    func testTheAPNsClientIsUrgentAndTheWebhookClientIsNot() {
        XCTAssertEqual(H2Client.Options.apns().priority, .urgent)
        XCTAssertEqual(CurlClient.Options.webhooks.priority, .normal)
    }

    func testBackgroundWorkRunsInOrderOnceNothingElseIsReady() {
        let loop = EventLoop()
        var order: [Int] = []
        for i in 0..<3 {
            loop.soon(.background) {
                order.append(i)
                if order.count == 3 { loop.stop() }
            }
        }
        let guardTimer = loop.timer(after: 5) { loop.stop() }
        loop.run()
        guardTimer.cancel()
        XCTAssertEqual(order, [0, 1, 2])
    }
}

final class UrgencyGovernorTests: XCTestCase {
    func testAFloodDropsToNormalAndAQuietTurnRestoresUrgent() {
        var g = UrgencyGovernor(preferred: .urgent, floodTurn: 64)
        XCTAssertEqual(g.priority, .urgent)
        XCTAssertFalse(g.turn(completed: 10))
        XCTAssertFalse(g.turn(completed: 63))
        XCTAssertTrue(g.turn(completed: 64), "more answers in a turn than the loop drains: share turns")
        XCTAssertEqual(g.priority, .normal)
        XCTAssertFalse(g.turn(completed: 40), "still busy: stays normal")
        XCTAssertTrue(g.turn(completed: 32))
        XCTAssertEqual(g.priority, .urgent)
    }

    func testASourceThatIsNotUrgentIsNeverRaised() {
        var g = UrgencyGovernor(preferred: .normal)
        XCTAssertFalse(g.turn(completed: 0))
        XCTAssertFalse(g.turn(completed: 1000))
        XCTAssertEqual(g.priority, .normal)
    }
}
