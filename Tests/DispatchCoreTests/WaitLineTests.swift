import XCTest
@testable import DispatchCore

final class WaitLineTests: XCTestCase {
    /// First in, first out, across the drops of what was taken, in a line that never empties.
    func testTakesInOrderAndDropsWhatWasTakenInALineThatNeverEmpties() {
        var line = WaitLine<Int>()
        XCTAssertNil(line.takeFirst())
        var next = 0, expected = 0
        for _ in 0..<500 {
            for _ in 0..<3 { line.append(next); next += 1 }
            for _ in 0..<2 {
                XCTAssertEqual(line.takeFirst(), expected)
                expected += 1
            }
            XCTAssertLessThanOrEqual(line.taken, max(64, line.count), "taken elements are not kept for good")
        }
        XCTAssertEqual(line.count, 500)
        while let e = line.takeFirst() {
            XCTAssertEqual(e, expected)
            expected += 1
        }
        XCTAssertTrue(line.isEmpty)
        XCTAssertEqual(expected, 1_500)
    }
}
