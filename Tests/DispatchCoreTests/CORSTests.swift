@testable import DispatchCore
import XCTest

/// The CORS policy: which origin gets which headers, one line per case.
final class CORSTests: XCTestCase {
    func dict(_ h: [(String, String)]) -> [String: String] { Dictionary(h, uniquingKeysWith: { $1 }) }

    func testAnswers() {
        guard case .success(let list) = CORSPolicy.parse("https://ops.example, http://localhost:3000") else { return XCTFail() }
        XCTAssertEqual(dict(list.headers(origin: "https://ops.example"))["Access-Control-Allow-Origin"], "https://ops.example")
        XCTAssertEqual(dict(list.headers(origin: "https://ops.example"))["Vary"], "Origin")
        XCTAssertNotNil(dict(list.headers(origin: "http://localhost:3000"))["Access-Control-Expose-Headers"])
        XCTAssertEqual(list.headers(origin: "https://evil.example").map(\.0), ["Vary"], "another origin: no CORS header")
        XCTAssertEqual(list.headers(origin: nil).map(\.0), ["Vary"])
        XCTAssertEqual(list.headers(origin: "https://ops.example.evil").map(\.0), ["Vary"], "exact match only")
        guard case .success(let any) = CORSPolicy.parse("*") else { return XCTFail() }
        XCTAssertEqual(dict(any.headers(origin: "https://x.example"))["Access-Control-Allow-Origin"], "*")
        XCTAssertTrue(any.headers(origin: nil).isEmpty, "no Origin: not a CORS request")
        XCTAssertTrue(CORSPolicy.none.headers(origin: "https://ops.example").isEmpty, "default: none")
    }

    func testPreflight() {
        guard case .success(let list) = CORSPolicy.parse("https://ops.example") else { return XCTFail() }
        let h = dict(list.preflightHeaders(origin: "https://ops.example", methods: [.get]))
        XCTAssertEqual(h["Access-Control-Allow-Methods"], "GET, HEAD, OPTIONS")
        XCTAssertEqual(h["Access-Control-Allow-Headers"], "Authorization, Content-Type, Idempotency-Key, Last-Event-ID")
        XCTAssertEqual(h["Access-Control-Max-Age"], "7200")
        XCTAssertNil(dict(list.preflightHeaders(origin: "https://evil.example", methods: [.post]))["Access-Control-Allow-Origin"])
    }

    func testParse() {
        for bad in ["ops.example", "https://ops.example/", "*,https://a.example", "https://", "javascript:alert(1)", "https://a b"] {
            if case .success = CORSPolicy.parse(bad) { XCTFail("accepted \(bad)") }
        }
        XCTAssertEqual(try? CORSPolicy.parse(" , ").get(), CORSPolicy.none)
    }
}
