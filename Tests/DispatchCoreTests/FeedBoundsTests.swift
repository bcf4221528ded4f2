import XCTest
@testable import DispatchCore

/// A change of a chosen size, for the byte bounds.
struct SizedChange: FeedChange {
    let position: Int64
    let machine: String? = nil
    let isTerminal = false
    let byteCount: Int
}

/// The feed's byte bounds, its far-behind rule and the page sizing (issue 24, findings 3 and 11).
final class FeedBoundsTests: XCTestCase {
    func testTheCatchUpQueueIsBoundedInBytesNotOnlyInChanges() {
        var feed = FeedHub<Int, SizedChange>(maxPending: 100_000, maxPendingBytes: 9_500)
        _ = feed.subscribe(1, filter: FeedFilter(), lastEventID: nil)
        _ = feed.initialLoaded(1, [], through: 1, complete: true)
        guard case .readChanges? = feed.notifiedWithoutData(position: 2).first else { return XCTFail() }
        // Nine changes of 1,000 bytes wait for the read: under the bound.
        for p in 3...11 { XCTAssertTrue(feed.notified(SizedChange(position: Int64(p), byteCount: 1000)).isEmpty) }
        XCTAssertEqual(feed.pendingBytes, 9 * 1000)
        // The tenth passes 9,500 bytes with only ten changes queued: every stream reconnects.
        let r = feed.notified(SizedChange(position: 12, byteCount: 1000))
        guard case .drop(1, .tooFarBehind)? = r.first else { return XCTFail("\(r)") }
        XCTAssertFalse(feed.isResyncing)
        XCTAssertEqual(feed.pendingBytes, 0)
    }

    func testTheCatchUpQueueIsEmptiedWhenTheReadCatchesUp() {
        var feed = FeedHub<Int, SizedChange>(maxPendingBytes: 10_000)
        _ = feed.subscribe(1, filter: FeedFilter(), lastEventID: nil)
        _ = feed.initialLoaded(1, [], through: 1, complete: true)
        guard case .readChanges(_, let g)? = feed.notifiedWithoutData(position: 2).first else { return XCTFail() }
        _ = feed.notified(SizedChange(position: 3, byteCount: 6000))
        let done = feed.changesLoaded(generation: g, [SizedChange(position: 2, byteCount: 10)], complete: true)
        XCTAssertEqual(done.count, 2, "2 read, then 3 from the queue")
        XCTAssertEqual(feed.pendingBytes, 0)
        // A second resync starts from an empty queue: 6,000 more bytes fit.
        guard case .readChanges? = feed.notifiedWithoutData(position: 4).first else { return XCTFail() }
        XCTAssertTrue(feed.notified(SizedChange(position: 5, byteCount: 6000)).isEmpty)
    }

    func testAReadingSubscriberIsBoundedInBytes() {
        var feed = FeedHub<Int, SizedChange>(maxBuffered: 4096, maxBufferedBytes: 5000)
        _ = feed.subscribe(1, filter: FeedFilter(), lastEventID: nil)
        // Another filter, so that it reads (and goes live) by itself.
        _ = feed.subscribe(2, filter: FeedFilter(state: .active), lastEventID: nil)
        _ = feed.initialLoaded(2, [], through: 0, complete: true)
        for p in 1...5 { XCTAssertTrue(feed.notified(SizedChange(position: Int64(p), byteCount: 1000)).filter(isDrop).isEmpty) }
        let r = feed.notified(SizedChange(position: 6, byteCount: 1000))
        XCTAssertEqual(r.filter(isDrop).count, 1)
        XCTAssertFalse(feed.isSubscribed(1))
        XCTAssertTrue(feed.isLive(2), "the live stream is not concerned")
    }

    func isDrop(_ a: FeedHub<Int, SizedChange>.Action) -> Bool {
        if case .drop = a { return true }
        return false
    }

    func testFarBehindRule() {
        // Within the floor: always a replay, and the activities were not even counted.
        XCTAssertFalse(FeedResume.tooFarBehind(after: 0, newest: FeedResume.replayFloor, activities: nil))
        XCTAssertFalse(FeedResume.tooFarBehind(after: 0, newest: FeedResume.replayFloor, activities: 1))
        // Past it: a replay of more changes than the initial set has activities starts over.
        XCTAssertTrue(FeedResume.tooFarBehind(after: 0, newest: 50_000, activities: 40_000))
        XCTAssertFalse(FeedResume.tooFarBehind(after: 0, newest: 50_000, activities: 60_000))
        XCTAssertFalse(FeedResume.tooFarBehind(after: 0, newest: 50_000, activities: nil), "not counted: replay")
    }

    func testPagesAskForAboutWhatTheirBudgetSends() {
        var sizer = PageSizer(maxRows: 1000, initialRowBytes: 512)
        XCTAssertEqual(sizer.rows(forBudget: 16 * 1024), 41, "32 rows fit; a quarter more and one")
        for _ in 0..<20 { sizer.observe(rows: 50, bytes: 50 * 700) }
        XCTAssertEqual(sizer.averageRowBytes, 700, accuracy: 1)
        XCTAssertEqual(sizer.rows(forBudget: 64 * 1024), 119)
        XCTAssertEqual(sizer.rows(forBudget: 1), 2, "at least the row that overflows")
        sizer.observe(rows: 0, bytes: 0)
        XCTAssertEqual(sizer.averageRowBytes, 700, accuracy: 1, "an empty page teaches nothing")
        for _ in 0..<40 { sizer.observe(rows: 10, bytes: 10) }
        XCTAssertEqual(sizer.rows(forBudget: 1 << 20), 1000, "never above the row cap")
    }

    func testTheBudgetCutsAfterTheRowThatReachesIt() {
        XCTAssertEqual(PageSizer.fitting([], budget: 10), 0)
        XCTAssertEqual(PageSizer.fitting([50], budget: 10), 1, "the first row always comes")
        XCTAssertEqual(PageSizer.fitting([4, 4, 4, 4], budget: 10), 3, "the third starts at 8, below 10")
        XCTAssertEqual(PageSizer.fitting([5, 5, 5], budget: 10), 2)
    }
}
