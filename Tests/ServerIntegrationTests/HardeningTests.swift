// Long: the hardening issue's items, one small test class each, side by side.
import DispatchCore
import DispatchCrypto
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

    /// As root with the data dir under a private directory (0700, as a home directory often
    /// is), the postgres user cannot reach the cluster: older releases moved it to
    /// /var/lib/dispatch/<hash> in silence; now dispatchd says so and exits 2 (issue 36; the
    /// full case is EmbeddedStartupTests.testAnotherUsersDataDirAndAnUnreachableOneAreRefused).
    /// A cluster an older release put there is still used.
    func testAPrivateParentDirectoryIsSaidAndAnOlderRelocatedClusterStillServes() throws {
        guard getuid() == 0 else { throw XCTSkip("relocation happened only when dispatchd ran as root") }
        let parent = dataDir + "-home"
        try Files.makeDirectory(parent, mode: 0o700)
        chmod(parent, 0o700)
        let ownDir = dataDir
        dataDir = parent + "/data"
        let relocated = "/var/lib/dispatch/" + String(SHA256.hex(Array(dataDir.utf8)).prefix(16))
        defer {
            for pid in pids { kill(pid, SIGTERM); _ = Subprocess.wait(pid, seconds: 15) }
            pids = []
            _ = Subprocess.run(["runuser", "-u", "postgres", "--", "/usr/lib/postgresql/15/bin/pg_ctl", "-D", relocated + "/pg", "-m", "immediate", "stop"])
            _ = Subprocess.run(["rm", "-rf", relocated, parent, ownDir + ".log"])
            dataDir = ownDir
        }
        let refused = Subprocess.run([TestPaths.binary("dispatchd"), "--data-dir", dataDir, "--listen", "127.0.0.1:\(try TestServer.freePort())",
                                      "--workers", "1"], environment: ["PATH": "/usr/sbin:/usr/bin:/sbin:/bin"])
        XCTAssertEqual(refused.status, 2, refused.output)
        XCTAssertTrue(refused.output.contains("cannot reach"), refused.output)
        XCTAssertFalse(Files.exists(relocated), "nothing made elsewhere")

        // An older release's relocated cluster: made here by initdb as that release did.
        try Files.makeDirectory("/var/lib/dispatch", mode: 0o711)
        try Files.makeDirectory(relocated, mode: 0o700)
        XCTAssertEqual(Subprocess.run(["chown", "postgres:postgres", relocated]).status, 0)
        try Files.makeDirectory(dataDir, mode: 0o700)
        try Files.write(dataDir + "/pg-password", "older-release-password\n", mode: 0o600)
        try Files.write(relocated + "/pw", "older-release-password\n", mode: 0o600)
        XCTAssertEqual(Subprocess.run(["chown", "postgres:postgres", relocated + "/pw"]).status, 0)
        let initdb = Subprocess.run(["runuser", "-u", "postgres", "--", "/usr/lib/postgresql/15/bin/initdb", "-D", relocated + "/pg", "-U", "dispatch",
                                     "--auth=scram-sha-256", "--pwfile=\(relocated)/pw", "-E", "UTF8", "--locale=C.UTF-8", "--no-instructions"])
        XCTAssertEqual(initdb.status, 0, initdb.output)
        let port = try TestServer.freePort()
        _ = try startServer(port: port)
        XCTAssertTrue((Files.read(dataDir + ".log") ?? "").contains("embedded_postgres.legacy_location"))
        XCTAssertEqual(try HTTPClient(port: port).get("/readyz").status, 200)
    }

    /// A dispatchd killed with -9 leaves no cluster running; one found running anyway is
    /// adopted (and stopped on exit); a second server on the same data dir is refused.
    func testAClusterLeftRunningIsAdoptedAndASecondServerIsRefused() throws {
        let port = try TestServer.freePort()
        let first = try startServer(port: port)
        let second = Subprocess.run([TestPaths.binary("dispatchd"), "--data-dir", dataDir, "--listen", "127.0.0.1:\(try TestServer.freePort())",
                                     "--workers", "1"], environment: ["PATH": "/usr/sbin:/usr/bin:/sbin:/bin"])
        XCTAssertNotEqual(second.status, 0)
        XCTAssertTrue(second.output.contains("another dispatchd"), second.output)

        kill(first, SIGKILL)
        _ = Subprocess.wait(first)
        pids.removeAll()
        // Its watchdog stops the cluster (issue 36: no orphan postgres); a cluster still
        // running when the next server starts (the watchdog killed too) is adopted.
        XCTAssertTrue(waitUntil(20) { !Files.exists(self.dataDir + "/pg/postmaster.pid") }, "the killed server's cluster was stopped")
        // That watchdog keeps looking for 10 s (for a start still under way) and, nobody holding
        // the data dir's lock, would stop the cluster started below before the next server
        // adopts it (seen under load: that server then started the cluster itself).
        XCTAssertTrue(waitUntil(20) { Subprocess.run(["pgrep", "-f", "kill -0 \(first) 2>/dev/null"]).status != 0 }, "the killed server's watchdog ended")
        let ctl = (getuid() == 0 ? ["runuser", "-u", "postgres", "--"] : []) + ["/usr/lib/postgresql/15/bin/pg_ctl", "-D", dataDir + "/pg"]
        let options = "-k \(dataDir)/run -c listen_addresses='' -c unix_socket_permissions=0700"
        XCTAssertEqual(Subprocess.run(ctl + ["-o", options, "-l", dataDir + "/pg/server.log", "-w", "start"]).status, 0)
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
        let env = ["PATH": "/usr/sbin:/usr/bin:/sbin:/bin"]
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

    /// The feed too: a revoked key's feeds end.
    func testRevokingAKeyEndsItsFeeds() throws {
        let s = try TestServer.start(environment: ["DISPATCH_WORKERS": "2"])
        defer { s.stop() }
        try s.startActivity("REVOKED-FEED")
        let secret = try AuthKit.createKey(s, "feeder", ["read"])
        let feeds = try (0..<8).map { _ in try SSEClient(port: s.port, path: "/v1/stream", token: secret) }
        for f in feeds { XCTAssertTrue(try f.pump(timeout: 10) { $0.events.contains { $0.event == "synced" } }) }
        XCTAssertEqual(try s.client.request("DELETE", "/v1/keys/feeder").status, 200)
        for f in feeds { XCTAssertTrue(try f.waitForEnd(timeout: 5), "a feed of a revoked key stayed open") }
    }
}

/// Only the workers of one server share its address.
final class ListenAddressTests: XCTestCase {
    func run(_ env: [String: String], timeout: Double = 20) -> (status: Int32?, output: String) {
        var e = Subprocess.currentEnvironment()
        for (k, v) in env { e[k] = v }
        let log = "/tmp/dispatchd-listen-\(getpid())-\(Int.random(in: 0..<1_000_000)).log"
        defer { unlink(log) }
        guard let pid = Subprocess.start(["/bin/sh", "-c", "exec \(TestPaths.binary("dispatchd")) > \(log) 2>&1"], environment: e) else {
            return (nil, "cannot start")
        }
        let status = Subprocess.wait(pid, seconds: timeout)
        if status == nil { kill(pid, SIGKILL); _ = Subprocess.wait(pid) }
        return (status, Files.read(log) ?? "")
    }

    /// A second dispatchd on the same address (its own database) must not start and split the
    /// port with the first.
    func testASecondServerOnTheSameAddressFailsAtStart() throws {
        let first = try TestServer.start(environment: ["DISPATCH_WORKERS": "2"])
        defer { first.stop() }
        let other = try TestPostgres.shared().freshDatabase()
        let r = run(["DATABASE_URL": other, "DISPATCH_LISTEN": "127.0.0.1:\(first.port)", "DISPATCH_WORKERS": "2"])
        XCTAssertNotNil(r.status, "the second server kept running")
        XCTAssertNotEqual(r.status, 0, r.output)
        XCTAssertTrue(r.output.contains("address in use"), r.output)
        XCTAssertFalse(r.output.contains("worker_started"), "it forked workers: \(r.output)")
        for _ in 0..<20 { XCTAssertEqual(try first.client.get("/v1/activities").status, 200, "every request reaches the first server") }
    }

    /// A port another program holds: one clear failure, non-zero, before any worker starts.
    func testAnAddressTakenByAnotherProgramFailsOnceNonZero() throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &addr) { p in p.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, len) == 0 && getsockname(fd, $0, &len) == 0 } }
        listen(fd, 16)
        let port = Int(UInt16(bigEndian: addr.sin_port))
        let started = Clock.monotonic()
        let r = run(["DATABASE_URL": try TestPostgres.shared().freshDatabase(), "DISPATCH_LISTEN": "127.0.0.1:\(port)", "DISPATCH_WORKERS": "2"])
        XCTAssertNotEqual(r.status ?? 0, 0, r.output)
        XCTAssertTrue(r.output.contains("address in use"), r.output)
        XCTAssertFalse(r.output.contains("giving_up") || r.output.contains("worker_crashed"), r.output)
        XCTAssertLessThan(Clock.monotonic() - started, 15, "it failed once, not after restart cycles")
    }

    /// Port 0: the server picks one port and every worker serves it.
    func testPortZeroIsOnePortForEveryWorker() throws {
        let s = try TestServer.start(environment: ["DISPATCH_WORKERS": "2"])
        defer { s.stop() }
        let r = run(["DATABASE_URL": s.conninfo, "DISPATCH_LISTEN": "127.0.0.1:0", "DISPATCH_WORKERS": "2"], timeout: 3)
        XCTAssertNil(r.status, "the server exited: \(r.output)")
        let ports = Set(r.output.split(separator: "\n").filter { $0.contains("worker.listening") }.compactMap { line in
            line.split(separator: " ").first { $0.hasPrefix("listen=") }.map(String.init)
        })
        XCTAssertEqual(ports.count, 1, r.output)
    }
}

/// Slow, unauthenticated clients cannot hold the server: a whole-request deadline, and a cap
/// per client address on connections that have not completed a request.
final class SlowClientTests: XCTestCase {
    /// Headers trickled a line at a time forever (slowloris), hundreds of connections, on a
    /// server with few descriptors: health checks keep working and every trickler is cut.
    func testTricklingConnectionsAreCutAndHealthChecksKeepWorking() throws {
        let s = TestServer(port: try TestServer.freePort(), conninfo: try TestPostgres.shared().freshDatabase(), environment: [
            "DISPATCH_REQUEST_DEADLINE": "4", "DISPATCH_MAX_PENDING_PER_CLIENT": "16",
        ])
        s.shell = "ulimit -n 256;"  // few descriptors: the flood would exhaust them
        try s.launch()
        defer { s.stop() }
        var sockets: [TestSocket] = []
        for _ in 0..<300 {
            guard let sock = try? TestSocket.connect(port: s.port) else { break }
            try? sock.send("GET /v1/activities HTTP/1.1\r\nHost: x\r\n")
            sockets.append(sock)
        }
        defer { for sock in sockets { sock.close() } }
        var healthy = 0, sick = 0
        let started = Clock.monotonic()
        while Clock.monotonic() - started < 9 {
            for sock in sockets { try? sock.send("X-Trickle: 1\r\n") }
            if (try? HTTPClient(port: s.port).get("/healthz").status) == 200 { healthy += 1 } else { sick += 1 }
            usleep(500_000)
        }
        // Within a few seconds (the cap cuts the flood after its grace) health checks answer.
        XCTAssertGreaterThan(healthy, 10, "healthy \(healthy), failing \(sick)")
        let closed = AuthKit.waitForClose(sockets, timeout: 10)
        XCTAssertEqual(closed.stillOpen, 0, "trickling connections outlived the request deadline")
        XCTAssertFalse(closed.sawSuccess)
        XCTAssertGreaterThanOrEqual(try s.metric("dispatch_connections_cut_total"), 250)
    }
}

/// A database that refuses writes (read-only, a full disk): reads and streams keep working,
/// publishes get a clear 503, and /readyz says why.
final class ReadOnlyDatabaseTests: XCTestCase {
    func testReadsAndStreamsWorkOnADatabaseThatRefusesWrites() throws {
        let s = try TestServer.start(environment: ["DISPATCH_HEARTBEAT": "0.5"])
        defer { s.stop() }
        try s.startActivity("RO-1")
        let reader = try AuthKit.createKey(s, "ro-reader", ["read"])   // never used yet: not cached
        let pg = try TestPostgres.shared()
        let dbName = try XCTUnwrap(pg.sql(s.conninfo, "SELECT current_database()").first?.first ?? nil)
        _ = try pg.sql(s.conninfo, "ALTER DATABASE \"\(dbName)\" SET default_transaction_read_only = on")
        // The test's own session stays writable to undo it.
        let writable = s.conninfo + " options='-c default_transaction_read_only=off'"
        defer { _ = try? pg.sql(writable, "ALTER DATABASE \"\(dbName)\" RESET default_transaction_read_only") }
        // The server's sessions pick the setting up when they reconnect.
        _ = try pg.sql(s.conninfo, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
        XCTAssertTrue(waitUntil(20) { (try? HTTPClient(port: s.port).get("/readyz").text.contains("writes_refused")) == true },
                      (try? HTTPClient(port: s.port).get("/readyz").text) ?? "")
        XCTAssertEqual(try HTTPClient(port: s.port).get("/readyz").status, 503)

        let c = HTTPClient(port: s.port, token: reader)
        XCTAssertEqual(try c.get("/v1/activities").status, 200, "authentication must not need a write")
        XCTAssertEqual(try c.get("/v1/activities/RO-1").status, 200)
        let stream = try SSEClient(port: s.port, path: "/v1/activities/RO-1/status", token: reader)
        XCTAssertEqual(try stream.waitForEvents(1).map(\.event), ["processing"])
        let refused = try s.update("RO-1")
        AuthKit.assertError(refused, 503, "database_unavailable", "a publish on a read-only database")

        _ = try pg.sql(writable, "ALTER DATABASE \"\(dbName)\" RESET default_transaction_read_only")
        _ = try pg.sql(writable, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
        XCTAssertTrue(waitUntil(20) { (try? HTTPClient(port: s.port).get("/readyz").status) == 200 })
        XCTAssertTrue(waitUntil(10) { (try? s.update("RO-1").status) == 200 })
    }
}

/// A `read` key cannot grow a worker's memory: finished query results are released with
/// their batch, and a long replay is read page by page only as fast as its client reads.
final class ReplayMemoryTests: XCTestCase {
    /// A history of `count` events of about 500 bytes, written straight into the database.
    func makeHistory(_ s: TestServer, id: String, count: Int) throws {
        try s.startActivity(id)
        let pg = try TestPostgres.shared()
        let filler = String(repeating: "x", count: 420)
        _ = try pg.sql(s.conninfo, """
            INSERT INTO activity_events (activity_id, seq, event, data, created_ms, position)
            SELECT $1, g, 'processing', '{"activityId":"' || $1 || '","seq":' || g || ',"status":"\(filler)"}', 0, nextval('feed_positions')
            FROM generate_series(2, $2::int) g
            """, [id, String(count)])
        _ = try pg.sql(s.conninfo, "UPDATE activities SET seq = $2::bigint WHERE activity_id = $1", [id, String(count)])
    }

    func rssMB(_ s: TestServer) -> Int { (ProcessFigures.residentBytes(of: s.pid) ?? 0) >> 20 }

    /// 60 reads of 1,000 events each (before: +400 MB that stayed).
    func testHistoryReadsDoNotAccumulate() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        try makeHistory(s, id: "LONG-READS", count: 3000)
        XCTAssertEqual(try s.client.get("/v1/activities/LONG-READS/events?limit=1000").status, 200)
        let before = rssMB(s)
        for i in 0..<60 {
            let r = try s.client.get("/v1/activities/LONG-READS/events?after=\(i % 3 * 1000)&limit=1000")
            XCTAssertEqual(r.status, 200)
        }
        XCTAssertLessThan(rssMB(s) - before, 48, "RSS grew \(rssMB(s) - before) MB over 60 history reads")
    }

    /// Replays that never read (before: about 60 MB per stream, fetched regardless): the server
    /// holds about one page for each, and the reading ones get everything.
    func testStalledReplaysHoldAboutOnePage() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        try makeHistory(s, id: "LONG-REPLAY", count: 3000)
        let before = rssMB(s)
        var stalled: [SSEClient] = []
        for _ in 0..<40 {
            stalled.append(try SSEClient(port: s.port, path: "/v1/activities/LONG-REPLAY/status", token: s.adminKey, lastEventID: 0, smallBuffer: true))
        }
        defer { for st in stalled { st.close() } }
        let reader = try s.stream("LONG-REPLAY", lastEventID: 0)
        XCTAssertTrue(try reader.pump(timeout: 30) { $0.events.count >= 3000 }, "the reading client got \(reader.events.count) events")
        assertConsecutive(reader.ids, from: 1, through: 3000)
        usleep(500_000)
        let grown = rssMB(s) - before
        XCTAssertLessThan(grown, 40, "RSS grew \(grown) MB with 40 stalled replays")
        XCTAssertEqual(try s.metric("dispatch_streams_active"), 41, "stalled replays wait; they are not dropped")
    }
}

/// A worker listens only once its database sessions are up: a publish that reaches the server
/// right after start is answered, not refused with 503.
final class StartupTests: XCTestCase {
    func testTheFirstRequestsAfterStartAreServed() throws {
        let s = TestServer(port: try TestServer.freePort(), conninfo: try TestPostgres.shared().freshDatabase(),
                           environment: ["DISPATCH_WORKERS": "2"])
        var env = Subprocess.currentEnvironment()
        env["DATABASE_URL"] = s.conninfo
        env["DISPATCH_LISTEN"] = "127.0.0.1:\(s.port)"
        env["DISPATCH_BOOTSTRAP_KEY"] = s.adminKey
        env["DISPATCH_WORKERS"] = "2"
        let pid = try XCTUnwrap(Subprocess.start(["/bin/sh", "-c", "exec \(TestPaths.binary("dispatchd")) > /dev/null 2>&1"], environment: env))
        defer { kill(pid, SIGTERM); _ = Subprocess.wait(pid, seconds: 20) }
        // The first moment anything answers, publish through many new connections.
        XCTAssertTrue(waitUntil(30) { (try? TestSocket.connect(port: s.port)) != nil })
        var statuses: [Int] = []
        for i in 0..<40 {
            let r = try s.client.post("/v1/activities/start", #"{"activityId":"EARLY-\#(i)","taskName":"x"}"#)
            statuses.append(r.status)
        }
        XCTAssertEqual(Set(statuses), [201], "\(statuses)")
    }
}
