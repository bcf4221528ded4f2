import DispatchCore
import DispatchIO
import DispatchServer
import DispatchSystem
import DispatchTestSupport
import Glibc
import XCTest

/// Contract §6: a database that stops answering (SIGSTOP: a stuck disk, a network black hole)
/// is unavailable. Calls get 503 within DISPATCH_DB_TIMEOUT, /readyz fails, the sessions start
/// over, and once it answers again nothing acknowledged is lost and nothing is applied twice.
/// The cluster is this test's own: stopping the shared one would stall every other test.
final class DatabaseDeadlineTests: XCTestCase {
    var cluster: EmbeddedPostgres?
    var dataDir = ""
    var stopped: [pid_t] = []

    override func setUpWithError() throws {
        dataDir = "/tmp/dispatch-stall-\(getpid())-\(Int.random(in: 0..<1_000_000))"
        let pg = try EmbeddedPostgres(dataDir: dataDir, log: Logger(level: .warning))
        try pg.start()
        cluster = pg
    }

    override func tearDown() {
        resume()
        cluster?.stop()
        _ = Subprocess.run(["rm", "-rf", dataDir])
    }

    /// The postmaster and every backend it forked, stopped (postmaster first: no new forks).
    func freeze() throws {
        let pidFile = try XCTUnwrap(cluster).clusterDir + "/postmaster.pid"
        let postmaster = try XCTUnwrap(Files.read(pidFile)?.split(separator: "\n").first.flatMap { pid_t($0) })
        kill(postmaster, SIGSTOP)
        stopped = [postmaster]
        let children = Subprocess.run(["pgrep", "-P", String(postmaster)]).output.split(separator: "\n").compactMap { pid_t($0) }
        for child in children { kill(child, SIGSTOP) }
        stopped += children
        XCTAssertGreaterThan(children.count, 2, "the server's sessions are among the stopped backends")
    }

    func resume() {
        for pid in stopped { kill(pid, SIGCONT) }
        stopped = []
    }

    func testAStuckDatabaseAnswers503WithinTheTimeoutAndNothingIsLostOrAppliedTwice() throws {
        let pg = try XCTUnwrap(cluster)
        let server = TestServer(port: try TestServer.freePort(), conninfo: pg.conninfo, environment: ["DISPATCH_DB_TIMEOUT": "1"])
        try server.launch()
        defer { server.stop() }
        try server.startActivity("STALL-1")
        XCTAssertEqual(try server.update("STALL-1", #"{"progress":0.25}"#).status, 200)

        try freeze()
        let limit = 1.0 + 3
        var started = Clock.monotonic()
        let publish = try server.client.post("/v1/activities/STALL-1/update", #"{"progress":0.75}"#, headers: ["Idempotency-Key": "stall-k1"])
        XCTAssertEqual(publish.status, 503, publish.text)
        XCTAssertEqual(publish.json?["error"]?["code"], .string("database_unavailable"), publish.text)
        XCTAssertLessThan(Clock.monotonic() - started, limit, "the publish waited past the deadline")

        started = Clock.monotonic()
        let read = try server.client.get("/v1/activities/STALL-1")
        XCTAssertEqual(read.status, 503, read.text)
        XCTAssertLessThan(Clock.monotonic() - started, limit, "the read waited past the deadline")

        started = Clock.monotonic()
        let unknown = try HTTPClient(port: server.port, token: "no-such-key-0123456789").get("/v1/activities/STALL-1")
        XCTAssertTrue([401, 503].contains(unknown.status), "\(unknown.status) \(unknown.text)")
        XCTAssertLessThan(Clock.monotonic() - started, limit, "an unknown key waited on the stuck database")

        XCTAssertEqual(try HTTPClient(port: server.port).get("/readyz").status, 503)
        // Reconnects to the stuck server time out too (connect deadline): still 503, still quick.
        XCTAssertTrue(waitUntil(15) { server.log().contains("no answer to the connection attempt") }, "a reconnect timed out: \(server.log())")
        started = Clock.monotonic()
        XCTAssertEqual(try server.client.get("/v1/activities/STALL-1").status, 503)
        XCTAssertLessThan(Clock.monotonic() - started, limit)
        XCTAssertEqual(try HTTPClient(port: server.port).get("/readyz").status, 503)

        resume()
        XCTAssertTrue(waitUntil(30) { (try? HTTPClient(port: server.port).get("/readyz").status) == 200 }, server.log())
        // The publish answered 503 may have committed after all (its batch was on the wire): the
        // client's retry with the same Idempotency-Key must apply it exactly once.
        let retry = try server.client.post("/v1/activities/STALL-1/update", #"{"progress":0.75}"#, headers: ["Idempotency-Key": "stall-k1"])
        XCTAssertEqual(retry.status, 200, retry.text)
        XCTAssertEqual(try server.update("STALL-1", #"{"progress":0.9}"#).status, 200)
        let events = try server.client.get("/v1/activities/STALL-1/events?after=0&limit=100")
        XCTAssertEqual(events.status, 200, events.text)
        guard case .array(let list)? = events.json?["events"] else { return XCTFail(events.text) }
        let seqs = list.compactMap { e -> Int64? in if case .number(let n)? = e["seq"] { return Int64(n) } else { return nil } }
        let progresses = list.compactMap { e -> Double? in if case .number(let n)? = e["data"]?["progress"] { return n } else { return nil } }
        XCTAssertEqual(seqs, [1, 2, 3, 4], "acknowledged changes kept, the retried one applied once: \(events.text)")
        XCTAssertEqual(progresses.filter { $0 == 0.75 }.count, 1, events.text)
        XCTAssertTrue(server.log().contains("no answer from the database within 1 s"), server.log())
        XCTAssertGreaterThanOrEqual(try server.metric("dispatch_db_timeouts_total"), 2, "the writer's and the reader's, at least")
    }

    /// The blocking client of start-up, migrations and admin commands has deadlines too: an
    /// open session's statement and a new connection both give up instead of hanging.
    func testStartUpAndAdminStatementsGiveUpOnAStuckDatabase() throws {
        let pg = try XCTUnwrap(cluster)
        let open = try BlockingPG(pg.conninfo, timeout: 1)
        XCTAssertEqual(try open.query("SELECT 1 AS one").first?["one"], "1")
        try freeze()
        var started = Clock.monotonic()
        XCTAssertThrowsError(try open.query("SELECT 1")) { XCTAssertTrue("\($0)".contains("no answer from the database within 1 s"), "\($0)") }
        XCTAssertLessThan(Clock.monotonic() - started, 3)
        started = Clock.monotonic()
        XCTAssertThrowsError(try BlockingPG(pg.conninfo, timeout: 1))
        XCTAssertLessThan(Clock.monotonic() - started, 5, "connect_timeout (at least 2 s) bounds a new connection")
        resume()
        XCTAssertEqual(try BlockingPG(pg.conninfo, timeout: 5).query("SELECT 2 AS two").first?["two"], "2")
    }
}
