import DispatchSystem
import DispatchCore
import DispatchCLIKit
import DispatchTestSupport
import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// idle and rejected through the CLI (issue 16): published, shown as "waiting" and
/// "rejected" on a terminal, and rejected ends a watch like error does.
final class StatesCLIIntegrationTests: CLIServerTestCase {
    func testRejectedEndsTheWatchWithExitOne() throws {
        let id = uniqueID()
        XCTAssertEqual(try ctx.run(["start", "--id", id, "--name", "queued job"]).0, 0)
        let watch = try ctx.start(["watch", "--id", id])
        eventually(30, "the watch to connect") { watch.stdoutLines.count >= 1 }
        let (code, _, err) = try ctx.run(["end", "--id", id, "--state", "rejected", "--error", "queue full"])
        XCTAssertEqual(code, 0, err)
        XCTAssertEqual(watch.wait(timeout: 30), CLIExitCode.jobFailed.rawValue, watch.stderr)
        XCTAssertEqual(watch.stdoutLines.last, "#2 rejected - — error: queue full")
        // A finished (rejected) activity watched afterwards: its final event, exit 1 at once.
        XCTAssertEqual(try ctx.run(["watch", "--id", id]).0, CLIExitCode.jobFailed.rawValue)
        // Only a queued activity can be rejected: a conflict (5) otherwise.
        let running = uniqueID()
        XCTAssertEqual(try ctx.run(["start", "--id", running, "--name", "job", "--state", "processing"]).0, 0)
        XCTAssertEqual(try ctx.run(["end", "--id", running, "--state", "rejected"]).0, CLIExitCode.conflict.rawValue)
    }

    /// On a terminal the live line says "waiting" while idle, and the final mark when it completes.
    func testTheLiveLineShowsWaitingWhileIdle() throws {
        let id = uniqueID()
        XCTAssertEqual(try ctx.run(["start", "--id", id, "--name", "Render", "--state", "processing", "--percent", "30"]).0, 0)
        var env = ctx.environment
        env["COLUMNS"] = "120"
        let pty = try CLIProcess("/usr/bin/script", ["-qfec", "'\(ctx.dispatch)' watch --id \(id)", "/dev/null"], environment: env)
        eventually(30, "the live line") { pty.stdout.contains("30% processing") }
        XCTAssertEqual(try ctx.run(["progress", "--id", id, "--idle", "--status", "waiting for a GPU"]).0, 0)
        eventually(30, "waiting") { pty.stdout.contains("‖ Render") && pty.stdout.contains("30% waiting  waiting for a GPU") }
        XCTAssertEqual(try ctx.run(["progress", "--id", id, "--state", "processing", "--percent", "60"]).0, 0)
        XCTAssertEqual(try ctx.run(["end", "--id", id]).0, 0)
        XCTAssertEqual(pty.wait(), 0, pty.stdout)
        XCTAssertTrue(pty.stdout.contains("✔ Render"), pty.stdout)
        XCTAssertTrue(pty.stdout.contains("100% completed"), pty.stdout)
    }
}
