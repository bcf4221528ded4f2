import XCTest
@testable import DispatchServer

/// APNs and token-key settings: all or nothing, and clear messages.
final class PushConfigTests: XCTestCase {
    let apns = ["DISPATCH_APNS_KEY_FILE": "/keys/AuthKey_ABC123DEFG.p8", "DISPATCH_APNS_KEY_ID": "ABC123DEFG",
                "DISPATCH_APNS_TEAM_ID": "TEAM123456", "DISPATCH_APNS_TOPIC": "com.example.dispatch"]

    func parse(_ env: [String: String]) -> Result<ServerConfig, ConfigError> {
        do throws(ConfigError) {
            return .success(try ServerConfig.parse(environment: env, arguments: [], cores: 2))
        } catch {
            return .failure(error)
        }
    }

    func refusal(_ env: [String: String], file: StaticString = #filePath, line: UInt = #line) -> String {
        if case .failure(let e) = parse(env) { return e.message }
        XCTFail("accepted", file: file, line: line)
        return ""
    }

    func testNoAPNsMeansNoPushes() throws {
        let c = try parse([:]).get()
        XCTAssertNil(c.apns)
        XCTAssertNil(c.tokenKey)
        XCTAssertEqual(c.pushDismissalSeconds, 14_400)
        XCTAssertEqual(c.pushLeaseSeconds, 60)
    }

    func testAllFourTurnPushesOn() throws {
        let c = try parse(apns).get()
        XCTAssertEqual(c.apns?.url, "https://api.push.apple.com")
        XCTAssertEqual(c.apns?.apnsTopic, "com.example.dispatch.push-type.liveactivity")
        var sandbox = apns
        sandbox["DISPATCH_APNS_URL"] = "https://api.sandbox.push.apple.com/"
        XCTAssertEqual(try parse(sandbox).get().apns?.url, "https://api.sandbox.push.apple.com")
        let flags = try ServerConfig.parse(environment: [:], arguments: ["--apns-key-file", "/k.p8", "--apns-key-id", "K",
                                                                          "--apns-team-id", "T", "--apns-topic", "a.b"], cores: 2)
        XCTAssertEqual(flags.apns?.keyFile, "/k.p8")
    }

    /// Each push setting by environment, `--flag value` and `--flag=value` (the APNs four together).
    func testEveryPushSetting() throws {
        let hex = String(repeating: "ab", count: 32)
        let table: [(String, String, String, (ServerConfig) -> Bool)] = [
            ("DISPATCH_APNS_KEY_FILE", "--apns-key-file", "/k/a.p8", { $0.apns?.keyFile == "/k/a.p8" }),
            ("DISPATCH_APNS_KEY_ID", "--apns-key-id", "KID0000001", { $0.apns?.keyID == "KID0000001" }),
            ("DISPATCH_APNS_TEAM_ID", "--apns-team-id", "TEAM000001", { $0.apns?.teamID == "TEAM000001" }),
            ("DISPATCH_APNS_TOPIC", "--apns-topic", "org.example.app", { $0.apns?.topic == "org.example.app" }),
            ("DISPATCH_APNS_URL", "--apns-url", "https://127.0.0.1:4443", { $0.apns?.url == "https://127.0.0.1:4443" }),
            ("DISPATCH_APNS_SANDBOX_URL", "--apns-sandbox-url", "https://127.0.0.1:4444", { $0.apns?.sandboxURL == "https://127.0.0.1:4444" }),
            ("DISPATCH_APNS_MANAGE_URL", "--apns-manage-url", "https://127.0.0.1:4445", { $0.apns?.manageURL == "https://127.0.0.1:4445" }),
            ("DISPATCH_APNS_MANAGE_SANDBOX_URL", "--apns-manage-sandbox-url", "https://127.0.0.1:4446",
             { $0.apns?.manageSandboxURL == "https://127.0.0.1:4446" }),
            ("DISPATCH_APNS_BROADCAST_ENV", "--apns-broadcast-env", "sandbox", { $0.apns?.broadcastEnvironment == .sandbox }),
            ("DISPATCH_PUSH_PACE", "--push-pace", "2.5", { $0.apns?.pace == 2.5 }),
            ("DISPATCH_APNS_CA_FILE", "--apns-ca-file", "/k/ca.pem", { $0.apns?.caFile == "/k/ca.pem" }),
            ("DISPATCH_TOKEN_KEY", "--token-key", hex, { $0.tokenKey == [UInt8](repeating: 0xAB, count: 32) }),
            ("DISPATCH_PUSH_DISMISSAL", "--push-dismissal", "0", { $0.pushDismissalSeconds == 0 }),
            ("DISPATCH_PUSH_LEASE", "--push-lease", "4", { $0.pushLeaseSeconds == 4 }),
            ("DISPATCH_PUSH_TO_START_LIMIT", "--push-to-start-limit", "3", { $0.apns?.pushToStartLimit == 3 }),
            ("DISPATCH_APNS_IDLE", "--apns-idle", "30", { $0.apns?.idleSeconds == 30 }),
        ]
        XCTAssertEqual(table.count, APNsSettings.settings.count)
        for (env, flag, value, check) in table {
            XCTAssertTrue(ServerConfig.settings.contains { $0.env == env && $0.flag == flag }, env)
            var base = apns
            base[env] = nil
            for (e, args) in [(base.merging([env: value]) { $1 }, [String]()), (base, [flag, value]), (base, ["\(flag)=\(value)"])] {
                let c = try ServerConfig.parse(environment: e, arguments: args, cores: 2)
                XCTAssertTrue(check(c), "\(env)=\(value)")
            }
        }
    }

    func testPartialConfigurationIsRefusedNamingWhatIsMissing() {
        for missing in APNsSettings.required {
            var env = apns
            env[missing] = nil
            XCTAssertTrue(refusal(env).contains("\(missing) missing"), missing)
        }
        XCTAssertTrue(refusal(["DISPATCH_APNS_URL": "https://x"]).contains("partly configured"))
    }

    func testBadValues() {
        func with(_ k: String, _ v: String) -> [String: String] { apns.merging([k: v]) { $1 } }
        XCTAssertTrue(refusal(with("DISPATCH_APNS_TOPIC", "com.example.push-type.liveactivity")).contains("appends"))
        XCTAssertTrue(refusal(with("DISPATCH_APNS_TOPIC", "bad topic")).contains("bundle id"))
        XCTAssertTrue(refusal(with("DISPATCH_APNS_URL", "http://api.push.apple.com")).contains("https://"))
        XCTAssertTrue(refusal(with("DISPATCH_APNS_URL", "https://host/path")).contains("https://"))
        XCTAssertTrue(refusal(with("DISPATCH_APNS_KEY_ID", "ab-c")).contains("DISPATCH_APNS_KEY_ID"))
        XCTAssertTrue(refusal(["DISPATCH_PUSH_DISMISSAL": "14401"]).contains("DISPATCH_PUSH_DISMISSAL"))
        XCTAssertTrue(refusal(["DISPATCH_PUSH_LEASE": "3"]).contains("DISPATCH_PUSH_LEASE"))
    }

    func testTokenKeyIsHexOrBase64Of32Bytes() throws {
        let hex = String(repeating: "ab", count: 32)
        XCTAssertEqual(try parse(["DISPATCH_TOKEN_KEY": hex]).get().tokenKey, [UInt8](repeating: 0xAB, count: 32))
        XCTAssertEqual(try parse(["DISPATCH_TOKEN_KEY": "q6urq6urq6urq6urq6urq6urq6urq6urq6urq6urq6s="]).get().tokenKey,
                       [UInt8](repeating: 0xAB, count: 32))
        XCTAssertTrue(refusal(["DISPATCH_TOKEN_KEY": String(repeating: "ab", count: 16)]).contains("32 bytes"))
        XCTAssertTrue(refusal(["DISPATCH_TOKEN_KEY": "not a key"]).contains("openssl rand -hex 32"))
        XCTAssertEqual(try TokenKey.parse(TokenKey.generate()).count, 32)
    }

    func testTheVaultSealsFindsAndRefusesSwappedBlobs() throws {
        let vault = TokenVault(key: [UInt8](repeating: 7, count: 32))
        let a = try vault.seal(String(repeating: "0a", count: 32))
        let b = try vault.seal(String(repeating: "0b", count: 32))
        XCTAssertEqual(vault.open(a.sealed, mac: a.mac), String(repeating: "0a", count: 32))
        XCTAssertEqual(a.mac, vault.mac(String(repeating: "0a", count: 32)), "found without decrypting")
        XCTAssertNil(vault.open(a.sealed, mac: b.mac), "a blob only opens in its own row")
        XCTAssertNil(TokenVault(key: [UInt8](repeating: 8, count: 32)).open(a.sealed, mac: a.mac), "another key")
        XCTAssertNotEqual(try vault.seal(String(repeating: "0a", count: 32)).sealed, a.sealed, "a fresh IV each time")
        XCTAssertEqual(a.hint, "…0a0a")
    }
}
