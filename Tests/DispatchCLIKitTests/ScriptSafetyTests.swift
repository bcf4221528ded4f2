import DispatchCore
import DispatchCLIKit
import XCTest

/// The decisions that keep a script moving: progress's deadline, which answers are retried,
/// run's machine and status, and the short help with its shared tables.
final class ScriptSafetyTests: XCTestCase {
    func body(_ code: String) -> [UInt8] { Array(#"{"error":{"code":"\#(code)","message":"m"}}"#.utf8) }

    /// A 4xx is an answer: only the two that say "again, later" are retried.
    func testA429LimitIsAnAnswerAndPacingIsRetried() {
        XCTAssertEqual(CLIHTTPDisposition.of(status: 429, body: body("too_many_live_activities")), .fail(.rejected))
        XCTAssertEqual(CLIHTTPDisposition.of(status: 429, body: body("too_many_streams")), .fail(.rejected))
        XCTAssertEqual(CLIHTTPDisposition.of(status: 429, body: body("rate_limited")), .retry)
        XCTAssertEqual(CLIHTTPDisposition.of(status: 429), .retry, "a proxy's 429 without our body is pacing")
        XCTAssertEqual(CLIHTTPDisposition.of(status: 422, body: body("invalid_field")), .fail(.rejected))
        XCTAssertEqual(CLIHTTPDisposition.of(status: 502), .retry)
    }

    func testProgressDeadlineFlag() throws {
        guard case .progress(let o) = try command(["progress", "--id", "a", "--percent", "5"]).1 else { return XCTFail() }
        XCTAssertEqual(o.deadline, 2)
        guard case .progress(let half) = try command(["progress", "--id", "a", "--deadline", "500ms"]).1 else { return XCTFail() }
        XCTAssertEqual(half.deadline, 0.5)
        guard case .progress(let long) = try command(["progress", "--id", "a", "--deadline", "30s"]).1 else { return XCTFail() }
        XCTAssertEqual(long.deadline, 30)
        XCTAssertNotNil(usageError(["progress", "--id", "a", "--deadline", "0"]))
        XCTAssertNotNil(usageError(["progress", "--id", "a", "--deadline", "2h"]))
        XCTAssertNotNil(usageError(["start", "--name", "a", "--deadline", "2"]), "only progress has a deadline")
    }

    /// Each attempt gets what is left of the deadline (at most its own cap); nothing left, none.
    func testAttemptsShareTheDeadline() {
        XCTAssertEqual(CLIRetryPolicy.attemptTimeout(deadline: 2, elapsed: 0, cap: 10), 2)
        XCTAssertEqual(CLIRetryPolicy.attemptTimeout(deadline: 2, elapsed: 1.5, cap: 10), 0.5)
        XCTAssertEqual(CLIRetryPolicy.attemptTimeout(deadline: 30, elapsed: 1, cap: 10), 10)
        XCTAssertNil(CLIRetryPolicy.attemptTimeout(deadline: 2, elapsed: 1.99, cap: 10))
        let line = CLIRetryPolicy.deadlineMessage("connection refused", deadline: 2, attempts: 4)
        XCTAssertFalse(line.contains("\n"))
        XCTAssertTrue(line.contains("connection refused") && line.contains("4 attempts"), line)
    }

    func testRunMachineFromHostName() {
        XCTAssertEqual(CLIRunMachine.fromHostName("shodan"), "shodan")
        XCTAssertEqual(CLIRunMachine.fromHostName("build-07.example.org"), "build-07.example.org")
        XCTAssertNil(CLIRunMachine.fromHostName("my host"))
        XCTAssertNil(CLIRunMachine.fromHostName("héte"))
        XCTAssertNil(CLIRunMachine.fromHostName(String(repeating: "a", count: 65)))
        XCTAssertNil(CLIRunMachine.fromHostName(""))
        XCTAssertTrue(CLIRunMachine.retryWithoutMachine(status: 403, guessed: true))
        XCTAssertFalse(CLIRunMachine.retryWithoutMachine(status: 403, guessed: false), "the user's own --machine stands")
        XCTAssertFalse(CLIRunMachine.retryWithoutMachine(status: 400, guessed: true))
        XCTAssertFalse(CLIRunMachine.retryWithoutMachine(status: nil, guessed: true))
    }

    func testStatusFromAnOutputLine() {
        XCTAssertEqual(CLIRunStatus.fromOutput("  Compiling foo (3/10)  "), "Compiling foo (3/10)")
        XCTAssertEqual(CLIRunStatus.fromOutput("\u{1B}[32mok\u{1B}[0m all good"), "ok all good")
        XCTAssertEqual(CLIRunStatus.fromOutput("10%\r20%\r30% done\r"), "30% done", "what the terminal shows last")
        XCTAssertEqual(CLIRunStatus.fromOutput("bell\u{07} and\ttab"), "bell and tab")
        XCTAssertNil(CLIRunStatus.fromOutput("\u{1B}[2K   "))
        let long = CLIRunStatus.fromOutput(String(repeating: "é", count: 300))!
        XCTAssertEqual(long.count, 200)
        XCTAssertTrue(long.hasSuffix("…"))
    }

    func testRunStatusFromOutputFlag() throws {
        guard case .run(let o) = try command(["run", "--status-from-output", "--", "make"]).1 else { return XCTFail() }
        XCTAssertTrue(o.statusFromOutput)
        guard case .run(let plain) = try command(["run", "make"]).1 else { return XCTFail() }
        XCTAssertFalse(plain.statusFromOutput)
        XCTAssertNotNil(usageError(["run", "--status-from-output", "--no-progress", "--", "make"]))
    }

    /// A status line goes out with the pending progress, at the pace of progress updates; one
    /// refused is skipped, not tried again.
    func testStatusLinesArePublishedInOrderAndCoalesced() {
        var q = CLIRunPublishQueue(touchInterval: nil, now: 0)
        XCTAssertEqual(q.next(now: 0), .send(.start))
        q.succeeded(.start, now: 0)
        q.offer(status: "one")
        q.offer(progress: 0.2)
        q.offer(status: "two")
        XCTAssertEqual(q.next(now: 0), .send(.status("two", progress: 0.2)))
        q.succeeded(.status("two", progress: 0.2), now: 0)
        XCTAssertEqual(q.next(now: 0.1), .wait(until: .infinity))
        q.offer(status: "three")
        XCTAssertEqual(q.next(now: 0.1), .wait(until: CLIRunPublishQueue.progressInterval))
        XCTAssertEqual(q.next(now: 0.3), .send(.status("three", progress: nil)))
        q.failed(.status("three", progress: nil), transient: false, now: 0.3)
        q.offer(progress: 0.5)
        XCTAssertEqual(q.next(now: 0.6), .send(.progress(0.5)))
    }

    /// `--help` of a command is its own options; the shared tables have their own topics.
    func testShortHelpAndSharedTables() throws {
        XCTAssertEqual(try parseArguments(["help", "exit-codes"]), .help("exit-codes"))
        XCTAssertEqual(try parseArguments(["help", "env"]), .help("env"))
        let codes = CLIHelp.text(for: "exit-codes")
        for code in CLIExitCode.allCases { XCTAssertTrue(codes.contains("  \(code.rawValue)  "), "exit code \(code) not in the table") }
        let env = CLIHelp.text(for: "env")
        for flag in CLIArguments.globalFlags.keys where flag != "help" { XCTAssertTrue(env.contains("--\(flag)"), flag) }
        for variable in ["DISPATCH_URL", "DISPATCH_TOKEN", "DISPATCH_TOKEN_FILE", "DISPATCH_MACHINE", "DISPATCH_CA_FILE"] {
            XCTAssertTrue(env.contains(variable), variable)
        }
        for spec in CLIHelp.commands {
            let help = CLIHelp.text(for: spec.name)
            XCTAssertFalse(help.contains("Exit codes (all commands)"), spec.name)
            XCTAssertTrue(help.contains("dispatch help exit-codes") && help.contains("dispatch help env"), spec.name)
            let globalLines = help.split(separator: "\n").filter { $0.hasPrefix("Global options") || $0.hasPrefix("    --") }
            XCTAssertLessThanOrEqual(globalLines.count, 3, "global options in a few lines: \(spec.name)")
        }
        XCTAssertTrue(CLIHelp.text(for: "progress").contains("--deadline DUR"))
        XCTAssertTrue(CLIHelp.text(for: "run").contains("--status-from-output"))
    }
}
