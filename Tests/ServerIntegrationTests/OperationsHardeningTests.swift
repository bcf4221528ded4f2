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
