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
    }
}
