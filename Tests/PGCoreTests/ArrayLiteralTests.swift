import XCTest
import PGCore

final class ArrayLiteralTests: XCTestCase {
    func testTextElementsAreQuotedEscapedAndNullable() {
        XCTAssertEqual(PGArray.text([]), "{}")
        XCTAssertEqual(PGArray.text(["a", nil, ""]), #"{"a",NULL,""}"#)
        XCTAssertEqual(PGArray.text([#"say "hi""#, #"C:\dir"#, "NULL", "a,b}{"]), #"{"say \"hi\"","C:\\dir","NULL","a,b}{"}"#)
        XCTAssertEqual(PGArray.text(["é✓", "line\nbreak"]), "{\"é✓\",\"line\nbreak\"}")
    }

    func testNumbers() {
        XCTAssertEqual(PGArray.numbers([]), "{}")
        XCTAssertEqual(PGArray.numbers([1, nil, -9_223_372_036_854_775_808]), "{1,NULL,-9223372036854775808}")
    }
}
