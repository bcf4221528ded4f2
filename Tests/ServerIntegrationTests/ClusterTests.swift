import DispatchSystem
import DispatchCore
import DispatchIO
import DispatchTestSupport
import Glibc
import XCTest

/// Several server processes on one database, crashes, and lost database sessions.
final class ClusterTests: XCTestCase {
    func testTwoServersOnOneDatabaseBehaveAsOne() throws {
        let a = try TestServer.start()
        defer { a.stop() }
        let b = try TestServer.start(conninfo: a.conninfo)
        defer { b.stop() }
        try b.startActivity("shared")
        let onA = try a.stream("shared")
        let onB = try b.stream("shared")
        _ = try onA.waitForEvents(1)
        _ = try onB.waitForEvents(1)
        for i in 0..<30 {
            // Publishers alternate between the two servers: seq stays gap-free.
            let target = i % 2 == 0 ? a : b
            XCTAssertEqual(try target.update("shared", #"{"progress":\#(Double(i) / 30)}"#).status, 200)
        }
        try a.end("shared")
        for st in [onA, onB] {
            XCTAssertTrue(try st.waitForEnd())
            assertConsecutive(st.ids, from: 1, through: 32)
        }
    }

    func testConcurrentPublishersThroughTwoServersNeverGapOrDuplicate() throws {
        let a = try TestServer.start()
        defer { a.stop() }
        let b = try TestServer.start(conninfo: a.conninfo)
        defer { b.stop() }
        try a.startActivity("race")
        let watcher = try a.stream("race")
        XCTAssertEqual(try watcher.waitForEvents(1).count, 1, "subscribed before the publishing")
        // Two processes publish to the same activity at once.
        let script = { (port: Int) -> [String] in
            ["/bin/sh", "-c", "for i in $(seq 1 60); do curl -s -o /dev/null -XPOST -H 'Authorization: Bearer \(a.adminKey)' -H 'Content-Type: application/json' -d '{\"progress\":0.5}' http://127.0.0.1:\(port)/v1/activities/race/update; done"]
        }
        guard let p1 = Subprocess.start(script(a.port)), let p2 = Subprocess.start(script(b.port)) else { return XCTFail("curl") }
        _ = Subprocess.wait(p1)
        _ = Subprocess.wait(p2)
        XCTAssertEqual(try a.seq("race"), 121)
        let history = try TestPostgres.shared().sql(a.conninfo, "SELECT seq FROM activity_events WHERE activity_id = 'race' ORDER BY seq")
        XCTAssertEqual(history.compactMap { $0[0].flatMap { Int64($0) } }, Array(1...121))
        try b.end("race")
        XCTAssertTrue(try watcher.waitForEnd())
        assertConsecutive(watcher.ids, from: 1, through: 122)
    }

    func testKilledServerRestartsAndClientResumesWithLastEventID() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        try s.startActivity("crash")
        let first = try s.stream("crash")
        XCTAssertEqual(try first.waitForEvents(1).count, 1, "subscribed before the updates")
        try s.update("crash")
        try s.update("crash")
        XCTAssertEqual(try first.waitForEvents(3).count, 3)
        s.kill()
        XCTAssertTrue(try first.waitForEnd(timeout: 5))
        let publisher = try TestServer.start(conninfo: s.conninfo)
        defer { publisher.stop() }
        try publisher.update("crash")
        try publisher.update("crash")
        try s.launch()
        let resumed = try s.stream("crash", lastEventID: first.ids.last)
        XCTAssertEqual(try resumed.waitForEvents(2).count, 2)
        try s.end("crash")
        XCTAssertTrue(try resumed.waitForEnd())
        assertConsecutive(first.ids + resumed.ids, from: 1, through: 6)
    }

    func testTerminatedDatabaseSessionsLoseNoEvents() throws {
        let subscriberSide = try TestServer.start()
        defer { subscriberSide.stop() }
        let publisherSide = try TestServer.start(conninfo: subscriberSide.conninfo)
        defer { publisherSide.stop() }
        try publisherSide.startActivity("term")
        let stream = try subscriberSide.stream("term")
        _ = try stream.waitForEvents(1)
        let pg = try TestPostgres.shared()
        for round in 0..<3 {
            for _ in 0..<5 { XCTAssertEqual(try publisherSide.update("term").status, 200) }
            // Kill every database session of the subscriber's server while publishing goes on.
            let killed = try pg.sql(subscriberSide.conninfo,
                                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE $1",
                                    ["dispatchd-\(subscriberSide.pid)-%"])
            XCTAssertGreaterThanOrEqual(killed.count, 3, "round \(round)")
            for _ in 0..<5 { XCTAssertEqual(try publisherSide.update("term").status, 200) }
            XCTAssertTrue(waitUntil(15) { (try? HTTPClient(port: subscriberSide.port).get("/readyz").status) == 200 })
        }
        try publisherSide.end("term")
        XCTAssertTrue(try stream.waitForEnd(timeout: 30), subscriberSide.log())
        assertConsecutive(stream.ids, from: 1, through: 32)
        XCTAssertGreaterThanOrEqual(try subscriberSide.metric("dispatch_db_reconnects_total"), 3)
    }

    func testSeveralWorkersShareThePortAndAStream() throws {
        let s = try TestServer.start(environment: ["DISPATCH_WORKERS": "2"])
        defer { s.stop() }
        try s.startActivity("workers")
        var streams: [SSEClient] = []
        for _ in 0..<20 { streams.append(try s.stream("workers")) }
        for st in streams { XCTAssertEqual(try st.waitForEvents(1).count, 1) }
        for _ in 0..<10 { XCTAssertEqual(try s.update("workers").status, 200) }
        try s.end("workers")
        for st in streams {
            XCTAssertTrue(try st.waitForEnd())
            assertConsecutive(st.ids, from: 1, through: 12)
        }
        // SIGTERM reaches both workers; the supervisor exits.
        s.stop()
        XCTAssertNotEqual(try? HTTPClient(port: s.port).get("/healthz").status, 200)
    }
}

final class SupervisorTests: XCTestCase {
    func testWorkersExitWhenTheSupervisorIsKilled() throws {
        let s = try TestServer.start(environment: ["DISPATCH_WORKERS": "2"])
        let supervisor = s.pid
        let out = Subprocess.run(["pgrep", "-P", String(supervisor)])
        let workers = out.output.split(separator: "\n").compactMap { Int32($0) }
        XCTAssertEqual(workers.count, 2, out.output)
        s.kill()
        XCTAssertTrue(waitUntil(10) { workers.allSatisfy { Glibc.kill($0, 0) != 0 } }, "workers outlived their supervisor")
    }

    func testACrashedWorkerIsRestarted() throws {
        let s = try TestServer.start(environment: ["DISPATCH_WORKERS": "2"])
        defer { s.stop() }
        let before = Subprocess.run(["pgrep", "-P", String(s.pid)]).output.split(separator: "\n").compactMap { Int32($0) }
        XCTAssertEqual(before.count, 2)
        Glibc.kill(before[0], SIGKILL)
        XCTAssertTrue(waitUntil(10) {
            let now = Subprocess.run(["pgrep", "-P", String(s.pid)]).output.split(separator: "\n").compactMap { Int32($0) }
            return now.count == 2 && !now.contains(before[0])
        })
        XCTAssertTrue(s.log().contains("supervisor.worker_crashed"))
        XCTAssertEqual(try s.client.get("/readyz").status, 200)
    }
}

final class GroupCommitTests: XCTestCase {
    /// One statement failing inside a group-committed batch fails only its own publish; the
    /// others are replayed and the writer's session keeps working (it once stayed inside an
    /// aborted transaction and every later publish hung).
    func testAFailingStatementDoesNotPoisonTheBatchOrTheSession() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        let ids = (0..<12).map { "gc-\($0)" }
        for id in ids + ["boom"] { try s.startActivity(id) }
        let pg = try TestPostgres.shared()
        _ = try pg.sql(s.conninfo, """
            CREATE FUNCTION refuse_boom() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN IF NEW.activity_id = 'boom' THEN RAISE EXCEPTION 'refused for the test'; END IF; RETURN NEW; END $$
            """)
        _ = try pg.sql(s.conninfo, "CREATE TRIGGER refuse_boom BEFORE INSERT ON activity_events FOR EACH ROW EXECUTE FUNCTION refuse_boom()")
        // Many publishers at once, so the failing one shares batches with the others.
        let script = { (id: String) -> [String] in
            ["/bin/sh", "-c", "for i in $(seq 1 10); do curl -s -o /dev/null -w '%{http_code}\\n' -XPOST -H 'Authorization: Bearer \(s.adminKey)' -H 'Content-Type: application/json' -d '{\"progress\":0.5}' http://127.0.0.1:\(s.port)/v1/activities/\(id)/update; done"]
        }
        let pids = (ids + ["boom"]).compactMap { Subprocess.start(script($0)) }
        for p in pids { XCTAssertEqual(Subprocess.wait(p), 0) }
        for id in ids { XCTAssertEqual(try s.seq(id), 11, id) }
        XCTAssertEqual(try s.seq("boom"), 1)
        XCTAssertEqual(try s.update("boom").status, 500)
        XCTAssertEqual(try s.update("gc-0").status, 200)
        XCTAssertGreaterThan(try s.metric("dispatch_publish_batches_total"), 0)
    }

    /// Starts, updates, idempotent repeats, cancels with a webhook and ends, all at once on one
    /// worker, so they share batches (one statement per kind): each applies exactly once.
    func testMixedBatchesApplyEachChangeOnce() throws {
        let s = try TestServer.start(environment: ["DISPATCH_WORKERS": "1", "DISPATCH_WEBHOOK_ALLOW_PRIVATE": "1"])
        defer { s.stop() }
        for i in 0..<10 { try s.startActivity("m-\(i)", extra: #","cancelURL":"http://127.0.0.1:9/hook""#) }
        let auth = "-H 'Authorization: Bearer \(s.adminKey)' -H 'Content-Type: application/json'"
        let base = "http://127.0.0.1:\(s.port)/v1/activities"
        var scripts: [String] = []
        for i in 0..<10 {
            // Updates with one Idempotency-Key sent three times, then a cancel, then an end.
            scripts.append("""
                for k in 1 2 3 4 5; do for r in 1 2 3; do curl -s -o /dev/null -XPOST \(auth) -H "Idempotency-Key: u$k" \
                  -d "{\\"progress\\":0.$k}" \(base)/m-\(i)/update; done; done
                curl -s -o /dev/null -XPOST \(auth) -d '{"reason":"stop"}' \(base)/m-\(i)/cancel
                curl -s -o /dev/null -XPOST \(auth) -d '{"state":"cancelled"}' \(base)/m-\(i)/end
                """)
            scripts.append("for j in 1 2 3 4 5; do curl -s -o /dev/null -XPOST \(auth) -d '{\"activityId\":\"n-\(i)-'$j'\",\"taskName\":\"T\"}' \(base)/start; done")
        }
        let pids = scripts.compactMap { Subprocess.start(["/bin/sh", "-c", $0]) }
        for p in pids { XCTAssertEqual(Subprocess.wait(p), 0) }
        for i in 0..<10 {
            XCTAssertEqual(try Kit.sql(s, "SELECT string_agg(event, ',' ORDER BY seq) FROM activity_events WHERE activity_id = 'm-\(i)'"),
                           ["processing,processing,processing,processing,processing,processing,cancel_requested,cancelled"])
            XCTAssertEqual(try Kit.sql(s, "SELECT state || ' ' || seq || ' ' || cancel_requested FROM activities WHERE activity_id = 'm-\(i)'"),
                           ["cancelled 8 true"])
        }
        XCTAssertEqual(try Kit.sql(s, "SELECT count(*) FROM webhook_outbox"), ["10"], "one webhook per cancel")
        XCTAssertEqual(try Kit.sql(s, "SELECT count(*) FROM activities WHERE activity_id LIKE 'n-%' AND seq = 1"), ["50"])
        XCTAssertEqual(try Kit.sql(s, "SELECT count(DISTINCT position) = count(*) FROM activity_events"), ["t"], "one position each")
        XCTAssertGreaterThan(try s.metric("dispatch_publish_batches_total"), 0)
    }
}

