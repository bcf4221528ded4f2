import DispatchCLIKit
import DispatchCore
import XCTest

/// `dispatch batch`'s decisions: what each line becomes, how lines are cut into requests,
/// the result lines and the exit code.
final class CLIBatchTests: XCTestCase {
    func testLinesBecomeChangesWithAnIdempotencyKeyOrLocalRefusals() throws {
        let input = Array("{\"op\":\"start\",\"taskName\":\"a\"}\r\n\n   \n{\"op\":\"end\",\"activityId\":\"a\",\"idempotencyKey\":\"mine\"}\nnot json\n[1]\n".utf8)
        let lines = CLIBatch.lines(input)
        XCTAssertEqual(lines.map(\.number), [1, 4, 5, 6], "blank lines are skipped, numbers are the input's")
        var n = 0
        let prepared = lines.map { CLIBatch.prepare($0.text, number: $0.number, newKey: { n += 1; return "key-\(n)" }) }
        guard case .change(let first) = prepared[0], case .change(let second) = prepared[1] else { return XCTFail("\(prepared)") }
        XCTAssertEqual(try JSONParser.parse(first)["idempotencyKey"], .string("key-1"), "a key is added")
        XCTAssertEqual(try JSONParser.parse(first)["taskName"], .string("a"))
        XCTAssertEqual(try JSONParser.parse(second)["idempotencyKey"], .string("mine"), "the line's own key is kept")
        XCTAssertEqual(n, 1)
        for (i, line) in [(2, 5), (3, 6)] {
            guard case .refused(let result) = prepared[i] else { return XCTFail("\(prepared[i])") }
            let value = try JSONParser.parse(result)
            XCTAssertEqual(value["status"], .number(400))
            XCTAssertEqual(value["error"]?["code"], .string("invalid_json"))
            guard case .string(let message)? = value["error"]?["message"] else { return XCTFail(result) }
            XCTAssertTrue(message.hasPrefix("line \(line) "), message)
            XCTAssertFalse(CLIBatch.accepted(result))
        }
    }

    func testRequestsHoldAtMostTheirCountAndBytes() {
        let small = [UInt8](repeating: 0x61, count: 10)
        XCTAssertEqual(CLIBatch.requests(Array(repeating: small, count: 2500)), [0..<1000, 1000..<2000, 2000..<2500])
        XCTAssertEqual(CLIBatch.requests(Array(repeating: small, count: 5), maxChanges: 2), [0..<2, 2..<4, 4..<5])
        XCTAssertEqual(CLIBatch.requests(Array(repeating: small, count: 5), maxBodyBytes: 14 + 33), [0..<3, 3..<5], "3 x 11 bytes fit")
        let huge = [UInt8](repeating: 0x61, count: 100)
        XCTAssertEqual(CLIBatch.requests([small, huge, small], maxBodyBytes: 50), [0..<1, 1..<2, 2..<3], "too large alone: sent alone")
        XCTAssertEqual(CLIBatch.requests([]), [])
        let body = CLIBatch.body([Array("{\"a\":1}".utf8), Array("{\"b\":2}".utf8)][...])
        XCTAssertEqual(String(decoding: body, as: UTF8.self), #"{"changes":[{"a":1},{"b":2}]}"#)
        for count in [1, 999, 1000, 1001] {
            let ranges = CLIBatch.requests(Array(repeating: small, count: count))
            for r in ranges { XCTAssertLessThanOrEqual(CLIBatch.body(Array(repeating: small, count: count)[r]).count, CLIBatch.maxBodyBytes) }
        }
    }

    func testResultsAndTheExitCode() {
        let answer = Array(#"{"results":[{"status":201,"snapshot":{"seq":1}},{"status":409,"error":{"code":"already_finished","message":"m"}}]}"#.utf8)
        let lines = CLIBatch.results(answer, expected: 2)
        XCTAssertEqual(lines, [#"{"status":201,"snapshot":{"seq":1}}"#, #"{"status":409,"error":{"code":"already_finished","message":"m"}}"#])
        XCTAssertNil(CLIBatch.results(answer, expected: 3), "not one result per change")
        XCTAssertNil(CLIBatch.results(Array("{}".utf8), expected: 0))
        XCTAssertEqual(lines?.map(CLIBatch.accepted), [true, false])
        XCTAssertEqual(CLIBatch.exitCode(refused: 0), .success)
        XCTAssertEqual(CLIBatch.exitCode(refused: 1), .someRefused)
        XCTAssertEqual(CLIExitCode.someRefused.rawValue, 9)
    }

    func testArguments() throws {
        let env: (String) -> String? = { $0 == "DISPATCH_TOKEN" ? "k" : nil }
        guard case .command(_, .batch(let stdin)) = try CLIArguments.parse(["batch"], environment: env) else { return XCTFail() }
        XCTAssertEqual(stdin, CLIBatchOptions(path: nil, size: 1000))
        guard case .command(_, .batch(let dash)) = try CLIArguments.parse(["batch", "-"], environment: env) else { return XCTFail() }
        XCTAssertNil(dash.path)
        guard case .command(_, .batch(let file)) = try CLIArguments.parse(["batch", "changes.jsonl", "--size", "10"], environment: env) else { return XCTFail() }
        XCTAssertEqual(file, CLIBatchOptions(path: "changes.jsonl", size: 10))
        for bad in [["batch", "a", "b"], ["batch", "--size", "0"], ["batch", "--size", "1001"], ["batch", "--size", "x"]] {
            XCTAssertThrowsError(try CLIArguments.parse(bad, environment: env), "\(bad)")
        }
    }
}
