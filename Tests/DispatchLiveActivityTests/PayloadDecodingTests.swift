import DispatchCore
import DispatchLiveActivity
import Foundation
import XCTest

/// What the phone does with a push: ActivityKit decodes `content-state` (and, for a
/// push-to-start, `attributes`) into the app's types with a default JSONDecoder. The server's
/// payloads must decode into `DispatchAttributes` exactly so, with the right numbers.
final class PayloadDecodingTests: XCTestCase {
    func testEveryEventDecodesIntoTheAppsTypes() throws {
        let t: Int64 = 1_796_070_000_000
        for state in ActivityState.allCases {
            let a = Activity(activityId: "TEST-RTORRENT-01", taskName: "Debian 13 Trixie ISO", systemImage: "arrow.down.circle.fill",
                             machine: "shodan", state: state, progress: state == .queued ? nil : 0.68,
                             status: state == .idle ? nil : "Downloading at 18.4 MB/s (68%)", attempt: 2, seq: 5,
                             createdAt: t - 1000, updatedAt: t, endedAt: state.isTerminal ? t : nil,
                             error: state == .error ? "disk full" : nil)
            for kind in PushKind.allCases {
                let event = LiveActivityPayload.event(kind: kind, state: state)
                let payload = LiveActivityPayload.build(a, event: event, timestamp: 1_796_070_001)
                let decoded = try LiveActivityPush.decode(Data(payload))
                XCTAssertEqual(decoded.event, event.rawValue)
                XCTAssertEqual(decoded.timestamp, 1_796_070_001)
                let cs = decoded.contentState
                XCTAssertEqual(cs.state, state.rawValue)
                XCTAssertEqual(cs.progress, a.progress)
                XCTAssertEqual(cs.status, a.status)
                XCTAssertEqual(cs.attempt, 2)
                XCTAssertEqual(cs.seq, 5)
                XCTAssertEqual(cs.updatedAt, 1_796_070_000, "Unix seconds, not seconds since 2001")
                XCTAssertEqual(cs.isFinal, state.isTerminal)
                if event == .start {
                    XCTAssertEqual(decoded.attributesType, "DispatchAttributes")
                    XCTAssertEqual(decoded.attributes, DispatchAttributes(activityId: "TEST-RTORRENT-01", taskName: "Debian 13 Trixie ISO",
                                                                          machine: "shodan", systemImage: "arrow.down.circle.fill"))
                } else {
                    XCTAssertNil(decoded.attributes)
                }
                XCTAssertEqual(decoded.dismissalDate != nil, event == .end)
                XCTAssertEqual(decoded.inputPushToken, event == .start ? 1 : nil)
                XCTAssertNil(decoded.inputPushChannel)
                XCTAssertNil(decoded.staleDate, "no stale deadline given")
            }
        }
    }

    /// iOS 18's keys: a broadcast start names its channel instead of asking for a token, and
    /// updates carry the stale deadline (never a start or an end).
    func testTheIOS18KeysDecode() throws {
        let t: Int64 = 1_796_070_000_000
        let a = Activity(activityId: "j", taskName: "Build", state: .processing, progress: 0.5, seq: 2, createdAt: t, updatedAt: t)
        let extras = LiveActivityPayload.Extras(staleDate: 1_796_070_600, channelID: "dHdpbGlnaHQ=")
        let start = try LiveActivityPush.decode(Data(LiveActivityPayload.build(a, event: .start, timestamp: 1, extras: extras)))
        XCTAssertEqual(start.inputPushChannel, "dHdpbGlnaHQ=")
        XCTAssertNil(start.inputPushToken)
        XCTAssertEqual(start.staleDate, 1_796_070_600, "a start carries the stale-date too")
        XCTAssertEqual(start.alert?.title, "Build")
        let update = try LiveActivityPush.decode(Data(LiveActivityPayload.build(a, event: .update, timestamp: 2, extras: extras)))
        XCTAssertEqual(update.staleDate, 1_796_070_600)
        XCTAssertNil(update.inputPushChannel)
        XCTAssertNil(update.alert)
        var ended = a
        ended.state = .error
        ended.endedAt = t
        let end = try LiveActivityPush.decode(Data(LiveActivityPayload.build(ended, event: .end, timestamp: 3, extras: extras)))
        XCTAssertNil(end.staleDate)
        XCTAssertNotNil(end.alert)
        XCTAssertEqual(end.dismissalDate, 1_796_070_000 + 4 * 3600)
    }

    func testTheContractsExampleDecodes() throws {
        let example = #"""
        {"aps": {
          "timestamp": 1796070000,
          "event": "update",
          "content-state": {"state": "processing", "progress": 0.68,
                            "status": "Downloading at 18.4 MB/s (68%)", "attempt": 1,
                            "seq": 5, "updatedAt": 1796070000},
          "attributes-type": "DispatchAttributes",
          "attributes": {"activityId": "TEST-RTORRENT-01", "taskName": "Debian 13 Trixie ISO",
                         "machine": "shodan", "systemImage": "arrow.down.circle.fill"},
          "alert": {"title": "Debian 13 Trixie ISO", "body": "Starting download..."},
          "dismissal-date": 1796084400
        }}
        """#
        let decoded = try LiveActivityPush.decode(Data(example.utf8))
        XCTAssertEqual(decoded.contentState.progress, 0.68)
        XCTAssertEqual(decoded.attributes?.machine, "shodan")
    }

    /// `cancelRequested` decodes when present, and a push without it (an older server's)
    /// still decodes, as not requested; encoding keeps the key.
    func testCancelRequestedDecodesAndOldPayloadsStillDo() throws {
        let t: Int64 = 1_796_070_000_000
        var a = Activity(activityId: "j", taskName: "Build", state: .processing, progress: 0.5, seq: 3, createdAt: t, updatedAt: t)
        a.cancelRequested = true
        let pushed = try LiveActivityPush.decode(Data(LiveActivityPayload.build(a, event: .update, timestamp: 2)))
        XCTAssertTrue(pushed.contentState.cancelRequested)
        a.cancelRequested = false
        XCTAssertFalse(try LiveActivityPush.decode(Data(LiveActivityPayload.build(a, event: .update, timestamp: 3))).contentState.cancelRequested)
        let old = #"{"state":"processing","progress":0.5,"status":null,"attempt":1,"seq":2,"updatedAt":1796070000}"#
        let cs = try JSONDecoder().decode(DispatchAttributes.ContentState.self, from: Data(old.utf8))
        XCTAssertFalse(cs.cancelRequested)
        let again = try JSONDecoder().decode(DispatchAttributes.ContentState.self, from: JSONEncoder().encode(
            DispatchAttributes.ContentState(state: "processing", seq: 4, updatedAt: 1, cancelRequested: true)))
        XCTAssertTrue(again.cancelRequested)
        XCTAssertThrowsError(try JSONDecoder().decode(DispatchAttributes.ContentState.self,
                                                      from: Data(#"{"state":"processing","attempt":1,"seq":2,"updatedAt":1,"cancelRequested":"yes"}"#.utf8)),
                             "a wrong type is still an error")
    }

    func testNullsDecodeAsNil() throws {
        let json = #"{"state":"queued","progress":null,"status":null,"attempt":1,"seq":1,"updatedAt":1796070000}"#
        let cs = try JSONDecoder().decode(DispatchAttributes.ContentState.self, from: Data(json.utf8))
        XCTAssertNil(cs.progress)
        XCTAssertNil(cs.status)
        XCTAssertFalse(cs.isFinal)
    }
}

extension LiveActivityPush {
    static func decode(_ data: Data) throws -> LiveActivityPush {
        try JSONDecoder().decode(Envelope.self, from: data).aps
    }
}
