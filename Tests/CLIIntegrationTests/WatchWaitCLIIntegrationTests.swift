import DispatchSystem
import DispatchCore
import DispatchCLIKit
import DispatchTestSupport
import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// `watch --wait`: watch a job before it is started (a CI step that follows the job another
/// step will start), bounded by --wait-timeout.
final class WatchWaitCLIIntegrationTests: CLIServerTestCase {
    func testWatchWaitsForTheActivityToStartThenFollowsIt() throws {
        let id = uniqueID("WAIT")
        let watch = try ctx.start(["watch", "--id", id, "--wait"])
        eventually(30, "the note that it waits") { watch.stderr.contains("does not exist yet; waiting up to 10m00s for it to start") }
        usleep(1_500_000)  // at least one more look that finds nothing
        XCTAssertTrue(watch.isRunning, watch.stderr)
        XCTAssertEqual(watch.stdout, "", "nothing shown while it does not exist")

        XCTAssertEqual(try ctx.run(["start", "--id", id, "--name", "late job", "--state", "processing"]).0, 0)
        eventually(30, "the watch to see the start") { watch.stdoutLines.count >= 1 }
        XCTAssertEqual(try ctx.run(["progress", "--id", id, "--percent", "50"]).0, 0)
        XCTAssertEqual(try ctx.run(["end", "--id", id]).0, 0)
        XCTAssertEqual(watch.wait(), 0, watch.stderr)
        XCTAssertEqual(watch.stdoutLines.first, "#1 processing -")
        XCTAssertTrue(watch.stdoutLines.last?.hasPrefix("#3 completed") == true, watch.stdout)
    }

    func testWaitGivesUpAfterItsTimeoutWithNotFound() throws {
        let started = Date()
        let (code, out, err) = try ctx.run(["watch", "--id", uniqueID("NEVER"), "--wait-timeout", "2s"])
        let took = Date().timeIntervalSince(started)
        XCTAssertEqual(code, CLIExitCode.notFound.rawValue, err)
        XCTAssertTrue(out.hasPrefix("not_found"), out)
        XCTAssertGreaterThanOrEqual(took, 2)
        XCTAssertLessThan(took, 10)
        XCTAssertEqual(try ctx.run(["watch", "--id", uniqueID("NEVER")]).0, CLIExitCode.notFound.rawValue, "without --wait: at once")
    }
}
