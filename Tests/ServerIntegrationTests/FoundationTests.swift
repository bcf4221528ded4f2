import DispatchSystem
import DispatchCore
import DispatchIO
import DispatchServer
import DispatchTestSupport
import Glibc
import XCTest

/// Issue 2: the server skeleton against a real PostgreSQL.
final class FoundationTests: XCTestCase {
    func testHealthReadyAndMetrics() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        let plain = HTTPClient(port: s.port)
        XCTAssertEqual(try plain.get("/healthz").status, 200)
        XCTAssertEqual(try plain.get("/readyz").status, 200)
        let m = try plain.get("/metrics")
        XCTAssertEqual(m.status, 200)
        XCTAssertTrue(m.text.contains("\ndispatch_streams_active 0\n"), m.text)
        XCTAssertTrue(m.text.contains("dispatch_db_query_seconds_bucket"))
        XCTAssertTrue(m.text.contains("process_resident_memory_bytes"))
        XCTAssertEqual(try plain.get("/nope").status, 404)
        XCTAssertEqual(try plain.get("/nope").errorCode, "not_found")
    }

    func testMigrationsAppliedOnceInOrder() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        let pg = try TestPostgres.shared()
        let before = try pg.sql(s.conninfo, "SELECT version FROM schema_migrations ORDER BY applied_at, version")
        // Running `migrate` again, and restarting, applies nothing twice.
        var env = Subprocess.currentEnvironment()
        env["DATABASE_URL"] = s.conninfo
        let out = Subprocess.run([TestPaths.binary("dispatchd"), "migrate"], environment: env)
        XCTAssertEqual(out.status, 0, out.output)
        try s.restart()
        let after = try pg.sql(s.conninfo, "SELECT version FROM schema_migrations ORDER BY applied_at, version")
        XCTAssertEqual(before, after)
        let files = try Migrations.load(from: TestPaths.repositoryRoot + "/Migrations").map { $0.version }
        XCTAssertEqual(after.compactMap { $0[0] }, files)
        XCTAssertEqual(files, files.sorted())
        XCTAssertEqual(Migrations.embedded.map(\.version), files, "the binary carries every migration of the tree")
        XCTAssertEqual(Migrations.embedded.map(\.sql), try Migrations.load(from: TestPaths.repositoryRoot + "/Migrations").map(\.sql))
    }

    /// A deployed dispatchd needs nothing beside it: copied alone into an empty directory, it
    /// migrates a new database and serves; it says its version and commit.
    func testTheBinaryIsSelfContained() throws {
        let dir = "/tmp/dispatchd-alone-\(getpid())"
        _ = Subprocess.run(["rm", "-rf", dir])
        try Files.makeDirectory(dir)
        defer { _ = Subprocess.run(["rm", "-rf", dir]) }
        XCTAssertEqual(Subprocess.run(["cp", TestPaths.binary("dispatchd"), dir + "/dispatchd"]).status, 0)
        let version = Subprocess.run([dir + "/dispatchd", "--version"])
        XCTAssertEqual(version.status, 0)
        XCTAssertTrue(version.output.hasPrefix("dispatchd 0."), version.output)
        XCTAssertTrue(version.output.contains("commit"), version.output)
        var env = Subprocess.currentEnvironment()
        env["DATABASE_URL"] = try TestPostgres.shared().freshDatabase()
        env["DISPATCH_MIGRATIONS_DIR"] = nil
        let out = Subprocess.run(["/bin/sh", "-c", "cd \(dir) && ./dispatchd migrate"], environment: env)
        XCTAssertEqual(out.status, 0, out.output)
        XCTAssertTrue(out.output.contains("migration.applied"), out.output)
    }

    func testBadConfigurationExitsWithCodeTwo() throws {
        for (k, v) in [("DISPATCH_HEARTBEAT", "soon"), ("DISPATCH_LISTEN", "nowhere"), ("DISPATCH_WORKERS", "0"), ("DISPATCH_LOG_LEVEL", "loud")] {
            var env = Subprocess.currentEnvironment()
            env[k] = v
            let out = Subprocess.run([TestPaths.binary("dispatchd")], environment: env)
            XCTAssertEqual(out.status, 2, "\(k)=\(v): \(out.output)")
            XCTAssertTrue(out.output.contains(k), out.output)
        }
        let help = Subprocess.run([TestPaths.binary("dispatchd"), "--help"])
        XCTAssertEqual(help.status, 0)
        for s in ServerConfig.settings { XCTAssertTrue(help.output.contains(s.env)) }
    }

    func testOversizedHeadersAndBodiesAreRejected() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        let big = String(repeating: "a", count: 20_000)
        let r = try s.client.get("/healthz", headers: ["X-Big": big])
        XCTAssertTrue([400, 413, 431].contains(r.status), "\(r.status)")
        let body = #"{"taskName":"\#(String(repeating: "x", count: 17_000))"}"#
        let b = try s.client.post("/v1/activities/start", body)
        XCTAssertEqual(b.status, 413)
        XCTAssertEqual(b.errorCode, "body_too_large")
        let huge = #"{"taskName":"\#(String(repeating: "x", count: 100_000))"}"#
        XCTAssertEqual(try s.client.post("/v1/activities/start", huge).status, 413)
        XCTAssertEqual(try s.client.get("/healthz").status, 200)
    }

    func testHalfSentRequestIsClosedByTheDeadline() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        let sock = try TestSocket.connect(port: s.port)
        try sock.send("POST /v1/activities/start HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"task")
        // The server's read deadline (10 s of silence) closes it; we wait up to 30 s.
        let start = Clock.monotonic()
        var closed = false
        while Clock.monotonic() - start < 30 {
            if let chunk = try sock.read(timeout: 1), chunk.isEmpty || String(decoding: chunk, as: UTF8.self).contains("HTTP/1.1 4") {
                closed = true
                break
            }
        }
        XCTAssertTrue(closed, "half-sent request still open after 30 s")
        XCTAssertEqual(try s.client.get("/healthz").status, 200)
    }

    func testReadinessFollowsTheDatabaseAndTheServerReconnects() throws {
        let pg = try TestPostgres.shared()
        let s = try TestServer.start()
        defer { s.stop() }
        try s.startActivity("db-1")
        let stopped = Subprocess.run(pgctl(pg) + ["-m", "immediate", "-w", "stop"])
        XCTAssertEqual(stopped.status, 0, stopped.output)
        XCTAssertTrue(waitUntil(15) { (try? HTTPClient(port: s.port).get("/readyz").status) == 503 })
        XCTAssertEqual(try HTTPClient(port: s.port).get("/healthz").status, 200)
        let during = try s.update("db-1")
        XCTAssertEqual(during.status, 503)
        XCTAssertEqual(during.errorCode, "database_unavailable")
        let started = Subprocess.run(pgctl(pg) + ["-o", "-k \(pg.embedded.socketDir) -c listen_addresses=''", "-l", pg.embedded.clusterDir + "/server.log", "-w", "start"])
        XCTAssertEqual(started.status, 0, started.output)
        XCTAssertTrue(waitUntil(20) { (try? HTTPClient(port: s.port).get("/readyz").status) == 200 }, s.log())
        XCTAssertEqual(try s.update("db-1").status, 200)
        XCTAssertEqual(try s.seq("db-1"), 2)
    }

    private func pgctl(_ pg: TestPostgres) -> [String] {
        let versions = ["17", "16", "15", "14", "13"]
        let bin = versions.map { v -> String in "/usr/lib/postgresql/" + v + "/bin/pg_ctl" }.first { access($0, X_OK) == 0 }!
        return (getuid() == 0 ? ["runuser", "-u", "postgres", "--"] : []) + [bin, "-D", pg.embedded.clusterDir]
    }
}
