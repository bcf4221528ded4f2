import XCTest
@testable import DispatchCore

/// A remote cancel request against the activity state machine (contract §5.3).
final class CancelRequestTests: XCTestCase {
    static let t0: Int64 = 1_795_992_806_123

    static func activity(_ state: ActivityState) -> Activity {
        Activity(activityId: "job", taskName: "Job", state: state, progress: 0.5, status: "busy", attempt: 2, seq: 4,
                 createdAt: t0, updatedAt: t0 + 10, endedAt: state.isTerminal ? t0 + 10 : nil)
    }

    func testEveryLiveStateGetsOneRequestEventWithTheStateUnchanged() throws {
        for state in ActivityState.live {
            guard case .success(.requested(let e)) = ActivityMachine.cancel(current: Self.activity(state), reason: "disk full", now: Self.t0 + 20) else {
                return XCTFail("\(state)")
            }
            XCTAssertEqual(e.name, .cancelRequested)
            XCTAssertEqual(e.seq, 5)
            XCTAssertEqual(e.snapshot.state, state)
            XCTAssertTrue(e.snapshot.cancelRequested)
            XCTAssertEqual(e.snapshot.cancelReason, "disk full")
            XCTAssertEqual(e.snapshot.progress, 0.5)
            XCTAssertEqual(e.snapshot.status, "busy")
            XCTAssertEqual(e.snapshot.attempt, 2)
            XCTAssertEqual(e.snapshot.updatedAt, Self.t0 + 20)
            XCTAssertEqual(e.pushPriority(previous: state), 5, "news, not an alarm: the publisher's end follows at 10 (contract §5.2)")
        }
    }

    func testARepeatWritesNothingAndAFinishedActivityRefuses() {
        var asked = Self.activity(.processing)
        asked.cancelRequested = true
        asked.cancelReason = "first"
        XCTAssertEqual(ActivityMachine.cancel(current: asked, reason: "second", now: Self.t0 + 30), .success(.alreadyRequested(asked)))
        for state in ActivityState.terminal {
            guard case .failure(let e) = ActivityMachine.cancel(current: Self.activity(state), now: Self.t0 + 30) else { return XCTFail("\(state)") }
            XCTAssertEqual(e.code, .alreadyFinished)
            XCTAssertEqual(e.snapshot?.state, state)
        }
    }

    func testTheReasonIsInTheSnapshotOnlyOnceACancelWasRequested() throws {
        let plain = Self.activity(.processing)
        XCTAssertFalse(String(decoding: plain.json(), as: UTF8.self).contains("cancelReason"), "the contract's shape")
        guard case .success(.requested(let e)) = ActivityMachine.cancel(current: plain, now: Self.t0 + 20),
              case .success(.requested(let withReason)) = ActivityMachine.cancel(current: plain, reason: "stop \"it\"", now: Self.t0 + 20) else {
            return XCTFail()
        }
        XCTAssertTrue(String(decoding: e.snapshot.json(), as: UTF8.self).contains(#""cancelRequested":true,"cancelReason":null,"#))
        XCTAssertTrue(String(decoding: withReason.snapshot.json(), as: UTF8.self).contains(#""cancelReason":"stop \"it\"""#))
        for a in [e.snapshot, withReason.snapshot] {
            XCTAssertEqual(Activity.decode(try JSONParser.parse(a.json())), a)
        }
        // The reason stays through later changes, the publisher's end included.
        guard case .success(.ended(let end)) = ActivityMachine.end(EndCommand(state: .cancelled), current: withReason.snapshot,
                                                                   storedEndFingerprint: nil, now: Self.t0 + 40) else { return XCTFail() }
        XCTAssertEqual(end.snapshot.cancelReason, "stop \"it\"")
    }

    /// An event's name is a state or a cancel request; its text is the SSE `event:` field
    /// and the history's `event` column, and anything else is no event name.
    func testEventNamesAreAStateOrACancelRequestAndRoundTripTheirText() {
        let rows: [(String, EventName?)] = [
            ("queued", .state(.queued)), ("processing", .state(.processing)), ("completed", .state(.completed)),
            ("error", .state(.error)), ("cancelled", .state(.cancelled)), ("rejected", .state(.rejected)),
            ("cancel_requested", .cancelRequested), ("", nil), ("Processing", nil), ("cancel-requested", nil), ("failed", nil), ("synced", nil),
        ]
        for (text, name) in rows {
            XCTAssertEqual(EventName(rawValue: text), name, text)
            if let name { XCTAssertEqual(name.rawValue, text) }
        }
        XCTAssertEqual(PublishReplay(json: "{}", event: "cancel_requested", seq: 3).call, .cancel)
        XCTAssertEqual(PublishReplay(json: "{}", event: "error", seq: 3).call, .end)
        XCTAssertEqual(PublishReplay(json: "{}", event: "processing", seq: 3).call, .update)
        XCTAssertEqual(PublishReplay(json: "{}", event: "error", seq: 1).call, .start)
    }
}
