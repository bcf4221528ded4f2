import XCTest
final class PlaceholderDispatchServerTests: XCTestCase { func testNothing() {} }
