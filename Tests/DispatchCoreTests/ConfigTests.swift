import XCTest
@testable import DispatchCore

/// Server configuration, rate limiting with injected time, key specs and list cursors.
final class ConfigTests: XCTestCase {
    typealias Address = ServerConfig.Address

    func parse(_ env: [String: String] = [:], _ args: [String] = [], cores: Int = 4) -> Result<ServerConfig, ConfigError> {
        do throws(ConfigError) {
            return .success(try ServerConfig.parse(environment: env, arguments: args, cores: cores))
        } catch {
            return .failure(error)
        }
    }

    func config(_ env: [String: String] = [:], _ args: [String] = [], cores: Int = 4,
                file: StaticString = #filePath, line: UInt = #line) -> ServerConfig? {
        switch parse(env, args, cores: cores) {
        case .success(let c): return c
        case .failure(let e): XCTFail("refused: \(e.message)", file: file, line: line); return nil
        }
    }

    func testDefaults() {
        guard let c = config(["HOME": "/root", "PATH": "/bin"]) else { return }
        XCTAssertEqual(c.listen, [Address(host: "127.0.0.1", port: 8080)])
        XCTAssertNil(c.databaseURL)
        XCTAssertEqual(c.dataDir, "./.dispatch")
        XCTAssertEqual(c.heartbeatSeconds, 15)
        XCTAssertNil(c.bootstrapKey)
        XCTAssertEqual(c.logLevel, "info")
        XCTAssertEqual(c.workers, 4)
        XCTAssertEqual(c.streamBacklogBytes, 256 * 1024)
        XCTAssertEqual(c.retentionDays, 7)
        XCTAssertEqual(c.publishRatePerSecond, 200)
        XCTAssertEqual(c.maxStreamsPerKey, 20_000)
        XCTAssertEqual(config(cores: 0)?.workers, 1, "at least one worker")
        XCTAssertEqual(config(cores: 2)?.workers, 2)
    }

    /// Each setting by environment, by `--flag value` and by `--flag=value`.
    func testEverySetting() {
        let key = "0123456789abcdef-key"
        let table: [(String, String, String, (ServerConfig) -> Bool)] = [
            ("DISPATCH_LISTEN", "--listen", "0.0.0.0:9000", { $0.listen == [Address(host: "0.0.0.0", port: 9000)] }),
            ("DATABASE_URL", "--database-url", "postgres://u@h/db?sslmode=require", { $0.databaseURL == "postgres://u@h/db?sslmode=require" }),
            ("DISPATCH_DATA_DIR", "--data-dir", "/var/lib/dispatch", { $0.dataDir == "/var/lib/dispatch" }),
            ("DISPATCH_HEARTBEAT", "--heartbeat", "0.5", { $0.heartbeatSeconds == 0.5 }),
            ("DISPATCH_BOOTSTRAP_KEY", "--bootstrap-key", key, { $0.bootstrapKey == key }),
            ("DISPATCH_LOG_LEVEL", "--log-level", "DEBUG", { $0.logLevel == "debug" }),
            ("DISPATCH_WORKERS", "--workers", "3", { $0.workers == 3 }),
            ("DISPATCH_STREAM_BACKLOG", "--stream-backlog", "4096", { $0.streamBacklogBytes == 4096 }),
            ("DISPATCH_RETENTION_DAYS", "--retention-days", "0.5", { $0.retentionDays == 0.5 }),
            ("DISPATCH_PUBLISH_RATE", "--publish-rate", "0", { $0.publishRatePerSecond == 0 }),
            ("DISPATCH_MAX_STREAMS_PER_KEY", "--max-streams-per-key", "5", { $0.maxStreamsPerKey == 5 }),
        ]
        XCTAssertEqual(table.count, ServerConfig.settings.count)
        for (env, flag, value, check) in table {
            XCTAssertTrue(ServerConfig.settings.contains { $0.env == env && $0.flag == flag }, env)
            for c in [config([env: value]), config([:], [flag, value]), config([:], ["\(flag)=\(value)"])] {
                XCTAssertTrue(c.map(check) ?? false, "\(env)=\(value)")
            }
        }
    }

    func testFlagsWinOverEnvironment() {
        let env = ["DISPATCH_WORKERS": "2", "DISPATCH_HEARTBEAT": "30", "DISPATCH_LOG_LEVEL": "error"]
        guard let c = config(env, ["--workers", "5", "--heartbeat=1"]) else { return }
        XCTAssertEqual(c.workers, 5)
        XCTAssertEqual(c.heartbeatSeconds, 1)
        XCTAssertEqual(c.logLevel, "error", "environment applies where no flag is given")
        XCTAssertEqual(config([:], ["--workers", "2", "--workers", "7"])?.workers, 7, "the last flag wins")
        XCTAssertNil(config(["DATABASE_URL": ""])?.databaseURL, "empty means unset")
    }

    func testListen() {
        let table: [(String, [Address]?)] = [
            ("127.0.0.1:8080", [Address(host: "127.0.0.1", port: 8080)]),
            ("[::1]:8080", [Address(host: "::1", port: 8080)]),
            ("[::]:0", [Address(host: "::", port: 0)]),
            ("localhost:65535", [Address(host: "localhost", port: 65535)]),
            ("127.0.0.1:8080,[::1]:8081", [Address(host: "127.0.0.1", port: 8080), Address(host: "::1", port: 8081)]),
            (" 0.0.0.0:80 , [fe80::1]:443 ", [Address(host: "0.0.0.0", port: 80), Address(host: "fe80::1", port: 443)]),
            ("127.0.0.1:8080,", [Address(host: "127.0.0.1", port: 8080)]),
            ("", nil), (",", nil), ("8080", nil), (":8080", nil), ("[]:8080", nil), ("host:", nil), ("host:http", nil),
            ("host:65536", nil), ("host:-1", nil), ("[::1]", nil), ("[::1]:", nil), ("a:1,b", nil),
        ]
        for (value, want) in table {
            switch parse(["DISPATCH_LISTEN": value]) {
            case .success(let c): XCTAssertEqual(c.listen, want, value)
            case .failure(let e):
                XCTAssertNil(want, "\(value): \(e.message)")
                XCTAssertTrue(e.message.contains("DISPATCH_LISTEN"), e.message)
            }
        }
    }

    func testBadValues() {
        let table: [([String: String], [String])] = [
            (["DISPATCH_HEARTBEAT": "0"], []), (["DISPATCH_HEARTBEAT": "abc"], []), (["DISPATCH_HEARTBEAT": "nan"], []),
            (["DISPATCH_HEARTBEAT": "inf"], []), (["DISPATCH_HEARTBEAT": "3601"], []),
            (["DISPATCH_WORKERS": "0"], []), (["DISPATCH_WORKERS": "65"], []), (["DISPATCH_WORKERS": "two"], []),
            (["DISPATCH_STREAM_BACKLOG": "4095"], []), (["DISPATCH_STREAM_BACKLOG": "67108865"], []),
            (["DISPATCH_RETENTION_DAYS": "0"], []), (["DISPATCH_RETENTION_DAYS": "-1"], []),
            (["DISPATCH_PUBLISH_RATE": "-1"], []), (["DISPATCH_PUBLISH_RATE": "inf"], []),
            (["DISPATCH_MAX_STREAMS_PER_KEY": "0"], []), (["DISPATCH_LOG_LEVEL": "verbose"], []),
            (["DISPATCH_BOOTSTRAP_KEY": "short"], []), (["DISPATCH_BOOTSTRAP_KEY": "has a space in it ok"], []),
            (["DISPATCH_DATA_DIR": ""], []),
            ([:], ["--bogus"]), ([:], ["--workers"]), ([:], ["serve"]), ([:], ["--workers", "0"]),
            ([:], ["-workers", "2"]), ([:], ["--heartbeat=abc"]),
        ]
        for (env, args) in table {
            if case .success = parse(env, args) { XCTFail("accepted \(env) \(args)") }
        }
    }

    func testUsageListsEverySetting() {
        let usage = ServerConfig.usage()
        for s in ServerConfig.settings {
            XCTAssertTrue(usage.contains(s.flag) && usage.contains(s.env), s.env)
        }
    }

    // MARK: - Rate limiting

    func testTokenBucketWithInjectedTime() {
        var b = TokenBucket(rate: 2, burst: 3, now: 100)
        // (time, expected wait: nil = allowed)
        let table: [(Double, Double?)] = [
            (100, nil), (100, nil), (100, nil), (100, 0.5),
            (100.25, 0.25), (100.5, nil), (100.5, 0.5),
            (110, nil), (110, nil), (110, nil), (110, 0.5),  // refills to the burst, no more
            (109, 0.5),  // a clock that steps back adds nothing
        ]
        for (now, wait) in table {
            let got = b.take(now: now)
            if let wait, let got { XCTAssertEqual(got, wait, accuracy: 1e-9, "at \(now)") } else { XCTAssertEqual(got, wait, "at \(now)") }
        }
    }

    func testScopes() {
        let table: [(String, Set<Scope>?)] = [
            ("publish", [.publish]), ("read,device", [.read, .device]), ("admin,admin", [.admin]),
            ("publish,read,device,admin", Set(Scope.allCases)), ("", nil), ("root", nil), ("read,", [.read]), ("Read", nil),
        ]
        for (text, want) in table { XCTAssertEqual(Scope.parseList(text), want, text) }
    }

    // MARK: - Keys and cursors

    func testKeySpecParse() throws {
        let table: [(String, String?)] = [
            (#"{"name":"ci-runner.1","scopes":["publish"]}"#, nil),
            (#"{"name":"n","scopes":["read","device","admin"],"machine":"shodan"}"#, nil),
            (#"{"name":"n","scopes":["read"],"machine":null}"#, nil),
            (#"{"scopes":["read"]}"#, "missing_field"),
            (#"{"name":"n"}"#, "missing_field"),
            (#"{"name":"n","scopes":[]}"#, "invalid_field"),
            (#"{"name":"n","scopes":["root"]}"#, "invalid_field"),
            (#"{"name":"n","scopes":[1]}"#, "invalid_field"),
            (#"{"name":"","scopes":["read"]}"#, "invalid_field"),
            (#"{"name":"a b","scopes":["read"]}"#, "invalid_field"),
            (#"{"name":"\#(String(repeating: "k", count: 65))","scopes":["read"]}"#, "invalid_field"),
            (#"{"name":"n","scopes":["read"],"machine":""}"#, "invalid_field"),
            (#"{"name":"n","scopes":["read"],"machine":5}"#, "invalid_field"),
            (#"{"name":"n","scopes":["read"],"extra":1}"#, "unknown_field"),
            (#"{"name":"n","name":"m","scopes":["read"]}"#, "invalid_json"),
            ("[]", "invalid_json"),
        ]
        for (body, code) in table {
            do throws(DispatchError) {
                _ = try KeySpec.parse(bytes(body))
                XCTAssertNil(code, body)
            } catch {
                XCTAssertEqual(error.code.rawValue, code, "\(body): \(error.message)")
                XCTAssertEqual(error.httpStatus, 400)
            }
        }
        let spec = try KeySpec.parse(bytes(#"{"name":"n","scopes":["read","device","read"],"machine":"shodan"}"#))
        XCTAssertEqual(spec, try KeySpec(name: "n", scopes: [.read, .device], machine: "shodan"))
    }

    func testListCursor() {
        let cursors = [
            ListCursor(createdAt: 1_795_992_806_123, activityId: "TEST-RTORRENT-01"),
            ListCursor(createdAt: 0, activityId: "a_b_c"),
            ListCursor(createdAt: -5, activityId: "x:y.z"),
            ListCursor(createdAt: .max, activityId: String(repeating: "z", count: 128)),
        ]
        for c in cursors { XCTAssertEqual(ListCursor.decode(c.encode()), c, c.encode()) }
        XCTAssertEqual(cursors[0].encode(), "1795992806123_TEST-RTORRENT-01")
        for bad in ["", "_", "12", "12_", "_abc", "x_abc", "1.5_abc", "12_a b", "12_a/b", "99999999999999999999_a"] {
            XCTAssertNil(ListCursor.decode(bad), bad)
        }
    }
}
