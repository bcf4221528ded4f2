import DispatchSystem
import DispatchCore
import DispatchCLIKit
import DispatchTestSupport
import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// What a new user sees when something is missing or wrong (issue 14, "Feedback"), from the
/// real binary.
final class FeedbackCLIIntegrationTests: CLIServerTestCase {
    /// No key: exit 4 at once, naming the variable and the flags, and pointing at the
    /// development key when dispatch runs where dispatchd keeps it.
    func testAMissingKeySaysWhatToSetAndWhereTheDevelopmentKeyIs() throws {
        let dir = try makeScratchDirectory("devkey")
        defer { _ = Subprocess.run(["rm", "-rf", dir]) }
        var env = ctx.environment
        env["DISPATCH_TOKEN"] = nil
        env["DISPATCH_URL"] = "http://127.0.0.1:1"  // nothing listens: the message comes before any request
        let elsewhere = try CLIProcess("/bin/sh", ["-c", "cd '\(dir)' && exec '\(ctx.dispatch)' progress --id x --percent 5"], environment: env)
        XCTAssertEqual(elsewhere.wait(), CLIExitCode.auth.rawValue)
        XCTAssertTrue(elsewhere.stderr.hasPrefix("dispatch progress: no API key: set DISPATCH_TOKEN"), elsewhere.stderr)
        XCTAssertTrue(elsewhere.stderr.contains("--token-file"), elsewhere.stderr)
        XCTAssertTrue(elsewhere.stderr.contains("For a local development server the key is in ./.dispatch/dev-key"), elsewhere.stderr)
        XCTAssertFalse(elsewhere.stderr.contains("retrying"), "no request was sent")

        try Files.makeDirectory(dir + "/.dispatch")
        try Files.write(dir + "/.dispatch/dev-key", "dsp_dev\n", mode: 0o600)
        let here = try CLIProcess("/bin/sh", ["-c", "cd '\(dir)' && exec '\(ctx.dispatch)' watch --id x"], environment: env)
        XCTAssertEqual(here.wait(), CLIExitCode.auth.rawValue)
        XCTAssertTrue(here.stderr.contains("export DISPATCH_TOKEN=$(cat .dispatch/dev-key)"), here.stderr)
    }

    /// A server that does not answer: one `retrying…` line after the first failure, then the
    /// error when the budget is spent; `--quiet` (stderr not a terminal here) keeps only the error.
    /// (`end` and `start` retry for --retry-for; `progress` has its own short deadline.)
    func testAnUnreachableServerSaysItIsRetrying() throws {
        let held = try TestServer.ClosedPort()
        defer { withExtendedLifetime(held) {} }
        let port = held.port
        let (code, _, err) = try ctx.run(["end", "--id", "x", "--url", "http://127.0.0.1:\(port)", "--retry-for", "1.5"])
        XCTAssertEqual(code, CLIExitCode.unavailable.rawValue)
        let lines = err.split(separator: "\n").map(String.init)
        XCTAssertEqual(lines.count, 2, err)
        XCTAssertEqual(lines.first, "dispatch end: cannot connect to http://127.0.0.1:\(port): connection refused; retrying for up to 2s…")
        XCTAssertTrue(lines.last?.contains("gave up after") == true, err)

        let (quietCode, _, quietErr) = try ctx.run(["end", "--id", "x", "--url", "http://127.0.0.1:\(port)", "--retry-for", "0.5", "--quiet"])
        XCTAssertEqual(quietCode, CLIExitCode.unavailable.rawValue)
        XCTAssertFalse(quietErr.contains("retrying"), quietErr)
        XCTAssertTrue(quietErr.contains("gave up after"), "errors are never quiet: \(quietErr)")
    }

    /// `dispatch` alone and mistyped commands exit 2 with the commands or the likely one;
    /// `COMMAND --help` starts with that command's options.
    func testUsageMistakes() throws {
        let (bare, bareOut, bareErr) = try ctx.run([])
        XCTAssertEqual(bare, CLIExitCode.usage.rawValue)
        XCTAssertEqual(bareOut, "")
        XCTAssertTrue(bareErr.contains("dispatch: missing command"), bareErr)
        XCTAssertTrue(bareErr.contains("dispatch watch"), bareErr)

        let (typo, _, typoErr) = try ctx.run(["wacth", "--id", "x"])
        XCTAssertEqual(typo, CLIExitCode.usage.rawValue)
        XCTAssertTrue(typoErr.hasPrefix("dispatch: unknown command 'wacth' (did you mean 'watch'?)\n"), typoErr)
        let (flag, _, flagErr) = try ctx.run(["progress", "--id", "x", "--precent", "5"])
        XCTAssertEqual(flag, CLIExitCode.usage.rawValue)
        XCTAssertTrue(flagErr.contains("did you mean --percent?"), flagErr)
        XCTAssertTrue(flagErr.contains("Try 'dispatch progress --help'."), flagErr)

        let (help, helpOut, _) = try ctx.run(["progress", "--help"])
        XCTAssertEqual(help, 0)
        XCTAssertTrue(helpOut.hasPrefix("dispatch progress --id ID [options]\n  report progress, status or state\n\nOptions:\n  --id ID "), helpOut)
    }
}
