import DispatchSystem
import DispatchCore
import DispatchCLIKit
import DispatchTestSupport
import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// `dispatch run` starts its command at once and publishes in the background (issue 14).
final class RunStartsAtOnceIntegrationTests: XCTestCase {
    /// The server is down when run starts: the command starts at once anyway, run names the
    /// activity (its own UUID) and says it will catch up; when the server is back, the start,
    /// the progress and the end land, in order, once each.
    func testRunStartsTheCommandAtOnceWhenTheServerIsDownAndCatchesUpAfter() throws {
        let server = try TestServer.start()
        defer { server.kill() }
        let ctx = CLITestContext(server: server)
        try stopServer(server)

        let flag = NSTemporaryDirectory() + "run-flag-\(UUID().uuidString)"
        defer { unlink(flag) }
        let script = "echo started; echo 'step 1/4'; while [ ! -e '\(flag)' ]; do sleep 0.1; done; echo '75%'; sleep 0.5; echo done"
        let began = Date()
        let run = try ctx.start(["run", "--name", "late publisher", "--retry-for", "60", "--", "/bin/sh", "-c", script])
        eventually(5, "the command to start while the server is down") { run.stdout.contains("started") }
        XCTAssertLessThan(Date().timeIntervalSince(began), 5, "the command did not wait for the server")
        eventually(10, "run to say it will catch up") { run.stderr.contains("the command runs on, and its activity is published when the server answers") }
        let id = try XCTUnwrap(run.stderr.split(separator: "\n").first { $0.hasPrefix("dispatch run: activity ") }?
            .split(separator: " ")[3]).description
        XCTAssertEqual(id.count, 36, "a UUID made by run: \(id)")

        try server.launch()
        try eventually(60, "the start to land") { try ctx.snapshot(id) != nil }
        _ = FileManager.default.createFile(atPath: flag, contents: nil)
        XCTAssertEqual(run.wait(timeout: 90), 0, run.stderr)
        XCTAssertTrue(run.stderr.contains("the server answers again; activity \(id) is caught up"), run.stderr)

        let events = try ctx.events(id)
        XCTAssertEqual(events.compactMap { $0["seq"]?.numberValue }, (1...events.count).map(Double.init), "consecutive, nothing twice")
        XCTAssertEqual(events.first?["event"]?.stringValue, "processing")
        XCTAssertEqual(events.first?["data"]?["taskName"]?.stringValue, "late publisher")
        XCTAssertEqual(events.last?["event"]?.stringValue, "completed")
        let progresses = events.compactMap { $0["data"]?["progress"]?.numberValue }
        XCTAssertTrue(progresses.contains(0.75), "the progress read while the server was back: \(progresses)")
    }
}

final class RunDefaultsIntegrationTests: CLIServerTestCase {
    /// Without --progress-regex, percentages and counts in the output are progress;
    /// --no-progress reads none (and leaves the command's output alone).
    func testRunReadsTheUsualProgressShapesByDefault() throws {
        let id = uniqueID()
        let script = "echo '[1/4] fetch'; sleep 0.4; echo 'copying 50%' >&2; sleep 0.4; printf 'x 3/4\\r'; sleep 0.4; echo ok"
        let (code, out, err) = try ctx.run(["run", "--id", id, "--quiet", "--", "/bin/sh", "-c", script])
        XCTAssertEqual(code, 0, err)
        XCTAssertEqual(out, "[1/4] fetch\nx 3/4\rok\n", "output passes through unchanged")
        XCTAssertEqual(err, "copying 50%\n")
        let progresses = try ctx.events(id).compactMap { $0["data"]?["progress"]?.numberValue }
        XCTAssertEqual(progresses.filter { $0 < 1 }, [0.25, 0.5, 0.75], "\(progresses)")

        let plain = uniqueID()
        let (plainCode, plainOut, _) = try ctx.run(["run", "--id", plain, "--quiet", "--no-progress", "--", "/bin/sh", "-c", "echo 50%"])
        XCTAssertEqual(plainCode, 0)
        XCTAssertEqual(plainOut, "50%\n")
        XCTAssertEqual(try ctx.events(plain).map { $0["event"]?.stringValue }, ["processing", "completed"], "no progress read")
    }

    /// No key: the command still runs (the work matters more than its tracking), and run says
    /// how to give one.
    func testRunWithoutAKeyRunsTheCommandUntracked() throws {
        var env = ctx.environment
        env["DISPATCH_TOKEN"] = nil
        let p = try CLIProcess(ctx.dispatch, ["run", "--", "/bin/sh", "-c", "echo hi; exit 5"], environment: env)
        XCTAssertEqual(p.wait(), 5)
        XCTAssertEqual(p.stdout, "hi\n")
        XCTAssertTrue(p.stderr.contains("no API key: set DISPATCH_TOKEN"), p.stderr)
        XCTAssertTrue(p.stderr.contains("running the command untracked"), p.stderr)
    }

    /// A start the server refuses (a different start reusing the id) leaves the command
    /// untracked, says so, and does not touch the other activity.
    func testARefusedStartLeavesTheCommandUntracked() throws {
        let id = uniqueID()
        XCTAssertEqual(try ctx.run(["start", "--id", id, "--name", "someone else's"]).0, 0)
        let (code, out, err) = try ctx.run(["run", "--id", id, "--", "/bin/sh", "-c", "sleep 0.3; echo work"])
        XCTAssertEqual(code, 0, err)
        XCTAssertEqual(out, "work\n")
        XCTAssertTrue(err.contains("could not start activity \(id)") && err.contains("untracked"), err)
        XCTAssertEqual(try ctx.events(id).count, 1, "the other activity is left alone")
    }
}
