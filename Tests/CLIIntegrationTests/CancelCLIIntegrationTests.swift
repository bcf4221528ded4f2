import DispatchSystem
import DispatchCore
import DispatchCLIKit
import DispatchTestSupport
import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// `dispatch cancel`, `touch`, `start --stale-after`, and `run`'s side of a remote cancel.
final class CancelCLIIntegrationTests: CLIServerTestCase {
    func testCancelTouchAndStaleAfter() throws {
        let (code, out, err) = try ctx.run(["start", "--name", "cancel me", "--stale-after", "1h30m"])
        XCTAssertEqual(code, 0, err)
        let id = out.trimmingCharacters(in: .whitespacesAndNewlines)
        XCTAssertEqual(try sql("SELECT stale_after_s FROM activities WHERE activity_id = $1", id), ["5400"])
        XCTAssertEqual(try ctx.run(["start", "--name", "x", "--stale-after", "5s"]).0, CLIExitCode.usage.rawValue)

        XCTAssertEqual(try ctx.run(["touch", "--id", id]).0, 0)
        XCTAssertEqual(try ctx.events(id).count, 1, "a touch is no event")
        let (c1, _, e1) = try ctx.run(["cancel", "--id", id, "--reason", "wrong ISO"])
        XCTAssertEqual(c1, 0, e1)
        let snap = try ctx.snapshot(id)
        XCTAssertEqual(snap?["cancelRequested"], .bool(true))
        XCTAssertEqual(snap?["cancelReason"]?.stringValue, "wrong ISO")
        XCTAssertEqual(try ctx.run(["cancel", "--id", id]).0, 0, "asking again is fine")
        let (c2, json, _) = try ctx.run(["cancel", "--id", id, "--json"])
        XCTAssertEqual(c2, 0)
        XCTAssertEqual((try? JSONParser.parse(json))?["seq"], .number(2), "nothing new was written")
        XCTAssertEqual(try ctx.events(id).map { $0["event"]?.stringValue }, ["queued", "cancel_requested"])

        XCTAssertEqual(try ctx.run(["end", "--id", id, "--state", "cancelled"]).0, 0)
        XCTAssertEqual(try ctx.run(["cancel", "--id", id]).0, CLIExitCode.conflict.rawValue)
        XCTAssertEqual(try ctx.run(["touch", "--id", id]).0, CLIExitCode.conflict.rawValue)
        XCTAssertEqual(try ctx.run(["cancel", "--id", "no-such-activity"]).0, CLIExitCode.notFound.rawValue)
        XCTAssertEqual(try ctx.run(["touch", "--id", "no-such-activity"]).0, CLIExitCode.notFound.rawValue)
    }

    /// `dispatch run -- sleep 300`, then a cancel: the command is gone within the grace period,
    /// the activity ends cancelled with the reason, and run exits 143.
    func testRunStopsItsCommandWhenCancelled() throws {
        let id = uniqueID()
        let pidFile = NSTemporaryDirectory() + "run-\(id).pid"
        defer { unlink(pidFile) }
        let run = try ctx.start(["run", "--id", id, "--kill-after", "5s", "--", "/bin/sh", "-c", "echo $$ > \(pidFile); exec sleep 300"])
        eventually(30, "the command to start") { (try? String(contentsOfFile: pidFile, encoding: .utf8))?.isEmpty == false }
        let pid = try XCTUnwrap(pid_t((try String(contentsOfFile: pidFile, encoding: .utf8)).trimmingCharacters(in: .whitespacesAndNewlines)))
        XCTAssertEqual(kill(pid, 0), 0, "sleep runs")

        let (code, _, err) = try ctx.run(["cancel", "--id", id, "--reason", "stop now"])
        XCTAssertEqual(code, 0, err)
        XCTAssertEqual(run.wait(timeout: 30), 143, "stderr: \(run.stderr)")
        XCTAssertFalse(run.diedOfSignal)
        XCTAssertNotEqual(kill(pid, 0), 0, "the command is gone")
        let snap = try ctx.snapshot(id)
        XCTAssertEqual(snap?["state"]?.stringValue, "cancelled")
        XCTAssertEqual(snap?["status"]?.stringValue, "Cancelled: stop now")
        XCTAssertEqual(try ctx.events(id).map { $0["event"]?.stringValue }, ["processing", "cancel_requested", "cancelled"])
        XCTAssertTrue(run.stderr.contains("cancel requested (stop now)"), run.stderr)
    }

    /// The whole process group is signalled (a shell's children too), and a command that ignores
    /// SIGTERM gets SIGKILL after --kill-after: run exits 137.
    func testRunKillsTheProcessGroupAndEscalatesToSIGKILL() throws {
        let id = uniqueID()
        let pidFile = NSTemporaryDirectory() + "run-\(id).pid"
        defer { unlink(pidFile) }
        // The shell ignores SIGTERM, and so do its children (ignored signals are inherited).
        let script = "trap '' TERM; sleep 300 & echo $! > \(pidFile); while true; do sleep 0.2; done"
        let run = try ctx.start(["run", "--id", id, "--kill-after", "1s", "--", "/bin/sh", "-c", script])
        eventually(30, "the command to start") { (try? String(contentsOfFile: pidFile, encoding: .utf8))?.isEmpty == false }
        let grandchild = try XCTUnwrap(pid_t((try String(contentsOfFile: pidFile, encoding: .utf8)).trimmingCharacters(in: .whitespacesAndNewlines)))
        XCTAssertEqual(try ctx.run(["cancel", "--id", id]).0, 0)
        XCTAssertEqual(run.wait(timeout: 30), 137, "stderr: \(run.stderr)")
        XCTAssertTrue(run.stderr.contains("SIGKILL"), run.stderr)
        eventually(10, "the grandchild to be gone") { kill(grandchild, 0) != 0 }
        XCTAssertEqual(try ctx.snapshot(id)?["state"]?.stringValue, "cancelled")
        XCTAssertEqual(try ctx.snapshot(id)?["status"]?.stringValue, "Cancelled remotely")
    }

    /// A run keeps its activity fresh while it lives; killed with -9 (its machine dies), the
    /// activity ends stale instead of showing "processing" for ever.
    func testRunTouchesWhileAliveAndItsActivityEndsStaleWhenItDies() throws {
        let id = uniqueID()
        let pidFile = NSTemporaryDirectory() + "run-\(id).pid"
        defer { unlink(pidFile) }
        let run = try ctx.start(["run", "--id", id, "--stale-after", "10s", "--", "/bin/sh", "-c", "echo $$ > \(pidFile); exec sleep 300"])
        eventually(30, "the command to start") { (try? String(contentsOfFile: pidFile, encoding: .utf8))?.isEmpty == false }
        let child = try XCTUnwrap(pid_t((try String(contentsOfFile: pidFile, encoding: .utf8)).trimmingCharacters(in: .whitespacesAndNewlines)))
        defer { kill(-child, SIGKILL) }  // it leads its own process group; run is not there to stop it
        let first = try XCTUnwrap(Int64((try sql("SELECT stale_at_ms FROM activities WHERE activity_id = $1", id).first ?? nil) ?? ""))
        // Past its 10 s, touched and alive, with no new event.
        Thread.sleep(forTimeInterval: 13)
        XCTAssertEqual(try ctx.snapshot(id)?["state"]?.stringValue, "processing")
        XCTAssertEqual(try ctx.events(id).count, 1)
        let later = try XCTUnwrap(Int64((try sql("SELECT stale_at_ms FROM activities WHERE activity_id = $1", id).first ?? nil) ?? ""))
        XCTAssertGreaterThan(later, first + 5000, "touched")

        // The machine dies: run and its command with it. (The command goes too because
        // Foundation's Process learns of run's exit only once every inheritor of its
        // termination socket, the command included, is gone.)
        kill(run.pid, SIGKILL)
        kill(-child, SIGKILL)
        _ = run.wait()
        try eventually(40, "the activity to end stale") { try ctx.snapshot(id)?["state"]?.stringValue == "error" }
        XCTAssertEqual(try ctx.snapshot(id)?["error"]?.stringValue, "stale: no update for 10s")
    }

    private func sql(_ query: String, _ params: String...) throws -> [String?] {
        try TestPostgres.shared().sql(ctx.server.conninfo, query, params).map { $0.first ?? nil }
    }
}

/// `dispatch verify-webhook` on a real webhook, signed by a real server, caught by a real receiver.
final class VerifyWebhookCLIIntegrationTests: XCTestCase {
    func testVerifyWebhookAcceptsTheRealThingAndNothingElse() throws {
        let secret = "whsec-cli-test-0123456789"
        let receiver = try WebhookReceiver()
        let server = try TestServer.start(environment: ["DISPATCH_WEBHOOK_SECRET": secret, "DISPATCH_WEBHOOK_ALLOW_PRIVATE": "1"])
        defer { server.stop() }
        let ctx = CLITestContext(server: server)
        XCTAssertEqual(try ctx.run(["start", "--id", "hooked", "--name", "Hooked", "--cancel-url", receiver.url()]).0, 0)
        XCTAssertEqual(try ctx.run(["cancel", "--id", "hooked", "--reason", "user asked"]).0, 0)
        let call = try XCTUnwrap(try receiver.waitForRequests(1).first, server.log())
        let signature = try XCTUnwrap(call.headers["dispatch-signature"])
        let bodyFile = NSTemporaryDirectory() + "hook-\(getpid()).json"
        defer { unlink(bodyFile) }
        try call.body.write(toFile: bodyFile, atomically: true, encoding: .utf8)

        func verify(_ args: [String], env: [String: String] = [:]) throws -> (Int32, String) {
            let (code, _, err) = try ctx.run(["verify-webhook"] + args, env: env)
            return (code, err)
        }
        XCTAssertEqual(try verify(["--secret", secret, "--signature", signature, "--body", bodyFile]).0, 0)
        XCTAssertEqual(try verify(["--signature", signature, "--body", bodyFile], env: ["DISPATCH_WEBHOOK_SECRET": secret]).0, 0)
        let wrong = try verify(["--secret", "not-the-secret-at-all", "--signature", signature, "--body", bodyFile])
        XCTAssertEqual(wrong.0, 1)
        XCTAssertTrue(wrong.1.contains("does not match"), wrong.1)

        let tampered = NSTemporaryDirectory() + "hook-\(getpid())-tampered.json"
        defer { unlink(tampered) }
        try call.body.replacingOccurrences(of: "user asked", with: "user asked!").write(toFile: tampered, atomically: true, encoding: .utf8)
        XCTAssertEqual(try verify(["--secret", secret, "--signature", signature, "--body", tampered]).0, 1)
        XCTAssertEqual(try verify(["--secret", secret, "--signature", "garbage", "--body", bodyFile]).0, 1)
        // Issue 24 item 7: malformed headers exit 1 with a message, never a crash (the first one
        // used to trap on an arithmetic overflow, exit 132; a second t= was accepted).
        let v1 = try XCTUnwrap(signature.split(separator: ",").first { $0.hasPrefix("v1=") })
        let t = try XCTUnwrap(signature.split(separator: ",").first { $0.hasPrefix("t=") })
        for malformed in ["t=-9223372036854775808,v1=00", "t=-9223372036854775808,\(v1)", "\(t),\(t),\(v1)", "t=1,\(t),\(v1)",
                          "\(t),\(v1),\(v1)", "\(t)", "\(t),v1=not-hex-at-all", "\(t),v1=" + String(repeating: "z", count: 64)] {
            let r = try verify(["--secret", secret, "--signature", malformed, "--body", bodyFile])
            XCTAssertEqual(r.0, 1, malformed)
            XCTAssertTrue(r.1.contains("the signature is not"), "\(malformed): \(r.1)")
        }
        XCTAssertEqual(try verify(["--secret", secret, "--signature", signature, "--body", "/nonexistent/body"]).0, 1)

        // An old signature (a replay) is refused unless --max-age allows it.
        let sig = try XCTUnwrap(CancelWebhook.parseSignature(signature))
        let oldT = sig.timestamp - 3600
        let oldSignature = "t=\(oldT),v1=" + (try opensslHMAC(key: secret, message: "\(oldT).\(call.body)"))
        let old = try verify(["--secret", secret, "--signature", oldSignature, "--body", bodyFile])
        XCTAssertEqual(old.0, 1)
        XCTAssertTrue(old.1.contains("old"), old.1)
        XCTAssertEqual(try verify(["--secret", secret, "--signature", oldSignature, "--body", bodyFile, "--max-age", "2h"]).0, 0)
        XCTAssertEqual(try verify(["--secret", secret, "--signature", oldSignature, "--body", bodyFile, "--max-age", "0"]).0, 0)

        // The body from stdin, as a shell receiver would pipe it.
        let dir = (ctx.dispatch as NSString).deletingLastPathComponent
        let piped = Subprocess.run(["/bin/sh", "-c", "cat '\(bodyFile)' | '\(dir)/dispatch' verify-webhook --signature '\(signature)' --body -"],
                                   environment: ["DISPATCH_WEBHOOK_SECRET": secret, "PATH": "/usr/bin:/bin"])
        XCTAssertEqual(piped.status, 0, piped.output)
    }

    private func opensslHMAC(key: String, message: String) throws -> String {
        let path = NSTemporaryDirectory() + "hmac-\(getpid())"
        defer { unlink(path) }
        try message.write(toFile: path, atomically: true, encoding: .utf8)
        let out = Subprocess.run(["/usr/bin/openssl", "dgst", "-sha256", "-hmac", key, "-r", path])
        guard out.status == 0, let hex = out.output.split(separator: " ").first else { throw TestError("openssl: \(out.output)") }
        return String(hex)
    }
}
