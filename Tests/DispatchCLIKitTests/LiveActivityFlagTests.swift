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
}
