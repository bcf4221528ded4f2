import XCTest
@testable import DispatchCore

/// The process-wide replay memory budget (issue 24, finding 11).
final class MemoryBudgetTests: XCTestCase {
    typealias Budget = MemoryBudget<String, Int>

    func testAReadIsAdmittedWhileItFitsAndReservedUntilItArrives() {
        var b = Budget(limit: 100)
        b.open(1, key: "a", now: 0)
        XCTAssertTrue(b.admit(1, bytes: 60, now: 0).granted)
        XCTAssertEqual(b.total, 60, "reserved before any byte arrived")
        b.open(2, key: "a", now: 0)
        XCTAssertFalse(b.admit(2, bytes: 60, now: 0).granted, "no room: it waits")
        XCTAssertEqual(b.waitingCount, 1)
        // The page arrives (50 bytes, in the socket): counted with its reservation until the
        // read is over, then the socket takes it all.
        XCTAssertTrue(b.hold(1, bytes: 50, now: 0.1).isEmpty)
        XCTAssertEqual(b.total, 110, "the reservation stands until the page is done")
        XCTAssertTrue(b.hold(1, bytes: 50, now: 0.1, release: 60).isEmpty, "50 + 60 > 100: still waiting")
        XCTAssertEqual(b.hold(1, bytes: 0, now: 0.2).wake, [2])
        XCTAssertEqual(b.total, 60)
        // A second read granted before the first one's end: each end releases its own bytes.
        XCTAssertTrue(b.admit(1, bytes: 20, now: 0.3).granted)
        XCTAssertTrue(b.admit(1, bytes: 20, now: 0.3).granted)
        _ = b.hold(1, bytes: 0, now: 0.4, release: 20)
        XCTAssertEqual(b.held(by: 1), 20, "one reservation left")
        XCTAssertEqual(b.waitingCount, 0)
    }

    func testReadersWaitAheadOfStreamsThatNeverTookAByte() {
        var b = Budget(limit: 100)
        b.open(0, key: "x", now: 0)
        _ = b.hold(0, bytes: 100, now: 0)
        b.open(1, key: "a", now: 0)
        b.open(2, key: "a", now: 0)
        // 2 has read a page (its socket took bytes); 1 never took any.
        _ = b.hold(2, bytes: 0, now: 0)
        XCTAssertFalse(b.admit(1, bytes: 10, now: 0).granted)
        XCTAssertFalse(b.admit(2, bytes: 10, now: 0).granted)
        XCTAssertEqual(b.hold(0, bytes: 90, now: 0.1).wake, [1], "nothing has been read yet: first come")
        b.open(3, key: "a", now: 0)
        _ = b.hold(3, bytes: 10, now: 0)
        _ = b.hold(3, bytes: 0, now: 0.1)
        _ = b.hold(0, bytes: 100, now: 0.2)
        b.open(4, key: "a", now: 0)
        XCTAssertFalse(b.admit(4, bytes: 10, now: 0.2).granted)
        XCTAssertFalse(b.admit(3, bytes: 10, now: 0.2).granted)
        XCTAssertEqual(b.hold(0, bytes: 70, now: 0.3).wake, [3, 2], "the reader first, then 2 and 4 in their order")
    }

    /// A fan-out's writes report one after another in one instant, before the shell has closed
    /// what the first report condemned: the later ones count it as freed. Each had condemned
    /// one more stalled stream (all ten here) while the total was back under the limit.
    func testWritesOfOneInstantCondemnOnlyWhatBringsTheTotalUnder() {
        var b = Budget(limit: 10_000)
        for s in 0..<10 {
            b.open(s, key: "a", now: 0)
            _ = b.hold(s, bytes: 900 + s, now: 0)  // stalled from 2 s on: nothing taken since 0
        }
        b.open(99, key: "b", now: 5)
        let first = b.hold(99, bytes: 1_500, now: 5)  // 10,545: 545 over
        XCTAssertEqual(first.disconnect, [9], "the stalled stream holding the most, of the key holding the most")
        var later: [Int] = []
        for s in 0..<10 { later += b.hold(s, bytes: 900 + s, now: 5).disconnect }
        later += b.hold(99, bytes: 1_500, now: 5).disconnect
        XCTAssertEqual(later, [], "what was condemned is freed once closed: nothing more to take")
        XCTAssertEqual(b.disconnections, 1)
        // Closed, the condemned stream's bytes leave the total; more bytes then take the next.
        XCTAssertTrue(b.close(9).closed)
        XCTAssertEqual(b.total, 9_636)
        XCTAssertEqual(b.hold(99, bytes: 2_000, now: 5).disconnect, [8], "10,136: over again, one more")
        XCTAssertEqual(b.disconnections, 2)
        // The instant's scan is reused: a stream closed since (7, next in line) is skipped.
        XCTAssertTrue(b.close(8).closed)
        XCTAssertTrue(b.close(7).closed)
        XCTAssertEqual(b.hold(99, bytes: 4_000, now: 5).disconnect, [6], "8,321 -> 10,321: one more, never the closed one")
    }

    func testCloseReleasesExactlyOnceWhicheverPathComesFirst() {
        var b = Budget(limit: 100)
        b.open(1, key: "a", now: 0)
        _ = b.admit(1, bytes: 40, now: 0)
        _ = b.hold(1, bytes: 70, now: 0, release: 40)
        XCTAssertEqual(b.held(byKey: "a"), 70)
        XCTAssertTrue(b.close(1).closed)
        XCTAssertFalse(b.close(1).closed, "the second close is a no-op")
        XCTAssertEqual(b.total, 0)
        XCTAssertEqual(b.held(byKey: "a"), 0)
        XCTAssertTrue(b.hold(1, bytes: 500, now: 1).isEmpty, "a late report for a closed stream counts nothing")
        XCTAssertEqual(b.total, 0)
        XCTAssertEqual(b.count, 0)
    }

    func testAClosedWaiterLeavesTheLine() {
        var b = Budget(limit: 10)
        b.open(1, key: "a", now: 0)
        b.open(2, key: "a", now: 0)
        b.open(3, key: "b", now: 0)
        _ = b.hold(1, bytes: 10, now: 0)
        XCTAssertFalse(b.admit(2, bytes: 5, now: 0).granted)
        XCTAssertFalse(b.admit(3, bytes: 5, now: 0).granted)
        _ = b.close(2)
        XCTAssertEqual(b.close(1).decision.wake, [3], "2 is gone; 3 is next")
    }

    func testOnlyStalledStreamsAreDisconnectedAndOnlyPastTheLimit() {
        var b = Budget(limit: 100, stallSeconds: 2)
        for s in 1...3 { b.open(s, key: "a", now: 0) }
        _ = b.hold(1, bytes: 40, now: 0)
        _ = b.hold(2, bytes: 40, now: 0)
        XCTAssertTrue(b.tick(now: 10).isEmpty, "80 of 100: nobody is cut, stalled or not")
        // 3's live events push the total past the limit; 1 is stalled, 2 keeps reading.
        _ = b.hold(2, bytes: 30, now: 9.5)
        let d = b.hold(3, bytes: 50, now: 10)
        XCTAssertEqual(d.disconnect, [1], "stalled for 10 s; 2 took bytes 0.5 s ago, 3 just arrived")
        XCTAssertEqual(b.disconnections, 1)
        XCTAssertTrue(b.tick(now: 10).isEmpty, "1 is condemned once, not again")
        _ = b.close(1)
        XCTAssertEqual(b.total, 80)
    }

    func testStalledStreamsOfTheKeyHoldingTheMostGoFirst() {
        var b = Budget(limit: 1000, stallSeconds: 1)
        // Key "greedy": 10 stalled streams of 90 bytes; key "small": 1 stalled stream of 90.
        for s in 1...10 { b.open(s, key: "greedy", now: 0); _ = b.hold(s, bytes: 90, now: 0) }
        b.open(100, key: "small", now: 0)
        _ = b.hold(100, bytes: 90, now: 0)
        XCTAssertEqual(b.total, 990)
        // A reader of "small" wants a 300-byte page: 280 must be freed, all from "greedy".
        b.open(101, key: "small", now: 5)
        let r = b.admit(101, bytes: 300, now: 5)
        XCTAssertEqual(r.decision.disconnect.count, 4, "four of 90 bytes free the 290 needed")
        XCTAssertTrue(r.decision.disconnect.allSatisfy { (1...10).contains($0) }, "\(r.decision.disconnect)")
        XCTAssertFalse(r.granted, "not before the condemned streams are closed")
        var woken: [Int] = []
        for s in r.decision.disconnect { woken += b.close(s).decision.wake }
        XCTAssertEqual(woken, [101], "granted once their bytes are freed")
        XCTAssertLessThanOrEqual(b.total, 1000)
    }

    func testWaitingKeysTakeTurns() {
        var b = Budget(limit: 100, stallSeconds: 1)
        b.open(0, key: "x", now: 0)
        _ = b.hold(0, bytes: 100, now: 0)
        // Key "many" queues five reads before key "one" queues its single read.
        for s in 1...5 { b.open(s, key: "many", now: 0); XCTAssertFalse(b.admit(s, bytes: 10, now: 0).granted) }
        b.open(9, key: "one", now: 0)
        XCTAssertFalse(b.admit(9, bytes: 10, now: 0).granted)
        // 20 bytes free up: one read of each key, not two of the first to queue.
        XCTAssertEqual(b.hold(0, bytes: 80, now: 0.1).wake, [1, 9])
        XCTAssertEqual(b.hold(0, bytes: 50, now: 0.2).wake, [2, 3, 4])
    }

    func testWhateverTheNumberOfStalledReadersTheTotalStaysBounded() {
        let page = 16 * 1024
        var b = Budget(limit: 64 * 1024, stallSeconds: 1)
        var rng = SeededGenerator(seed: 7)
        var open = Set<Int>()
        var now = 0.0
        // Performs a decision as the shell does: a granted read brings its page (which nobody
        // reads), a disconnected stream is closed; both may lead to more.
        func perform(_ first: Budget.Decision) {
            var pending = [first]
            while let d = pending.popLast() {
                for v in d.disconnect {
                    let c = b.close(v)
                    XCTAssertTrue(c.closed, "each stream is disconnected once")
                    open.remove(v)
                    pending.append(c.decision)
                }
                for g in d.wake {
                    pending.append(b.hold(g, bytes: page / 2 + Int(rng.next() % UInt64(page / 2)), now: now, release: page))
                }
            }
        }
        for s in 0..<5000 {
            now = Double(s) / 1000
            b.open(s, key: "k\(s % 3)", now: now)
            open.insert(s)
            let r = b.admit(s, bytes: page, now: now)
            var d = r.decision
            if r.granted { d.wake.append(s) }
            perform(d)
            XCTAssertLessThanOrEqual(b.total, 64 * 1024, "the budget holds, whatever the number of stalled readers")
        }
        // Each tick replaces the stalled holders by waiting readers (which stall in turn).
        for t in 0..<3000 where b.waitingCount > 0 { perform(b.tick(now: 10 + Double(t) * 1.5)) }
        XCTAssertEqual(b.waitingCount, 0, "every reader got its page in the end")
        XCTAssertGreaterThan(b.disconnections, 4900)
        XCTAssertEqual(b.count, open.count)
        XCTAssertLessThanOrEqual(b.total, 64 * 1024)
        let perKey = (0..<3).map { b.held(byKey: "k\($0)") }
        XCTAssertEqual(perKey.reduce(0, +), b.total)
    }
}
