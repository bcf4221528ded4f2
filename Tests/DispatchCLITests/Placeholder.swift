import XCTest
final class PlaceholderDispatchCLITests: XCTestCase { func testNothing() {} }
