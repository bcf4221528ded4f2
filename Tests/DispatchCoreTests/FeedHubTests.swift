import Foundation
import XCTest
@testable import DispatchCore

struct FCh: FeedChange, Equatable {
    let position: Int64
    let activity: String
    let machine: String?
    let isTerminal: Bool
    var byteCount: Int { 100 }
}

typealias TestFeed = FeedHub<Int, FCh>

/// The feed's transitions, one line each, then seeded random interleavings against a model
/// database (`FeedWorld`).
final class FeedHubTests: XCTestCase {
    func ch(_ p: Int64, _ a: String = "a", machine: String? = nil, terminal: Bool = false) -> FCh {
        FCh(position: p, activity: a, machine: machine, isTerminal: terminal)
    }

    func sent(_ actions: [TestFeed.Action], to s: Int) -> [Int64] {
        actions.flatMap { a -> [Int64] in
            if case .send(s, let cs) = a { return cs.map(\.position) }
            if case .sendShared(s, let cs) = a { return cs.map(\.position) }
            return []
        }
    }

    func testInitialSetThenSyncedThenBufferedChangesAfterTheReadOnly() {
        var feed = TestFeed()
        let first = feed.subscribe(1, filter: FeedFilter(), lastEventID: nil)
        guard case .readInitial(1, _, after: 0, firstHead: nil)? = first.first else { return XCTFail("\(first)") }
        // Heard while the read is out: 5 is in the read's snapshot (P = 6), 7 is not.
        XCTAssertTrue(feed.notified(ch(5)).isEmpty)
        XCTAssertTrue(feed.notified(ch(7)).isEmpty)
        let done = feed.initialLoaded(1, [ch(3, "b"), ch(6, "a")], through: 6, complete: true)
        XCTAssertEqual(sent(done, to: 1), [3, 6, 7])
        guard case .synced(1, position: 6)? = done.dropFirst().first else { return XCTFail("\(done)") }
        XCTAssertEqual(sent(feed.notified(ch(8)), to: 1), [8])
        XCTAssertTrue(feed.notified(ch(8)).isEmpty, "a repeated notice is not sent twice")
    }

    func testInitialPagesCarryTheFirstHeadAndTheCursor() {
        var feed = TestFeed()
        _ = feed.subscribe(1, filter: FeedFilter(state: .active), lastEventID: nil)
        let page = feed.initialLoaded(1, [ch(2), ch(4)], through: 9, complete: false)
        guard case .readInitial(1, _, after: 4, firstHead: 9)? = page.last else { return XCTFail("\(page)") }
        let next = feed.initialLoaded(1, [ch(10, terminal: true)], through: 11, complete: true)
        XCTAssertEqual(sent(next, to: 1), [10])
        guard case .synced(1, position: 11)? = next.last else { return XCTFail("\(next)") }
    }

    func testReplayPagesThenLiveWithoutGapOrDuplicate() {
        var feed = TestFeed()
        guard case .readReplay(1, _, after: 3)? = feed.subscribe(1, filter: FeedFilter(), lastEventID: 3).first else { return XCTFail() }
        _ = feed.notified(ch(6))
        _ = feed.notified(ch(9))
        // A cut page covers up to its last change, not the snapshot's newest (9).
        let p1 = feed.replayLoaded(1, .page([ch(4), ch(6)], through: 9, complete: false))
        XCTAssertEqual(sent(p1, to: 1), [4, 6])
        guard case .readReplay(1, _, after: 6)? = p1.last else { return XCTFail("\(p1)") }
        let p2 = feed.replayLoaded(1, .page([ch(7)], through: 8, complete: true))
        XCTAssertEqual(sent(p2, to: 1), [7, 9])
        guard case .synced(1, position: 8)? = p2.dropFirst().first else { return XCTFail("a resume says synced too: \(p2)") }
        XCTAssertTrue(feed.isLive(1))
    }

    func testResetStartsOverWithTheInitialSet() {
        var feed = TestFeed()
        _ = feed.subscribe(1, filter: FeedFilter(), lastEventID: 2)
        let r = feed.replayLoaded(1, .reset)
        guard r.count == 2, case .reset(1) = r[0], case .readInitial(1, _, after: 0, firstHead: nil) = r[1] else { return XCTFail("\(r)") }
        let bad = feed.subscribe(2, filter: FeedFilter(), lastEventID: nil, reset: true)
        guard bad.count == 2, case .reset(2) = bad[0] else { return XCTFail("\(bad)") }
    }

    func testFiltersChooseWhoGetsAChange() {
        var feed = TestFeed()
        for (s, f) in [(1, FeedFilter()), (2, FeedFilter(machine: "x")), (3, FeedFilter(state: .finished)), (4, FeedFilter(state: .active))] {
            _ = feed.subscribe(s, filter: f, lastEventID: nil)
            _ = feed.initialLoaded(s, [], through: 0, complete: true)
        }
        let a = feed.notified(ch(1, machine: "x"))
        let b = feed.notified(ch(2, machine: "y", terminal: true))
        XCTAssertEqual((1...4).map { sent(a, to: $0) }, [[1], [1], [], [1]])
        XCTAssertEqual((1...4).map { sent(b, to: $0) }, [[2], [], [2], [2]])
    }

    func testANoticeWithoutDataIsReadAndLaterNoticesWait() {
        var feed = TestFeed()
        _ = feed.subscribe(1, filter: FeedFilter(), lastEventID: nil)
        _ = feed.initialLoaded(1, [], through: 4, complete: true)
        XCTAssertEqual(sent(feed.notified(ch(5)), to: 1), [5])
        let r = feed.notifiedWithoutData(position: 6)
        guard case .readChanges(after: 5, let g)? = r.first else { return XCTFail("\(r)") }
        XCTAssertTrue(feed.notified(ch(7)).isEmpty, "7 waits for 6")
        let done = feed.changesLoaded(generation: g, [ch(6), ch(7)], complete: true)
        XCTAssertEqual(sent(done, to: 1), [6, 7], "7 once, though read and heard")
        XCTAssertFalse(feed.isResyncing)
    }

    func testListenRestoredRereadsAfterTheHeadAndIgnoresStaleAnswers() {
        var feed = TestFeed()
        _ = feed.subscribe(1, filter: FeedFilter(), lastEventID: nil)
        _ = feed.initialLoaded(1, [], through: 2, complete: true)
        _ = feed.notified(ch(3))
        guard case .readChanges(after: 3, let g1)? = feed.listenRestored().first else { return XCTFail() }
        guard case .readChanges(after: 3, let g2)? = feed.listenRestored().first else { return XCTFail() }
        XCTAssertTrue(feed.changesLoaded(generation: g1, [ch(4)], complete: true).isEmpty, "an older resync's answer")
        _ = feed.notified(ch(6))
        let page = feed.changesLoaded(generation: g2, [ch(4), ch(5)], complete: false)
        XCTAssertEqual(sent(page, to: 1), [4, 5])
        guard case .readChanges(after: 5, _)? = page.last else { return XCTFail("\(page)") }
        XCTAssertEqual(sent(feed.changesLoaded(generation: g2, [ch(6)], complete: true), to: 1), [6])
    }

    func testListenRestoredBeforeAnythingWasHeardDropsReadingStreams() {
        var feed = TestFeed()
        _ = feed.subscribe(1, filter: FeedFilter(), lastEventID: nil)
        _ = feed.subscribe(2, filter: FeedFilter(state: .active), lastEventID: nil)
        _ = feed.initialLoaded(2, [], through: 7, complete: true)
        let r = feed.listenRestored()
        XCTAssertTrue(r.contains { if case .drop(1, .readFailed) = $0 { return true } else { return false } })
        XCTAssertTrue(r.contains { if case .readChanges(after: 7, _) = $0 { return true } else { return false } })
    }

    func testABufferPastTheCapDropsOnlyThatSubscriber() {
        var feed = TestFeed(maxBuffered: 2)
        _ = feed.subscribe(1, filter: FeedFilter(), lastEventID: nil)
        _ = feed.subscribe(2, filter: FeedFilter(machine: "z"), lastEventID: nil)
        _ = feed.notified(ch(1))
        _ = feed.notified(ch(2))
        let r = feed.notified(ch(3))
        guard case .drop(1, .tooFarBehind)? = r.first else { return XCTFail("\(r)") }
        XCTAssertFalse(feed.isSubscribed(1))
        XCTAssertTrue(feed.isSubscribed(2))
        XCTAssertTrue(feed.initialLoaded(1, [], through: 3, complete: true).isEmpty, "a late answer for a dropped stream")
    }

    func testReadersConnectingTogetherShareTheInitialReads() {
        var feed = TestFeed()
        guard case .readInitial(1, _, after: 0, firstHead: nil)? = feed.subscribe(1, filter: FeedFilter(), lastEventID: nil).first else { return XCTFail() }
        XCTAssertTrue(feed.notified(ch(5)).isEmpty, "heard before the second reader came")
        XCTAssertTrue(feed.subscribe(2, filter: FeedFilter(), lastEventID: nil).isEmpty, "no read of its own")
        guard case .readInitial(3, _, after: 0, firstHead: nil)? = feed.subscribe(3, filter: FeedFilter(machine: "x"), lastEventID: nil).first else {
            return XCTFail("another filter reads alone")
        }
        XCTAssertEqual(feed.followerCount, 1)
        XCTAssertTrue(feed.notified(ch(7)).isEmpty)
        let page = feed.initialLoaded(1, [ch(2, "b"), ch(4)], through: 6, complete: false)
        XCTAssertEqual(sent(page, to: 1), [2, 4])
        XCTAssertEqual(sent(page, to: 2), [2, 4])
        XCTAssertTrue(page.contains { if case .sendShared(2, _) = $0 { return true } else { return false } }, "counted as shared")
        let reads = page.compactMap { a -> Int? in if case .readInitial(let s, _, after: 4, firstHead: 6) = a { return s }; return nil }
        XCTAssertEqual(reads, [1], "one read for the next page")
        let done = feed.initialLoaded(1, [ch(6, "c")], through: 6, complete: true)
        // 5 was in the read's snapshot (≤ 6) for both; 7 came after it: both get it once, live.
        XCTAssertEqual(sent(done, to: 1), [6, 7])
        XCTAssertEqual(sent(done, to: 2), [6, 7])
        XCTAssertTrue(feed.isLive(1) && feed.isLive(2))
        XCTAssertEqual(feed.followerCount, 0)
        guard case .readInitial(4, _, after: 0, firstHead: nil)? = feed.subscribe(4, filter: FeedFilter(), lastEventID: nil).first else {
            return XCTFail("a reader after the first page reads for itself")
        }
    }

    func testAFollowerGetsWhatItsLeaderHeardBeforeItCame() {
        var feed = TestFeed()
        _ = feed.subscribe(1, filter: FeedFilter(), lastEventID: nil)
        _ = feed.notified(ch(8))
        _ = feed.subscribe(2, filter: FeedFilter(), lastEventID: nil)
        // The read's snapshot (taken after 1 subscribed) ended at 7: 8 is owed to both.
        let done = feed.initialLoaded(1, [ch(3)], through: 7, complete: true)
        XCTAssertEqual(sent(done, to: 2), [3, 8])
    }

    func testALeaderThatLeavesHandsItsReadToTheNext() {
        var feed = TestFeed()
        _ = feed.subscribe(1, filter: FeedFilter(), lastEventID: nil)
        _ = feed.subscribe(2, filter: FeedFilter(), lastEventID: nil)
        _ = feed.subscribe(3, filter: FeedFilter(), lastEventID: nil)
        let handed = feed.unsubscribe(1)
        guard handed.count == 1, case .readInitial(2, _, after: 0, firstHead: nil) = handed[0] else { return XCTFail("\(handed)") }
        XCTAssertTrue(feed.initialLoaded(1, [ch(1)], through: 1, complete: true).isEmpty, "the gone leader's answer is ignored")
        XCTAssertTrue(feed.subscribe(4, filter: FeedFilter(), lastEventID: nil).isEmpty, "the group can still be joined")
        let done = feed.initialLoaded(2, [ch(1)], through: 1, complete: true)
        for s in [2, 3, 4] { XCTAssertEqual(sent(done, to: s), [1], "reader \(s)") }
        XCTAssertTrue(feed.unsubscribe(3).isEmpty)
    }

    func testAReaderThatFallsBehindReadsOnAlone() {
        var feed = TestFeed()
        _ = feed.subscribe(1, filter: FeedFilter(), lastEventID: nil)
        _ = feed.subscribe(2, filter: FeedFilter(), lastEventID: nil)
        _ = feed.subscribe(3, filter: FeedFilter(), lastEventID: nil)
        // The leader itself stalled: the first that keeps up reads for the rest.
        let page = feed.initialLoaded(1, [ch(2)], through: 9, complete: false) { $0 != 1 }
        let reads = page.compactMap { a -> Int? in if case .readInitial(let s, _, after: 2, firstHead: 9) = a { return s }; return nil }
        XCTAssertEqual(reads.sorted(), [1, 2])
        XCTAssertTrue(feed.initialLoaded(3, [ch(4)], through: 9, complete: true).isEmpty, "3 follows 2 now")
        let alone = feed.initialLoaded(1, [ch(4)], through: 9, complete: true)
        XCTAssertEqual(sent(alone, to: 1), [4])
        XCTAssertEqual(sent(alone, to: 3), [])
        let together = feed.initialLoaded(2, [ch(4)], through: 9, complete: true)
        XCTAssertEqual(sent(together, to: 2), [4])
        XCTAssertEqual(sent(together, to: 3), [4])
    }

    func testResumeRule() {
        XCTAssertTrue(FeedResume.canResume(after: 10, horizon: 10, newest: 20))
        XCTAssertTrue(FeedResume.canResume(after: 20, horizon: 0, newest: 20))
        XCTAssertFalse(FeedResume.canResume(after: 9, horizon: 10, newest: 20), "older than what is kept")
        XCTAssertFalse(FeedResume.canResume(after: 21, horizon: 0, newest: 20), "not issued yet")
    }

    func testRandomInterleavingsAgainstAModelDatabase() {
        var failures: [String] = []
        var checked = 0
        for seed in (0..<UInt64(environmentInt("DISPATCH_PROPERTY_SEEDS", default: 200))).map({ $0 &* 104_729 &+ 3 }) {
            var world = FeedWorld(seed: seed)
            world.run(steps: 400)
            checked += world.checkedStreams
            if let f = world.failure { failures.append("seed \(seed): \(f)") }
        }
        XCTAssertEqual(failures.count, 0, failures.prefix(5).joined(separator: "\n"))
        XCTAssertGreaterThan(checked, 200, "the runs reached live streams to check")
    }
}

/// One process's feed against a model database: commits draw positions in order (some roll
/// back and leave holes), NOTIFYs arrive later in order (some without data, all lost while
/// the LISTEN session is down), reads take their snapshot at a random moment after being
/// issued and answer later, and clients come, go and resume with their last id.
struct FeedWorld {
    struct Client {
        let filter: FeedFilter
        let lastEventID: Int64?
        var ids: [Int64] = []
        var changes: [FCh] = []
        var synced: Int64?
        var reset = false
        var dropped = false
    }

    enum Read {
        case initial(Int, FeedFilter, after: Int64, firstHead: Int64?)
        case replay(Int, FeedFilter, after: Int64)
        case changes(after: Int64, generation: UInt64)
    }

    enum Answer {
        case initial(Int, [FCh], through: Int64, complete: Bool)
        case replay(Int, TestFeed.ReplayPage)
        case changes(UInt64, [FCh], complete: Bool)
    }

    var rng: SeededGenerator
    var feed = TestFeed(maxBuffered: 40, maxPending: 10_000)
    var db: [FCh] = []
    var nextPosition: Int64 = 1
    var notices: [(FCh, withData: Bool)] = []
    var listenUp = true
    var issued: [Read] = []
    var snapshotted: [Answer] = []
    var clients: [Int: Client] = [:]
    var nextClient = 1
    var failure: String?
    var checkedStreams = 0
    let page = 3
    let activities = ["a", "b", "c", "d", "e"]
    let machines: [String: String?] = ["a": "x", "b": "y", "c": nil, "d": "x", "e": "y"]
    var ended: Set<String> = []

    init(seed: UInt64) { rng = SeededGenerator(seed: seed) }

    mutating func run(steps: Int) {
        for _ in 0..<steps where failure == nil {
            switch Int.random(in: 0..<100, using: &rng) {
            case 0..<25: commit()
            case 25..<45: deliverNotice()
            case 45..<55: snapshotARead()
            case 55..<70: answerARead()
            case 70..<78: connect(lastEventID: nil)
            case 78..<82: connect(lastEventID: Int64.random(in: 0...nextPosition + 2, using: &rng))
            case 82..<86: leave()
            case 86..<89: if listenUp { listenUp = false; notices.removeAll() }
            case 89..<92: if !listenUp { listenUp = true; perform(feed.listenRestored()) }
            default: commit()
            }
        }
        // Quiesce: the LISTEN session is up, every notice heard and every read answered.
        if !listenUp { listenUp = true; perform(feed.listenRestored()) }
        var guardSteps = 0
        while failure == nil && (!notices.isEmpty || !issued.isEmpty || !snapshotted.isEmpty) {
            guardSteps += 1
            if guardSteps > 100_000 { failure = "did not quiesce"; return }
            if !notices.isEmpty { deliverNotice() }
            if !issued.isEmpty { snapshotARead() }
            if !snapshotted.isEmpty { answerARead() }
        }
        if failure == nil { check() }
    }

    mutating func commit() {
        let p = nextPosition
        nextPosition += Int64.random(in: 1...2, using: &rng)
        if Int.random(in: 0..<10, using: &rng) == 0 { return } // rolled back: a hole
        let live = activities.filter { !ended.contains($0) }
        guard let a = live.randomElement(using: &rng) else { return }
        let terminal = Int.random(in: 0..<8, using: &rng) == 0
        if terminal { ended.insert(a) }
        let c = FCh(position: p, activity: a, machine: machines[a]!, isTerminal: terminal)
        db.append(c)
        if listenUp { notices.append((c, Int.random(in: 0..<10, using: &rng) != 0)) }
    }

    mutating func deliverNotice() {
        guard !notices.isEmpty else { return }
        let (c, withData) = notices.removeFirst()
        perform(withData ? feed.notified(c) : feed.notifiedWithoutData(position: c.position))
    }

    mutating func connect(lastEventID: Int64?) {
        let id = nextClient
        nextClient += 1
        let filters = [FeedFilter(), FeedFilter(machine: "x"), FeedFilter(state: .active), FeedFilter(state: .finished),
                       FeedFilter(machine: "y", state: .active)]
        let f = filters.randomElement(using: &rng)!
        clients[id] = Client(filter: f, lastEventID: lastEventID)
        perform(feed.subscribe(id, filter: f, lastEventID: lastEventID))
    }

    mutating func leave() {
        guard let id = clients.keys.filter({ !clients[$0]!.dropped }).randomElement(using: &rng) else { return }
        clients[id]!.dropped = true
        perform(feed.unsubscribe(id))
    }

    mutating func snapshotARead() {
        guard !issued.isEmpty else { return }
        let read = issued.remove(at: Int.random(in: 0..<issued.count, using: &rng))
        let newest = db.last?.position ?? 0
        switch read {
        case .initial(let s, let f, let after, let firstHead):
            var latest: [String: FCh] = [:]
            for c in db { latest[c.activity] = c }
            let candidates = latest.values.filter { c in
                guard c.position > after, f.machine == nil || f.machine == c.machine else { return false }
                switch f.state {
                case nil: return true
                case .active?: return !c.isTerminal || (firstHead.map { c.position > $0 } ?? false)
                case .finished?: return c.isTerminal
                }
            }.sorted { $0.position < $1.position }
            let rows = Array(candidates.prefix(page))
            snapshotted.append(.initial(s, rows, through: newest, complete: rows.count < page))
        case .replay(let s, let f, let after):
            if after > nextPosition - 1 { snapshotted.append(.replay(s, .reset)); return }
            let rows = Array(db.filter { $0.position > after && f.matches($0) }.prefix(page))
            let full = rows.count == page
            // `through` is the snapshot's newest position on every page, as the SQL returns it.
            snapshotted.append(.replay(s, .page(rows, through: max(newest, after), complete: !full)))
        case .changes(let after, let g):
            let rows = Array(db.filter { $0.position > after }.prefix(page))
            snapshotted.append(.changes(g, rows, complete: rows.count < page))
        }
    }

    mutating func answerARead() {
        guard !snapshotted.isEmpty else { return }
        switch snapshotted.remove(at: Int.random(in: 0..<snapshotted.count, using: &rng)) {
        case .initial(let s, let rows, let through, let complete):
            // Some members of a group fall behind and read on alone.
            let coin = Int.random(in: 0..<7, using: &rng)
            perform(feed.initialLoaded(s, rows, through: through, complete: complete) { ($0 + coin) % 3 != 0 })
        case .replay(let s, let p): perform(feed.replayLoaded(s, p))
        case .changes(let g, let rows, let complete): perform(feed.changesLoaded(generation: g, rows, complete: complete))
        }
    }

    mutating func perform(_ actions: [TestFeed.Action]) {
        for a in actions {
            switch a {
            case .readChanges(let after, let g): issued.append(.changes(after: after, generation: g))
            case .readInitial(let s, let f, let after, let fh): issued.append(.initial(s, f, after: after, firstHead: fh))
            case .readReplay(let s, let f, let after): issued.append(.replay(s, f, after: after))
            case .send(let s, let cs), .sendShared(let s, let cs):
                guard clients[s] != nil, !clients[s]!.dropped else { failure = "sent to a gone client \(s)"; return }
                for c in cs { receive(s, id: c.position); clients[s]!.changes.append(c) }
            case .synced(let s, let p):
                // `synced` carries P, which may be the last row's own position.
                if let last = clients[s]!.ids.last, p < last { failure = "client \(s): synced \(p) after \(last)"; return }
                clients[s]!.ids.append(p)
                clients[s]!.synced = p
            case .reset(let s):
                clients[s]!.reset = true
            case .drop(let s, _):
                guard let c = clients[s], !c.dropped else { failure = "dropped twice \(s)"; return }
                clients[s]!.dropped = true
                // It reconnects with the last id it saw, as EventSource does.
                let resumeFrom = c.ids.last ?? c.lastEventID
                let id = nextClient
                nextClient += 1
                clients[id] = Client(filter: c.filter, lastEventID: resumeFrom)
                perform(feed.subscribe(id, filter: c.filter, lastEventID: resumeFrom))
            }
        }
    }

    mutating func receive(_ s: Int, id: Int64) {
        if let last = clients[s]!.ids.last, id <= last { failure = "client \(s): id \(id) after \(last)"; return }
        clients[s]!.ids.append(id)
    }

    mutating func check() {
        for (id, c) in clients.sorted(by: { $0.key < $1.key }) where !c.dropped {
            guard feed.isLive(id) else { failure = "client \(id) not live after quiescing"; return }
            checkedStreams += 1
            let real = Dictionary(uniqueKeysWithValues: db.map { ($0.position, $0) })
            for ch in c.changes where real[ch.position] != ch { failure = "client \(id) got \(ch), not stored"; return }
            let from: Int64
            if let l = c.lastEventID, !c.reset {
                from = l
            } else {
                guard let p = c.synced else { failure = "client \(id) never synced"; return }
                from = p
                // The view built from the initial set and the live changes is the database's.
                var view: [String: FCh] = [:]
                for ch in c.changes { view[ch.activity] = ch }
                var latest: [String: FCh] = [:]
                for ch in db { latest[ch.activity] = ch }
                for (a, l) in latest where c.filter.machine == nil || c.filter.machine == l.machine {
                    let shown: Bool
                    switch c.filter.state {
                    case nil: shown = true
                    case .active?: shown = !l.isTerminal
                    case .finished?: shown = l.isTerminal
                    }
                    if shown && view[a] != l { failure = "client \(id) (\(c.filter)) shows \(String(describing: view[a])) for \(a), stored \(l)"; return }
                }
            }
            let expected = db.filter { $0.position > from && c.filter.matches($0) }.map(\.position)
            let got = c.changes.map(\.position).filter { $0 > from }
            if got != expected { failure = "client \(id) (\(c.filter), from \(from)) got \(got), expected \(expected)"; return }
        }
    }
}
