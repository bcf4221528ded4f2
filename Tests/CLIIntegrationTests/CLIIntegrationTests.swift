import DispatchSystem
import DispatchCore
import DispatchCLIKit
import DispatchTestSupport
import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// Shares one server (real dispatchd, real PostgreSQL) among the tests that do not restart it.
class CLIServerTestCase: SharedServerTestCase {
    override class var sharedServerEnding: Ending { .kill }  // cleanup only; graceful shutdown is the server tests' subject

    var ctx: CLITestContext!

    override func setUpWithError() throws {
        ctx = CLITestContext(server: try server())
    }

    func uniqueID(_ prefix: String = "CLI") -> String { "\(prefix)-\(UUID().uuidString.prefix(8))" }
}

final class CLIPublishIntegrationTests: CLIServerTestCase {
    /// The README example, through a real shell: `$(dispatch start ...)` yields just the id.
    func testStartOutputWorksInShellSubstitution() throws {
        let dir = (ctx.dispatch as NSString).deletingLastPathComponent
        let script = """
        set -e
        id=$(dispatch start --name "Debian 13 Trixie ISO" --symbol arrow.down.circle.fill --machine shodan)
        dispatch progress --id "$id" --percent 68 --status "Downloading at 18.4 MB/s (68%)"
        dispatch end --id "$id" --status "Completed"
        printf '%s' "$id"
        """
        var env = ctx.environment
        env["PATH"] = dir + ":" + (env["PATH"] ?? "/usr/bin:/bin")
        let sh = try CLIProcess("/bin/sh", ["-c", script], environment: env)
        XCTAssertEqual(sh.wait(), 0, sh.stderr)
        let id = sh.stdout
        XCTAssertFalse(id.isEmpty)
        XCTAssertFalse(id.contains(where: { $0.isWhitespace }), "id is one word: \(id.debugDescription)")

        let snap = try XCTUnwrap(try ctx.snapshot(id))
        XCTAssertEqual(snap["taskName"]?.stringValue, "Debian 13 Trixie ISO")
        XCTAssertEqual(snap["systemImage"]?.stringValue, "arrow.down.circle.fill")
        XCTAssertEqual(snap["machine"]?.stringValue, "shodan")
        XCTAssertEqual(snap["state"]?.stringValue, "completed")
        XCTAssertEqual(snap["status"]?.stringValue, "Completed")
        XCTAssertEqual(snap["seq"]?.numberValue, 3)
        let events = try ctx.events(id)
        XCTAssertEqual(events.compactMap { $0["seq"]?.numberValue }, [1, 2, 3])
        XCTAssertEqual(events.dropFirst().first?["data"]?["progress"]?.numberValue, 0.68)
        XCTAssertEqual(events.dropFirst().first?["data"]?["status"]?.stringValue, "Downloading at 18.4 MB/s (68%)")
    }

    func testStartOptionsJSONOutputAndRepeatedStart() throws {
        let id = uniqueID()
        let args = ["start", "--id", id, "--name", "transcode", "--state", "processing", "--progress", "0.25",
                    "--status", "Starting", "--cancel-url", "https://actions.example/cancel", "--json"]
        let (code, out, err) = try ctx.run(args)
        XCTAssertEqual(code, 0, err)
        let snap = try JSONParser.parse(out.trimmingCharacters(in: .whitespacesAndNewlines))
        XCTAssertEqual(snap["activityId"]?.stringValue, id)
        XCTAssertEqual(snap["state"]?.stringValue, "processing")
        XCTAssertEqual(snap["progress"]?.numberValue, 0.25)
        XCTAssertEqual(snap["status"]?.stringValue, "Starting")
        XCTAssertEqual(snap["cancelURL"]?.stringValue, "https://actions.example/cancel")
        XCTAssertEqual(snap["seq"]?.numberValue, 1)

        // The identical start again is fine; a different one for the same id is a conflict.
        XCTAssertEqual(try ctx.run(args).0, 0)
        let (conflict, _, conflictErr) = try ctx.run(["start", "--id", id, "--name", "something else"])
        XCTAssertEqual(conflict, 5, conflictErr)
        XCTAssertEqual(try ctx.snapshot(id)?["seq"]?.numberValue, 1, "nothing written")
    }

    func testProgressStatesAndEndOutcomes() throws {
        let id = uniqueID()
        XCTAssertEqual(try ctx.run(["start", "--id", id, "--name", "job"]).0, 0)
        // queued -> retrying is not a move the state machine allows: a conflict, nothing written.
        XCTAssertEqual(try ctx.run(["progress", "--id", id, "--state", "retrying"]).0, 5)
        XCTAssertEqual(try ctx.run(["progress", "--id", id, "--state", "processing", "--status", "working"]).0, 0)
        let (code, out, err) = try ctx.run(["progress", "--id", id, "--progress", "0.5", "--state", "retrying", "--json"])
        XCTAssertEqual(code, 0, err)
        let snap = try JSONParser.parse(out.trimmingCharacters(in: .whitespacesAndNewlines))
        XCTAssertEqual(snap["state"]?.stringValue, "retrying")
        XCTAssertEqual(snap["progress"]?.numberValue, 0.5)
        XCTAssertEqual(snap["attempt"]?.numberValue, 2)
        let (plainCode, plainOut, _) = try ctx.run(["progress", "--id", id, "--percent", "60"])
        XCTAssertEqual(plainCode, 0)
        XCTAssertEqual(plainOut, "", "progress prints nothing without --json")

        let (endCode, _, endErr) = try ctx.run(["end", "--id", id, "--state", "error", "--error", "disk full", "--status", "Failed"])
        XCTAssertEqual(endCode, 0, endErr)
        let ended = try XCTUnwrap(try ctx.snapshot(id))
        XCTAssertEqual(ended["state"]?.stringValue, "error")
        XCTAssertEqual(ended["status"]?.stringValue, "Failed")
        // The same end again: idempotent. A different end or a later update: conflict (5).
        XCTAssertEqual(try ctx.run(["end", "--id", id, "--state", "error", "--error", "disk full", "--status", "Failed"]).0, 0)
        XCTAssertEqual(try ctx.run(["end", "--id", id, "--state", "completed"]).0, 5)
        XCTAssertEqual(try ctx.run(["progress", "--id", id, "--percent", "70"]).0, 5)
        XCTAssertEqual(try ctx.snapshot(id)?["seq"]?.numberValue, 5)
    }

    func testExitCodesForEveryKindOfFailure() throws {
        let id = uniqueID()
        XCTAssertEqual(try ctx.run(["start", "--id", id, "--name", "job"]).0, 0)

        // 2: usage, nothing sent.
        let (usage, _, usageErr) = try ctx.run(["progress", "--id", id, "--percent", "250"])
        XCTAssertEqual(usage, 2)
        XCTAssertTrue(usageErr.contains("--percent"), usageErr)
        XCTAssertEqual(try ctx.run(["frobnicate"]).0, 2)

        // 3: unknown activity.
        let (missing, _, missingErr) = try ctx.run(["progress", "--id", uniqueID("NOPE"), "--percent", "5"])
        XCTAssertEqual(missing, 3)
        XCTAssertTrue(missingErr.contains("HTTP 404"), missingErr)
        XCTAssertEqual(missingErr.split(separator: "\n").count, 1, "one line: \(missingErr)")

        // 4: bad or missing key.
        XCTAssertEqual(try ctx.run(["progress", "--id", id, "--percent", "5", "--token", "not-a-key"]).0, 4)
        XCTAssertEqual(try ctx.run(["progress", "--id", id, "--percent", "5"], env: ["DISPATCH_TOKEN": ""]).0, 4)

        // 7: input the server refuses (a status must be one line; names are at most 200 characters).
        let (bad, badOut, badErr) = try ctx.run(["progress", "--id", id, "--status", "two\nlines", "--json"])
        XCTAssertEqual(bad, 7, badErr)
        XCTAssertTrue(badErr.contains("HTTP 400"), badErr)
        XCTAssertNotNil(try JSONParser.parse(badOut.trimmingCharacters(in: .whitespacesAndNewlines))["error"], "--json prints the error body")
        XCTAssertEqual(try ctx.run(["start", "--name", String(repeating: "n", count: 201)]).0, 7)
        XCTAssertEqual(try ctx.snapshot(id)?["seq"]?.numberValue, 1, "rejected input changed nothing")

        // 6: nobody listening, after a bounded retry.
        let (down, _, downErr) = try ctx.run(["end", "--id", id, "--url", "http://127.0.0.1:1", "--retry-for", "0.5"])
        XCTAssertEqual(down, 6)
        XCTAssertTrue(downErr.contains("refused"), downErr)
        // 8: progress, nobody listening, at its deadline.
        let (late, _, lateErr) = try ctx.run(["progress", "--id", id, "--percent", "5", "--url", "http://127.0.0.1:1", "--deadline", "0.5"])
        XCTAssertEqual(late, 8)
        XCTAssertTrue(lateErr.contains("refused"), lateErr)
    }
}

final class CLIWatchIntegrationTests: CLIServerTestCase {
    func testWatchPrintsOneLinePerEventAndExitsZeroOnCompletion() throws {
        let id = uniqueID()
        XCTAssertEqual(try ctx.run(["start", "--id", id, "--name", "ISO", "--machine", "shodan"]).0, 0)
        let watch = try ctx.start(["watch", "--id", id])
        eventually(30, "the watch to show the start") { watch.stdoutLines.count >= 1 }
        XCTAssertEqual(try ctx.run(["progress", "--id", id, "--percent", "50", "--status", "halfway"]).0, 0)
        eventually(30, "the watch to show the progress") { watch.stdoutLines.count >= 2 }
        XCTAssertEqual(try ctx.run(["end", "--id", id, "--status", "Completed"]).0, 0)
        XCTAssertEqual(watch.wait(), 0, watch.stderr)
        let lines = watch.stdoutLines
        XCTAssertEqual(lines.count, 3, watch.stdout)
        XCTAssertEqual(lines.first, "#1 queued - [shodan]")
        XCTAssertEqual(lines.dropFirst().first, "#2 processing 50% [shodan] halfway")
        XCTAssertTrue(lines.last?.hasPrefix("#3 completed ") == true, watch.stdout)
        XCTAssertTrue(lines.last?.hasSuffix(" [shodan] Completed") == true, watch.stdout)
    }

    func testWatchExitCodesForFailedCancelledAndUnknownActivities() throws {
        let failed = uniqueID()
        XCTAssertEqual(try ctx.run(["start", "--id", failed, "--name", "job"]).0, 0)
        XCTAssertEqual(try ctx.run(["end", "--id", failed, "--state", "error", "--error", "disk full"]).0, 0)
        let (fcode, fout, ferr) = try ctx.run(["watch", "--id", failed])
        XCTAssertEqual(fcode, 1, ferr)
        XCTAssertTrue(fout.contains("error"), fout)

        let cancelled = uniqueID()
        XCTAssertEqual(try ctx.run(["start", "--id", cancelled, "--name", "job"]).0, 0)
        let watch = try ctx.start(["watch", "--id", cancelled, "--json"])
        eventually(30, "the watch to connect") { watch.stdoutLines.count >= 1 }
        XCTAssertEqual(try ctx.run(["end", "--id", cancelled, "--state", "cancelled"]).0, 0)
        XCTAssertEqual(watch.wait(), 1, watch.stderr)
        let seqs = try watch.stdoutLines.map { try JSONParser.parse($0)["seq"]?.numberValue }
        XCTAssertEqual(seqs, [1, 2], "--json prints each snapshot as one line")

        let (ncode, nout, nerr) = try ctx.run(["watch", "--id", uniqueID("NOPE")])
        XCTAssertEqual(ncode, 3, nerr)
        XCTAssertTrue(nout.hasPrefix("not_found"), nout)

        XCTAssertEqual(try ctx.run(["watch", "--id", failed, "--token", "wrong"]).0, 4)
    }

    /// On a terminal (a pty from script(1)) watch redraws one line in place and ends with the final state.
    func testWatchDrawsALiveLineOnATerminal() throws {
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/script") else { throw XCTSkip("script(1) not installed") }
        let id = uniqueID()
        XCTAssertEqual(try ctx.run(["start", "--id", id, "--name", "Live ISO", "--machine", "shodan", "--percent", "10"]).0, 0)
        let command = "'\(ctx.dispatch)' watch --id \(id)"
        var env = ctx.environment
        env["COLUMNS"] = "100"
        let pty = try CLIProcess("/usr/bin/script", ["-qfec", command, "/dev/null"], environment: env)
        eventually(30, "the live line") { pty.stdout.contains("Live ISO") }
        XCTAssertEqual(try ctx.run(["progress", "--id", id, "--percent", "40", "--status", "copying"]).0, 0)
        eventually(30, "the redraw") { pty.stdout.contains("copying") }
        XCTAssertEqual(try ctx.run(["end", "--id", id]).0, 0)
        XCTAssertEqual(pty.wait(), 0, pty.stdout)
        let screen = pty.stdout
        XCTAssertTrue(screen.contains("\r\u{1B}[2K"), "redraws in place")
        XCTAssertTrue(screen.contains("[████"), screen)
        XCTAssertTrue(screen.contains("✔ Live ISO"), screen)
        XCTAssertTrue(screen.contains("shodan"), screen)
        XCTAssertFalse(screen.contains("#2 processing"), "no plain lines on a terminal")
    }
}

final class CLIRunIntegrationTests: CLIServerTestCase {
    func testRunCompletesAndPassesOutputThrough() throws {
        let id = uniqueID()
        let (code, out, err) = try ctx.run(["run", "--id", id, "--name", "nightly backup", "--", "/bin/sh", "-c", "echo backing up; exit 0"])
        XCTAssertEqual(code, 0, err)
        XCTAssertEqual(out, "backing up\n")
        let snap = try XCTUnwrap(try ctx.snapshot(id))
        XCTAssertEqual(snap["state"]?.stringValue, "completed")
        XCTAssertEqual(snap["taskName"]?.stringValue, "nightly backup")
        XCTAssertEqual(try ctx.events(id).first?["data"]?["state"]?.stringValue, "processing")
    }

    func testRunPropagatesTheExitCodeAndRecordsTheError() throws {
        let id = uniqueID()
        let (code, _, err) = try ctx.run(["run", "--id", id, "--", "/bin/sh", "-c", "echo oops >&2; exit 3"])
        XCTAssertEqual(code, 3)
        XCTAssertEqual(err, "dispatch run: activity \(id) (dispatch watch --id \(id))\noops\n", "the id first, then the command's own")
        let snap = try XCTUnwrap(try ctx.snapshot(id))
        XCTAssertEqual(snap["state"]?.stringValue, "error")
        let stored = try ctx.events(id).last?["data"]
        let errorText = snap["error"]?.stringValue ?? stored?["error"]?.stringValue ?? snap["status"]?.stringValue ?? ""
        XCTAssertTrue(errorText.contains("exit status 3"), "\(snap)")

        let missing = uniqueID()
        XCTAssertEqual(try ctx.run(["run", "--id", missing, "--", "/nonexistent/command"]).0, 127)
        XCTAssertEqual(try ctx.snapshot(missing)?["state"]?.stringValue, "error")
    }

    func testRunTurnsOutputIntoProgress() throws {
        let id = uniqueID()
        let script = "echo 'step 25% done'; sleep 0.6; echo 'step 50% done' >&2; sleep 0.6; echo finished"
        let (code, out, err) = try ctx.run(["run", "--id", id, "--quiet", "--progress-regex", "([0-9]+)%", "--", "/bin/sh", "-c", script])
        XCTAssertEqual(code, 0, err)
        XCTAssertEqual(out, "step 25% done\nfinished\n", "stdout passes through unchanged")
        XCTAssertEqual(err, "step 50% done\n", "stderr passes through unchanged (--quiet: no note of ours)")
        let progresses = try ctx.events(id).compactMap { $0["data"]?["progress"]?.numberValue }
        XCTAssertTrue(progresses.contains(0.25), "\(progresses)")
        XCTAssertTrue(progresses.contains(0.5), "\(progresses)")
        XCTAssertEqual(try ctx.snapshot(id)?["state"]?.stringValue, "completed")
    }

    /// SIGTERM to `dispatch run` reaches the command; the activity ends cancelled.
    func testRunForwardsSignalsAndEndsCancelled() throws {
        let id = uniqueID()
        // The trap also stops the background sleep: an orphan would hold the test's pipes open.
        let script = "trap 'echo got-term; kill $!; exit 143' TERM; echo ready; sleep 60 & wait"
        let run = try ctx.start(["run", "--id", id, "--", "/bin/sh", "-c", script])
        eventually(30, "the command to start") { run.stdout.contains("ready") }
        try eventually(30, "the activity to exist") { try ctx.snapshot(id)?["state"]?.stringValue == "processing" }
        kill(run.pid, SIGTERM)
        let code = run.wait()
        XCTAssertTrue(run.stdout.contains("got-term"), "the command saw SIGTERM: \(run.stdout)")
        XCTAssertEqual(code, 143, "the command's own exit code; stderr: \(run.stderr)")
        XCTAssertEqual(try ctx.snapshot(id)?["state"]?.stringValue, "cancelled")

        // A command that does not trap the signal dies of it, and so does `dispatch run`.
        let plain = uniqueID()
        let run2 = try ctx.start(["run", "--id", plain, "--", "/bin/sleep", "60"])
        try eventually(30, "the activity to exist") { try ctx.snapshot(plain)?["state"]?.stringValue == "processing" }
        kill(run2.pid, SIGINT)
        XCTAssertEqual(run2.wait(), SIGINT)
        XCTAssertTrue(run2.diedOfSignal)
        XCTAssertEqual(try ctx.snapshot(plain)?["state"]?.stringValue, "cancelled")
    }

    func testRunStillRunsTheCommandWhenTheServerIsUnreachable() throws {
        let (code, out, err) = try ctx.run(["run", "--url", "http://127.0.0.1:1", "--retry-for", "0", "--", "/bin/sh", "-c", "echo hi; exit 4"])
        XCTAssertEqual(code, 4)
        XCTAssertEqual(out, "hi\n")
        XCTAssertTrue(err.contains("untracked"), err)
    }
}

/// Tests that restart the server get one of their own.
final class CLIRestartIntegrationTests: XCTestCase {
    /// watch keeps going across a server restart: every event once, in order, ids consecutive.
    func testWatchSurvivesAServerRestartWithoutLosingOrRepeatingEvents() throws {
        let server = try TestServer.start()
        defer { server.kill() }
        let ctx = CLITestContext(server: server)
        let id = "RESTART-WATCH"
        XCTAssertEqual(try ctx.run(["start", "--id", id, "--name", "long job"]).0, 0)
        let watch = try ctx.start(["watch", "--id", id, "--retry-for", "120"])
        eventually(30, "the watch to connect") { watch.stdoutLines.count >= 1 }
        XCTAssertEqual(try ctx.run(["progress", "--id", id, "--percent", "10"]).0, 0)
        eventually(30, "event 2") { watch.stdoutLines.count >= 2 }

        try restartServer(server)
        // Published while the watch is still reconnecting: it must arrive through Last-Event-ID.
        XCTAssertEqual(try ctx.run(["progress", "--id", id, "--percent", "20"]).0, 0)
        XCTAssertEqual(try ctx.run(["progress", "--id", id, "--percent", "30"]).0, 0)
        eventually(60, "events 3 and 4 after the restart") { watch.stdoutLines.count >= 4 }
        XCTAssertEqual(try ctx.run(["end", "--id", id]).0, 0)
        XCTAssertEqual(watch.wait(), 0, watch.stderr)

        let seqs = watch.stdoutLines.map { $0.split(separator: " ").first.map(String.init) ?? "" }
        XCTAssertEqual(seqs, ["#1", "#2", "#3", "#4", "#5"], watch.stdout)
        XCTAssertEqual(watch.stdoutLines[2], "#3 processing 20%")
    }

    /// A publish made while the server is down is retried until it is back, and lands once.
    func testPublishRetriesAcrossARestartAndLandsOnce() throws {
        let server = try TestServer.start()
        defer { server.kill() }
        let ctx = CLITestContext(server: server)
        let id = "RESTART-PUBLISH"
        XCTAssertEqual(try ctx.run(["start", "--id", id, "--name", "job"]).0, 0)
        try stopServer(server)
        let progress = try ctx.start(["progress", "--id", id, "--percent", "40", "--deadline", "120"])
        usleep(1_500_000)  // let it fail a few times against the stopped server
        XCTAssertTrue(progress.process.isRunning, "still retrying: \(progress.stderr)")
        try server.launch()
        XCTAssertEqual(progress.wait(timeout: 120), 0, progress.stderr)
        let events = try ctx.events(id)
        XCTAssertEqual(events.compactMap { $0["seq"]?.numberValue }, [1, 2], "applied exactly once")
        XCTAssertEqual(events.last?["data"]?["progress"]?.numberValue, 0.4)
    }
}

/// The case Idempotency-Key exists for: the server commits a publish but its answer is lost.
final class CLIIdempotencyIntegrationTests: CLIServerTestCase {
    func testARetryAfterALostAnswerIsNotAppliedTwice() throws {
        let id = uniqueID()
        XCTAssertEqual(try ctx.run(["start", "--id", id, "--name", "job"]).0, 0)
        let proxy = try LossyProxy(targetPort: ctx.server.port, dropResponses: 1)
        defer { proxy.close() }
        let (code, out, err) = try ctx.run(["progress", "--id", id, "--percent", "40", "--json", "--url", "http://127.0.0.1:\(proxy.port)"])
        XCTAssertEqual(code, 0, err)
        XCTAssertEqual(proxy.requestsForwarded, 2, "the first answer was dropped, so the CLI retried")
        let events = try ctx.events(id)
        XCTAssertEqual(events.compactMap { $0["seq"]?.numberValue }, [1, 2], "applied once")
        XCTAssertEqual(try JSONParser.parse(out.trimmingCharacters(in: .whitespacesAndNewlines))["seq"]?.numberValue, 2,
                       "the retry got the stored answer")
    }
}
