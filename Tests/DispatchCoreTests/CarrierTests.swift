import XCTest
@testable import DispatchCore

/// The NATS carrier's pure parts: message framing, subjects, the sequencer's machine, and
/// the hubs' repair inputs (announcements, "the database holds newer").
final class CarrierMessageTests: XCTestCase {
    func testAChangeRoundTripsWithTabsAndNewlinesEscapedInItsJSON() {
        let c = CarrierMessage.Change(activityID: "TEST-RTORRENT.01:a_b", seq: 42, event: "processing",
                                      json: #"{"status":"a\tb\nc","progress":0.5}"#)
        XCTAssertEqual(CarrierMessage.decodeChange(CarrierMessage.encode(c)), c)
    }

    func testMalformedChangesAreRefusedNotTrapped() {
        for bad in ["", "a", "a\t1", "a\tx\tprocessing\t{}", "a\t0\tprocessing\t{}", "\t1\tprocessing\t{}", "a\t1\t\t{}",
                    "a\t1\tp\t{\n}", "a\t99999999999999999999\tp\t{}"] {
            XCTAssertNil(CarrierMessage.decodeChange(Array(bad.utf8)), bad)
        }
    }

    func testAnnouncementsAreChainedAcrossChunks() {
        let rows = (1...50).map { CarrierMessage.Change(position: Int64(100 + $0), activityID: "a\($0)", seq: 1, event: "queued",
                                                        json: String(repeating: "x", count: 100)) }
        let messages = CarrierMessage.announcements(after: 100, rows, maxBytes: 1000)
        XCTAssertGreaterThan(messages.count, 5)
        var expectedAfter: Int64 = 100
        var all: [CarrierMessage.Change] = []
        for m in messages {
            guard let a = CarrierMessage.decodeAnnouncement(m) else { return XCTFail("undecodable") }
            XCTAssertEqual(a.after, expectedAfter, "each continues from the one before")
            expectedAfter = a.through
            all += a.changes
        }
        XCTAssertEqual(all, rows)
        XCTAssertTrue(CarrierMessage.announcements(after: 7, []).isEmpty)
    }

    func testAnnouncementsOutOfOrderOrMalformedAreRefused() {
        XCTAssertNil(CarrierMessage.decodeAnnouncement(Array("F\t5\n5\ta\t1\tqueued\t{}\n".utf8)), "a position not after `after`")
        XCTAssertNil(CarrierMessage.decodeAnnouncement(Array("F\t5\n7\ta\t1\tqueued\t{}\n6\tb\t1\tqueued\t{}\n".utf8)))
        XCTAssertNil(CarrierMessage.decodeAnnouncement(Array("G\t5\n".utf8)))
        XCTAssertNil(CarrierMessage.decodeAnnouncement([]))
        XCTAssertEqual(CarrierMessage.decodeAnnouncement(Array("F\t5\n".utf8))?.changes, [])
    }

    func testSubjectsHoldAnyIdAsOneToken() {
        let s = CarrierSubjects(prefix: "prod.dispatch")
        for id in ["a", "TEST.RTORRENT:01", "x-y_z.9", String(repeating: "Z", count: 128)] {
            let subject = s.activity(id)
            XCTAssertEqual(subject.split(separator: ".").count, 4, subject)
            XCTAssertEqual(s.activityID(inSubject: subject), id)
        }
        XCTAssertNil(s.activityID(inSubject: "prod.dispatch.activity.zz"))
        XCTAssertNil(s.activityID(inSubject: "prod.dispatch.activity.616"))
        XCTAssertNil(s.activityID(inSubject: "other.activity.61"))
        XCTAssertEqual(s.feed, "prod.dispatch.feed")
    }
}

final class SequencerMachineTests: XCTestCase {
    typealias M = SequencerMachine
    let settings = M.Settings(claimInterval: 1, pollInterval: 0.2, batch: 100)

    func leader(newest: Int64 = 10) -> M {
        var m = M(settings: settings)
        XCTAssertEqual(m.sessionReady(now: 0), [.claim(generation: 1)])
        XCTAssertEqual(m.claimed(newest: newest, generation: 1, now: 0), [.leading(true), .number(limit: 100, generation: 1)])
        return m
    }

    func testACandidateClaimsAtOnceThenEveryIntervalWhileRefused() {
        var m = M(settings: settings)
        XCTAssertEqual(m.tick(now: 0), [], "no session, no claim")
        XCTAssertEqual(m.sessionReady(now: 0), [.claim(generation: 1)])
        XCTAssertEqual(m.tick(now: 0.1), [], "one claim out at a time")
        XCTAssertEqual(m.claimRefused(generation: 1, now: 0.1), [])
        XCTAssertEqual(m.tick(now: 0.5), [])
        XCTAssertEqual(m.woken(now: 0.6), [], "only the leader numbers")
        XCTAssertEqual(m.tick(now: 1.1), [.claim(generation: 1)])
        XCTAssertFalse(m.isLeader)
    }

    func testTheLeaderAnnouncesFromTheNewestPositionItReadAndChainsPasses() {
        var m = leader(newest: 10)
        XCTAssertEqual(m.numbered(count: 3, through: 13, generation: 1, now: 0.01), [.announce(after: 10)])
        XCTAssertEqual(m.woken(now: 0.02), [.number(limit: 100, generation: 1)])
        XCTAssertEqual(m.numbered(count: 2, through: 17, generation: 1, now: 0.03), [.announce(after: 13)],
                       "positions 14-15 lost to a rolled-back pass do not break the chain")
        XCTAssertEqual(m.role, .leader(announced: 17))
    }

    func testWakeUpsDuringAPassRunOneMorePassAfterIt() {
        var m = leader()
        XCTAssertEqual(m.woken(now: 0.01), [])
        XCTAssertEqual(m.woken(now: 0.02), [])
        XCTAssertEqual(m.numbered(count: 0, through: nil, generation: 1, now: 0.03), [.number(limit: 100, generation: 1)])
        XCTAssertEqual(m.numbered(count: 0, through: nil, generation: 1, now: 0.04), [], "then it waits for the poll")
        XCTAssertEqual(m.tick(now: 0.1), [])
        XCTAssertEqual(m.tick(now: 0.25), [.number(limit: 100, generation: 1)])
    }

    func testAFullPassIsFollowedAtOnce() {
        var m = leader()
        XCTAssertEqual(m.numbered(count: 100, through: 110, generation: 1, now: 0.01),
                       [.announce(after: 10), .number(limit: 100, generation: 1)])
    }

    func testALostSessionStepsDownAndLateAnswersChangeNothing() {
        var m = leader()
        XCTAssertEqual(m.sessionLost(now: 1), [.leading(false)])
        XCTAssertEqual(m.numbered(count: 5, through: 15, generation: 1, now: 1.1), [], "the old session's pass")
        XCTAssertEqual(m.tick(now: 2), [], "no session")
        XCTAssertEqual(m.sessionReady(now: 3), [.claim(generation: 3)])
        XCTAssertEqual(m.claimed(newest: 15, generation: 1, now: 3), [], "an old claim's answer")
        XCTAssertEqual(m.claimed(newest: 15, generation: 3, now: 3), [.leading(true), .number(limit: 100, generation: 3)])
    }

    func testAFailedPassKeepsTheLeadAndRetriesAfterThePoll() {
        var m = leader()
        XCTAssertEqual(m.passFailed(generation: 1, now: 1), [])
        XCTAssertTrue(m.isLeader)
        XCTAssertEqual(m.tick(now: 1.1), [])
        XCTAssertEqual(m.tick(now: 1.3), [.number(limit: 100, generation: 1)])
        XCTAssertEqual(m.numbered(count: 1, through: 11, generation: 1, now: 1.4), [.announce(after: 10)])
    }
}

/// The hubs' inputs for the carrier's repairs.
final class CarrierHubTests: XCTestCase {
    struct E: HubEvent, Equatable { let seq: Int64; let isTerminal: Bool }
    func ch(_ p: Int64) -> FCh { FCh(position: p, activity: "a", machine: nil, isTerminal: false) }

    func sent(_ actions: [TestFeed.Action], to s: Int) -> [Int64] {
        actions.flatMap { a -> [Int64] in
            if case .send(s, let cs) = a { return cs.map(\.position) }
            if case .sendShared(s, let cs) = a { return cs.map(\.position) }
            return []
        }
    }

    func live(_ feed: inout TestFeed, _ s: Int, through: Int64) {
        _ = feed.subscribe(s, filter: FeedFilter(), lastEventID: nil)
        _ = feed.initialLoaded(s, [], through: through, complete: true)
    }

    func testAnAnnouncementThatContinuesTheChainIsDelivered() {
        var feed = TestFeed()
        live(&feed, 1, through: 10)
        XCTAssertEqual(sent(feed.announced(after: 10, [ch(11), ch(12)]), to: 1), [11, 12])
        XCTAssertEqual(sent(feed.announced(after: 12, [ch(14)]), to: 1), [14])
    }

    func testABrokenChainRereadsFromTheDatabaseThenAppliesWhatWaited() {
        var feed = TestFeed()
        live(&feed, 1, through: 10)
        _ = feed.announced(after: 10, [ch(11)])
        let gap = feed.announced(after: 13, [ch(14), ch(15)])
        guard case .readChanges(after: 11, let g)? = gap.first else { return XCTFail("\(gap)") }
        XCTAssertTrue(feed.announced(after: 15, [ch(16)]).isEmpty, "waits behind the read")
        XCTAssertEqual(sent(feed.changesLoaded(generation: g, [ch(12), ch(13), ch(14)], complete: true), to: 1), [12, 13, 14, 15, 16])
    }

    func testTheFirstAnnouncementCatchesUpLiveReadersThatAreBehindIt() {
        var feed = TestFeed()
        live(&feed, 1, through: 10)
        let first = feed.announced(after: 20, [ch(21)])
        guard case .readChanges(after: 10, let g)? = first.first else { return XCTFail("\(first)") }
        XCTAssertEqual(sent(feed.changesLoaded(generation: g, [ch(15), ch(20)], complete: true), to: 1), [15, 20, 21])
    }

    func testAReaderWhoseReadEndedBeforeTheChainBeganReadsTheRestBeforeGoingLive() {
        var feed = TestFeed()
        _ = feed.subscribe(1, filter: FeedFilter(), lastEventID: nil)
        XCTAssertTrue(feed.announced(after: 20, [ch(21)]).isEmpty, "buffered while it reads")
        let done = feed.initialLoaded(1, [ch(3)], through: 18, complete: true)
        guard case .readReplay(1, _, after: 18)? = done.last else { return XCTFail("\(done)") }
        let replay = feed.replayLoaded(1, .page([ch(19), ch(20), ch(21)], through: 21, complete: true))
        XCTAssertEqual(sent(done, to: 1) + sent(replay, to: 1), [3, 19, 20, 21])
        XCTAssertEqual(sent(feed.announced(after: 21, [ch(22)]), to: 1), [22])
    }

    func testWithoutReadersOnlyThePlaceInTheChainIsKept() {
        var feed = TestFeed()
        XCTAssertTrue(feed.announced(after: 5, [ch(6)]).isEmpty)
        XCTAssertTrue(feed.announced(after: 9, [ch(10)]).isEmpty, "no read for nobody")
        XCTAssertEqual(feed.head, 10)
        feed.sourceDetached()
        XCTAssertNil(feed.head)
    }

    func testTheDatabaseHoldingANewerPositionIsAGap() {
        var feed = TestFeed()
        live(&feed, 1, through: 10)
        _ = feed.announced(after: 10, [ch(11)])
        XCTAssertTrue(feed.announced(after: 11, []).isEmpty, "nothing newer")
        guard case .readChanges(after: 11, _)? = feed.announced(after: 12, []).first else { return XCTFail() }
    }

    func testAStatusTopicBehindTheDatabaseRereadsItsHistory() {
        var hub = Hub<Int, E>()
        _ = hub.subscribe(1, topic: "a", lastEventID: nil)
        _ = hub.snapshotLoaded(topic: "a", generation: 1, E(seq: 3, isTerminal: false))
        XCTAssertEqual(hub.syncedTopics.map(\.seq), [3])
        XCTAssertTrue(hub.behind(topic: "a", seq: 3).isEmpty, "not newer")
        XCTAssertTrue(hub.behind(topic: "b", seq: 9).isEmpty, "not held")
        guard case .readTopicHistory(topic: "a", generation: 1, after: 3)? = hub.behind(topic: "a", seq: 5).first else { return XCTFail() }
        XCTAssertTrue(hub.syncedTopics.isEmpty, "resyncing")
        let loaded = hub.topicHistoryLoaded(topic: "a", generation: 1, [E(seq: 4, isTerminal: false), E(seq: 5, isTerminal: false)])
        var seqs: [Int64] = []
        for a in loaded { if case .send(1, let es) = a { seqs += es.map(\.seq) } }
        XCTAssertEqual(seqs, [4, 5])
    }
}

final class FeedResumeSyncedTests: XCTestCase {
    func testAResumedFeedSaysSyncedOnceItCaughtUpAndOnlyOnce() {
        var feed = TestFeed()
        _ = feed.subscribe(1, filter: FeedFilter(), lastEventID: 3)
        let cut = feed.replayLoaded(1, .page([FCh(position: 4, activity: "a", machine: nil, isTerminal: false)], through: 9, complete: false))
        XCTAssertFalse(cut.contains { if case .synced = $0 { return true }; return false }, "not while it still catches up")
        let done = feed.replayLoaded(1, .page([FCh(position: 6, activity: "a", machine: nil, isTerminal: false)], through: 8, complete: true))
        let synced = done.compactMap { a -> Int64? in if case .synced(1, let p) = a { return p }; return nil }
        XCTAssertEqual(synced, [8])
        XCTAssertTrue(feed.isLive(1))
    }

    func testACatchUpForTheCarriersChainAfterSyncedSaysNothingMore() {
        var feed = TestFeed()
        _ = feed.subscribe(1, filter: FeedFilter(), lastEventID: nil)
        _ = feed.announced(after: 20, [FCh(position: 21, activity: "a", machine: nil, isTerminal: false)])
        let first = feed.initialLoaded(1, [], through: 18, complete: true)
        XCTAssertEqual(first.filter { if case .synced = $0 { return true }; return false }.count, 1)
        let after = feed.replayLoaded(1, .page([FCh(position: 21, activity: "a", machine: nil, isTerminal: false)], through: 21, complete: true))
        XCTAssertFalse(after.contains { if case .synced = $0 { return true }; return false })
    }
}
