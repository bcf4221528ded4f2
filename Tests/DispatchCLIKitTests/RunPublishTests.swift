import XCTest
import DispatchCore
import DispatchCLIKit

/// `dispatch run` publishes in the background while its command runs from the first instant:
/// the order, the coalescing, the touches and the retries, one transition per line.
final class CLIRunPublishQueueTests: XCTestCase {
    typealias Q = CLIRunPublishQueue
    let done = CLIEndOptions(activityID: "", state: "completed", status: "Completed")

    func testStartComesFirstThenTheLatestProgressThenTheEnd() {
        var q = Q(touchInterval: nil, now: 0)
        q.offer(progress: 0.1)
        q.offer(progress: 0.2)
        XCTAssertEqual(q.next(now: 0), .send(.start), "nothing exists before the start")
        q.succeeded(.start, now: 0.01)
        XCTAssertEqual(q.next(now: 0.01), .send(.progress(0.2)), "coalesced: only the latest value")
        q.succeeded(.progress(0.2), now: 0.02)
        q.offer(progress: 0.3)
        XCTAssertEqual(q.next(now: 0.1), .wait(until: 0.27), "at most four a second")
        XCTAssertEqual(q.next(now: 0.27), .send(.progress(0.3)))
        q.succeeded(.progress(0.3), now: 0.3)
        q.offer(progress: 0.3)
        XCTAssertEqual(q.next(now: 1), .wait(until: .infinity), "the same value is not sent again")
        q.offer(progress: 0.9)
        q.requestEnd(done, now: 1, budget: 30)
        q.offer(progress: 1.0)  // after the end was asked for: ignored
        XCTAssertEqual(q.next(now: 1), .send(.progress(0.9)), "what was pending goes out before the end")
        q.succeeded(.progress(0.9), now: 1)
        XCTAssertEqual(q.next(now: 1.1), .send(.end(done)))
        q.succeeded(.end(done), now: 1.1)
        XCTAssertEqual(q.next(now: 1.2), .finished)
    }

    func testTouchesKeepItFreshWhenNothingElseIsSaid() {
        var q = Q(touchInterval: 200, now: 0)
        XCTAssertEqual(q.next(now: 0), .send(.start))
        q.succeeded(.start, now: 1)
        XCTAssertEqual(q.next(now: 10), .wait(until: 201))
        XCTAssertEqual(q.next(now: 201), .send(.touch))
        q.succeeded(.touch, now: 201)
        q.offer(progress: 0.5)
        q.succeeded(.progress(0.5), now: 300)
        XCTAssertEqual(q.next(now: 300), .wait(until: 500), "any accepted publish renews the deadline")
        q.failed(.touch, transient: false, now: 500)  // 404/409: ended elsewhere, or gone stale
        XCTAssertEqual(q.next(now: 10_000), .wait(until: .infinity), "no more touches")
    }

    func testAServerThatIsDownIsRetriedWithGrowingPausesWhileTheCommandRuns() {
        var q = Q(touchInterval: nil, now: 0)
        var now = 0.0
        var pauses: [Double] = []
        for _ in 0..<7 {
            XCTAssertEqual(q.next(now: now), .send(.start))
            q.failed(.start, transient: true, now: now)
            guard case .wait(let until) = q.next(now: now) else { return XCTFail() }
            pauses.append(until - now)
            now = until
        }
        XCTAssertEqual(pauses, [0.5, 1, 2, 4, 5, 5, 5], "never given up while the command runs")
        q.offer(progress: 0.4)
        q.succeeded(.start, now: now)
        XCTAssertEqual(q.next(now: now), .send(.progress(0.4)), "caught up: the progress follows at once")
        XCTAssertEqual(q.failures, 0)
    }

    func testAfterTheCommandTheEndIsTriedForTheBudgetThenGivenUp() {
        var q = Q(touchInterval: nil, now: 0)
        q.failed(.start, transient: true, now: 0)
        q.failed(.start, transient: true, now: 0.5)
        q.requestEnd(done, now: 100, budget: 3)
        XCTAssertEqual(q.next(now: 100), .send(.start), "one more try at once when the command ends")
        q.failed(.start, transient: true, now: 100)
        XCTAssertEqual(q.next(now: 100), .wait(until: 102))
        q.failed(.start, transient: true, now: 102)
        XCTAssertEqual(q.next(now: 102), .wait(until: 103), "the last pause ends at the budget")
        q.failed(.start, transient: true, now: 103)
        XCTAssertEqual(q.next(now: 103), .gaveUp)

        // --retry-for 0: exactly one try.
        var once = Q(touchInterval: nil, now: 0)
        once.requestEnd(done, now: 0, budget: 0)
        XCTAssertEqual(once.next(now: 0), .send(.start))
        once.failed(.start, transient: true, now: 0)
        XCTAssertEqual(once.next(now: 0), .gaveUp)

        // A server that answers again is not cut off half-way, budget or not.
        var late = Q(touchInterval: nil, now: 0)
        late.requestEnd(done, now: 0, budget: 1)
        late.failed(.start, transient: true, now: 0)
        XCTAssertEqual(late.next(now: 0.5), .send(.start))
        late.succeeded(.start, now: 5)
        XCTAssertEqual(late.next(now: 5), .send(.end(done)))
    }

    func testRefusalsAreFinal() {
        var q = Q(touchInterval: 60, now: 0)
        q.offer(progress: 0.5)
        q.failed(.start, transient: false, now: 0)  // bad key, bad input, a different start for this id
        XCTAssertTrue(q.untracked)
        XCTAssertEqual(q.next(now: 1000), .wait(until: .infinity), "untracked: nothing more is sent")
        q.requestEnd(done, now: 1000, budget: 30)
        XCTAssertEqual(q.next(now: 1000), .finished)

        var p = Q(touchInterval: nil, now: 0)
        p.succeeded(.start, now: 0)
        p.offer(progress: 0.5)
        p.failed(.progress(0.5), transient: false, now: 1)
        XCTAssertEqual(p.next(now: 2), .wait(until: .infinity), "a refused value is skipped")
        p.requestEnd(done, now: 2, budget: 30)
        p.failed(.end(done), transient: false, now: 2)  // 409: ended elsewhere meanwhile
        XCTAssertEqual(p.next(now: 2), .finished)
    }

    func testRunMakesItsOwnIdsAsRandomUUIDs() {
        let id = CLIActivityID.uuid(0, 0)
        XCTAssertEqual(id, "00000000-0000-4000-8000-000000000000")
        XCTAssertEqual(CLIActivityID.uuid(.max, .max), "ffffffff-ffff-4fff-bfff-ffffffffffff")
        XCTAssertEqual(CLIActivityID.uuid(0x0123456789abcdef, 0xfedcba9876543210), "01234567-89ab-4def-bedc-ba9876543210")
        XCTAssertTrue(id.allSatisfy { $0 == "-" || $0.isHexDigit } && id.count == 36)
    }
}
