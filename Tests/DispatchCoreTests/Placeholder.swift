import XCTest
final class PlaceholderDispatchCoreTests: XCTestCase { func testNothing() {} }
