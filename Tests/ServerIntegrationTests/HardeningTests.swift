import DispatchCore
import DispatchIO
import DispatchSystem
import DispatchTestSupport
import Glibc
import XCTest

/// The hardening issue: each test failed before its fix.
final class EmbeddedDatabaseTests: XCTestCase {
    var dataDir = ""
    var pids: [pid_t] = []

    override func setUp() {
        dataDir = "/tmp/dispatch-embedded-\(getpid())-\(Int.random(in: 0..<1_000_000))"
    }

    override func tearDown() {
        for pid in pids { kill(pid, SIGTERM); _ = Subprocess.wait(pid, seconds: 15) }
        // Whatever a failed test left running.
        let ctl = "/usr/lib/postgresql/15/bin/pg_ctl"
        _ = Subprocess.run((getuid() == 0 ? ["runuser", "-u", "postgres", "--"] : []) + [ctl, "-D", dataDir + "/pg", "-m", "immediate", "stop"])
        _ = Subprocess.run(["rm", "-rf", dataDir])
    }

    /// A dispatchd on an embedded cluster in `dataDir`, its log in `dataDir`.log.
    func startServer(port: Int) throws -> pid_t {
        var env = Subprocess.currentEnvironment()
        env["DATABASE_URL"] = nil
        env["DISPATCH_DATA_DIR"] = dataDir
        env["DISPATCH_LISTEN"] = "127.0.0.1:\(port)"
        env["DISPATCH_WORKERS"] = "1"
        env["DISPATCH_MIGRATIONS_DIR"] = TestPaths.repositoryRoot + "/Migrations"
        let pid = try XCTUnwrap(Subprocess.start(["/bin/sh", "-c", "exec \(TestPaths.binary("dispatchd")) >> \(dataDir).log 2>&1"], environment: env))
        pids.append(pid)
        let ready = waitUntil(60) { (try? HTTPClient(port: port).get("/readyz").status) == 200 }
        XCTAssertTrue(ready, Files.read(dataDir + ".log") ?? "")
        return pid
    }

    func psql(_ conninfo: String, as user: String? = nil) -> Subprocess.Output {
        let cmd = ["/usr/lib/postgresql/15/bin/psql", conninfo, "-w", "-tAc", "SELECT 1"]
        return Subprocess.run(user.map { ["runuser", "-u", $0, "--"] + cmd } ?? cmd, environment: ["PATH": "/usr/sbin:/usr/bin:/sbin:/bin"])
    }

    /// Another local account cannot reach the embedded cluster: its socket directory is 0700,
    /// authentication needs the generated password (0600 file), and nothing listens on TCP.
    func testTheEmbeddedDatabaseIsPrivate() throws {
        let port = try TestServer.freePort()
        _ = try startServer(port: port)
        let socketDir = dataDir + "/run"
        var st = stat()
        XCTAssertEqual(stat(socketDir, &st), 0)
        XCTAssertEqual(st.st_mode & 0o777, 0o700, "socket directory mode")
        XCTAssertEqual(stat(dataDir + "/pg-password", &st), 0)
        XCTAssertEqual(st.st_mode & 0o777, 0o600, "password file mode")
        let hba = Subprocess.run((getuid() == 0 ? ["runuser", "-u", "postgres", "--"] : []) + ["cat", dataDir + "/pg/pg_hba.conf"]).output
        XCTAssertFalse(hba.split(separator: "\n").contains { !$0.hasPrefix("#") && $0.hasSuffix("trust") }, hba)

        let target = "host=\(socketDir) user=dispatch dbname=dispatch"
        if getuid() == 0 {
            let other = psql(target, as: "nobody")
            XCTAssertNotEqual(other.status, 0, "another local user connected: \(other.output)")
        }
        let noPassword = psql(target + " passfile=/nonexistent")
        XCTAssertNotEqual(noPassword.status, 0, "connected without the password: \(noPassword.output)")
        XCTAssertTrue(noPassword.output.contains("password"), noPassword.output)
        XCTAssertEqual(psql(target + " passfile=\(dataDir)/pgpass").status, 0, "the server's own way in works")
        let tcp = psql("host=127.0.0.1 port=5432 user=dispatch dbname=dispatch")
        XCTAssertNotEqual(tcp.status, 0)
    }

    /// A dispatchd killed with -9 leaves its cluster running: the next start adopts it (and
    /// stops it on exit); a second server on the same data dir is refused.
    func testAClusterLeftRunningIsAdoptedAndASecondServerIsRefused() throws {
        let port = try TestServer.freePort()
        let first = try startServer(port: port)
        let second = Subprocess.run([TestPaths.binary("dispatchd"), "--data-dir", dataDir, "--listen", "127.0.0.1:\(try TestServer.freePort())",
                                     "--workers", "1"], environment: ["PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DISPATCH_MIGRATIONS_DIR": TestPaths.repositoryRoot + "/Migrations"])
        XCTAssertNotEqual(second.status, 0)
        XCTAssertTrue(second.output.contains("another dispatchd"), second.output)

        kill(first, SIGKILL)
        _ = Subprocess.wait(first)
        pids.removeAll()
        let again = try startServer(port: port)
        XCTAssertTrue((Files.read(dataDir + ".log") ?? "").contains("embedded_postgres.adopted"))
        kill(again, SIGTERM)
        XCTAssertNotNil(Subprocess.wait(again, seconds: 20))
        pids.removeAll()
        XCTAssertFalse(Files.exists(dataDir + "/pg/postmaster.pid"), "the adopted cluster was stopped at exit")
    }

    /// Key commands never create a database: from a directory without one they fail naming the
    /// data dir they looked for; with one they say which database they used.
    func testKeyCommandsNeverInitialiseADatabase() throws {
        let env = ["PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DISPATCH_MIGRATIONS_DIR": TestPaths.repositoryRoot + "/Migrations"]
        let missing = Subprocess.run([TestPaths.binary("dispatchd"), "keys", "list", "--data-dir", dataDir], environment: env)
        XCTAssertEqual(missing.status, 2, missing.output)
        XCTAssertTrue(missing.output.contains(dataDir), missing.output)
        XCTAssertFalse(Files.exists(dataDir), "a key command created \(dataDir)")

        _ = try startServer(port: try TestServer.freePort())
        let listed = Subprocess.run([TestPaths.binary("dispatchd"), "keys", "list", "--data-dir", dataDir], environment: env)
        XCTAssertEqual(listed.status, 0, listed.output)
        XCTAssertTrue(listed.output.contains("embedded PostgreSQL under \(dataDir)"), listed.output)
        XCTAssertTrue(listed.output.contains("development"), listed.output)
    }
}

final class HardeningTests: XCTestCase {
    /// A revoked bootstrap key stays revoked across restarts unless its secret changes.
    func testARevokedBootstrapKeyStaysRevoked() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        let spare = try AuthKit.createKey(s, "spare-admin", ["admin"])
        XCTAssertEqual(try HTTPClient(port: s.port, token: spare).request("DELETE", "/v1/keys/bootstrap").status, 200)
        try s.restart()
        AuthKit.assertError(try s.client.get("/v1/activities"), 401, "unauthorized", "after a restart")
        s.environment["DISPATCH_BOOTSTRAP_KEY"] = "another-bootstrap-secret-0123"
        try s.restart()
        XCTAssertEqual(try HTTPClient(port: s.port, token: "another-bootstrap-secret-0123").get("/v1/activities").status, 200)
    }

    /// Two Content-Length headers that disagree make the request's framing ambiguous: 400.
    func testConflictingContentLengthsAreRefused() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        let body = #"{"activityId":"CL-1","taskName":"x"}"#
        func send(_ lengths: [Int]) -> (status: Int?, raw: [UInt8]) {
            var head = "POST /v1/activities/start HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer \(s.adminKey)\r\nContent-Type: application/json\r\n"
            for n in lengths { head += "Content-Length: \(n)\r\n" }
            let r = AuthKit.exchange(port: s.port, Array((head + "\r\n" + body).utf8), timeout: 10)
            return (r.status, r.raw)
        }
        XCTAssertEqual(send([body.utf8.count, 5]).status, 400)
        XCTAssertEqual(try s.client.get("/v1/activities/CL-1").status, 404, "nothing stored")
        XCTAssertEqual(send([body.utf8.count, body.utf8.count]).status, 201, "identical duplicates are one length")
    }

    /// A stored Idempotency-Key answer goes only to the same key's owner, for the same
    /// activity and the same kind of call.
    func testIdempotencyReplaysOnlyTheSameCallOfTheSameOwner() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        let alice = HTTPClient(port: s.port, token: try AuthKit.createKey(s, "alice", ["publish"]))
        let mallory = HTTPClient(port: s.port, token: try AuthKit.createKey(s, "mallory", ["publish"]))
        XCTAssertEqual(try alice.post("/v1/activities/start", #"{"activityId":"IK-1","taskName":"x","state":"processing"}"#).status, 201)
        let key = ["Idempotency-Key": "same-key-1"]
        let update = try alice.post("/v1/activities/IK-1/update", #"{"progress":0.5}"#, headers: key)
        XCTAssertEqual(update.status, 200)
        XCTAssertEqual(try alice.post("/v1/activities/IK-1/update", #"{"progress":0.5}"#, headers: key).status, 200, "the same call again")

        AuthKit.assertError(try mallory.post("/v1/activities/IK-1/update", #"{"progress":0.5}"#, headers: key), 403, "forbidden",
                            "another publisher reusing the key")
        AuthKit.assertError(try alice.post("/v1/activities/IK-1/end", "{}", headers: key), 409, "conflict", "an end reusing an update's key")
        let now = try s.client.get("/v1/activities/IK-1")
        XCTAssertEqual(now.json?["state"], .string("processing"), "the end was not applied")
        XCTAssertEqual(now.json?["seq"], .number(2))
        XCTAssertEqual(try alice.post("/v1/activities/IK-1/end", "{}", headers: ["Idempotency-Key": "end-key"]).status, 200)
    }
}

/// Revocation: the answering worker stops accepting the key before it answers, and every
/// worker ends the key's streams.
final class RevocationTests: XCTestCase {
    /// Revoke, then use the key on the same kept-alive connection (so the same worker): never
    /// accepted after the answer, hundreds of times, with two workers.
    func testARevokedKeyIsRefusedRightAfterTheAnswer() throws {
        let s = try TestServer.start(environment: ["DISPATCH_WORKERS": "2"])
        defer { s.stop() }
        for i in 0..<150 {
            let secret = try AuthKit.createKey(s, "loop-\(i)", ["read"])
            let conn = try KeepAliveConnection(port: s.port)
            defer { conn.close() }
            XCTAssertEqual(try conn.request("GET", "/v1/activities", token: secret).status, 200, "cached as valid on this worker")
            XCTAssertEqual(try conn.request("DELETE", "/v1/keys/loop-\(i)", token: s.adminKey).status, 200)
            let after = try conn.request("GET", "/v1/activities", token: secret)
            XCTAssertEqual(after.status, 401, "iteration \(i): a revoked key was accepted after the revocation's answer")
            if after.status != 401 { break }
        }
    }

    /// A revoked key's open streams end on every worker within a few seconds, and a later
    /// event never reaches them.
    func testRevokingAKeyEndsItsStreamsOnEveryWorker() throws {
        let s = try TestServer.start(environment: ["DISPATCH_WORKERS": "2"])
        defer { s.stop() }
        try s.startActivity("REVOKED-STREAMS")
        let secret = try AuthKit.createKey(s, "streamer", ["read"])
        // Enough streams that both workers hold some (the kernel spreads connections).
        let streams = try (0..<12).map { _ in try SSEClient(port: s.port, path: "/v1/activities/REVOKED-STREAMS/status", token: secret) }
        for st in streams { _ = try st.waitForEvents(1) }
        XCTAssertEqual(try s.client.request("DELETE", "/v1/keys/streamer").status, 200)
        for st in streams { XCTAssertTrue(try st.waitForEnd(timeout: 5), "a stream of a revoked key stayed open") }
        try s.update("REVOKED-STREAMS")
        for st in streams { XCTAssertEqual(st.events.count, 1, "an event published after the revocation arrived") }
        XCTAssertGreaterThanOrEqual(try s.metric("dispatch_stream_closes_total", labels: "reason=\"revoked\""), 1)
    }
}
