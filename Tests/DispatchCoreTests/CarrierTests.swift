import XCTest
@testable import DispatchCore

/// The NATS carrier's pure parts: hint framing, subjects, the numbering passes' machine, the
/// liveness probe, and the hubs' inputs for hints ("read from the database after here").
final class CarrierMessageTests: XCTestCase {
    func testHintsRoundTripAndCarryNoSnapshot() {
        let h = CarrierMessage.ActivityHint(seq: 42, event: "cancel_requested")
        let bytes = CarrierMessage.encode(h)
        XCTAssertEqual(String(decoding: bytes, as: UTF8.self), "42\tcancel_requested")
        XCTAssertEqual(CarrierMessage.decodeActivityHint(bytes), h)
        XCTAssertEqual(CarrierMessage.decodeFeedHint(CarrierMessage.feedHint(through: 9_000_000_000)), 9_000_000_000)
    }

    func testMalformedHintsAreRefusedNotTrapped() {
        // What the carrier used to carry (a change with its snapshot) is no hint any more.
        for bad in ["", "a", "1", "x\tprocessing", "0\tprocessing", "1\t", "1\tProcessing", "1\tp\t{}", "1\tp rocessing",
                    "99999999999999999999\tprocessing", "9223372036854775808\tprocessing",
                    "TEST\t5\tcompleted\t{\"state\":\"completed\"}"] {
            XCTAssertNil(CarrierMessage.decodeActivityHint(Array(bad.utf8)), bad)
        }
        for bad in ["", "F", "F\t", "F\t0", "F\t-1", "G\t5", "F\t5\t6", "F\t5\n6\ta\t1\tqueued\t{}", "F\t9223372036854775808"] {
            XCTAssertNil(CarrierMessage.decodeFeedHint(Array(bad.utf8)), bad)
        }
        XCTAssertEqual(CarrierMessage.decodeActivityHint(Array("9223372036854775807\tcompleted".utf8))?.seq, Int64.max,
                       "a far-ahead seq decodes: harmless, since it only says where to read")
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
        for subject in [s.feed, s.sequencer, s.starts, s.probe("w0"), s.activity("a")] {
            XCTAssertTrue(subject.hasPrefix("prod.dispatch."), "every subject is under the prefix: \(subject)")
        }
    }
}

final class SequencerMachineTests: XCTestCase {
    typealias M = SequencerMachine
    let settings = M.Settings(pollInterval: 0.2, busyRetry: 0.02, batch: 100)

    func ready() -> M {
        var m = M(settings: settings)
        XCTAssertEqual(m.sessionReady(now: 0), [.number(limit: 100, generation: 1)], "no election: a pass at once")
        return m
    }

    func testAPassAnnouncesOnlyWhereItGotAndThenPolls() {
        var m = ready()
        XCTAssertEqual(m.numbered(count: 3, through: 13, generation: 1, now: 0.01), [.announce(through: 13)])
        XCTAssertEqual(m.tick(now: 0.1), [], "polls every 0.2 s")
        XCTAssertEqual(m.tick(now: 0.22), [.number(limit: 100, generation: 1)])
        XCTAssertEqual(m.numbered(count: 0, through: nil, generation: 1, now: 0.23), [], "nothing numbered, nothing said")
    }

    func testALockHeldElsewhereIsTriedAgainSoonNotWaitedFor() {
        var m = ready()
        XCTAssertEqual(m.busy(generation: 1, now: 0.01), [])
        XCTAssertFalse(m.passInFlight, "holds nothing while another server numbers")
        XCTAssertEqual(m.tick(now: 0.05), [])
        XCTAssertEqual(m.tick(now: 0.12), [.number(limit: 100, generation: 1)], "within a few busy retries, far below the poll")
        _ = m.woken(now: 0.13)
        XCTAssertEqual(m.busy(generation: 1, now: 0.14), [])
        XCTAssertEqual(m.tick(now: 0.161), [.number(limit: 100, generation: 1)], "woken meanwhile: retried at the busy retry")
    }

    func testWakeUpsDuringAPassRunOneMorePassAfterIt() {
        var m = ready()
        XCTAssertEqual(m.woken(now: 0.01), [])
        XCTAssertEqual(m.woken(now: 0.02), [])
        XCTAssertEqual(m.numbered(count: 1, through: 5, generation: 1, now: 0.03), [.announce(through: 5), .number(limit: 100, generation: 1)])
        XCTAssertEqual(m.numbered(count: 0, through: nil, generation: 1, now: 0.04), [])
    }

    func testAFullPassIsFollowedAtOnce() {
        var m = ready()
        XCTAssertEqual(m.numbered(count: 100, through: 100, generation: 1, now: 0.01), [.announce(through: 100), .number(limit: 100, generation: 1)])
    }

    func testALostSessionStopsPassesAndLateAnswersChangeNothing() {
        var m = ready()
        m.sessionLost(now: 0.5)
        XCTAssertEqual(m.numbered(count: 5, through: 15, generation: 1, now: 0.6), [], "an answer from the lost session")
        XCTAssertEqual(m.woken(now: 0.6), [])
        XCTAssertEqual(m.tick(now: 5), [])
        XCTAssertEqual(m.sessionReady(now: 6), [.number(limit: 100, generation: 3)])
        XCTAssertEqual(m.busy(generation: 1, now: 6.1), [], "stale")
        XCTAssertTrue(m.passInFlight)
    }

    func testAFailedPassRetriesAfterThePoll() {
        var m = ready()
        XCTAssertEqual(m.passFailed(generation: 1, now: 1), [])
        XCTAssertEqual(m.tick(now: 1.1), [])
        XCTAssertEqual(m.tick(now: 1.3), [.number(limit: 100, generation: 1)])
    }
}

final class CarrierProbeTests: XCTestCase {
    func testAProbeThatComesBackKeepsTheCarrierLive() {
        var p = CarrierProbe(settings: .init(interval: 1, deadline: 3))
        XCTAssertEqual(p.connected(now: 0), [.send(1)])
        XCTAssertEqual(p.heard(1, now: 0.01), [])
        XCTAssertEqual(p.tick(now: 0.5), [])
        XCTAssertEqual(p.tick(now: 1.0), [.send(2)])
        XCTAssertEqual(p.heard(2, now: 1.02), [])
        XCTAssertFalse(p.isStalled)
        XCTAssertEqual(p.lastRoundTrip ?? 0, 0.02, accuracy: 1e-9)
    }

    func testASilentCarrierIsStalledOnceThenRecoversWhenAProbeReturns() {
        var p = CarrierProbe(settings: .init(interval: 1, deadline: 3))
        _ = p.connected(now: 0)
        XCTAssertEqual(p.tick(now: 1), [.send(2)])
        XCTAssertEqual(p.tick(now: 2), [.send(3)])
        XCTAssertEqual(p.tick(now: 3), [.stalled, .send(4)], "probe 1 is 3 s late")
        XCTAssertTrue(p.isStalled)
        XCTAssertEqual(p.tick(now: 4), [.send(5)], "reported once")
        XCTAssertEqual(p.heard(99, now: 4.1), [], "a number never sent (forged) proves nothing")
        XCTAssertTrue(p.isStalled)
        XCTAssertEqual(p.heard(4, now: 4.2), [.recovered])
        XCTAssertEqual(p.stalls, 1)
    }

    func testADisconnectedCarrierIsNotAStall() {
        var p = CarrierProbe(settings: .init(interval: 1, deadline: 3))
        _ = p.connected(now: 0)
        p.disconnected()
        XCTAssertEqual(p.tick(now: 10), [])
        XCTAssertFalse(p.isStalled)
        XCTAssertEqual(p.connected(now: 11), [.send(2)])
    }
}

/// The hubs' inputs for the carrier's hints and repairs.
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

    func testAHintIsReadFromTheDatabaseNeverTakenAsAPosition() {
        var feed = TestFeed()
        live(&feed, 1, through: 10)
        let read = feed.hinted(position: 12)
        guard case .readChanges(after: 10, let g)? = read.first else { return XCTFail("\(read)") }
        XCTAssertEqual(sent(feed.changesLoaded(generation: g, [ch(11), ch(12)], complete: true), to: 1), [11, 12])
        XCTAssertEqual(feed.head, 12)
        XCTAssertTrue(feed.hinted(position: 12).isEmpty, "nothing new: no read")
    }

    func testAForgedFarAheadHintCostsOneReadAndFreezesNothing() {
        var feed = TestFeed()
        live(&feed, 1, through: 10)
        let forged = feed.hinted(position: Int64.max - 1)
        guard case .readChanges(after: 10, let g)? = forged.first else { return XCTFail("\(forged)") }
        XCTAssertTrue(feed.changesLoaded(generation: g, [], complete: true).isEmpty, "the database has nothing newer: nothing sent")
        XCTAssertEqual(feed.head, 10, "the hint did not move the feed's place")
        let real = feed.hinted(position: 11)
        guard case .readChanges(after: 10, let g2)? = real.first else { return XCTFail("a real change after the forgery is still read: \(real)") }
        XCTAssertEqual(sent(feed.changesLoaded(generation: g2, [ch(11)], complete: true), to: 1), [11])
    }

    func testHintsDuringAReadAreReadOnceAfterIt() {
        var feed = TestFeed()
        live(&feed, 1, through: 10)
        guard case .readChanges(after: 10, let g)? = feed.hinted(position: 11).first else { return XCTFail() }
        XCTAssertTrue(feed.hinted(position: 13).isEmpty, "waits behind the read")
        XCTAssertTrue(feed.hinted(position: 14).isEmpty)
        let after = feed.changesLoaded(generation: g, [ch(11)], complete: true)
        XCTAssertEqual(sent(after, to: 1), [11])
        guard case .readChanges(after: 11, let g2)? = after.last else { return XCTFail("one more read: \(after)") }
        let last = feed.changesLoaded(generation: g2, [ch(12), ch(14)], complete: true)
        XCTAssertEqual(sent(last, to: 1), [12, 14])
        XCTAssertFalse(last.contains { if case .readChanges = $0 { return true }; return false }, "and only one")
    }

    func testAHintWhileEveryoneStillReadsIsReadWhenTheFirstGoesLive() {
        var feed = TestFeed()
        _ = feed.subscribe(1, filter: FeedFilter(), lastEventID: nil)
        XCTAssertTrue(feed.hinted(position: 21).isEmpty, "no live reader: nothing to read after yet")
        let done = feed.initialLoaded(1, [ch(3)], through: 18, complete: true)
        guard case .readChanges(after: 18, let g)? = done.last else { return XCTFail("\(done)") }
        XCTAssertEqual(sent(feed.changesLoaded(generation: g, [ch(19), ch(21)], complete: true), to: 1), [19, 21])
    }

    func testWithoutReadersAHintKeepsNothing() {
        var feed = TestFeed()
        XCTAssertTrue(feed.hinted(position: 6).isEmpty)
        XCTAssertNil(feed.head, "no place taken from a message")
    }

    func testAHintWhileTheTopicReReadsIsCheckedOnceAfterIt() {
        var hub = Hub<Int, E>()
        _ = hub.subscribe(1, topic: "a", lastEventID: nil)
        _ = hub.snapshotLoaded(topic: "a", generation: 1, E(seq: 3, isTerminal: false))
        guard case .readTopicHistory(topic: "a", generation: 1, after: 3)? = hub.behind(topic: "a", seq: 4).first else { return XCTFail() }
        XCTAssertTrue(hub.behind(topic: "a", seq: 6).isEmpty, "remembered while the read is out")
        let loaded = hub.topicHistoryLoaded(topic: "a", generation: 1, [E(seq: 4, isTerminal: false)])
        guard case .readTopicHistory(topic: "a", generation: 1, after: 4)? = loaded.last else { return XCTFail("read again: \(loaded)") }
        let again = hub.topicHistoryLoaded(topic: "a", generation: 1, [])
        XCTAssertTrue(again.isEmpty, "a hint beyond what is stored (forged) is read once, not for ever")
        XCTAssertEqual(hub.syncedTopics.map(\.seq), [4])
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

    func testACatchUpAfterSyncedSaysNothingMore() {
        var feed = TestFeed()
        _ = feed.subscribe(1, filter: FeedFilter(), lastEventID: nil)
        _ = feed.hinted(position: 21)
        let first = feed.initialLoaded(1, [], through: 18, complete: true)
        XCTAssertEqual(first.filter { if case .synced = $0 { return true }; return false }.count, 1)
        guard case .readChanges(after: 18, let g)? = first.last else { return XCTFail("\(first)") }
        let after = feed.changesLoaded(generation: g, [FCh(position: 21, activity: "a", machine: nil, isTerminal: false)], complete: true)
        XCTAssertFalse(after.contains { if case .synced = $0 { return true }; return false })
    }
}
