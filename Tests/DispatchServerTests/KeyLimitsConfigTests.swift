import XCTest
@testable import DispatchServer
import DispatchCore

/// DISPATCH_MAX_LIVE_PER_KEY, DISPATCH_MAX_DEVICES_PER_KEY, DISPATCH_DEVICE_RATE and
/// DISPATCH_DEVICE_RETENTION_DAYS: defaults, flags, refusals.
final class KeyLimitsConfigTests: XCTestCase {
    func parse(_ env: [String: String], _ args: [String] = []) throws(ConfigError) -> KeyLimits {
        try ServerConfig.parse(environment: env, arguments: args, cores: 1).limits
    }

    func testDefaultsAreTheContracts() throws {
        let l = try parse([:])
        XCTAssertEqual(l.maxLivePerKey, 10_000)
        XCTAssertEqual(l.maxDevicesPerKey, 1_000)
        XCTAssertEqual(l.maxFinishedPerKey, 20_000)
        XCTAssertEqual(KeyRules.finishedWindowMs, FeedService.recentWindowMs, "the limit's window is the feed's initial set's")
        XCTAssertEqual(l.deviceRatePerSecond, 10)
        XCTAssertEqual(l.deviceRetentionDays, 90)
        XCTAssertEqual(l.maxActivityTokensPerDevice, 64)
        XCTAssertEqual(l.maxSessionsPerKey, 100)
        XCTAssertEqual(l.signInsPerMinute, 20)
    }

    func testSettingsAndFlags() throws {
        let l = try parse(["DISPATCH_MAX_LIVE_PER_KEY": "5", "DISPATCH_DEVICE_RATE": "0"],
                          ["--max-devices-per-key", "7", "--device-retention-days=0.5"])
        XCTAssertEqual(l.maxLivePerKey, 5)
        XCTAssertEqual(l.maxDevicesPerKey, 7)
        XCTAssertEqual(l.deviceRatePerSecond, 0)
        XCTAssertEqual(l.deviceRetentionDays, 0.5)
    }

    /// Each setting by environment, by `--flag value` and by `--flag=value`.
    func testEverySettingEveryWay() throws {
        let table: [(String, String, String, (KeyLimits) -> Bool)] = [
            ("DISPATCH_MAX_LIVE_PER_KEY", "--max-live-per-key", "12", { $0.maxLivePerKey == 12 }),
            ("DISPATCH_MAX_DEVICES_PER_KEY", "--max-devices-per-key", "34", { $0.maxDevicesPerKey == 34 }),
            ("DISPATCH_MAX_FINISHED_PER_KEY", "--max-finished-per-key", "56", { $0.maxFinishedPerKey == 56 }),
            ("DISPATCH_DEVICE_RATE", "--device-rate", "2.5", { $0.deviceRatePerSecond == 2.5 }),
            ("DISPATCH_DEVICE_RETENTION_DAYS", "--device-retention-days", "30", { $0.deviceRetentionDays == 30 }),
            ("DISPATCH_MAX_ACTIVITY_TOKENS_PER_DEVICE", "--max-activity-tokens-per-device", "8", { $0.maxActivityTokensPerDevice == 8 }),
            ("DISPATCH_MAX_SESSIONS_PER_KEY", "--max-sessions-per-key", "9", { $0.maxSessionsPerKey == 9 }),
            ("DISPATCH_SIGNIN_RATE", "--signin-rate", "0", { $0.signInsPerMinute == 0 }),
        ]
        XCTAssertEqual(table.count, KeyLimits.settings.count)
        for (env, flag, value, check) in table {
            XCTAssertTrue(KeyLimits.settings.contains { $0.env == env && $0.flag == flag }, env)
            for l in [try parse([env: value]), try parse([:], [flag, value]), try parse([:], ["\(flag)=\(value)"])] {
                XCTAssertTrue(check(l), "\(env)=\(value)")
            }
        }
    }

    func testBadValuesAreRefused() {
        for (name, value) in [("DISPATCH_MAX_LIVE_PER_KEY", "0"), ("DISPATCH_MAX_LIVE_PER_KEY", "many"),
                              ("DISPATCH_MAX_DEVICES_PER_KEY", "-1"), ("DISPATCH_DEVICE_RATE", "-1"),
                              ("DISPATCH_DEVICE_RATE", "inf"), ("DISPATCH_DEVICE_RETENTION_DAYS", "0"),
                              ("DISPATCH_MAX_ACTIVITY_TOKENS_PER_DEVICE", "0"), ("DISPATCH_MAX_SESSIONS_PER_KEY", "none"),
                              ("DISPATCH_SIGNIN_RATE", "-3"), ("DISPATCH_MAX_FINISHED_PER_KEY", "0"),
                              ("DISPATCH_MAX_FINISHED_PER_KEY", "1e3")] {
            XCTAssertThrowsError(try parse([name: value]), "\(name)=\(value)") { e in
                XCTAssertTrue((e as? ConfigError)?.message.contains(name) == true, "\(e)")
            }
        }
    }
}
