import DispatchCore
import XCTest

/// `POST /v1/changes`' pure parts as tables: bodies refused as a whole, each change's own
/// refusal (the single call's error), and the answer's shape.
final class ChangeBatchTests: XCTestCase {
    func parse(_ body: String, machine: String? = nil) throws(DispatchError) -> [Result<ChangeBatch.Change, DispatchError>] {
        var n = 0
        return try ChangeBatch.parse(Array(body.utf8), boundMachine: machine, newID: { n += 1; return "generated-\(n)" })
    }

    func testBodiesThatAreNotTheShapeAreRefusedAsAWhole() {
        let many = "{\"changes\":[" + Array(repeating: #"{"op":"end","activityId":"a"}"#, count: 1001).joined(separator: ",") + "]}"
        let huge = #"{"changes":[{"op":"start","taskName":"x","status":""# + String(repeating: "y", count: 1 << 20) + #""}]}"#
        let table: [(String, String, DispatchError.Code)] = [
            ("not JSON", "{nope", .invalidJSON),
            ("empty", "", .invalidJSON),
            ("an array", "[]", .invalidJSON),
            ("no changes", "{}", .missingField),
            ("changes not an array", #"{"changes":{"op":"start"}}"#, .invalidField),
            ("changes null", #"{"changes":null}"#, .invalidField),
            ("no change", #"{"changes":[]}"#, .invalidField),
            ("another member", #"{"changes":[],"dryRun":true}"#, .unknownField),
            ("1,001 changes", many, .bodyTooLarge),
            ("over 1 MiB", huge, .bodyTooLarge),
        ]
        for (what, body, code) in table {
            do {
                _ = try parse(body)
                XCTFail("\(what): accepted")
            } catch {
                XCTAssertEqual(error.code, code, what)
            }
        }
    }

    func testEachChangeIsCheckedAsItsSingleCall() throws {
        let body = """
            {"changes":[
              {"op":"start","activityId":"a","taskName":"Build","state":"processing"},
              {"op":"update","activityId":"a","progress":0.5,"idempotencyKey":"k-1"},
              {"op":"end","activityId":"a","state":"error","error":"boom"},
              {"op":"start","taskName":"no id"},
              7,
              {"activityId":"a"},
              {"op":"cancel","activityId":"a"},
              {"op":"update","progress":0.5},
              {"op":"update","activityId":"bad id"},
              {"op":"update","activityId":"a","progress":2},
              {"op":"update","activityId":"a","taskName":"x"},
              {"op":"start","activityId":"b"},
              {"op":"end","activityId":"a","state":"processing"},
              {"op":"update","activityId":"a","idempotencyKey":""},
              {"op":"update","activityId":"a","idempotencyKey":7},
              {"op":"update","activityId":"a","status":"two\\nlines"},
              {"op":"update","activityId":"a","idempotencyKey":null}
            ]}
            """
        let results = try parse(body)
        func line(_ r: Result<ChangeBatch.Change, DispatchError>) -> String {
            switch r {
            case .success(let c):
                let kind: String
                switch c.kind {
                case .start(let s): kind = "start \(s.taskName)"
                case .update(let u): kind = "update \(u.state.rawValue)"
                case .end(let e): kind = "end \(e.state.rawValue)"
                case .cancel: kind = "cancel"
                }
                return "\(c.activityID) \(kind)" + (c.idempotencyKey.map { " key \($0)" } ?? "")
            case .failure(let e): return "\(e.httpStatus) \(e.code.rawValue)"
            }
        }
        XCTAssertEqual(results.map(line), [
            "a start Build",
            "a update processing key k-1",
            "a end error",
            "generated-1 start no id",
            "400 invalid_json",
            "400 missing_field",
            "400 invalid_field",
            "400 missing_field",
            "400 invalid_field",
            "400 invalid_field",
            "400 unknown_field",
            "400 missing_field",
            "400 invalid_field",
            "400 invalid_field",
            "400 invalid_field",
            "400 invalid_field",
            "a update processing",
        ])
    }

    func testAMachineBoundKeysStartsGetItsMachineAndMayNotNameAnother() throws {
        let results = try parse(#"{"changes":[{"op":"start","activityId":"a","taskName":"x"},{"op":"start","activityId":"b","taskName":"x","machine":"other"},{"op":"start","activityId":"c","taskName":"x","machine":"shodan"}]}"#, machine: "shodan")
        guard case .success(let a) = results[0], case .start(let cmd) = a.kind else { return XCTFail("\(results[0])") }
        XCTAssertEqual(cmd.machine, "shodan")
        guard case .failure(let e) = results[1] else { return XCTFail("\(results[1])") }
        XCTAssertEqual(e.httpStatus, 403)
        guard case .success = results[2] else { return XCTFail("\(results[2])") }
    }

    func testTheAnswerHasOneResultPerChangeWithTheSingleCallsStatusAndBody() throws {
        let a = Activity(activityId: "a", taskName: "t", state: .completed, seq: 3, createdAt: 1, updatedAt: 1, endedAt: 1)
        let conflict = DispatchError(.alreadyFinished, "activity a has already finished", snapshot: a)
        let bytes = ChangeBatch.answer([
            .success(.committed(json: a.json(), created: true)),
            .success(.committed(json: a.json(), created: false)),
            .success(.ok(a)),
            .success(.replay(String(decoding: a.json(), as: UTF8.self))),
            .success(.failed(conflict)),
            .failure(DispatchError(.invalidField, "bad")),
        ])
        let value = try JSONParser.parse(bytes)
        guard case .array(let results)? = value["results"] else { return XCTFail("no results") }
        XCTAssertEqual(results.map { $0["status"] }, [.number(201), .number(200), .number(200), .number(200), .number(409), .number(400)])
        for r in results.prefix(4) { XCTAssertEqual(r["snapshot"]?["seq"], .number(3)); XCTAssertNil(r["error"]) }
        XCTAssertEqual(results[4]["error"]?["code"], .string("already_finished"))
        XCTAssertEqual(results[4]["activity"]?["seq"], .number(3), "a 409 carries the stored snapshot, as the single call's body")
        XCTAssertEqual(results[5]["error"]?["message"], .string("bad"))
        XCTAssertNil(results[5]["snapshot"])
    }
}
