@testable import DispatchCore
import XCTest

/// The Live Activity payload builder (contract §5.2): exactly the contract's keys per event,
/// Unix seconds, and never more than 4096 bytes.
final class PushPayloadTests: XCTestCase {
    static let t0: Int64 = 1_796_070_000_123

    func activity(_ state: ActivityState = .processing, status: String? = "Downloading at 18.4 MB/s (68%)",
                  taskName: String = "Debian 13 Trixie ISO", error: String? = nil) -> Activity {
        Activity(activityId: "TEST-RTORRENT-01", taskName: taskName, systemImage: "arrow.down.circle.fill", machine: "shodan",
                 state: state, progress: 0.68, status: status, attempt: 1, seq: 5, liveActivity: true,
                 createdAt: Self.t0 - 60_000, updatedAt: Self.t0, endedAt: state.isTerminal ? Self.t0 : nil, error: error)
    }

    func aps(_ payload: [UInt8], file: StaticString = #filePath, line: UInt = #line) -> JSONValue {
        guard let v = try? JSONParser.parse(payload), let aps = v["aps"] else {
            XCTFail("not JSON with aps: \(text(payload))", file: file, line: line)
            return .null
        }
        if case .object(let top) = v { XCTAssertEqual(top.map(\.0), ["aps"], file: file, line: line) }
        return aps
    }

    func keys(_ v: JSONValue?) -> [String] {
        guard case .object(let members)? = v else { return [] }
        return members.map(\.0)
    }

    func testUpdateHasExactlyTheContentStateKeys() {
        let a = aps(LiveActivityPayload.build(activity(), event: .update, timestamp: 1_796_070_001))
        XCTAssertEqual(keys(a), ["timestamp", "event", "content-state"])
        XCTAssertEqual(a["timestamp"], .number(1_796_070_001))
        XCTAssertEqual(a["event"], .string("update"))
        XCTAssertEqual(keys(a["content-state"]), ["state", "progress", "status", "attempt", "seq", "updatedAt", "cancelRequested"])
        XCTAssertEqual(a["content-state"]?["updatedAt"], .number(1_796_070_000), "Unix seconds, whole")
        XCTAssertEqual(a["content-state"]?["progress"], .number(0.68))
        XCTAssertEqual(a["content-state"]?["seq"], .number(5))
    }

    func testNullProgressAndStatusStayAsNull() {
        var x = activity(status: nil)
        x.progress = nil
        let cs = aps(LiveActivityPayload.build(x, event: .update, timestamp: 1))["content-state"]
        XCTAssertEqual(cs?["progress"], .null)
        XCTAssertEqual(cs?["status"], .null)
    }

    func testStartCarriesAttributesTypeAttributesAndAlert() {
        let a = aps(LiveActivityPayload.build(activity(), event: .start, timestamp: 7))
        XCTAssertEqual(keys(a), ["timestamp", "event", "content-state", "attributes-type", "attributes", "alert", "input-push-token"])
        XCTAssertEqual(a["input-push-token"], .number(1), "iOS 18: the started Live Activity gets its update token at once")
        XCTAssertEqual(a["attributes-type"], .string("DispatchAttributes"))
        XCTAssertEqual(keys(a["attributes"]), ["activityId", "taskName", "machine", "systemImage"])
        XCTAssertEqual(a["attributes"]?["machine"], .string("shodan"))
        XCTAssertEqual(a["alert"]?["title"], .string("Debian 13 Trixie ISO"))
        XCTAssertEqual(a["alert"]?["body"], .string("Downloading at 18.4 MB/s (68%)"))
    }

    func testStartWithoutMachineOrSymbolKeepsTheKeysAsNull() {
        var x = activity(status: nil)
        x.machine = nil
        x.systemImage = nil
        let a = aps(LiveActivityPayload.build(x, event: .start, timestamp: 7))
        XCTAssertEqual(a["attributes"]?["machine"], .null)
        XCTAssertEqual(a["attributes"]?["systemImage"], .null)
        XCTAssertEqual(a["alert"]?["body"], .string("In progress"), "no status: the state says it")
    }

    /// The table of §5.2: which keys go with which end.
    func testEndCarriesDismissalDateAndAnAlertOnlyForFailures() {
        let cases: [(ActivityState, Bool)] = [(.completed, false), (.cancelled, false), (.error, true), (.rejected, true)]
        for (state, alert) in cases {
            let a = aps(LiveActivityPayload.build(activity(state, error: state == .error ? "disk full" : nil), event: .end,
                                                  timestamp: 9, dismissalDelaySeconds: 4 * 3600))
            XCTAssertEqual(a["event"], .string("end"), "\(state)")
            XCTAssertEqual(a["dismissal-date"], .number(1_796_070_000 + 14_400), "\(state): end + 4 h")
            XCTAssertEqual(a["alert"] != nil, alert, "\(state)")
            XCTAssertNil(a["attributes"], "\(state)")
            XCTAssertNil(a["attributes-type"], "\(state)")
        }
        let failed = aps(LiveActivityPayload.build(activity(.error, error: "disk full"), event: .end, timestamp: 9))
        XCTAssertEqual(failed["alert"]?["body"], .string("disk full"), "the error says why")
    }

    /// §5.2/§5.5: a broadcast start names its channel instead of asking for a token; only
    /// updates carry the stale deadline; the stale deadline follows the last change or touch.
    func testInputPushChannelAndStaleDate() {
        let extras = LiveActivityPayload.Extras(staleDate: 1_796_070_900, channelID: "Y2hhbm5lbA==")
        let start = aps(LiveActivityPayload.build(activity(), event: .start, timestamp: 7, extras: extras))
        XCTAssertEqual(start["input-push-channel"], .string("Y2hhbm5lbA=="))
        XCTAssertNil(start["input-push-token"])
        XCTAssertEqual(start["stale-date"], .number(1_796_070_900), "a start carries the stale-date too (issue 37)")
        let update = aps(LiveActivityPayload.build(activity(), event: .update, timestamp: 8, extras: extras))
        XCTAssertEqual(keys(update), ["timestamp", "event", "content-state", "stale-date"])
        XCTAssertEqual(update["stale-date"], .number(1_796_070_900))
        let end = aps(LiveActivityPayload.build(activity(.completed), event: .end, timestamp: 9, extras: extras))
        XCTAssertNil(end["stale-date"])
        XCTAssertNil(end["input-push-channel"])
        XCTAssertEqual(LiveActivityPayload.staleDeadline(activity(), staleAfterSeconds: 600, touchedMs: 0), Self.t0 + 600_000)
        XCTAssertEqual(LiveActivityPayload.staleDeadline(activity(), staleAfterSeconds: 600, touchedMs: Self.t0 + 5000), Self.t0 + 605_000)
        XCTAssertNil(LiveActivityPayload.staleDeadline(activity(), staleAfterSeconds: 0, touchedMs: 0))
        XCTAssertNil(LiveActivityPayload.staleDeadline(activity(.completed), staleAfterSeconds: 600, touchedMs: 0))
        guard case .send(let body, _, _, _) = PushPlan.make(kind: .update, snapshot: activity(), hasToken: true, lastTimestamp: 0, priority: 5,
                                                            dismissalDelaySeconds: 0, staleDeadlineMs: Self.t0 + 600_000) else {
            return XCTFail("no push")
        }
        XCTAssertEqual(aps(body)["stale-date"], .number(1_796_070_600))
    }

    func testDismissalDelayIsConfigurable() {
        let a = aps(LiveActivityPayload.build(activity(.completed), event: .end, timestamp: 9, dismissalDelaySeconds: 0))
        XCTAssertEqual(a["dismissal-date"], .number(1_796_070_000), "0: dismissed at once")
    }

    func testEventFollowsKindAndState() {
        XCTAssertEqual(LiveActivityPayload.event(kind: .start, state: .queued), .start)
        XCTAssertEqual(LiveActivityPayload.event(kind: .update, state: .idle), .update)
        for s in ActivityState.terminal { XCTAssertEqual(LiveActivityPayload.event(kind: .update, state: s), .end) }
    }

    func testEscapesAreValidJSON() {
        let a = aps(LiveActivityPayload.build(activity(status: #"quote " backslash \ tab"#), event: .start, timestamp: 1))
        XCTAssertEqual(a["content-state"]?["status"], .string(#"quote " backslash \ tab"#))
    }

    // MARK: - The 4096-byte limit

    /// The longest texts the contract allows, in the widest characters, still fit: shortened,
    /// with an ellipsis, as valid JSON and whole characters.
    func testLongestTextsInWideCharactersAreShortenedToFit() {
        let wide = String(repeating: "\u{1F680}", count: 200)  // 4 UTF-8 bytes each
        let heavy = String(repeating: "e\u{301}\u{302}\u{303}\u{304}", count: 200)  // 9 bytes per character
        for status in [wide, heavy] {
            for event in [LiveActivityPayload.Event.start, .update, .end] {
                let x = activity(event == .end ? .error : .processing, status: status, taskName: status,
                                 error: event == .end ? String(repeating: "\u{1F525}", count: 500) : nil)
                let payload = LiveActivityPayload.build(x, event: event, timestamp: 1)
                XCTAssertLessThanOrEqual(payload.count, LiveActivityPayload.maxBytes, "\(event)")
                let a = aps(payload)
                guard case .string(let s)? = a["content-state"]?["status"] else { XCTFail("status"); continue }
                if s != status {
                    XCTAssertTrue(s.hasSuffix("…"), "shortened with an ellipsis")
                    XCTAssertTrue(status.hasPrefix(String(s.dropLast())), "a prefix of the original, whole characters")
                }
            }
        }
    }

    func testAStatusThatFitsIsNeverShortened() {
        let status = String(repeating: "x", count: 200)
        let a = aps(LiveActivityPayload.build(activity(status: status), event: .start, timestamp: 1))
        XCTAssertEqual(a["content-state"]?["status"], .string(status))
    }

    /// Shortening takes the status first and only as much as needed: the result is within a
    /// few bytes of the limit, not far below it.
    func testShorteningIsMinimal() {
        let heavy = String(repeating: "e\u{301}\u{302}\u{303}\u{304}", count: 200)
        var x = activity(status: heavy, taskName: String(repeating: "\u{1F680}", count: 200))
        x.activityId = String(repeating: "a", count: 128)
        let payload = LiveActivityPayload.build(x, event: .start, timestamp: 1)
        XCTAssertGreaterThan(payload.count, LiveActivityPayload.maxBytes - 16)
        XCTAssertEqual(aps(payload)["attributes"]?["taskName"], .string(x.taskName), "the task name was not needed")
    }

    // MARK: - Plans

    func testPlanTable() {
        let live = activity()
        let dismissal: Int64 = 100
        // Gone activity or token: drop.
        XCTAssertEqual(PushPlan.make(kind: .update, snapshot: nil, hasToken: true, lastTimestamp: 0, priority: 5, dismissalDelaySeconds: dismissal), .drop)
        XCTAssertEqual(PushPlan.make(kind: .update, snapshot: live, hasToken: false, lastTimestamp: 0, priority: 5, dismissalDelaySeconds: dismissal), .drop)
        // A start for an activity that ended first: skipped.
        XCTAssertEqual(PushPlan.make(kind: .start, snapshot: activity(.completed), hasToken: true, lastTimestamp: 0, priority: 10,
                                     dismissalDelaySeconds: dismissal), .skip)
        guard case .send(_, let ts, let priority, let expiration) = PushPlan.make(kind: .update, snapshot: live, hasToken: true, lastTimestamp: 0,
                                                                                  priority: 5, dismissalDelaySeconds: dismissal)
        else { return XCTFail() }
        XCTAssertEqual(ts, 1_796_070_000)
        XCTAssertEqual(priority, 5)
        XCTAssertEqual(expiration, ts + 3600)
        guard case .send(_, _, let startPriority, _) = PushPlan.make(kind: .start, snapshot: live, hasToken: true, lastTimestamp: 0,
                                                                     priority: 5, dismissalDelaySeconds: dismissal)
        else { return XCTFail() }
        XCTAssertEqual(startPriority, 10, "a start is always 10")
        guard case .send(_, let endTs, let endPriority, let endExpiration) = PushPlan.make(
            kind: .update, snapshot: activity(.completed), hasToken: true, lastTimestamp: 1_796_070_000, priority: 5,
            dismissalDelaySeconds: dismissal)
        else { return XCTFail() }
        XCTAssertEqual(endTs, 1_796_070_001, "after the last timestamp")
        XCTAssertEqual(endPriority, 10, "an end is always 10")
        XCTAssertEqual(endExpiration, 1_796_070_000 + 100 + 0, "kept until its dismissal date")
    }

    /// `apns-expiration` counts from the send, not from the change: a push made an hour after
    /// its change (its token arrived late) still gets its hour at APNs.
    func testExpirationCountsFromTheSend() {
        let sentAt: Int64 = 1_796_070_000 + 5400
        guard case .send(_, let ts, _, let expiration) = PushPlan.make(kind: .update, snapshot: activity(), hasToken: true, lastTimestamp: 0,
                                                                       priority: 5, dismissalDelaySeconds: 100, sentAtSeconds: sentAt)
        else { return XCTFail() }
        XCTAssertEqual(ts, 1_796_070_000, "the timestamp stays the change's")
        XCTAssertEqual(expiration, sentAt + 3600)
        guard case .send(_, _, _, let startExpiration) = PushPlan.make(kind: .start, snapshot: activity(), hasToken: true, lastTimestamp: 0,
                                                                       priority: 10, dismissalDelaySeconds: 100, sentAtSeconds: sentAt)
        else { return XCTFail() }
        XCTAssertEqual(startExpiration, sentAt + 3600)
        guard case .send(_, _, _, let endExpiration) = PushPlan.make(kind: .update, snapshot: activity(.completed), hasToken: true,
                                                                     lastTimestamp: 0, priority: 10, dismissalDelaySeconds: 100,
                                                                     sentAtSeconds: sentAt)
        else { return XCTFail() }
        XCTAssertEqual(endExpiration, sentAt + 60, "past its dismissal date an end still gets a minute")
    }

    /// `content-state.cancelRequested` mirrors the snapshot on every event.
    func testCancelRequestedIsInEveryContentState() {
        var x = activity()
        for event in [LiveActivityPayload.Event.start, .update] {
            XCTAssertEqual(aps(LiveActivityPayload.build(x, event: event, timestamp: 1))["content-state"]?["cancelRequested"], .bool(false))
        }
        x.cancelRequested = true
        for event in [LiveActivityPayload.Event.start, .update, .end] {
            XCTAssertEqual(aps(LiveActivityPayload.build(x, event: event, timestamp: 1))["content-state"]?["cancelRequested"], .bool(true))
        }
        XCTAssertEqual(keys(aps(LiveActivityPayload.build(x, event: .update, timestamp: 1))["content-state"] ?? .null),
                       ["state", "progress", "status", "attempt", "seq", "updatedAt", "cancelRequested"])
    }

    /// A cancel request is pushed at 5 (the state does not change; the publisher's end, at 10,
    /// follows); a new state and the end at 10.
    func testPriorityTable() {
        let running = activity()
        var cancelling = running
        cancelling.cancelRequested = true
        let rows: [(EventName, Activity, ActivityState?, Int)] = [
            (.state(.processing), running, .processing, 5),
            (.state(.processing), running, .queued, 10),
            (.cancelRequested, cancelling, .processing, 5),
            (.state(.completed), activity(.completed), .processing, 10),
        ]
        for (name, snapshot, previous, priority) in rows {
            XCTAssertEqual(ActivityEvent(name: name, snapshot: snapshot).pushPriority(previous: previous), priority, name.rawValue)
        }
    }

    /// The push-to-start budget counts the starts sent in the last hour and those of the batch.
    func testStartBudgetTable() {
        var b = StartBudget(limit: 8)
        XCTAssertTrue(b.take(device: 1, sentLastHour: 6))
        XCTAssertTrue(b.take(device: 1, sentLastHour: 6))
        XCTAssertFalse(b.take(device: 1, sentLastHour: 6), "6 sent + 2 planned: the 9th is refused")
        XCTAssertTrue(b.take(device: 2, sentLastHour: 0), "per device")
        XCTAssertFalse(b.take(device: 3, sentLastHour: 8))
        var none = StartBudget(limit: 0)
        XCTAssertFalse(none.take(device: 1, sentLastHour: 0), "0: no starts at all")
    }
}
