import DispatchSystem
import DispatchCore
import DispatchIO
import DispatchTestSupport
import Foundation
import Glibc
import XCTest

/// Contract §10 as an attacker on the private network and a failing machine would try it:
/// no NATS message is believed, no server can stall the others, a carrier switch keeps every
/// change, a carrier that goes silent is noticed and repaired, NATS is secured.
final class CarrierTruthTests: XCTestCase {
    var nats: NATSCluster?

    override func tearDown() {
        nats?.stopAll()
        nats = nil
    }

    func node(_ cluster: NATSCluster, _ i: Int, conninfo: String? = nil, _ extra: [String: String] = [:]) throws -> TestServer {
        var env = ["DISPATCH_NATS_URL": cluster.urls[i], "DISPATCH_CARRIER_CHECK": "0.5"]
        for (k, v) in extra { env[k] = v }
        return try TestServer.start(environment: env, conninfo: conninfo)
    }

    /// Two servers on one NATS server and one database: a status stream on `a` following an
    /// activity `b` started, and a feed on `a` that said `synced` (its position).
    func twoNodesWithAStreamAndAFeed(_ id: String) throws -> (cluster: NATSCluster, a: TestServer, b: TestServer, stream: SSEClient,
                                                                 feed: SSEClient, p0: Int64) {
        let cluster = try NATSCluster(size: 1)
        nats = cluster
        let a = try node(cluster, 0)
        let b = try node(cluster, 0, conninfo: a.conninfo)
        try b.startActivity(id)
        let stream = try a.stream(id)
        XCTAssertTrue(try stream.pump(timeout: 5) { !$0.ids.isEmpty })
        let feed = try a.feed()
        let p0 = try XCTUnwrap(try feed.waitSynced(), "no synced")
        return (cluster, a, b, stream, feed, p0)
    }

    /// A change copied off the wire and altered (a raised seq, a final state, a cancel request,
    /// a position near 2^63), and messages in the old format with a snapshot in them: none
    /// reaches any client, and none hides the real change that follows.
    func testAForgedOrAlteredMessageChangesNothingAnyClientSeesAndHidesNoRealChange() throws {
        let (cluster, a, b, stream, feed, p0) = try twoNodesWithAStreamAndAFeed("victim")
        defer { b.stop(); a.stop() }
        XCTAssertTrue(cluster.waitForInterest(0, CarrierSubjects(prefix: TestCarrier.subjectPrefix(a.conninfo)).activity("victim"), count: 1),
                      "server a listens to the activity")

        // What anyone who reaches NATS can send.
        let attacker = try RawNATSClient(port: cluster.ports[0])
        let subjects = CarrierSubjects(prefix: TestCarrier.subjectPrefix(a.conninfo))
        let subject = subjects.activity("victim")
        for payload in ["2\tcompleted", "5\tcancel_requested", "9223372036854775807\terror",
                        #"victim\t2\tcompleted\t{"activityId":"victim","state":"completed","seq":2}"#,
                        #"victim\t2\tprocessing\t{"activityId":"victim","status":"forged","seq":2}"#] {
            try attacker.publish(subject, Array(payload.utf8))
        }
        for payload in ["F\t9223372036854775806", "F\t\(p0 + 1)\n\(p0 + 1)\tvictim\t2\tcompleted\t{\"state\":\"completed\"}"] {
            try attacker.publish(subjects.feed, Array(payload.utf8))
        }
        try attacker.publish(subjects.starts, Array("victim".utf8))
        try attacker.flush()
        // Nothing is sent for any of them: the stream and the feed stay as they were.
        XCTAssertFalse(try stream.pump(timeout: 1.5) { $0.ids.count > 1 || $0.ended }, "no forged event on the stream: \(stream.ids)")
        XCTAssertFalse(try feed.pump(timeout: 0.5) { !$0.changeIDs.isEmpty || $0.ended }, "no forged change on the feed")

        // The real change that follows is delivered, exactly as committed, to both.
        XCTAssertEqual(try b.update("victim", #"{"progress":0.42,"status":"real"}"#).status, 200)
        XCTAssertTrue(try stream.pump(timeout: 5) { $0.ids.count >= 2 || $0.ended })
        XCTAssertEqual(stream.ids, [1, 2])
        XCTAssertFalse(stream.ended, "a forged final state ended nothing")
        let last = stream.events.last
        XCTAssertEqual(last?.event, "processing")
        XCTAssertTrue(last?.data.contains(#""status":"real""#) == true, last?.data ?? "")
        let positions = try a.positions(after: p0)
        XCTAssertTrue(try feed.pump(timeout: 5) { $0.changeIDs.count >= positions.count || $0.ended })
        XCTAssertEqual(feed.changeIDs, positions, "the feed's place was not moved by a forged position")
        XCTAssertFalse(feed.events.contains { $0.data.contains("forged") || $0.event == "completed" })
        // The server counted what it refused.
        XCTAssertGreaterThan(try a.metric("dispatch_carrier_malformed_total"), 0)
        // And a further real change still arrives (nothing froze).
        XCTAssertEqual(try b.end("victim", #"{"state":"completed"}"#).status, 200)
        XCTAssertTrue(try stream.pump(timeout: 5) { $0.ended })
        XCTAssertEqual(stream.ids, [1, 2, 3])
    }

    /// Someone subscribed to everything learns no activity's content: hints carry ids and
    /// seqs, never a snapshot.
    func testNoSnapshotCrossesNATS() throws {
        let cluster = try NATSCluster(size: 1)
        nats = cluster
        let a = try node(cluster, 0)
        defer { a.stop() }
        let spy = try RawNATSClient(port: cluster.ports[0])
        try spy.subscribe(">")
        try a.startActivity("job-1", extra: #","status":"payroll for ACME""#)
        let stream = try a.stream("job-1")
        XCTAssertTrue(try stream.pump(timeout: 5) { !$0.ids.isEmpty })
        XCTAssertEqual(try a.update("job-1", #"{"status":"top secret status"}"#).status, 200)
        let seen = try spy.messages(for: 1.5)
        XCTAssertFalse(seen.isEmpty, "the carrier was used")
        let prefix = TestCarrier.subjectPrefix(a.conninfo)
        for (subject, payload) in seen {
            XCTAssertTrue(subject.hasPrefix(prefix + "."), "only under the deployment's prefix: \(subject)")
            let text = String(decoding: payload, as: UTF8.self)
            XCTAssertFalse(text.contains("secret") || text.contains("ACME") || text.contains("{"), "\(subject): \(text)")
        }
    }

    /// A server that hangs with its connections open (SIGSTOP) delays no other server's feed
    /// by more than 5 s, whenever it stops: several times, at different moments.
    func testAHungServerDelaysNoOtherServersFeedByMoreThanFiveSeconds() throws {
        let cluster = try NATSCluster(size: 1)
        nats = cluster
        let a = try node(cluster, 0)
        defer { kill(a.pid, SIGCONT); a.stop() }
        let b = try node(cluster, 0, conninfo: a.conninfo)
        defer { b.stop() }
        try b.startActivity("survivor")
        try a.startActivity("hung")
        let feed = try b.feed()
        guard try feed.waitSynced() != nil else { return XCTFail("no synced") }
        for round in 0..<3 {
            // Both servers run passes while a publishes, so a is stopped somewhere in its work.
            for i in 0..<20 { _ = try a.update("hung", #"{"progress":\#(Double(i) / 100)}"#) }
            usleep(useconds_t(37_000 * (round + 1)))
            XCTAssertEqual(kill(a.pid, SIGSTOP), 0)
            let started = Clock.monotonic()
            XCTAssertEqual(try b.update("survivor", #"{"progress":\#(Double(round + 1) / 10)}"#).status, 200)
            guard let seq = try b.seq("survivor") else { return XCTFail() }
            var position: Int64?
            XCTAssertTrue(try keepReading([feed], timeout: 5) { position = try b.position(of: "survivor", seq: seq); return position != nil },
                          "round \(round): numbered by b while a hangs")
            XCTAssertTrue(try feed.pump(timeout: max(0.1, 5 - (Clock.monotonic() - started))) { $0.changeIDs.contains(position ?? -1) },
                          "round \(round): b's feed got the change within 5 s")
            XCTAssertLessThan(Clock.monotonic() - started, 5, "round \(round)")
            XCTAssertEqual(kill(a.pid, SIGCONT), 0)
        }
        XCTAssertFalse(feed.ended)
    }

    /// A deployment moved from NATS back to LISTEN/NOTIFY: what NATS mode committed but had not
    /// numbered yet is numbered at start-up, so a fresh feed shows every activity's latest seq.
    func testMovingFromNATSBackToNotifyKeepsEveryActivitysLatestChangeInTheFeed() throws {
        let cluster = try NATSCluster(size: 1)
        nats = cluster
        // A NATS-mode server whose changes nobody numbers (its passes are off, and it is alone).
        let natsMode = try node(cluster, 0, ["DISPATCH_TEST_SEQUENCER_OFF": "1"])
        for i in 0..<3 {
            try natsMode.startActivity("moved-\(i)")
            for n in 1...4 { XCTAssertEqual(try natsMode.update("moved-\(i)", #"{"progress":\#(Double(n) / 10)}"#).status, 200) }
        }
        let waiting = try TestPostgres.shared().sql(natsMode.conninfo, "SELECT count(*) FROM activity_events WHERE position IS NULL")[0][0]
        XCTAssertEqual(waiting, "15", "committed, not numbered")
        natsMode.stop()
        let notifyMode = try TestServer.start(environment: ["DISPATCH_NATS_URL": ""], conninfo: natsMode.conninfo)
        defer { notifyMode.stop() }
        XCTAssertTrue(notifyMode.log().contains("carrier.switch"), "the start-up says what it numbered")
        let feed = try notifyMode.feed()
        guard try feed.waitSynced() != nil else { return XCTFail("no synced") }
        for i in 0..<3 {
            let latest = feed.events.last { $0.data.contains(#""activityId":"moved-\#(i)""#) }
            XCTAssertTrue(latest?.data.contains(#""seq":5"#) == true, "moved-\(i): \(latest?.data ?? "missing")")
        }
        // And it goes on numbering at commit as before.
        XCTAssertEqual(try notifyMode.update("moved-0", #"{"progress":0.9}"#).status, 200)
        XCTAssertTrue(try feed.pump(timeout: 5) { $0.events.contains { $0.data.contains(#""seq":6"#) } })
    }

    /// NATS with a password, as docs/deploy.md runs it: the right one connects and is never
    /// logged; a wrong one is retried with backoff and shown in /readyz, and connects once the
    /// servers accept it.
    func testNATSCredentialsAreUsedRetriedAndNeverLogged() throws {
        let cluster = try NATSCluster(size: 1, serverArgs: ["--user", "dispatch", "--pass", "s3cret-pw"])
        nats = cluster
        let url = { (user: String, pass: String) in "nats://\(user):\(pass)@127.0.0.1:\(cluster.ports[0])" }
        let good = try TestServer.start(environment: ["DISPATCH_NATS_URL": url("dispatch", "s3cret-pw")])
        defer { good.stop() }
        XCTAssertTrue(try waitUntil(10) { try good.metric("dispatch_carrier_up") == 1 })
        XCTAssertEqual(try HTTPClient(port: good.port).get("/readyz").status, 200)

        let wrong = TestServer(port: try TestServer.freePort(), conninfo: good.conninfo,
                               environment: ["DISPATCH_NATS_URL": url("dispatch", "wrong-pw")])
        wrong.acceptCarrierUnready = true
        try wrong.launch()
        defer { wrong.stop() }
        XCTAssertTrue(try waitUntil(10) {
            let r = try HTTPClient(port: wrong.port).get("/readyz")
            return r.status == 503 && r.text.contains("carrier")
        }, "refused credentials are shown in /readyz")
        XCTAssertEqual(try wrong.metric("dispatch_carrier_up"), 0)
        // Streams still work from PostgreSQL meanwhile.
        try good.startActivity("authless")
        let stream = try wrong.stream("authless")
        XCTAssertTrue(try stream.pump(timeout: 5) { !$0.ids.isEmpty })
        XCTAssertEqual(try good.update("authless").status, 200)
        XCTAssertTrue(try stream.pump(timeout: 5) { $0.ids.count >= 2 })

        // The operator fixes the servers' side: the retrying client gets in.
        cluster.serverArgs = ["--user", "dispatch", "--pass", "wrong-pw"]
        cluster.stop(0)
        try cluster.start(0)
        XCTAssertTrue(try waitUntil(20) { try wrong.metric("dispatch_carrier_up") == 1 }, "retried until accepted")
        XCTAssertTrue(try waitUntil(5) { try HTTPClient(port: wrong.port).get("/readyz").status == 200 })
        for server in [good, wrong] {
            let log = server.log()
            XCTAssertFalse(log.contains("s3cret-pw") || log.contains("wrong-pw"), "a NATS password in the log")
        }
    }

    /// A nats-server that stops reading with its connections open (SIGSTOP): the servers notice
    /// their probes do not come back, follow PostgreSQL meanwhile, and cut no reader.
    func testAStalledNATSServerCutsNoReaderAndDeliveryGoesOn() throws {
        let (cluster, a, b, stream, feed, _) = try twoNodesWithAStreamAndAFeed("stalled-carrier")
        defer { b.stop(); a.stop() }
        // The server itself, not the watchdog shell whose arguments name it too.
        let found = Subprocess.run(["pgrep", "-f", "^\(try NATSCluster.binary()) -a 127.0.0.1 -p \(cluster.ports[0]) "])
        guard let natsPID = found.output.split(separator: "\n").first.flatMap({ pid_t($0) }) else { return XCTFail("no nats-server pid") }
        XCTAssertEqual(kill(natsPID, SIGSTOP), 0)
        defer { kill(natsPID, SIGCONT) }
        // Publishing goes on (acknowledged by PostgreSQL alone), fast enough to fill buffers.
        for i in 1...200 { XCTAssertEqual(try b.update("stalled-carrier", #"{"progress":\#(Double(i) / 1000)}"#).status, 200) }
        XCTAssertTrue(try keepReading([stream, feed], timeout: 10) { stream.ids.last == 201 }, "delivered from PostgreSQL: \(stream.ids.last ?? 0)")
        assertConsecutive(stream.ids, from: 1, through: 201)
        XCTAssertTrue(try waitUntil(10) { try a.metric("dispatch_carrier_stalls_total") >= 1 || a.metric("dispatch_carrier_up") == 0 },
                      "the silent carrier was noticed: by the probe, or dropped by the client's pings")
        XCTAssertFalse(stream.ended || feed.ended, "no reader was cut")
        XCTAssertEqual(kill(natsPID, SIGCONT), 0)
        XCTAssertEqual(try b.update("stalled-carrier", #"{"progress":0.5}"#).status, 200)
        XCTAssertTrue(try keepReading([stream, feed], timeout: 10) { stream.ids.last == 202 })
        XCTAssertFalse(stream.ended || feed.ended)
    }

    /// The LISTEN session's backend stops delivering while its socket stays open: the worker's
    /// probe notices, the session is reconnected, and what was committed meanwhile arrives.
    func testAStuckListenSessionIsNoticedAndRepaired() throws {
        let a = try TestServer.start(environment: ["DISPATCH_NATS_URL": ""])
        defer { a.stop() }
        let b = try TestServer.start(environment: ["DISPATCH_NATS_URL": ""], conninfo: a.conninfo)
        defer { b.stop() }
        try b.startActivity("listened")
        let stream = try a.stream("listened")
        XCTAssertTrue(try stream.pump(timeout: 5) { !$0.ids.isEmpty })
        let rows = try TestPostgres.shared().sql(a.conninfo, """
            SELECT pid FROM pg_stat_activity WHERE application_name = 'dispatchd-' || $1 || '-listener'
            """, [String(a.pid)])
        guard let backend = rows.first?[0].flatMap({ Int32($0) }) else { return XCTFail("no listener backend for \(a.pid)") }
        XCTAssertEqual(kill(backend, SIGSTOP), 0)
        defer { kill(backend, SIGCONT) }
        XCTAssertEqual(try b.update("listened", #"{"progress":0.5}"#).status, 200)
        XCTAssertTrue(try waitUntil(10) { try a.metric("dispatch_carrier_stalls_total") >= 1 }, "the probe noticed")
        XCTAssertTrue(try stream.pump(timeout: 10) { $0.ids.count >= 2 }, "the change committed meanwhile arrived")
        XCTAssertEqual(stream.ids, [1, 2])
        XCTAssertEqual(try b.update("listened", #"{"progress":0.6}"#).status, 200)
        XCTAssertTrue(try stream.pump(timeout: 5) { $0.ids.count >= 3 }, "and the new session delivers")
        XCTAssertTrue(try waitUntil(5) { try HTTPClient(port: a.port).get("/readyz").status == 200 })
        XCTAssertTrue(a.log().contains("carrier.stalled"))
    }
}
