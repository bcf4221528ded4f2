@testable import DispatchCore
import XCTest

/// APNs answers → what the outbox does next; timestamps; provider-token renewal; token input.
final class PushPolicyTests: XCTestCase {
    func testAnswerTable() {
        let table: [(APNsAnswer, PushDecision)] = [
            (.status(200, reason: nil, timestampMs: nil), .delivered),
            (.status(410, reason: "Unregistered", timestampMs: 1_700_000_000_000), .retire(invalidSinceMs: 1_700_000_000_000)),
            (.status(410, reason: "ExpiredToken", timestampMs: nil), .retire(invalidSinceMs: nil)),
            (.status(400, reason: "BadDeviceToken", timestampMs: nil), .retire(invalidSinceMs: nil)),
            (.status(400, reason: "DeviceTokenNotForTopic", timestampMs: nil), .reject),
            (.status(400, reason: "BadPriority", timestampMs: nil), .reject),
            (.status(400, reason: "InvalidPushType", timestampMs: nil), .reject),
            (.status(413, reason: "PayloadTooLarge", timestampMs: nil), .reject),
            (.status(404, reason: "BadPath", timestampMs: nil), .reject),
            (.status(403, reason: "ExpiredProviderToken", timestampMs: nil), .renewProviderToken),
            (.status(403, reason: "InvalidProviderToken", timestampMs: nil), .stopSending),
            (.status(403, reason: "MissingProviderToken", timestampMs: nil), .stopSending),
            (.status(429, reason: "TooManyRequests", timestampMs: nil), .retry(.throttled)),
            (.status(500, reason: "InternalServerError", timestampMs: nil), .retry(.serverError)),
            (.status(503, reason: "ServiceUnavailable", timestampMs: nil), .retry(.serverError)),
            (.transport(.connectionLost), .retry(.connectionError)),
            (.transport(.timeout), .retry(.connectionError)),
            (.transport(.connect), .retry(.connectionError)),
            (.transport(.invalidRequest), .reject),
            (.transport(.cancelled), .release),
        ]
        for (answer, decision) in table {
            XCTAssertEqual(PushDecision.decide(answer), decision, "\(answer)")
        }
    }

    func testErrorBodyIsParsed() {
        XCTAssertEqual(APNsAnswer.parse(status: 410, body: Array(#"{"reason":"Unregistered","timestamp":1700000000123}"#.utf8)),
                       .status(410, reason: "Unregistered", timestampMs: 1_700_000_000_123))
        XCTAssertEqual(APNsAnswer.parse(status: 500, body: Array("<html>".utf8)), .status(500, reason: nil, timestampMs: nil))
        XCTAssertEqual(APNsAnswer.parse(status: 200, body: []), .status(200, reason: nil, timestampMs: nil))
    }

    func testRetryDelays() {
        let policy = Backoff(initial: 1, maximum: 300, jitter: .equal)
        XCTAssertEqual(PushDecision.retryDelay(.connectionError, attempts: 1, policy: policy, random: 0.5), 0,
                       "a lost connection: at once, on a new one")
        XCTAssertEqual(PushDecision.retryDelay(.connectionError, attempts: 2, policy: policy, random: 0), 1)
        XCTAssertEqual(PushDecision.retryDelay(.throttled, attempts: 1, policy: policy, random: 0), 0.5)
        XCTAssertEqual(PushDecision.retryDelay(.serverError, attempts: 3, policy: policy, random: 0.999_999), 4, accuracy: 0.001)
        XCTAssertEqual(PushDecision.retryDelay(.serverError, attempts: 40, policy: policy, random: 0.999_999), 300, accuracy: 0.001)
    }

    func testTimestampsIncreaseAndPaceTheNextPush() {
        XCTAssertEqual(PushTimestamp.next(changeMs: 1_700_000_000_999, last: 0), 1_700_000_000)
        XCTAssertEqual(PushTimestamp.next(changeMs: 1_700_000_000_999, last: 1_700_000_000), 1_700_000_001, "same second: one more")
        XCTAssertEqual(PushTimestamp.next(changeMs: 1_700_000_005_000, last: 1_700_000_001), 1_700_000_005)
        // A push with timestamp T lets the next one go from second T (leading the clock by at most 1 s).
        XCTAssertEqual(PushTimestamp.nextAllowed(after: 1_700_000_001), 1_700_000_001)
    }

    func testProviderTokenRenewal() {
        let p = ProviderTokenPolicy()
        XCTAssertTrue(p.isDue(mintedAt: nil, now: 0))
        XCTAssertFalse(p.isDue(mintedAt: 1000, now: 1000 + 39 * 60))
        XCTAssertTrue(p.isDue(mintedAt: 1000, now: 1000 + 40 * 60), "renewed inside Apple's 20-60 minute window")
        XCTAssertTrue(p.isDue(mintedAt: 1000, now: 900), "the clock went back: mint again")
        XCTAssertEqual(p.onExpired(generation: 1, current: 2, mintedAt: 0, renewedForExpiry: false, now: 10), .resend)
        XCTAssertEqual(p.onExpired(generation: 2, current: 2, mintedAt: 0, renewedForExpiry: false, now: 3), .renew)
        XCTAssertEqual(p.onExpired(generation: 2, current: 2, mintedAt: 0, renewedForExpiry: true, now: 3), .backOff,
                       "renewed for expiry moments ago: do not mint one per request")
        XCTAssertEqual(p.onExpired(generation: 2, current: 2, mintedAt: 0, renewedForExpiry: true, now: 61), .renew)
    }

    // MARK: - Tokens and registrations

    func testTokenValidation() {
        let ok16 = String(repeating: "ab", count: 16)
        XCTAssertTrue(PushToken.isValid(ok16))
        XCTAssertTrue(PushToken.isValid(String(repeating: "AB", count: 256)))
        XCTAssertTrue(PushToken.isValid(String(repeating: "0f", count: 80)), "160 digits, as Live Activity tokens often are")
        XCTAssertFalse(PushToken.isValid(String(repeating: "ab", count: 15)), "15 bytes")
        XCTAssertFalse(PushToken.isValid(String(repeating: "ab", count: 257)), "257 bytes")
        XCTAssertFalse(PushToken.isValid(ok16 + "a"), "odd length")
        XCTAssertFalse(PushToken.isValid(String(repeating: "g", count: 32)))
        XCTAssertFalse(PushToken.isValid(""))
        XCTAssertFalse(PushToken.isValid(String(repeating: "ab", count: 15) + "a "))
        XCTAssertEqual(try PushToken.validate(String(repeating: "AB", count: 16), field: "t"), String(repeating: "ab", count: 16))
        XCTAssertEqual(PushToken.hint(ok16), "…abab")
    }

    func testRegistrationParsing() throws {
        let dev = String(repeating: "11", count: 32)
        let act = String(repeating: "22", count: 80)
        let r = try DeviceRegistration.parse(Array(#"{"deviceToken":"\#(dev)","pushToStartToken":null,"activityTokens":{"job-1":"\#(act.uppercased())","job-2":null}}"#.utf8))
        XCTAssertEqual(r.deviceToken, dev)
        XCTAssertEqual(r.pushToStart, .forget)
        XCTAssertEqual(r.activityTokens, [.init(activityID: "job-1", change: .set(act)), .init(activityID: "job-2", change: .forget)])
        let minimal = try DeviceRegistration.parse(Array(#"{"deviceToken":"\#(dev)"}"#.utf8))
        XCTAssertNil(minimal.pushToStart, "absent: unchanged")
        XCTAssertTrue(minimal.activityTokens.isEmpty)
    }

    func testRegistrationRefusals() {
        let dev = String(repeating: "11", count: 32)
        let cases: [(String, DispatchError.Code)] = [
            ("{}", .missingField),
            (#"{"deviceToken":12}"#, .invalidField),
            (#"{"deviceToken":"abc"}"#, .invalidField),
            (#"{"deviceToken":"\#(dev)","pushToStartToken":"zz"}"#, .invalidField),
            (#"{"deviceToken":"\#(dev)","pushToStartToken":5}"#, .invalidField),
            (#"{"deviceToken":"\#(dev)","activityTokens":[]}"#, .invalidField),
            (#"{"deviceToken":"\#(dev)","activityTokens":{"bad id":"\#(dev)"}}"#, .invalidField),
            (#"{"deviceToken":"\#(dev)","activityTokens":{"a":"short"}}"#, .invalidField),
            (#"{"deviceToken":"\#(dev)","activityTokens":{"a":true}}"#, .invalidField),
            (#"{"deviceToken":"\#(dev)","extra":1}"#, .unknownField),
            (#"{"deviceToken":"\#(dev)","activityTokens":{"a":"\#(dev)","a":null}}"#, .invalidJSON),
            ("[]", .invalidJSON),
        ]
        for (body, code) in cases {
            do {
                _ = try DeviceRegistration.parse(Array(body.utf8))
                XCTFail("accepted \(body)")
            } catch {
                XCTAssertEqual(error.code, code, body)
                XCTAssertEqual(error.httpStatus, 400, body)
            }
        }
        let many = (0...DeviceRegistration.maxActivityTokens).map { #""a\#($0)":null"# }.joined(separator: ",")
        XCTAssertThrowsError(try DeviceRegistration.parse(Array(#"{"deviceToken":"\#(dev)","activityTokens":{\#(many)}}"#.utf8)))
    }
}
