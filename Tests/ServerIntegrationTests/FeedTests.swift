import DispatchSystem
import DispatchCore
import DispatchIO
@testable import DispatchServer
import DispatchTestSupport
import Foundation
import Glibc
import XCTest

extension TestServer {
    func feed(_ query: String = "", lastEventID: Int64? = nil) throws -> SSEClient {
        try SSEClient(port: port, path: "/v1/stream" + (query.isEmpty ? "" : "?" + query), token: adminKey, lastEventID: lastEventID)
    }

    /// Every stored position after `after`, in order: what a feed must deliver.
    func positions(after: Int64) throws -> [Int64] {
        try TestPostgres.shared().sql(conninfo, "SELECT position FROM activity_events WHERE position > $1::bigint ORDER BY position",
                                      [String(after)]).compactMap { $0[0].flatMap { Int64($0) } }
    }

    /// The change's feed position; with the NATS carrier the sequencer numbers it just after
    /// its commit, so this waits for it (a few seconds at most).
    func position(of id: String, seq: Int64) throws -> Int64? {
        var position: Int64?
        _ = try waitUntil(5) {
            position = try TestPostgres.shared().sql(conninfo, "SELECT position FROM activity_events WHERE activity_id = $1 AND seq = $2::bigint",
                                                     [id, String(seq)]).first?[0].flatMap { Int64($0) }
            return position != nil
        }
        return position
    }
}

extension SSEClient {
    /// Pumps until `event: synced`; returns its position.
    func waitSynced(timeout: Double = 20) throws -> Int64? {
        try pump(timeout: timeout) { $0.events.contains { $0.event == "synced" } || $0.ended }
        return events.first { $0.event == "synced" }.flatMap { $0.id.flatMap { Int64($0) } }
    }

    /// Changes after the initial set (all of them on a resumed feed not reset, whose replay
    /// also ends with `synced`): ids of events other than synced/reset.
    var changeIDs: [Int64] {
        let resumed = lastEventID != nil && !events.contains { $0.event == "reset" }
        let start = resumed ? 0 : (events.firstIndex { $0.event == "synced" }).map { $0 + 1 } ?? 0
        return events[start...].filter { $0.event != "synced" && $0.event != "reset" }.compactMap { $0.id.flatMap { Int64($0) } }
    }
}

/// A thread-safe list for publisher threads.
final class Collected<T>: @unchecked Sendable {
    private let lock = NSLock()
    private var items: [T] = []
    func append(_ t: T) { lock.lock(); items.append(t); lock.unlock() }
    var all: [T] { lock.lock(); defer { lock.unlock() }; return items }
}

/// The feed, `GET /v1/stream` (contract §8), against real servers and PostgreSQL.
final class FeedTests: XCTestCase {
    func testInitialSetThenSyncedThenLiveChangesInPositionOrder() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        try s.startActivity("first", extra: #","machine":"xerxes""#)
        try s.startActivity("done", extra: #","machine":"shodan""#)
        try s.end("done")
        try s.startActivity("second")
        try s.update("first", #"{"progress":0.3,"status":"going"}"#)

        let f = try s.feed()
        guard let p = try f.waitSynced() else { return XCTFail("no synced: \(f.events)") }
        XCTAssertEqual(f.status, 200)
        XCTAssertEqual(f.headers["content-type"], "text/event-stream")
        let initial = Array(f.events.prefix { $0.event != "synced" })
        // Oldest first by the position of each activity's latest change; one row per activity.
        XCTAssertEqual(initial.map { $0.event }, ["completed", "processing", "processing"])
        XCTAssertEqual(initial.compactMap { (try? JSONParser.parse($0.data))?["activityId"]?.stringValue }, ["done", "second", "first"])
        let ids = initial.compactMap { $0.id.flatMap { Int64($0) } }
        XCTAssertEqual(ids, [try s.position(of: "done", seq: 2), try s.position(of: "second", seq: 1), try s.position(of: "first", seq: 2)])
        XCTAssertEqual(p, try s.positions(after: 0).last, "synced carries the newest position")
        XCTAssertEqual(f.events.first { $0.event == "synced" }?.data, #"{"position":\#(p)}"#)

        try s.update("second", #"{"progress":0.5}"#)
        try s.end("first")
        try s.startActivity("third")
        XCTAssertTrue(try f.pump(timeout: 10) { $0.changeIDs.count >= 3 })
        XCTAssertEqual(f.changeIDs, try s.positions(after: p))
        let live = f.events.suffix(3)
        XCTAssertEqual(live.map(\.event), ["processing", "completed", "processing"])
        XCTAssertEqual(try JSONParser.parse(live.last!.data)["activityId"]?.stringValue, "third")
    }

    func testFilters() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        try s.startActivity("x1", extra: #","machine":"xerxes""#)
        try s.startActivity("s1", extra: #","machine":"shodan""#)
        try s.startActivity("x2", extra: #","machine":"xerxes""#)
        try s.end("x2")
        let byMachine = try s.feed("machine=xerxes")
        let active = try s.feed("state=active")
        let finished = try s.feed("state=finished")
        for f in [byMachine, active, finished] { XCTAssertNotNil(try f.waitSynced()) }
        func rows(_ f: SSEClient) -> [String] {
            f.events.prefix { $0.event != "synced" }.compactMap { (try? JSONParser.parse($0.data))?["activityId"]?.stringValue }
        }
        XCTAssertEqual(rows(byMachine), ["x1", "x2"])
        XCTAssertEqual(rows(active), ["x1", "s1"])
        XCTAssertEqual(rows(finished), ["x2"])
        try s.update("s1")
        try s.update("x1")
        try s.end("x1")
        // x1's end is the last change: a feed that has it was passed every earlier one (a feed
        // goes in position order), so what it holds then is all it will ever hold of these.
        XCTAssertTrue(try byMachine.pump(timeout: 10) { $0.events.last?.event == "completed" })
        XCTAssertTrue(try active.pump(timeout: 10) { $0.changeIDs.count >= 3 }, "active follows live activities to their end")
        XCTAssertTrue(try finished.pump(timeout: 10) { $0.events.last?.event == "completed" })
        XCTAssertEqual(byMachine.events.suffix(2).map(\.event), ["processing", "completed"])
        XCTAssertEqual(finished.events.suffix(1).map(\.event), ["completed"])
        XCTAssertEqual(byMachine.changeIDs.count, 2, "shodan's change is not on the xerxes feed")
        XCTAssertEqual(finished.changeIDs.count, 1, "a progress change is not a finish")

        for bad in ["state=done", "machine=", "nope=1", "machine=\(String(repeating: "m", count: 65))"] {
            let r = try s.client.get("/v1/stream?\(bad)")
            XCTAssertEqual(r.status, 400, bad)
            XCTAssertEqual(r.errorCode, "invalid_query", bad)
        }
        XCTAssertEqual(try HTTPClient(port: s.port).get("/v1/stream").status, 401)
        let token = try SSEClient(port: s.port, path: "/v1/stream?access_token=\(s.adminKey)", token: nil)
        XCTAssertNotNil(try token.waitSynced(), "?access_token= as for status streams (EventSource)")
    }

    func testResumeAfterAPositionAcrossARestartHasNoGapOrDuplicate() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        try s.startActivity("r")
        let f = try s.feed()
        guard let p = try f.waitSynced() else { return XCTFail() }
        for i in 1...5 { try s.update("r", #"{"progress":\#(Double(i) / 10)}"#) }
        XCTAssertTrue(try f.pump(timeout: 10) { $0.changeIDs.count >= 5 })
        let seenBefore = f.changeIDs
        try s.restart()
        XCTAssertTrue(try f.waitForEnd(timeout: 5), "the restart ends the feed")
        for i in 6...9 { try s.update("r", #"{"progress":\#(Double(i) / 10)}"#) }
        let resumed = try s.feed(lastEventID: seenBefore.last)
        for i in 10...12 { try s.update("r", #"{"status":"step \#(i)"}"#) }
        // `synced` can follow the last change (it comes once the resume has caught up): wait for both.
        XCTAssertTrue(try resumed.pump(timeout: 10) { c in c.changeIDs.count >= 7 && c.events.contains { $0.event == "synced" } })
        XCTAssertFalse(resumed.events.contains { $0.event == "reset" }, "a resume is not a new initial set")
        XCTAssertEqual(resumed.events.filter { $0.event == "synced" }.count, 1, "a resume says synced once, when it is live (§8)")
        XCTAssertEqual(seenBefore + resumed.changeIDs, try s.positions(after: p))
    }

    /// Two server processes publish thousands of changes at once while one reader keeps
    /// disconnecting (FIN or RST) at random points and resuming with Last-Event-ID on either
    /// server: what it saw, put together, is every change exactly once, in position order.
    func testTwoServersPublishingWhileAReaderDropsAtRandomSeeEveryChangeOnce() throws {
        let a = try TestServer.start()
        defer { a.stop() }
        let b = try TestServer.start(conninfo: a.conninfo)
        defer { b.stop() }
        let ids = (0..<4).map { "busy-\($0)" }
        for (i, id) in ids.enumerated() { try (i % 2 == 0 ? a : b).startActivity(id) }
        var reader = try a.feed()
        guard let p0 = try reader.waitSynced() else { return XCTFail() }

        let perPublisher = 750
        let failures = Collected<String>()
        let group = DispatchGroup()
        for (i, id) in ids.enumerated() {
            let server = i % 2 == 0 ? a : b
            DispatchQueue.global().async(group: group) {
                for n in 0..<perPublisher {
                    let r = try? server.client.post("/v1/activities/\(id)/update", #"{"progress":\#(Double(n) / Double(perPublisher))}"#)
                    if r?.status != 200 { failures.append("\(id) \(n): \(r?.status ?? 0) \(r?.text ?? "")") }
                }
            }
        }
        var seen: [Int64] = []
        var rng = SeededGenerator(seed: 0xFEED)
        var reconnects = 0
        let deadline = Clock.monotonic() + 120
        while Clock.monotonic() < deadline {
            let target = Int.random(in: 1...250, using: &rng)
            try reader.pump(timeout: 1) { $0.changeIDs.count >= target || $0.ended }
            seen += reader.changeIDs
            if group.wait(timeout: .now()) == .success, let newest = try a.positions(after: 0).last, seen.last ?? p0 >= newest { break }
            if Bool.random(using: &rng) { reader.close() } else { reader.reset() }
            reconnects += 1
            reader = try (Bool.random(using: &rng) ? a : b).feed(lastEventID: seen.last ?? p0)
        }
        reader.close()
        XCTAssertEqual(failures.all, [])
        let expected = try a.positions(after: p0)
        XCTAssertEqual(expected.count, ids.count * perPublisher)
        XCTAssertEqual(seen.count, Set(seen).count, "no change twice")
        let missing = Set(expected).subtracting(seen).sorted(), extra = Set(seen).subtracting(expected).sorted()
        XCTAssertTrue(missing.isEmpty && extra.isEmpty, "missing \(missing.prefix(20)), never stored \(extra.prefix(20))")
        XCTAssertTrue(seen == expected, "every change once, in position order (\(reconnects) reconnects)")
        XCTAssertGreaterThan(reconnects, 10)
    }

    /// The interleaving that breaks positions drawn at insert time (FEED.md): a publish
    /// transaction draws its position and stays open while another server commits a later
    /// change. This test's own session is that slow publisher, running the server's own
    /// statements (change, position lock, finalize) and holding the commit for a second.
    func testADelayedCommitIsNeverSkippedAndOrderHolds() throws {
        try XCTSkipIf(TestCarrier.isNATS, "with NATS no lock orders commits: NATSCarrierTests.testADelayedCommitIsNeitherWaitedForNorSkipped")
        let a = try TestServer.start()
        defer { a.stop() }
        let b = try TestServer.start(conninfo: a.conninfo)
        defer { b.stop() }
        try a.startActivity("held")
        try b.startActivity("other")
        let live = try a.feed()
        guard let p0 = try live.waitSynced() else { return XCTFail() }
        let resumer = try b.feed(lastEventID: p0)
        XCTAssertTrue(try resumer.pump(timeout: 10) { $0.status == 200 })

        guard let json = try a.client.get("/v1/activities/held").json, var next = Activity.decode(json) else { return XCTFail() }
        let expectedSeq = next.seq
        next.seq += 1
        next.progress = 0.25
        next.updatedAt = Clock.nowMilliseconds()
        let event = ActivityEvent(name: .state(.processing), snapshot: next)
        let pg = try BlockingPG(a.conninfo)
        try pg.script("BEGIN")
        let change = try pg.query(ActivityRepository.updatesStatement([.init(event: event, expectedSeq: expectedSeq, endFingerprint: nil,
                                                                             cancelReason: nil, webhook: nil, idempotencyKey: nil,
                                                                             staleTouch: nil)]))
        XCTAssertEqual(change.rows.count, 1)
        _ = try pg.query(ActivityRepository.positionLock)
        let applied = ActivityRepository.Change(activityID: "held", seq: next.seq, event: event.name.rawValue, data: String(decoding: next.json(), as: UTF8.self),
                                                idempotencyKey: nil, createdMs: next.updatedAt, pushPriority: 5)
        let fin = try pg.query(ActivityRepository.finalizeStatement([applied], pushes: false, now: Clock.nowMilliseconds()))
        guard let heldPosition = fin.first?.int64("position") else { return XCTFail("no position drawn") }

        // Another server publishes while the held transaction is open.
        let other = Collected<Int>()
        let done = DispatchSemaphore(value: 0)
        DispatchQueue.global().async {
            other.append((try? b.update("other", #"{"progress":0.9}"#).status) ?? 0)
            done.signal()
        }
        // Its batch is queued behind the held transaction's position lock (a session of this
        // database waits on a lock), not merely not sent yet.
        let waiting = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        XCTAssertTrue(try waitUntil(10) { ((try TestPostgres.shared().sql(a.conninfo, waiting).first?.first ?? nil).flatMap { Int($0) } ?? 0) >= 1 },
                      "the later publish waits on the position lock")
        try live.pump(timeout: 0.2)
        try resumer.pump(timeout: 0.2)
        // The later publish waits for the position lock the held transaction owns, so no
        // reader can have seen a position beyond the held one yet.
        XCTAssertEqual(other.all, [], "the later publish is not acknowledged while the earlier position is open")
        XCTAssertEqual(live.changeIDs, [])
        XCTAssertEqual(resumer.changeIDs, [])
        try pg.script("COMMIT")
        XCTAssertEqual(done.wait(timeout: .now() + 10), .success)
        XCTAssertEqual(other.all, [200])
        guard let otherPosition = try a.position(of: "other", seq: 2) else { return XCTFail() }
        XCTAssertGreaterThan(otherPosition, heldPosition, "the later commit has the larger position")

        // A reader that drops after its first change and resumes from it misses nothing either.
        XCTAssertTrue(try resumer.pump(timeout: 10) { $0.changeIDs.count >= 1 })
        let firstSeen = resumer.changeIDs[0]
        resumer.close()
        let again = try a.feed(lastEventID: firstSeen)
        XCTAssertTrue(try live.pump(timeout: 10) { $0.changeIDs.count >= 2 })
        try again.pump(timeout: 3) { [firstSeen] in ([firstSeen] + $0.changeIDs).count >= 2 }
        XCTAssertEqual(live.changeIDs, [heldPosition, otherPosition], "live: the held change, then the later one")
        XCTAssertEqual([firstSeen] + again.changeIDs, [heldPosition, otherPosition], "resumed: nothing skipped")
        XCTAssertEqual(try a.positions(after: p0), [heldPosition, otherPosition])
    }

    func testResetWhenTheLastEventIDIsTooOldOrNotOurs() throws {
        // Retention of 0.0001 days: the pruner runs every ~2 s.
        let s = try TestServer.start(environment: ["DISPATCH_RETENTION_DAYS": "0.0001"])
        defer { s.stop() }
        try s.startActivity("old")
        try s.end("old")
        guard let oldEnd = try s.position(of: "old", seq: 2) else { return XCTFail() }
        try s.startActivity("kept")
        _ = try TestPostgres.shared().sql(s.conninfo, "UPDATE activities SET ended_ms = 1 WHERE activity_id = 'old'")
        XCTAssertTrue(try waitUntil(15) { try s.client.get("/v1/activities/old").status == 404 }, "pruned")
        let horizon = try TestPostgres.shared().sql(s.conninfo, "SELECT position FROM feed_horizon")[0][0].flatMap { Int64($0) }
        XCTAssertEqual(horizon, oldEnd, "prune raised the horizon to the newest position it deleted")

        func assertReset(_ f: SSEClient, _ why: String) throws {
            XCTAssertNotNil(try f.waitSynced(), why)
            XCTAssertEqual(f.events.first?.event, "reset", why)
            let rows = f.events.dropFirst().prefix { $0.event != "synced" }
            XCTAssertEqual(rows.compactMap { (try? JSONParser.parse($0.data))?["activityId"]?.stringValue }, ["kept"], why)
        }
        try assertReset(try s.feed(lastEventID: oldEnd - 1), "older than the horizon")
        try assertReset(try s.feed(lastEventID: 1_000_000), "ahead of every position issued")
        try assertReset(try SSEClient(port: s.port, path: "/v1/stream?lastEventId=abc", token: s.adminKey), "not a number")
        let fine = try s.feed(lastEventID: oldEnd)
        try s.update("kept")
        XCTAssertTrue(try fine.pump(timeout: 10) { $0.changeIDs.count >= 1 })
        XCTAssertEqual(fine.events.first?.event, "processing", "at the horizon: resumed, no reset")
        XCTAssertGreaterThanOrEqual(try s.metric("dispatch_feed_resets_total"), 3)
    }

    /// One framing per change, however many feeds: 1,000 feeds, 20 changes, 20 framings.
    func testFanOutToAThousandFeedsFramesEachChangeOnce() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        try s.startActivity("fan")
        var feeds: [SSEClient] = []
        for i in 0..<1000 { feeds.append(try s.feed(i % 2 == 0 ? "" : "state=active")) }
        for f in feeds { XCTAssertNotNil(try f.waitSynced()) }
        XCTAssertEqual(try s.metric("dispatch_feeds_active"), 1000)
        let framedBefore = try s.metric("dispatch_feed_framed_total")
        let deliveredBefore = try s.metric("dispatch_feed_deliveries_total")
        for i in 1...20 { try s.update("fan", #"{"progress":\#(Double(i) / 20)}"#) }
        for f in feeds { XCTAssertTrue(try f.pump(timeout: 20) { $0.changeIDs.count >= 20 }) }
        XCTAssertEqual(try s.metric("dispatch_feed_framed_total") - framedBefore, 20, "one framing per change")
        XCTAssertEqual(try s.metric("dispatch_feed_deliveries_total") - deliveredBefore, 20_000)
        for f in feeds.prefix(500) { f.reset() }
        XCTAssertTrue(try waitUntil(10) { try s.metric("dispatch_feeds_active") == 500 })
        XCTAssertEqual(try s.metric("dispatch_feed_closes_total", labels: "client_closed"), 500)
        for f in feeds.suffix(500) { f.close() }
    }

    /// Idle feeds get heartbeats; a feed that stops reading is cut off past the backlog cap
    /// (counted as slow_client) and loses nothing when it resumes with Last-Event-ID.
    func testHeartbeatsAndASlowFeedIsCutOffThenResumesWithoutLoss() throws {
        let s = try TestServer.start(environment: ["DISPATCH_HEARTBEAT": "0.2", "DISPATCH_STREAM_BACKLOG": "4096"])
        defer { s.stop() }
        try s.startActivity("hb")
        let idle = try s.feed()
        guard let p0 = try idle.waitSynced() else { return XCTFail() }
        try idle.pump(timeout: 1)
        XCTAssertGreaterThanOrEqual(idle.heartbeats, 2, "heartbeats on an idle feed")
        // Gone before the burst: unread, it would be cut off too, and the count below would
        // not tell which feed was.
        idle.close()
        XCTAssertTrue(try waitUntil(5) { try s.metric("dispatch_feeds_active") == 0 })

        let slow = try SSEClient(port: s.port, path: "/v1/stream", token: s.adminKey, lastEventID: p0, smallBuffer: true)
        // Live first (its `synced`): changes heard while a feed still catches up are sent as one
        // paced page when it goes live, not offered one by one against the cap.
        XCTAssertNotNil(try slow.waitSynced())
        let status = String(repeating: "s", count: 200)
        for i in 0..<600 { try s.update("hb", #"{"progress":\#(Double(i) / 600),"status":"\#(status)"}"#) }
        XCTAssertTrue(try waitUntil(10) { try s.metric("dispatch_feed_closes_total", labels: "slow_client") >= 1 }, "cut off")
        // Cut off, it still reads what the kernel held for it, through its small window: that
        // can take seconds on a busy machine, and it ends only after.
        try slow.pump(timeout: 60) { $0.ended }
        XCTAssertTrue(slow.ended)
        let got = slow.changeIDs
        XCTAssertLessThan(got.count, 600, "it was cut off before the end")
        let resumed = try s.feed(lastEventID: got.last ?? p0)
        XCTAssertTrue(try resumed.pump(timeout: 10) { got.count + $0.changeIDs.count >= 600 })
        XCTAssertEqual(got + resumed.changeIDs, try s.positions(after: p0), "nothing lost across the cut")
    }

    func testStreamLimitPerKeyCountsFeedsAndStatusStreams() throws {
        let s = try TestServer.start(environment: ["DISPATCH_MAX_STREAMS_PER_KEY": "2"])
        defer { s.stop() }
        try s.startActivity("lim")
        let f = try s.feed()
        XCTAssertNotNil(try f.waitSynced())
        let st = try s.stream("lim")
        XCTAssertEqual(try st.waitForEvents(1).count, 1)
        let third = try s.feed()
        try third.pump(timeout: 5) { $0.ended }
        XCTAssertEqual(third.status, 429)
        XCTAssertEqual(try s.client.get("/v1/activities/lim/status").status, 429)
    }
}

extension JSONValue {
    var stringValue: String? {
        if case .string(let s) = self { return s }
        return nil
    }
}
