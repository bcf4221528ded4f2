import DispatchSystem
import DispatchCore
import DispatchIO
import DispatchTestSupport
import Foundation
import Glibc
import XCTest

/// Several servers over NATS (contract §10), with real `nats-server` processes clustered on
/// loopback and real dispatchd nodes on one PostgreSQL: nothing lost, duplicated or reordered
/// whatever happens to the carrier.
final class NATSCarrierTests: XCTestCase {
    var nats: NATSCluster!

    override func setUpWithError() throws {
        nats = try NATSCluster(size: 3)
    }

    override func tearDown() {
        nats?.stopAll()
        nats = nil
    }

    /// A dispatchd node whose NATS client knows only NATS server `i` (so stopping that server
    /// partitions it), checking the database every half second.
    func node(_ i: Int, conninfo: String? = nil, _ extra: [String: String] = [:]) throws -> TestServer {
        var env = ["DISPATCH_NATS_URL": nats.urls[i], "DISPATCH_CARRIER_CHECK": "0.5"]
        for (k, v) in extra { env[k] = v }
        return try TestServer.start(environment: env, conninfo: conninfo)
    }

    /// Streams `id` on `server` and pumps until it has seen `seq`.
    func follow(_ stream: SSEClient, through seq: Int64, timeout: Double = 15) throws -> [Int64] {
        try stream.pump(timeout: timeout) { $0.ids.last ?? 0 >= seq || $0.ended }
        return stream.ids
    }

    func testAStreamOnOneServerHearsPublishesOnAnotherWithoutNotify() throws {
        let a = try node(0)
        defer { a.stop() }
        let b = try node(1, conninfo: a.conninfo)
        defer { b.stop() }
        try b.startActivity("cross")
        let stream = try a.stream("cross")
        XCTAssertTrue(try stream.pump(timeout: 5) { !$0.ids.isEmpty })
        for i in 1...200 { XCTAssertEqual(try b.update("cross", #"{"progress":\#(Double(i) / 200)}"#).status, 200) }
        let ids = try follow(stream, through: 201)
        assertConsecutive(ids, from: 1, through: 201)
        XCTAssertGreaterThan(try a.metric("dispatch_carrier_messages_total", labels: "direction=\"in\""), 0)
        XCTAssertEqual(try a.metric("dispatch_notifications_total"), 0, "publish transactions send no NOTIFY")
        XCTAssertEqual(try a.metric("dispatch_carrier_up"), 1)
    }

    func testFeedsOnEveryNodeSeeEveryChangeOnceInOrderWithPublishersOnEveryNode() throws {
        let a = try node(0)
        defer { a.stop() }
        let b = try node(1, conninfo: a.conninfo)
        defer { b.stop() }
        let c = try node(2, conninfo: a.conninfo)
        defer { c.stop() }
        let nodes = [a, b, c]
        let ids = (0..<6).map { "feed-\($0)" }
        for (i, id) in ids.enumerated() { try nodes[i % 3].startActivity(id) }
        let readers = try nodes.map { try $0.feed() }
        var p0: Int64 = .max
        for r in readers { guard let p = try r.waitSynced() else { return XCTFail("no synced") }; p0 = min(p0, p) }
        let failures = Collected<String>()
        let group = DispatchGroup()
        let perPublisher = 200
        for (i, id) in ids.enumerated() {
            let server = nodes[i % 3]
            DispatchQueue.global().async(group: group) {
                for n in 0..<perPublisher {
                    let r = try? server.update(id, #"{"progress":\#(Double(n) / Double(perPublisher))}"#)
                    if r?.status != 200 { failures.append("\(id) \(n): \(r?.status ?? 0)") }
                }
            }
        }
        XCTAssertTrue(try keepReading(readers, timeout: 120) { group.wait(timeout: .now()) == .success })
        XCTAssertFalse(readers.contains { $0.ended }, "no reader was cut off")
        XCTAssertEqual(failures.all, [])
        // Every change gets its position from the sequencer shortly after its commit.
        XCTAssertTrue(try waitUntil(10) {
            try TestPostgres.shared().sql(a.conninfo, "SELECT count(*) FROM activity_events WHERE position IS NULL")[0][0] == "0"
        })
        let expected = try a.positions(after: 0).filter { $0 > p0 }
        XCTAssertEqual(expected.count, ids.count * perPublisher)
        for (i, r) in readers.enumerated() {
            let synced = r.events.first { $0.event == "synced" }.flatMap { $0.id.flatMap { Int64($0) } } ?? 0
            let want = expected.filter { $0 > synced }
            try r.pump(timeout: 20) { $0.changeIDs.count >= want.count || $0.ended }
            XCTAssertEqual(r.changeIDs, want, "node \(i): every change once, in position order")
        }
    }

    /// The forced interleaving of FEED.md with the sequencer: a publish transaction stays open
    /// while another server commits a later change. With NATS no lock makes the later one
    /// wait; the held change still reaches every feed, after the later one (commit order).
    func testADelayedCommitIsNeitherWaitedForNorSkipped() throws {
        let a = try node(0)
        defer { a.stop() }
        let b = try node(1, conninfo: a.conninfo)
        defer { b.stop() }
        try a.startActivity("held")
        try b.startActivity("other")
        let live = try a.feed()
        guard let p0 = try live.waitSynced() else { return XCTFail() }
        let resumer = try b.feed(lastEventID: p0)
        XCTAssertTrue(try resumer.pump(timeout: 10) { $0.status == 200 })
        let pg = try BlockingPG(a.conninfo)
        try pg.script("BEGIN")
        _ = try pg.query("UPDATE activities SET seq = seq + 1, progress = 0.25 WHERE activity_id = 'held'")
        _ = try pg.query("""
            INSERT INTO activity_events (activity_id, seq, event, data, created_ms)
            SELECT activity_id, seq, 'processing', '{"activityId":"held"}', 0 FROM activities WHERE activity_id = 'held'
            """)
        let started = Clock.monotonic()
        XCTAssertEqual(try b.update("other", #"{"progress":0.9}"#).status, 200)
        // A publish held by a lock waits until COMMIT or its database deadline (5 s, then 503):
        // anything well under that deadline shows no wait, however loaded the machine.
        XCTAssertLessThan(Clock.monotonic() - started, 4, "no lock held by the open transaction delays another server's publish")
        XCTAssertTrue(try live.pump(timeout: 5) { $0.changeIDs.count >= 1 })
        try pg.script("COMMIT")
        XCTAssertTrue(try live.pump(timeout: 10) { $0.changeIDs.count >= 2 })
        try resumer.pump(timeout: 5) { $0.changeIDs.count >= 2 }
        let stored = try a.positions(after: p0)
        XCTAssertEqual(stored.count, 2)
        XCTAssertEqual(live.changeIDs, stored)
        XCTAssertEqual(resumer.changeIDs, stored)
        XCTAssertEqual(try a.position(of: "other", seq: 2), stored[0], "the change committed first comes first")
        XCTAssertEqual(try a.position(of: "held", seq: 2), stored[1])
    }

    func testStoppingTheNATSServerOfANodeMidPublishingLosesNothing() throws {
        let a = try node(0)
        defer { a.stop() }
        let b = try node(1, conninfo: a.conninfo)
        defer { b.stop() }
        try b.startActivity("outage")
        let stream = try a.stream("outage")
        let feed = try a.feed()
        guard let p0 = try feed.waitSynced() else { return XCTFail() }
        let total = 300
        let published = DispatchSemaphore(value: 0)
        let halfway = DispatchSemaphore(value: 0)
        let failures = Collected<Int>()
        DispatchQueue.global().async {
            for i in 1...total {
                if (try? b.update("outage", #"{"progress":\#(Double(i) / Double(total))}"#))?.status != 200 { failures.append(i) }
                if i == total / 3 { halfway.signal() }
                usleep(5_000)
            }
            published.signal()
        }
        XCTAssertEqual(halfway.wait(timeout: .now() + 30), .success)
        // The client knows the cluster's other servers (NATS tells it): it fails over.
        nats.stop(0)
        XCTAssertTrue(try waitUntil(5) { try a.metric("dispatch_carrier_reconnects_total") >= 1 }, "reconnected elsewhere")
        XCTAssertEqual(try HTTPClient(port: a.port).get("/readyz").status, 200)
        usleep(1_500_000)
        try nats.start(0)
        XCTAssertEqual(published.wait(timeout: .now() + 60), .success)
        XCTAssertEqual(failures.all, [])
        let ids = try follow(stream, through: Int64(total + 1), timeout: 20)
        assertConsecutive(ids, from: 1, through: Int64(total + 1))
        let expected = try a.positions(after: p0)
        try feed.pump(timeout: 20) { $0.changeIDs.count >= expected.count || $0.ended }
        XCTAssertEqual(feed.changeIDs, expected)
        XCTAssertEqual(try a.metric("dispatch_carrier_up"), 1)
    }

    /// A process that commits and never announces (as one killed between its commit and its
    /// message): the change still reaches every open stream and feed within 5 s.
    func testAChangeNobodyAnnouncedReachesStreamsAndFeedsWithinFiveSeconds() throws {
        let a = try node(0)
        defer { a.stop() }
        let silent = try node(1, conninfo: a.conninfo, ["DISPATCH_TEST_CARRIER_MUTE": "1"])
        defer { silent.stop() }
        try a.startActivity("quiet")
        let stream = try a.stream("quiet")
        let feed = try a.feed()
        guard try feed.waitSynced() != nil else { return XCTFail() }
        XCTAssertTrue(try stream.pump(timeout: 5) { !$0.ids.isEmpty })
        let started = Clock.monotonic()
        XCTAssertEqual(try silent.update("quiet", #"{"progress":0.5}"#).status, 200)
        XCTAssertTrue(try stream.pump(timeout: 5) { $0.ids.last == 2 }, "the stream got seq 2")
        var position: Int64?
        XCTAssertTrue(try waitUntil(5) { position = try a.position(of: "quiet", seq: 2); return position != nil }, "numbered")
        // (The start may also come after `synced`: it can be numbered after the feed's first read.)
        XCTAssertTrue(try feed.pump(timeout: 5) { $0.changeIDs.contains(position ?? -1) }, "the feed got its position")
        XCTAssertLessThan(Clock.monotonic() - started, 5)
        XCTAssertGreaterThan(try a.metric("dispatch_carrier_repairs_total", labels: "reason=\"check\""), 0)
    }

    func testAPublisherKilledMidPublishingLosesAndDuplicatesNothing() throws {
        let a = try node(0)
        defer { a.stop() }
        let b = try node(1, conninfo: a.conninfo, ["DISPATCH_WORKERS": "2"])
        defer { b.stop() }
        let ids = (0..<4).map { "kill-\($0)" }
        for id in ids { try b.startActivity(id) }
        let streams = try ids.map { try a.stream($0) }
        let feed = try a.feed()
        guard let p0 = try feed.waitSynced() else { return XCTFail() }
        let group = DispatchGroup()
        for id in ids {
            DispatchQueue.global().async(group: group) {
                for i in 0..<100_000 {
                    guard (try? b.update(id, #"{"progress":\#(Double(i % 100) / 100)}"#))?.status == 200 else { return }
                }
            }
        }
        // Killed while every publisher is under way (not at a fixed time: the machine may be slow).
        let readers = streams + [feed]
        XCTAssertTrue(try keepReading(readers, timeout: 30) { try ids.allSatisfy { try (a.seq($0) ?? 0) > 20 } })
        b.kill()
        XCTAssertTrue(try keepReading(readers, timeout: 30) { group.wait(timeout: .now()) == .success })
        XCTAssertFalse(readers.contains { $0.ended }, "no reader was cut off")
        for (id, stream) in zip(ids, streams) {
            guard let seq = try a.seq(id) else { return XCTFail() }
            XCTAssertGreaterThan(seq, 1)
            let seen = try follow(stream, through: seq, timeout: 10)
            assertConsecutive(seen, from: 1, through: seq)
        }
        XCTAssertTrue(try waitUntil(10) {
            try TestPostgres.shared().sql(a.conninfo, "SELECT count(*) FROM activity_events WHERE position IS NULL")[0][0] == "0"
        })
        let expected = try a.positions(after: p0)
        try feed.pump(timeout: 10) { $0.changeIDs.count >= expected.count || $0.ended }
        XCTAssertEqual(feed.changeIDs, expected)
    }

    func testAPartitionedNodeFollowsFromPostgreSQLAndCatchesUp() throws {
        let a = try node(0)
        defer { a.stop() }
        let b = try node(1, conninfo: a.conninfo)
        defer { b.stop() }
        try b.startActivity("island")
        let stream = try a.stream("island")
        let feed = try a.feed()
        guard let p0 = try feed.waitSynced() else { return XCTFail() }
        // No NATS server reachable at all.
        for i in 0..<3 { nats.stop(i) }
        XCTAssertTrue(try waitUntil(5) { try a.metric("dispatch_carrier_up") == 0 }, "the carrier is reported down")
        XCTAssertEqual(try HTTPClient(port: a.port).get("/readyz").status, 200, "NATS down does not make the server unready")
        for i in 1...30 { XCTAssertEqual(try b.update("island", #"{"progress":\#(Double(i) / 100)}"#).status, 200) }
        XCTAssertTrue(try stream.pump(timeout: 5) { $0.ids.last == 31 }, "cut off from NATS, the stream follows the database")
        let numbered = try a.positions(after: p0)
        XCTAssertTrue(try feed.pump(timeout: 5) { $0.changeIDs.count >= numbered.count }, "and so does the feed")
        for i in 0..<3 { try nats.start(i) }
        XCTAssertTrue(try waitUntil(10) { try a.metric("dispatch_carrier_up") == 1 })
        for i in 31...60 { XCTAssertEqual(try b.update("island", #"{"progress":\#(Double(i) / 100)}"#).status, 200) }
        assertConsecutive(try follow(stream, through: 61), from: 1, through: 61)
        let expected = try a.positions(after: p0)
        try feed.pump(timeout: 15) { $0.changeIDs.count >= expected.count || $0.ended }
        XCTAssertEqual(feed.changeIDs, expected)
    }

    /// No server leads the numbering: every server's passes number what any committed, so a
    /// killed server leaves nothing unnumbered and nothing waits for it to come back.
    func testWhenAServerDiesTheOthersNumberOn() throws {
        let a = try node(0)
        defer { a.stop() }
        let b = try node(1, conninfo: a.conninfo)
        defer { b.stop() }
        XCTAssertTrue(try waitUntil(5) { try a.metric("dispatch_sequencer_passes_total") > 0 && b.metric("dispatch_sequencer_passes_total") > 0 },
                      "both run passes")
        try b.startActivity("handover")
        let feed = try b.feed()
        guard let p0 = try feed.waitSynced() else { return XCTFail() }
        a.kill()
        for i in 1...20 { XCTAssertEqual(try b.update("handover", #"{"progress":\#(Double(i) / 20)}"#).status, 200) }
        XCTAssertTrue(try waitUntil(10) {
            try TestPostgres.shared().sql(b.conninfo, "SELECT count(*) FROM activity_events WHERE position IS NULL")[0][0] == "0"
        })
        XCTAssertEqual(try b.metric("dispatch_feed_unnumbered"), 0)
        let expected = try b.positions(after: p0)
        XCTAssertGreaterThanOrEqual(expected.count, 20, "the updates (and the start, if numbered after the feed's read)")
        try feed.pump(timeout: 10) { $0.changeIDs.count >= expected.count || $0.ended }
        XCTAssertEqual(feed.changeIDs, expected)
    }
}
