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
}
