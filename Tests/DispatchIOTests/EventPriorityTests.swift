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
        XCTAssertEqual(CurlClient.Options.apns().priority, .urgent)
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
