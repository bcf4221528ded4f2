import DispatchCore
import XCTest

final class BulkPacerTests: XCTestCase {
    func testShortTurnsAddUpBeforeARestBegins() {
        var p = BulkPacer(bytesPerTurn: 1000, restPerBusy: 2, minimumRest: 0.002)
        p.sent(busy: 0.0008, now: 10)
        XCTAssertFalse(p.isResting(now: 10))
        p.sent(busy: 0.0008, now: 10.001)
        XCTAssertFalse(p.isResting(now: 10.001), "1.6 ms is under the minimum rest")
        p.sent(busy: 0.0008, now: 10.002)
        XCTAssertTrue(p.isResting(now: 10.002))
        XCTAssertEqual(p.restUntil, 10.002 + 0.0024 * 2, accuracy: 1e-9, "twice the 2.4 ms sent")
        XCTAssertEqual(p.busyUnrested, 0)
        XCTAssertFalse(p.isResting(now: 10.0069))
    }

    func testALongTurnRestsInProportionAtOnce() {
        var p = BulkPacer(bytesPerTurn: 1000, restPerBusy: 1.5, minimumRest: 0.002)
        p.sent(busy: 0.010, now: 5)
        XCTAssertEqual(p.restUntil, 5.015, accuracy: 1e-9)
        XCTAssertTrue(p.isResting(now: 5.0149))
        XCTAssertFalse(p.isResting(now: 5.015))
    }

    func testARestIsBoundedSoALiveChangeNeverWaitsLong() {
        var p = BulkPacer(bytesPerTurn: 1000, restPerBusy: 2, minimumRest: 0.002, maximumRest: 0.05)
        p.sent(busy: 0.2, now: 1)
        XCTAssertEqual(p.restUntil, 1.05, accuracy: 1e-9, "a turn that waited for a CPU does not buy a long rest")
    }

    func testNoRestWithoutARatioAndNoCreditForTimeGoingBackwards() {
        var free = BulkPacer(bytesPerTurn: 1000, restPerBusy: 0, minimumRest: 0.002)
        free.sent(busy: 1, now: 1)
        XCTAssertFalse(free.isResting(now: 1))
        var p = BulkPacer(bytesPerTurn: 0, restPerBusy: 2, minimumRest: 0.002)
        XCTAssertEqual(p.bytesPerTurn, 1, "a slice always sends something")
        p.sent(busy: -5, now: 1)
        XCTAssertEqual(p.busyUnrested, 0)
        XCTAssertFalse(p.isResting(now: 1))
    }
}
