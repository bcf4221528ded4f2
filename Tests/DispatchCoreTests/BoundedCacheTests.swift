@testable import DispatchCore
import XCTest

final class BoundedCacheTests: XCTestCase {
    func testEvictsTheOldestByBytes() {
        var c = BoundedCache<String, Int>(maxBytes: 100)
        c.set("a", 1, bytes: 40)
        c.set("b", 2, bytes: 40)
        c.set("c", 3, bytes: 40)
        XCTAssertNil(c["a"], "the oldest went")
        XCTAssertEqual(c["b"], 2)
        XCTAssertEqual(c["c"], 3)
        XCTAssertEqual(c.bytes, 80)
        c.set("big", 4, bytes: 95)
        XCTAssertEqual(c.count, 1, "a large entry pushes out everything older")
        XCTAssertEqual(c.bytes, 95)
    }

    func testReplacingAndRemovingKeepTheCountRight() {
        var c = BoundedCache<String, Int>(maxBytes: 100)
        c.set("a", 1, bytes: 30)
        c.set("a", 2, bytes: 60)
        XCTAssertEqual(c.bytes, 60)
        c.set("b", 3, bytes: 30)
        c.remove("b")
        XCTAssertEqual(c.bytes, 60)
        c.set("c", 4, bytes: 50)   // 110 > 100: "a" (oldest live) goes, not the stale first stamp of "a"
        XCTAssertNil(c["a"])
        XCTAssertEqual(c["c"], 4)
        XCTAssertEqual(c.bytes, 50)
    }

    /// Many entries of widely varying sizes never hold more than the budget.
    func testNeverAboveTheBudget() {
        var c = BoundedCache<Int, [UInt8]>(maxBytes: 10_000)
        var g = SeededGenerator(seed: 3)
        for i in 0..<50_000 {
            let size = Int.random(in: 1...2_000, using: &g)
            c.set(i % 700, [], bytes: size)
            XCTAssertLessThanOrEqual(c.bytes, 10_000)
        }
    }

    /// A few keys set over and over under the budget: nothing is evicted, and the order kept
    /// for eviction does not grow with the sets (it did: one entry per set, forever).
    func testReplacingUnderTheBudgetKeepsTheOrderBounded() {
        var c = BoundedCache<Int, Int>(maxBytes: 1 << 20)
        for i in 0..<200_000 { c.set(i % 10, i, bytes: 100) }
        XCTAssertEqual(c.count, 10)
        XCTAssertEqual(c.bytes, 1_000)
        XCTAssertLessThanOrEqual(c.orderLength, 2 * 10 + 1024 + 1)
        for k in 0..<10 { XCTAssertEqual(c[k], 199_990 + k) }
        // Eviction still takes the oldest live entry after a compaction.
        var d = BoundedCache<Int, Int>(maxBytes: 1_000)
        for i in 0..<5_000 { d.set(i % 5, i, bytes: 100) }
        d.set(99, 0, bytes: 600)
        XCTAssertNil(d[0], "the oldest live entry went first")
        XCTAssertEqual(d[4], 4_999)
        XCTAssertLessThanOrEqual(d.bytes, 1_000)
    }
}
