import XCTest
import DispatchCore
import DispatchCLIKit

/// cancel, touch, verify-webhook and run's cancel path, without a process or a socket.
final class CancelCLIUnitTests: XCTestCase {
    private func parse(_ args: [String], env: [String: String] = [:]) throws -> CLICommand {
        guard case .command(_, let c) = try CLIArguments.parse(args, environment: { env[$0] }) else { throw CLIUsageError("not a command") }
        return c
    }

    private func refuses(_ args: [String], env: [String: String] = [:], _ fragment: String, file: StaticString = #filePath, line: UInt = #line) {
        do {
            let c = try CLIArguments.parse(args, environment: { env[$0] })
            XCTFail("accepted \(args): \(c)", file: file, line: line)
        } catch {
            XCTAssertTrue(error.message.contains(fragment), error.message, file: file, line: line)
        }
    }

    func testParsing() throws {
        XCTAssertEqual(try parse(["cancel", "--id", "job-1"]), .cancel(CLICancelOptions(activityID: "job-1")))
        XCTAssertEqual(try parse(["cancel", "--id", "job-1", "--reason", "disk full"]), .cancel(CLICancelOptions(activityID: "job-1", reason: "disk full")))
        XCTAssertEqual(try parse(["touch", "--id", "job-1"]), .touch("job-1"))
        refuses(["cancel"], "--id is required")
        refuses(["touch", "--id", "x", "--reason", "r"], "unknown option --reason")

        guard case .start(let s) = try parse(["start", "--name", "x", "--stale-after", "1h30m"]) else { return XCTFail() }
        XCTAssertEqual(s.staleAfter, 5400)
        XCTAssertEqual(text(CLIRequestBody.start(s)), #"{"taskName":"x","staleAfter":5400}"#)
        guard case .start(let plain) = try parse(["start", "--name", "x"]) else { return XCTFail() }
        XCTAssertNil(plain.staleAfter, "the server's default")
        XCTAssertFalse(text(CLIRequestBody.start(plain)).contains("staleAfter"))
        refuses(["start", "--name", "x", "--stale-after", "5"], "--stale-after")
        refuses(["start", "--name", "x", "--stale-after", "8d"], "--stale-after")
        refuses(["start", "--name", "x", "--stale-after", "10.5s"], "--stale-after")
        guard case .start(let odd) = try parse(["start", "--name", "x", "--stale-after", "1.5m"]) else { return XCTFail() }
        XCTAssertEqual(odd.staleAfter, 90, "whole seconds, however written")
        refuses(["start", "--name", "x", "--stale-after", "soon"], "--stale-after")

        guard case .run(let r) = try parse(["run", "--", "sleep", "300"]) else { return XCTFail() }
        XCTAssertEqual(r.killAfter, 10)
        XCTAssertEqual(r.start.staleAfter, 600, "run always sets one, and keeps it fresh")
        guard case .run(let r2) = try parse(["run", "--kill-after", "2.5s", "--stale-after", "30", "--", "sleep", "1"]) else { return XCTFail() }
        XCTAssertEqual(r2.killAfter, 2.5)
        XCTAssertEqual(r2.start.staleAfter, 30)
        XCTAssertEqual(r2.command, ["sleep", "1"])
        refuses(["run", "--kill-after", "-1", "--", "true"], "--kill-after")
        refuses(["run", "--kill-after", "2d", "--", "true"], "--kill-after")

        let v = try parse(["verify-webhook", "--secret", "s3cret-s3cret-s3cret", "--signature", "t=1,v1=ab", "--body", "/tmp/b"])
        XCTAssertEqual(v, .verifyWebhook(CLIVerifyWebhookOptions(secret: "s3cret-s3cret-s3cret", signature: "t=1,v1=ab", bodyPath: "/tmp/b", maxAge: 300)))
        let fromEnv = try parse(["verify-webhook", "--signature", "t=1,v1=ab", "--body", "-", "--max-age", "0"],
                                env: ["DISPATCH_WEBHOOK_SECRET": "from-the-environment"])
        XCTAssertEqual(fromEnv, .verifyWebhook(CLIVerifyWebhookOptions(secret: "from-the-environment", signature: "t=1,v1=ab", bodyPath: "-", maxAge: 0)))
        refuses(["verify-webhook", "--signature", "t=1,v1=ab", "--body", "-"], "--secret")
        refuses(["verify-webhook", "--secret", "s", "--body", "-"], "--signature")
        refuses(["verify-webhook", "--secret", "s", "--signature", "x"], "--body")
        refuses(["verify-webhook", "--secret", "s", "--signature", "x", "--body", "-", "--max-age", "old"], "--max-age")
        XCTAssertEqual(text(CLIRequestBody.cancel(CLICancelOptions(activityID: "x"))), "{}")
        XCTAssertEqual(text(CLIRequestBody.cancel(CLICancelOptions(activityID: "x", reason: "a \"b\""))), #"{"reason":"a \"b\""}"#)
    }

    // MARK: - verify-webhook

    /// A stand-in MAC (the real one is libcrypto's HMAC-SHA256, checked in the integration tests).
    /// 32 bytes, as long as HMAC-SHA256's (the header must carry 64 hex digits).
    private static func mac(_ key: [UInt8], _ message: [UInt8]) -> [UInt8] {
        (0..<4).flatMap { round -> [UInt8] in
            var h: UInt64 = 1469598103934665603 &+ UInt64(round)
            for b in key + [0] + message { h = (h ^ UInt64(b)) &* 1099511628211 }
            return withUnsafeBytes(of: h.bigEndian) { Array($0) }
        }
    }

    private func verify(_ header: String, body: String = #"{"activityId":"a"}"#, secret: String = "secret", now: Int64 = 1000,
                        maxAge: Double = 300) -> Result<Void, CLIWebhookVerifier.Failure> {
        CLIWebhookVerifier.verify(header: header, body: Array(body.utf8), secret: secret, now: now, maxAge: maxAge,
                                  mac: Self.mac, equal: { $0 == $1 })
    }

    private func sign(_ t: Int64, body: String = #"{"activityId":"a"}"#, secret: String = "secret") -> String {
        let hex = Self.mac(Array(secret.utf8), Array("\(t).\(body)".utf8)).map { String(format2: $0) }.joined()
        return "t=\(t),v1=\(hex)"
    }

    func testVerification() {
        XCTAssertNoThrow(try verify(sign(1000)).get())
        XCTAssertNoThrow(try verify(sign(800)).get(), "within max age")
        XCTAssertNoThrow(try verify(sign(1200)).get(), "a little ahead (clock skew)")
        XCTAssertNoThrow(try verify(sign(1000).replacingV1(with: String(repeating: "0", count: 64)) + "," + sign(1000).v1Part).get(),
                         "any v1 may match")
        XCTAssertNoThrow(try verify(sign(1000).uppercasedHex).get(), "hex case does not matter")
        XCTAssertEqual(verify(sign(1000, secret: "other")).failure, .mismatch)
        XCTAssertEqual(verify(sign(1000), body: #"{"activityId":"b"}"#).failure, .mismatch)
        XCTAssertEqual(verify(sign(1000, body: #"{"activityId":"a"} "#)).failure, .mismatch, "the body byte for byte")
        XCTAssertEqual(verify(sign(699)).failure, .tooOld(seconds: 301))
        XCTAssertEqual(verify(sign(1301)).failure, .inTheFuture(seconds: 301))
        XCTAssertNoThrow(try verify(sign(5), maxAge: 0).get(), "--max-age 0: no limit")
        XCTAssertEqual(verify("v1=abcd").failure, .malformedHeader)
        XCTAssertEqual(verify("t=1000").failure, .malformedHeader)
        XCTAssertEqual(verify("").failure, .malformedHeader)
        XCTAssertEqual(verify("t=1000,v1=").failure, .malformedHeader)
        // Issue 24 item 7: the time that overflowed `now - t` (a crash, exit 132), a second t
        // (which one was signed?), a repeated or non-hex v1.
        let v1 = sign(1000).v1Part
        XCTAssertEqual(verify("t=-9223372036854775808,\(v1)").failure, .malformedHeader)
        XCTAssertEqual(verify("t=9223372036854775807,\(v1)", now: -5).failure, .malformedHeader)
        XCTAssertEqual(verify("t=1000,t=1000,\(v1)").failure, .malformedHeader)
        XCTAssertEqual(verify("t=1000,t=999,\(v1)").failure, .malformedHeader)
        XCTAssertEqual(verify(sign(1000) + "," + v1).failure, .malformedHeader)
        XCTAssertEqual(verify("t=1000,v1=" + String(repeating: "g", count: 64)).failure, .malformedHeader)
        XCTAssertEqual(verify("t=999999999999,\(v1)", now: Int64.min).failure, .inTheFuture(seconds: Int64.max),
                       "a clock far off saturates instead of trapping")
    }

    // MARK: - run's cancel path

    func testRunCancelSignalsOnceThenKillsAfterTheGrace() {
        var c = CLIRunCancel(killAfter: 10)
        XCTAssertEqual(c.tick(childRunning: true, now: 0), [], "nothing until a request")
        XCTAssertFalse(c.cancelledTheCommand)
        XCTAssertEqual(c.cancelRequested(reason: "disk full", childRunning: true, now: 100), [.terminate])
        XCTAssertEqual(c.cancelRequested(reason: "again", childRunning: true, now: 101), [], "the stream shows it on later events too")
        XCTAssertEqual(c.reason, "disk full", "the first request's reason")
        XCTAssertEqual(c.tick(childRunning: true, now: 109.9), [])
        XCTAssertEqual(c.tick(childRunning: true, now: 110), [.kill])
        XCTAssertEqual(c.tick(childRunning: true, now: 200), [], "once")
        XCTAssertTrue(c.cancelledTheCommand)
        XCTAssertEqual(c.exitCode, 137)
        XCTAssertEqual(c.end, CLIEndOptions(activityID: "", state: "cancelled", status: "Cancelled: disk full"))

        var quick = CLIRunCancel(killAfter: 10)
        _ = quick.cancelRequested(reason: nil, childRunning: true, now: 0)
        XCTAssertEqual(quick.tick(childRunning: false, now: 20), [], "gone before the grace ran out: no SIGKILL")
        XCTAssertEqual(quick.exitCode, 143)
        XCTAssertEqual(quick.end.status, "Cancelled remotely")
    }

    func testARequestBeforeTheCommandStartsWaitsForIt() {
        var c = CLIRunCancel(killAfter: 1)
        XCTAssertEqual(c.cancelRequested(reason: nil, childRunning: false, now: 0), [])
        XCTAssertFalse(c.cancelledTheCommand)
        XCTAssertEqual(c.tick(childRunning: true, now: 5), [.terminate])
        XCTAssertEqual(c.tick(childRunning: true, now: 6), [.kill])
        var never = CLIRunCancel()
        XCTAssertEqual(never.cancelRequested(reason: nil, childRunning: false, now: 0), [])
        XCTAssertFalse(never.cancelledTheCommand, "the command ended by itself first: its own outcome stands")
    }

    func testEndTextAndTouchInterval() {
        var c = CLIRunCancel()
        _ = c.cancelRequested(reason: "line\nbreak " + String(repeating: "x", count: 300), childRunning: true, now: 0)
        XCTAssertEqual(c.end.status?.count, 200)
        XCTAssertFalse(c.end.status?.contains("\n") ?? true)
        XCTAssertEqual(CLIRunCancel.touchInterval(staleAfter: 600), 200)
        XCTAssertEqual(CLIRunCancel.touchInterval(staleAfter: 10), 10.0 / 3)
    }

    private func text(_ b: [UInt8]) -> String { String(decoding: b, as: UTF8.self) }
}

private extension Result where Failure == CLIWebhookVerifier.Failure {
    var failure: CLIWebhookVerifier.Failure? {
        if case .failure(let f) = self { return f }
        return nil
    }
}

private extension String {
    init(format2 byte: UInt8) {
        let digits = Array("0123456789abcdef")
        self = String([digits[Int(byte >> 4)], digits[Int(byte & 0xF)]])
    }

    var v1Part: String { String(split(separator: ",")[1]) }
    func replacingV1(with hex: String) -> String { String(split(separator: ",")[0]) + ",v1=" + hex }
    var uppercasedHex: String { String(split(separator: ",")[0]) + ",v1=" + String(split(separator: "=")[2]).uppercased() }
}
