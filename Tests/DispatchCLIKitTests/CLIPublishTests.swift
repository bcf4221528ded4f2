import XCTest
import DispatchCore
import DispatchCLIKit

final class CLIPublishTests: XCTestCase {
    func testRequestBodiesCarryOnlyGivenFields() {
        XCTAssertEqual(String(decoding: CLIRequestBody.start(CLIStartOptions(name: "n \"q\"")), as: UTF8.self), #"{"taskName":"n \"q\""}"#)
        XCTAssertEqual(String(decoding: CLIRequestBody.start(CLIStartOptions(activityID: "i", name: "n", symbol: "s", machine: "m",
                                                                             cancelURL: "http://c", status: "st", state: "queued", progress: 0.68)), as: UTF8.self),
                       #"{"activityId":"i","taskName":"n","systemImage":"s","machine":"m","cancelURL":"http://c","initialProgress":0.68,"status":"st","state":"queued"}"#)
        XCTAssertEqual(String(decoding: CLIRequestBody.update(CLIUpdateOptions(activityID: "a")), as: UTF8.self), "{}")
        XCTAssertEqual(String(decoding: CLIRequestBody.update(CLIUpdateOptions(activityID: "a", progress: 1, status: "s", state: "retrying")), as: UTF8.self),
                       #"{"progress":1,"status":"s","state":"retrying"}"#)
        XCTAssertEqual(String(decoding: CLIRequestBody.end(CLIEndOptions(activityID: "a", state: "error", status: "x", error: "disk full", progress: 0.5)), as: UTF8.self),
                       #"{"progress":0.5,"status":"x","state":"error","error":"disk full"}"#)
    }

    func testPercentConversion() {
        XCTAssertEqual(CLIProgress.fraction(fromPercent: 68), 0.68)
        XCTAssertEqual(CLIProgress.fraction(fromPercent: 0), 0)
        XCTAssertEqual(CLIProgress.fraction(fromPercent: 100), 1)
        XCTAssertNil(CLIProgress.fraction(fromPercent: 100.01))
        XCTAssertNil(CLIProgress.fraction(fromPercent: .nan))
        XCTAssertEqual(JSONWriter.formatNumber(CLIProgress.fraction(fromPercent: 29)!), "0.29")
    }

    func testRetryPolicyBacksOffWithinTheBudget() {
        let p = CLIRetryPolicy(budget: 3)
        XCTAssertEqual(p.delay(failures: 1, elapsed: 0), 0.1)
        XCTAssertEqual(p.delay(failures: 2, elapsed: 0.1), 0.2)
        XCTAssertEqual(p.delay(failures: 3, elapsed: 0.3), 0.4)
        XCTAssertEqual(p.delay(failures: 10, elapsed: 0.5), 2.0)     // capped
        XCTAssertEqual(p.delay(failures: 10, elapsed: 2.5), 0.5)     // last try at the deadline
        XCTAssertNil(p.delay(failures: 11, elapsed: 3.0))
        XCTAssertNil(CLIRetryPolicy(budget: 0).delay(failures: 1, elapsed: 0))
        XCTAssertEqual(p.delay(failures: 1, elapsed: 0, retryAfter: 1), 1)
        XCTAssertEqual(CLIRetryPolicy(budget: 100).delay(failures: 1, elapsed: 0, retryAfter: 3600), 10)  // bounded
        XCTAssertEqual(CLIRetryPolicy.parseRetryAfter(" 5 "), 5)
        XCTAssertNil(CLIRetryPolicy.parseRetryAfter("Wed, 21 Oct 2015 07:28:00 GMT"))
    }

    func testIdempotencyKeyFormat() {
        XCTAssertEqual(CLIIdempotencyKey.make(0, 0x0123456789abcdef), "00000000000000000123456789abcdef")
        XCTAssertEqual(CLIIdempotencyKey.make(.max, 1).count, 32)
    }
}
