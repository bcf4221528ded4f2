@testable import DispatchCore
import XCTest

/// One stream's outgoing queue, driven with a pretend socket backlog.
final class StreamOutboxTests: XCTestCase {
    func outbox() -> StreamOutbox<String> { StreamOutbox(maxBacklog: 1000, lowWater: 100, pageBudget: 300) }

    func testALiveEventGoesStraightOutWhenNothingWaits() {
        var o = outbox()
        guard case .writeNow("a") = o.offer("a", size: 10, socketBacklog: 0, live: true) else { return XCTFail() }
        XCTAssertTrue(o.isEmpty)
    }

    func testEventsQueueBehindASlowSocketAndLeaveInOrderAsItDrains() {
        var o = outbox()
        guard case .queued = o.offer("a", size: 10, socketBacklog: 150, live: true) else { return XCTFail("socket above low water") }
        guard case .queued = o.offer("b", size: 10, socketBacklog: 0, live: true) else { return XCTFail("something waits: keep order") }
        XCTAssertEqual(o.queuedBytes, 20)
        XCTAssertNil(o.next(socketBacklog: 150), "the socket must drain first")
        XCTAssertEqual(o.next(socketBacklog: 50), "a")
        XCTAssertEqual(o.next(socketBacklog: 60), "b")
        XCTAssertNil(o.next(socketBacklog: 0))
        XCTAssertEqual(o.queuedBytes, 0)
    }

    /// A reader that stopped reading: live events past the cap cut it off.
    func testLiveEventsPastTheCapAreRefused() {
        var o = outbox()
        var offered = 0
        while case .queued = o.offer("e", size: 100, socketBacklog: 500, live: true) { offered += 1 }
        XCTAssertEqual(offered, 5, "500 in the socket + 5 x 100 queued reaches the 1000-byte cap")
        guard case .overCap = o.offer("e", size: 100, socketBacklog: 500, live: true) else { return XCTFail() }
    }

    /// A replay is paced: the next page is wanted only once the queue drained below low water.
    func testReplayPagesAreAskedForOnlyWhenDrained() {
        var o = outbox()
        XCTAssertTrue(o.wantsMore(socketBacklog: 0))
        o.enqueue([("p1", 150), ("p2", 150)])
        XCTAssertFalse(o.wantsMore(socketBacklog: 0), "a page is waiting")
        XCTAssertEqual(o.next(socketBacklog: 0), "p1")
        XCTAssertFalse(o.wantsMore(socketBacklog: 90), "90 in the socket + 150 queued")
        XCTAssertEqual(o.next(socketBacklog: 90), "p2")
        XCTAssertFalse(o.wantsMore(socketBacklog: 150))
        XCTAssertTrue(o.wantsMore(socketBacklog: 99))
    }

    /// A replay page is accepted whatever its size (it was asked for), and never trips the cap.
    func testAReplayPageIsNeverRefused() {
        var o = outbox()
        o.enqueue([("big", 5000)])
        XCTAssertEqual(o.queuedBytes, 5000)
        XCTAssertEqual(o.next(socketBacklog: 0), "big")
    }

    func testFinishWhenDrained() {
        var o = outbox()
        XCTAssertTrue(o.finishWhenDrained(), "nothing queued: finished at once")
        o = outbox()
        o.enqueue([("last", 10)])
        XCTAssertFalse(o.finishWhenDrained())
        XCTAssertFalse(o.isFinished)
        XCTAssertFalse(o.wantsMore(socketBacklog: 0), "an ending stream reads no more history")
        XCTAssertEqual(o.next(socketBacklog: 0), "last")
        XCTAssertTrue(o.isFinished)
    }
}
