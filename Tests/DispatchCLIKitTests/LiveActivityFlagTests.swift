import DispatchCLIKit
import DispatchCore
import XCTest

/// `--live-activity` asks for push-to-start (contract §5.2: opt-in per activity).
final class LiveActivityFlagTests: XCTestCase {
    func start(_ args: [String]) throws -> CLIStartOptions? {
        switch try CLIArguments.parse(args, environment: { _ in nil }) {
        case .command(_, .start(let o)): return o
        case .command(_, .run(let r)): return r.start
        default: return nil
        }
    }

    func testTheFlagReachesTheStartBody() throws {
        let on = try XCTUnwrap(start(["start", "--name", "ISO", "--live-activity"]))
        XCTAssertTrue(on.liveActivity)
        XCTAssertEqual(try JSONParser.parse(CLIRequestBody.start(on))["liveActivity"], .bool(true))
        let off = try XCTUnwrap(start(["start", "--name", "ISO"]))
        XCTAssertFalse(off.liveActivity)
        XCTAssertNil(try JSONParser.parse(CLIRequestBody.start(off))["liveActivity"], "not sent unless asked")
        XCTAssertEqual(try start(["run", "--live-activity", "--", "true"])?.liveActivity, true)
    }

    /// `--broadcast` asks for an APNs broadcast channel (contract §5.5).
    func testTheBroadcastFlagReachesTheStartBody() throws {
        let on = try XCTUnwrap(start(["start", "--name", "Release", "--broadcast", "--live-activity"]))
        XCTAssertTrue(on.broadcast)
        let body = try JSONParser.parse(CLIRequestBody.start(on))
        XCTAssertEqual(body["broadcast"], .bool(true))
        XCTAssertEqual(body["liveActivity"], .bool(true))
        XCTAssertNil(try JSONParser.parse(CLIRequestBody.start(try XCTUnwrap(start(["start", "--name", "x"]))))["broadcast"])
        XCTAssertEqual(try start(["run", "--broadcast", "--", "true"])?.broadcast, true)
    }
}
