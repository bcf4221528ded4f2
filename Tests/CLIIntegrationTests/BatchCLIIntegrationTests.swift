import DispatchCore
import DispatchTestSupport
import Foundation
import XCTest

/// `dispatch batch` against a real server: one result line per input line in order, the
/// exit codes, stdin, and retries that apply nothing twice.
final class BatchCLIIntegrationTests: CLIServerTestCase {
    func write(_ lines: [String]) throws -> String {
        let path = NSTemporaryDirectory() + "batch-\(getpid())-\(UUID().uuidString).jsonl"
        try (lines.joined(separator: "\n") + "\n").write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    func statuses(_ out: String) -> [String] {
        out.split(separator: "\n").map { line in
            guard let v = try? JSONParser.parse(String(line)) else { return "?" }
            if case .number(let s)? = v["status"] {
                if case .number(let seq)? = v["snapshot"]?["seq"] { return "\(Int(s)) \(Int(seq))" }
                if case .string(let code)? = v["error"]?["code"] { return "\(Int(s)) \(code)" }
            }
            return "?"
        }
    }

    func testOneResultPerLineInOrderAndTheExitCodes() throws {
        let a = uniqueID("BATCH"), b = uniqueID("BATCH")
        let mixed = try write([
            #"{"op":"start","activityId":"\#(a)","taskName":"Render","state":"processing"}"#,
            #"{"op":"update","activityId":"\#(a)","progress":0.5}"#,
            "",
            "not json",
            #"{"op":"update","activityId":"\#(b)","progress":0.5}"#,
            #"{"op":"end","activityId":"\#(a)"}"#,
        ])
        defer { unlink(mixed) }
        let (code, out, err) = try ctx.run(["batch", mixed, "--size", "2"])
        XCTAssertEqual(code, 9, "some were refused: \(err)")
        XCTAssertEqual(statuses(out), ["201 1", "200 2", "400 invalid_json", "404 not_found", "200 3"], out)
        XCTAssertEqual(try ctx.events(a).count, 3)

        // All accepted, from stdin; the repeated end is answered 200 and changes nothing.
        let piped = try write([#"{"op":"end","activityId":"\#(a)"}"#, #"{"op":"start","activityId":"\#(b)","taskName":"x"}"#])
        defer { unlink(piped) }
        let dir = (ctx.dispatch as NSString).deletingLastPathComponent
        var env = ctx.environment
        env["PATH"] = dir + ":" + (env["PATH"] ?? "/usr/bin:/bin")
        let sh = try CLIProcess("/bin/sh", ["-c", "dispatch batch - < '\(piped)'"], environment: env)
        XCTAssertEqual(sh.wait(), 0, sh.stderr)
        XCTAssertEqual(statuses(sh.stdout), ["200 3", "201 1"])
    }

    func testARequestRefusedAsAWholeStopsWithItsCode() throws {
        let path = try write([#"{"op":"start","taskName":"x"}"#])
        defer { unlink(path) }
        var env = ctx.environment
        env["DISPATCH_TOKEN"] = "not-a-key"
        let (code, out, err) = try ctx.run(["batch", path], env: env)
        XCTAssertEqual(code, 4, err)
        XCTAssertEqual(out, "")
        XCTAssertTrue(err.contains("unauthorized"), err)
        let (missing, _, missingErr) = try ctx.run(["batch", "/nonexistent/changes.jsonl"])
        XCTAssertEqual(missing, 2, missingErr)
    }
}
