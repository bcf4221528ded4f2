import DispatchCLIKit
import DispatchCore
import DispatchSystem
import DispatchTestSupport
import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// The CLI in the scripts that report on jobs: a server that is away never stalls them, and
/// `run` says where and what without being told.
final class ScriptSafetyCLIIntegrationTests: XCTestCase {
    /// A job reporting every second keeps moving with the server down: each `progress` gives
    /// up within its deadline (default 2 s; it used to take 30 s), exits 8 and says so in one
    /// line. The figures are printed; the bound asserted is loose on purpose (shared machine).
    func testProgressInALoopAgainstAClosedPortReturnsWithinItsDeadline() throws {
        let held = try TestServer.ClosedPort()  // refused, and no other test's server can take it
        defer { withExtendedLifetime(held) {} }
        let closed = held.port
        let dispatch = TestPaths.binary("dispatch")
        let env = ["DISPATCH_URL": "http://127.0.0.1:\(closed)", "DISPATCH_TOKEN": "dsp_test", "PATH": "/usr/bin:/bin"]
        var figures: [Double] = []
        for i in 0..<8 {
            let began = Date()
            let p = try CLIProcess(dispatch, ["progress", "--id", "job-1", "--percent", "\(i * 10)"], environment: env)
            let code = p.wait(timeout: 30)
            figures.append(Date().timeIntervalSince(began))
            XCTAssertEqual(code, CLIExitCode.deadline.rawValue, p.stderr)
            let lines = p.stderr.split(separator: "\n")
            XCTAssertEqual(lines.count, 1, "one line on stderr: \(p.stderr)")
            XCTAssertTrue(p.stderr.hasPrefix("dispatch progress: no answer within the 2 s deadline"), p.stderr)
            XCTAssertTrue(p.stdout.isEmpty)
            usleep(1_000_000)  // "every second"
        }
        let text = figures.map { String(format: "%.2f", $0) }.joined(separator: " ")
        print("progress against a closed port, seconds per call: \(text)")
        for f in figures { XCTAssertLessThan(f, 10, "each call well below the old 30 s: \(text)") }

        let short = try CLIProcess(dispatch, ["progress", "--id", "job-1", "--percent", "5", "--deadline", "0.5"], environment: env)
        XCTAssertEqual(short.wait(timeout: 30), CLIExitCode.deadline.rawValue)
        XCTAssertTrue(short.stderr.contains("0.5 s deadline"), short.stderr)
    }

    /// With a server, `progress` works as before and `start`/`end` still retry an outage
    /// for --retry-for (exit 6 when it runs out), not the progress deadline.
    func testStartStillRetriesForItsBudget() throws {
        let server = try TestServer.start()
        defer { server.stop() }
        let ctx = CLITestContext(server: server)
        let (code, out, err) = try ctx.run(["start", "--name", "job", "--id", "safe-1"])
        XCTAssertEqual(code, 0, err)
        XCTAssertEqual(out, "safe-1\n")
        XCTAssertEqual(try ctx.run(["progress", "--id", "safe-1", "--percent", "40"]).0, 0)
        XCTAssertEqual(try ctx.snapshot("safe-1")?["progress"]?.numberValue, 0.4)

        let held = try TestServer.ClosedPort()
        defer { withExtendedLifetime(held) {} }
        let closed = held.port
        let began = Date()
        let (down, _, downErr) = try ctx.run(["start", "--name", "job", "--retry-for", "3"], env: ["DISPATCH_URL": "http://127.0.0.1:\(closed)"])
        let took = Date().timeIntervalSince(began)
        XCTAssertEqual(down, CLIExitCode.unavailable.rawValue, downErr)
        XCTAssertTrue(downErr.contains("retrying for up to 3s"), downErr)
        XCTAssertGreaterThanOrEqual(took, 2.5, "start kept retrying for its budget")
    }

    /// `run` tags its activity with this host's name; a key bound to another machine gets its
    /// own machine instead of a refusal. `--status-from-output` shows the last output line.
    func testRunTagsTheHostAndShowsTheLastOutputLine() throws {
        let server = try TestServer.start()
        defer { server.stop() }
        let ctx = CLITestContext(server: server)
        var name = [CChar](repeating: 0, count: 256)
        gethostname(&name, 255)
        let host = String(cString: name)

        let (code, _, err) = try ctx.run(["run", "--id", "host-1", "--status-from-output", "--", "/bin/sh", "-c",
                                          "echo 'step one'; sleep 0.4; printf '\\033[32mcopying\\033[0m 3 files\\n'; sleep 0.6"])
        XCTAssertEqual(code, 0, err)
        let snap = try XCTUnwrap(try ctx.snapshot("host-1"))
        if CLIRunMachine.fromHostName(host) != nil {
            XCTAssertEqual(snap["machine"]?.stringValue, host)
        } else {
            XCTAssertEqual(snap["machine"], .null, "a host name that does not fit is not sent")
        }
        let statuses = try ctx.events("host-1").compactMap { $0["data"]?["status"]?.stringValue }
        XCTAssertTrue(statuses.contains("copying 3 files"), "the last line, without its colour codes: \(statuses)")
        XCTAssertEqual(statuses.last, "Completed")

        // A publish key bound to machine "elsewhere": run's guess is refused, the start goes again without it.
        let created = try server.client.post("/v1/keys", #"{"name":"bound-run","scopes":["publish"],"machine":"elsewhere"}"#)
        XCTAssertEqual(created.status, 201, created.text)
        guard case .string(let secret)? = created.json?["secret"] else { return XCTFail("no secret: \(created.text)") }
        let (bound, _, boundErr) = try ctx.run(["run", "--id", "host-2", "--", "true"], env: ["DISPATCH_TOKEN": secret])
        XCTAssertEqual(bound, 0, boundErr)
        XCTAssertFalse(boundErr.contains("untracked"), boundErr)
        XCTAssertEqual(try ctx.snapshot("host-2")?["machine"]?.stringValue, "elsewhere")
        XCTAssertEqual(try ctx.snapshot("host-2")?["state"]?.stringValue, "completed")
    }

    /// `--help` is short; the shared tables are a topic each.
    func testHelpTopics() throws {
        let dispatch = TestPaths.binary("dispatch")
        let env = ["PATH": "/usr/bin:/bin"]
        let codes = try CLIProcess(dispatch, ["help", "exit-codes"], environment: env)
        XCTAssertEqual(codes.wait(), 0)
        XCTAssertTrue(codes.stdout.contains("  8  progress: no answer within --deadline"), codes.stdout)
        let vars = try CLIProcess(dispatch, ["help", "env"], environment: env)
        XCTAssertEqual(vars.wait(), 0)
        XCTAssertTrue(vars.stdout.contains("DISPATCH_TOKEN_FILE"), vars.stdout)
        let progress = try CLIProcess(dispatch, ["progress", "--help"], environment: env)
        XCTAssertEqual(progress.wait(), 0)
        XCTAssertLessThan(progress.stdoutLines.count, 30, progress.stdout)
        XCTAssertFalse(progress.stdout.contains("Exit codes (all commands)"), progress.stdout)
    }
}
