import XCTest
import DispatchCore
import DispatchCLIKit

extension CLIWatchState.Action {
    var isDisplay: Bool { if case .display = self { return true } else { return false } }
}

final class CLIWatchStateTests: XCTestCase {
    private func event(_ seq: Int, _ name: String, state: String? = nil) -> SSEEvent {
        SSEEvent(id: String(seq), event: name, data: #"{"activityId":"A","state":"\#(state ?? name)","seq":\#(seq)}"#)
    }

    func testStreamThroughCompletion() {
        var w = CLIWatchState(activityID: "A")
        XCTAssertNil(w.lastEventID)
        XCTAssertEqual(w.answered(status: 200), .readStream)
        XCTAssertEqual(w.received(event(1, "queued")).count, 1)
        XCTAssertEqual(w.lastEventID, "1")
        XCTAssertEqual(w.received(event(2, "processing")).count, 1)
        let last = w.received(event(3, "completed"))
        XCTAssertEqual(last.last, .finish(.success))
    }

    func testReconnectDropsWhatWasAlreadyShown() {
        var w = CLIWatchState(activityID: "A")
        _ = w.received(event(1, "queued"))
        _ = w.received(event(2, "processing"))
        w.retryAdvised(milliseconds: 1500)
        XCTAssertEqual(w.streamEnded(), .reconnect(afterMilliseconds: 1500))
        XCTAssertEqual(w.received(event(2, "processing")), [])  // a server that repeats itself
        XCTAssertEqual(w.received(event(3, "processing")).count, 1)
        XCTAssertEqual(w.lastEventID, "3")
    }

    func testEndStatesAndErrors() {
        var w = CLIWatchState(activityID: "A")
        XCTAssertEqual(w.received(event(4, "error")).last, .finish(.jobFailed))
        var c = CLIWatchState(activityID: "A")
        XCTAssertEqual(c.received(event(4, "cancelled")).last, .finish(.jobFailed))
        var r = CLIWatchState(activityID: "A")
        XCTAssertEqual(r.received(event(4, "rejected")).last, .finish(.jobFailed), "rejected is final: watch ends like on error")
        var n = CLIWatchState(activityID: "A")
        XCTAssertEqual(n.received(SSEEvent(id: nil, event: "not_found", data: #"{"activityId":"A"}"#)).last, .finish(.notFound))
        var h = CLIWatchState(activityID: "A")
        XCTAssertEqual(h.answered(status: 204), .fetchSnapshot)
        XCTAssertEqual(h.answered(status: 401), .finish(.auth))
        XCTAssertEqual(h.answered(status: 404), .finish(.notFound))
        XCTAssertEqual(h.answered(status: 503), .retryConnect)
        // After a 204 the final snapshot decides; an event already shown is not shown again.
        var s = CLIWatchState(activityID: "A")
        _ = s.received(event(3, "processing"))
        let done = CLIActivityView(activityID: "A", state: "completed", seq: 4)
        XCTAssertEqual(s.snapshotFetched(done), [.display(event: "completed", view: done), .finish(.success)])
        var t = CLIWatchState(activityID: "A")
        _ = t.received(event(4, "processing"))
        XCTAssertEqual(t.snapshotFetched(CLIActivityView(activityID: "A", state: "error", seq: 4)), [.finish(.jobFailed)])
        var u = CLIWatchState(activityID: "A")
        _ = u.received(event(1, "queued"))
        let rejected = CLIActivityView(activityID: "A", state: "rejected", seq: 2)
        XCTAssertEqual(u.snapshotFetched(rejected), [.display(event: "rejected", view: rejected), .finish(.jobFailed)],
                       "after a 204, a rejected snapshot ends the watch instead of reconnecting for ever")
    }

    /// `watch --wait`: not_found means "not started yet" until the deadline; once the activity
    /// was seen, not_found is final again.
    func testWaitingForAnActivityThatDoesNotExistYet() throws {
        let notFound = SSEEvent(id: "0", event: "not_found", data: #"{"activityId":"A"}"#)
        var w = CLIWatchState(activityID: "A", waitForStart: .until(100))
        XCTAssertEqual(w.received(notFound, now: 10), [.awaitActivity(afterMilliseconds: 1000)])
        XCTAssertNil(w.lastEventID, "not_found's id 0 is no Last-Event-ID: the next connection asks afresh")
        XCTAssertEqual(w.received(notFound, now: 99.75), [.awaitActivity(afterMilliseconds: 250)], "the last look lands on the deadline")
        XCTAssertEqual(w.received(notFound, now: 100).last, .finish(.notFound))
        XCTAssertEqual(try XCTUnwrap(w.received(notFound, now: 100).first).isDisplay, true, "the timeout shows not_found")

        var f = CLIWatchState(activityID: "A", waitForStart: .forever)
        XCTAssertEqual(f.received(notFound, now: 1e9), [.awaitActivity(afterMilliseconds: 1000)])
        XCTAssertEqual(f.received(event(1, "queued"), now: 1e9).count, 1)
        XCTAssertEqual(f.waitForStart, .no)
        XCTAssertEqual(f.received(notFound, now: 1e9).last, .finish(.notFound), "it existed: gone now is final")

        var n = CLIWatchState(activityID: "A")
        XCTAssertEqual(n.received(notFound, now: 0).last, .finish(.notFound), "without --wait: exit 3 at once")
        let (_, c) = try command(["watch", "--id", "A", "--wait"])
        XCTAssertEqual(c, .watch(CLIWatchOptions(activityID: "A", wait: true, waitTimeout: 600)))
        XCTAssertEqual(try command(["watch", "--id", "A", "--wait-timeout", "90s"]).1, .watch(CLIWatchOptions(activityID: "A", wait: true, waitTimeout: 90)))
        XCTAssertEqual(try command(["watch", "--id", "A", "--wait", "--wait-timeout", "0"]).1, .watch(CLIWatchOptions(activityID: "A", wait: true, waitTimeout: nil)))
        XCTAssertNotNil(usageError(["watch", "--id", "A", "--wait-timeout", "soon"]))
    }

    /// Contract §1: completed, error, cancelled and rejected are the terminal states; idle is live.
    func testTerminalStatesAreTheContractsFour() {
        for state in ["completed", "error", "cancelled", "rejected"] {
            XCTAssertTrue(CLIActivityView(activityID: "A", state: state).isTerminal, state)
        }
        for state in ["queued", "processing", "retrying", "idle"] {
            XCTAssertFalse(CLIActivityView(activityID: "A", state: state).isTerminal, state)
        }
        XCTAssertEqual(CLIActivityView.terminalStates, ["completed", "error", "cancelled", "rejected"])
    }
}
