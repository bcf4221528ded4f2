import XCTest
final class PlaceholderBench: XCTestCase { func testNothing() {} }
