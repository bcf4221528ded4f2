@testable import DispatchCore
import XCTest

/// Contract §6's pure decisions: who may read, who may follow an activity, what an answer to
/// a key that may not read carries.
final class KeyRulesTests: XCTestCase {
    func testWhoMayRead() {
        XCTAssertTrue(KeyRules.mayRead([.read]))
        XCTAssertTrue(KeyRules.mayRead([.publish]))
        XCTAssertTrue(KeyRules.mayRead([.admin]))
        XCTAssertTrue(KeyRules.mayRead([.device, .read]))
        XCTAssertFalse(KeyRules.mayRead([.device]))
        XCTAssertFalse(KeyRules.mayRead([]))
    }

    func testAnActivityTokenNeedsRead() {
        let device = String(repeating: "ab", count: 32), t = String(repeating: "cd", count: 32)
        let follows = DeviceRegistration(deviceToken: device, activityTokens: [.init(activityID: "job", change: .set(t))])
        let forgets = DeviceRegistration(deviceToken: device, activityTokens: [.init(activityID: "job", change: .forget)])
        let startOnly = DeviceRegistration(deviceToken: device, pushToStart: .set(t))
        XCTAssertEqual(KeyRules.registrationRefusal(follows, mayRead: false)?.code, .forbidden)
        XCTAssertEqual(KeyRules.registrationRefusal(follows, mayRead: false)?.httpStatus, 403)
        XCTAssertNil(KeyRules.registrationRefusal(follows, mayRead: true))
        XCTAssertNil(KeyRules.registrationRefusal(forgets, mayRead: false), "forgetting follows nothing")
        XCTAssertNil(KeyRules.registrationRefusal(startOnly, mayRead: false))
        let mixed = DeviceRegistration(deviceToken: device, activityTokens: [.init(activityID: "a", change: .forget),
                                                                             .init(activityID: "b", change: .set(t))])
        XCTAssertNotNil(KeyRules.registrationRefusal(mixed, mayRead: false))
    }

    func testNoSnapshotToAKeyThatMayNotRead() {
        let a = Activity(activityId: "job", taskName: "Secret", cancelURL: "https://hooks.example/x", state: .completed,
                         progress: nil, status: nil, attempt: 1, seq: 2, createdAt: 1, updatedAt: 2)
        let conflict = DispatchError(.alreadyFinished, "activity job has already finished", snapshot: a)
        XCTAssertEqual(KeyRules.visible(conflict, mayRead: true), conflict)
        let hidden = KeyRules.visible(conflict, mayRead: false)
        XCTAssertNil(hidden.snapshot)
        XCTAssertEqual(hidden.code, .alreadyFinished)
        XCTAssertFalse(String(decoding: hidden.jsonBody(), as: UTF8.self).contains("hooks.example"))
        let accepted = String(decoding: KeyRules.cancelAccepted(activityID: "job"), as: UTF8.self)
        XCTAssertEqual(try JSONParser.parse(Array(accepted.utf8)), .object([("activityId", .string("job")), ("cancelRequested", .bool(true))]))
    }

    func testLimitAnswersAre429WithTheirCodes() {
        XCTAssertEqual(KeyRules.tooManyLive(max: 3).httpStatus, 429)
        XCTAssertEqual(KeyRules.tooManyLive(max: 3).code.rawValue, "too_many_live_activities")
        XCTAssertEqual(KeyRules.tooManyDevices(max: 3).httpStatus, 429)
        XCTAssertEqual(KeyRules.tooManyDevices(max: 3).code.rawValue, "too_many_devices")
        let finished = KeyRules.tooManyFinished(max: 3, freeAtMs: 0, now: 1)
        XCTAssertEqual(finished.httpStatus, 429)
        XCTAssertEqual(finished.code.rawValue, "too_many_finished_activities")
        XCTAssertNotNil(finished.retryAfterSeconds)
    }

    /// Retry-After for the finished limit: until the oldest counted end leaves the 24 h window,
    /// rounded up, at least 1 s and at most the window.
    func testFinishedRetryAfterTable() {
        let w = KeyRules.finishedWindowMs, now: Int64 = 10 * w
        let table: [(Int64?, Int, String)] = [
            (now - w + 90_500, 91, "90.5 s left: 91"),
            (now - w + 1_000, 1, "one second left"),
            (now, 86_400, "ended now: the whole window"),
            (now - w, 1, "already out of the window (a racing end): at least 1"),
            (now - 2 * w, 1, "long gone"),
            (now + 5_000, 86_400, "a clock step back: never more than the window"),
            (nil, 1, "nothing counted"),
        ]
        for (freeAt, want, why) in table {
            XCTAssertEqual(KeyRules.finishedRetryAfter(freeAtMs: freeAt, now: now), want, why)
        }
    }
}
