import DispatchCore
import DispatchIO
import DispatchSystem
import DispatchTestSupport
import Glibc
import XCTest

/// Issue 24's operational findings: signals, secrets on the command line, start-up order.
final class SignalTests: XCTestCase {
    /// SIGHUP killed dispatchd at once, without a drain or a log line; now it is logged and
    /// ignored, by a single worker and by the supervisor of several.
    func testSIGHUPIsLoggedAndIgnored() throws {
        for workers in ["1", "2"] {
            let s = try TestServer.start(environment: ["DISPATCH_WORKERS": workers])
            defer { s.stop() }
            try s.startActivity("HUP-\(workers)")
            XCTAssertEqual(kill(s.pid, SIGHUP), 0)
            XCTAssertTrue(waitUntil(10) { s.log().contains("signal.hangup_ignored") }, s.log())
            XCTAssertEqual(waitpid(s.pid, nil, WNOHANG), 0, "dispatchd exited on SIGHUP (workers \(workers))")
            XCTAssertEqual(try s.update("HUP-\(workers)").status, 200)
            XCTAssertEqual(try HTTPClient(port: s.port).get("/readyz").status, 200)
        }
    }
}

/// Issue 24 item 9: secrets from files; a warning for secrets given as flags (visible in ps).
final class SecretFileTests: XCTestCase {
    func testTheBootstrapKeyFromAFileWorks() throws {
        let path = "/tmp/dispatch-bootstrap-\(getpid())-\(Int.random(in: 0..<1_000_000))"
        defer { unlink(path) }
        let cluster = try TestPostgres.shared()
        let s = TestServer(port: try TestServer.freePort(), conninfo: try cluster.freshDatabase(),
                           environment: ["DISPATCH_BOOTSTRAP_KEY": "", "DISPATCH_BOOTSTRAP_KEY_FILE": path])
        try Files.write(path, s.adminKey + "\n", mode: 0o600)
        try s.launch()
        defer { s.stop() }
        XCTAssertEqual(try s.client.get("/v1/activities").status, 200, "the key from the file is the admin key")
        XCTAssertFalse(s.log().contains("config.secret_on_command_line"), s.log())
    }

    func testSecretFlagsOnTheCommandLineAreWarnedAbout() throws {
        let port = try TestServer.freePort()
        let log = "/tmp/dispatchd-secretflag-\(getpid())-\(port).log"
        defer { unlink(log) }
        var env = Subprocess.currentEnvironment()
        env["DATABASE_URL"] = try TestPostgres.shared().freshDatabase()
        env["DISPATCH_WORKERS"] = "1"
        let cmd = "exec \(TestPaths.binary("dispatchd")) --listen 127.0.0.1:\(port) --webhook-secret whsec-on-the-command-line-0123 > \(log) 2>&1"
        let pid = try XCTUnwrap(Subprocess.start(["/bin/sh", "-c", cmd], environment: env))
        defer { kill(pid, SIGTERM); _ = Subprocess.wait(pid, seconds: 20) }
        XCTAssertTrue(waitUntil(30) { (try? HTTPClient(port: port).get("/readyz").status) == 200 }, Files.read(log) ?? "")
        let text = Files.read(log) ?? ""
        let warnings = text.split(separator: "\n").filter { $0.contains("config.secret_on_command_line") }
        XCTAssertEqual(warnings.count, 1, text)
        XCTAssertTrue(warnings.first?.contains("flag=--webhook-secret") ?? false, text)
        XCTAssertTrue(warnings.first?.contains("level=warning") ?? false, text)
        XCTAssertFalse(text.contains("whsec-on-the-command-line-0123"), "the secret itself is never logged")
    }
}

/// Issue 24 item 10: a second instance on a taken port fails before it touches any database.
final class TakenPortTests: XCTestCase {
    func run(_ env: [String: String], timeout: Double = 20) -> (status: Int32?, output: String) {
        var e = Subprocess.currentEnvironment()
        for (k, v) in env { e[k] = v }
        let log = "/tmp/dispatchd-taken-\(getpid())-\(Int.random(in: 0..<1_000_000)).log"
        defer { unlink(log) }
        guard let pid = Subprocess.start(["/bin/sh", "-c", "exec \(TestPaths.binary("dispatchd")) > \(log) 2>&1"], environment: e) else {
            return (nil, "cannot start")
        }
        let status = Subprocess.wait(pid, seconds: timeout)
        if status == nil { kill(pid, SIGKILL); _ = Subprocess.wait(pid) }
        return (status, Files.read(log) ?? "")
    }

    func testASecondServerOnATakenPortRunsNoMigrationAndNoInitdb() throws {
        let first = try TestServer.start()
        defer { first.stop() }
        let cluster = try TestPostgres.shared()
        let untouched = try cluster.freshDatabase()
        let r = run(["DATABASE_URL": untouched, "DISPATCH_LISTEN": "127.0.0.1:\(first.port)", "DISPATCH_WORKERS": "1"])
        XCTAssertEqual(r.status, 1, r.output)
        XCTAssertTrue(r.output.contains("address in use: 127.0.0.1:\(first.port)"), r.output)
        XCTAssertFalse(r.output.contains("migration"), r.output)
        let tables = try cluster.sql(untouched, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
        XCTAssertEqual(tables.first?.first ?? nil, "0", "the second server migrated the database before it noticed the port")

        // The same with the first server's own database: nothing logged about migrations either.
        let shared = run(["DATABASE_URL": first.conninfo, "DISPATCH_LISTEN": "127.0.0.1:\(first.port)", "DISPATCH_WORKERS": "1"])
        XCTAssertEqual(shared.status, 1, shared.output)
        XCTAssertFalse(shared.output.contains("migration"), shared.output)

        // Without DATABASE_URL: no embedded cluster is made either.
        let dataDir = "/tmp/dispatch-taken-\(getpid())-\(Int.random(in: 0..<1_000_000))"
        defer { _ = Subprocess.run(["rm", "-rf", dataDir]) }
        var env = ["DISPATCH_DATA_DIR": dataDir, "DISPATCH_LISTEN": "127.0.0.1:\(first.port)", "DISPATCH_WORKERS": "1"]
        env["DATABASE_URL"] = ""
        let embedded = run(env)
        XCTAssertEqual(embedded.status, 1, embedded.output)
        XCTAssertFalse(embedded.output.contains("initdb"), embedded.output)
        XCTAssertFalse(Files.exists(dataDir), "initdb ran for a server that could not listen")
        XCTAssertEqual(try first.client.get("/v1/activities").status, 200)
    }
}

/// Issue 24 item 8 (contract §4 item 3): a status stream whose Last-Event-ID is above the
/// activity's seq (an id from before a restore, or used again after retention) gets the
/// current snapshot, then every later change. It used to receive nothing, ever.
final class LastEventIDAboveSeqTests: XCTestCase {
    func testAnIDAboveTheSeqGetsTheSnapshotThenLive() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        try s.startActivity("AHEAD-1")
        XCTAssertEqual(try s.update("AHEAD-1", #"{"progress":0.3}"#).status, 200)
        XCTAssertEqual(try s.update("AHEAD-1", #"{"progress":0.6}"#).status, 200)
        // First on a new topic (the snapshot read decides), then on a topic already in memory.
        var holder: SSEClient?
        defer { holder?.close() }
        for (attempt, progress) in [(0, "0.6"), (1, "0.8")] {
            let stream = try s.stream("AHEAD-1", lastEventID: 50)
            defer { stream.close() }
            let seq = 3 + attempt
            let first = try stream.waitForEvents(1, timeout: 10)
            XCTAssertEqual(first.compactMap(\.id), ["\(seq)"], "the current snapshot (attempt \(attempt))")
            XCTAssertTrue(first.first?.data.contains(progress) ?? false, first.first?.data ?? "")
            XCTAssertEqual(try s.update("AHEAD-1", #"{"progress":0.\#(8 + attempt)}"#).status, 200)
            XCTAssertEqual(try stream.waitForEvents(2, timeout: 10).compactMap(\.id), ["\(seq)", "\(seq + 1)"], "then live")
            if holder == nil {
                holder = try s.stream("AHEAD-1")
                XCTAssertEqual(try holder?.waitForEvents(1).count, 1)
            }
        }
    }
}
