import XCTest
@testable import DispatchServer
import DispatchCore

/// Server configuration from the environment and flags.
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
        XCTAssertEqual(c.replayMemoryBytes, 64 << 20)
        XCTAssertEqual(c.cors, .none, "no origin may call /v1 from a browser unless configured")
        XCTAssertEqual(config(cores: 0)?.workers, 1, "at least one worker")
        XCTAssertEqual(config(cores: 2)?.workers, 2)
    }

    /// Each setting by environment, by `--flag value` and by `--flag=value`.
    func testEverySetting() throws {
        let key = "0123456789abcdef-key"
        let keyFile = NSTemporaryDirectory() + "config-key-\(getpid())"
        try (key + "\n").write(toFile: keyFile, atomically: true, encoding: .utf8)
        defer { unlink(keyFile) }
        let table: [(String, String, String, (ServerConfig) -> Bool)] = [
            ("DISPATCH_LISTEN", "--listen", "0.0.0.0:9000", { $0.listen == [Address(host: "0.0.0.0", port: 9000)] }),
            ("DATABASE_URL", "--database-url", "postgres://u@h/db?sslmode=require", { $0.databaseURL == "postgres://u@h/db?sslmode=require" }),
            ("DISPATCH_DATA_DIR", "--data-dir", "/var/lib/dispatch", { $0.dataDir == "/var/lib/dispatch" }),
            ("DISPATCH_HEARTBEAT", "--heartbeat", "0.5", { $0.heartbeatSeconds == 0.5 }),
            ("DISPATCH_BOOTSTRAP_KEY", "--bootstrap-key", key, { $0.bootstrapKey == key }),
            ("DISPATCH_LOG_LEVEL", "--log-level", "DEBUG", { $0.logLevel == "debug" }),
            ("DISPATCH_LOG_FORMAT", "--log-format", "JSON", { $0.logFormat == .json }),
            ("DISPATCH_ACCESS_LOG", "--access-log", "off", { $0.accessLog == .off }),
            ("DISPATCH_WORKERS", "--workers", "3", { $0.workers == 3 }),
            ("DISPATCH_STREAM_BACKLOG", "--stream-backlog", "4096", { $0.streamBacklogBytes == 4096 }),
            ("DISPATCH_RETENTION_DAYS", "--retention-days", "0.5", { $0.retentionDays == 0.5 }),
            ("DISPATCH_PUBLISH_RATE", "--publish-rate", "0", { $0.publishRatePerSecond == 0 }),
            ("DISPATCH_MAX_STREAMS_PER_KEY", "--max-streams-per-key", "5", { $0.maxStreamsPerKey == 5 }),
            ("DISPATCH_REPLAY_MEMORY_MB", "--replay-memory-mb", "8", { $0.replayMemoryBytes == 8 << 20 }),
            ("DISPATCH_STALE_AFTER", "--stale-after", "600", { $0.staleAfterSeconds == 600 }),
            ("DISPATCH_COMMIT_WINDOW_MS", "--commit-window-ms", "0", { $0.commitWindowMs == 0 }),
            ("DISPATCH_REQUEST_DEADLINE", "--request-deadline", "5", { $0.requestDeadlineSeconds == 5 }),
            ("DISPATCH_SHUTDOWN_TIMEOUT", "--shutdown-timeout", "3", { $0.shutdownTimeoutSeconds == 3 }),
            ("DISPATCH_MAX_PENDING_PER_CLIENT", "--max-pending-per-client", "4", { $0.maxPendingPerClient == 4 }),
            ("DISPATCH_CORS_ORIGINS", "--cors-origins", "https://ops.example, http://localhost:3000",
             { $0.cors == CORSPolicy(origins: ["https://ops.example", "http://localhost:3000"], anyOrigin: false) }),
            ("DISPATCH_WEBHOOK_SECRET", "--webhook-secret", key, { $0.webhookSecret == key }),
            ("DISPATCH_WEBHOOK_ALLOW_PRIVATE", "--webhook-allow-private", "1", { $0.webhookAllowPrivate }),
            ("DISPATCH_METRICS_MACHINE_LABEL", "--metrics-machine-label", "1", { $0.metricsMachineLabel }),
            ("DISPATCH_METRICS_MACHINES", "--metrics-machines", "7", { $0.metricsMachineLimit == 7 }),
            ("DISPATCH_TRUSTED_PROXIES", "--trusted-proxies", "10.0.0.0/8, ::1", { $0.trustedProxies.contains("10.2.3.4") && $0.trustedProxies.contains("::1") }),
            ("DISPATCH_DB_TIMEOUT", "--db-timeout", "1.5", { $0.dbTimeoutSeconds == 1.5 }),
            ("DISPATCH_WEBHOOK_TIMEOUT", "--webhook-timeout", "3", { $0.webhookTimeoutSeconds == 3 }),
            ("DISPATCH_WEBHOOK_SECRET_FILE", "--webhook-secret-file", keyFile, { $0.webhookSecret == key }),
            ("DISPATCH_BOOTSTRAP_KEY_FILE", "--bootstrap-key-file", keyFile, { $0.bootstrapKey == key }),
        ]
        XCTAssertEqual(table.count, ServerConfig.settings.count - APNsSettings.settings.count - KeyLimits.settings.count
                       - CarrierSettings.settings.count,
                       "push settings: PushConfigTests; limits per key: KeyLimitsConfigTests; the carrier: CarrierConfigTests")
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
            (["DISPATCH_MAX_STREAMS_PER_KEY": "0"], []), (["DISPATCH_LOG_LEVEL": "verbose"], []), (["DISPATCH_LOG_FORMAT": "xml"], []), (["DISPATCH_STALE_AFTER": "5"], []), (["DISPATCH_REQUEST_DEADLINE": "0"], []), (["DISPATCH_MAX_PENDING_PER_CLIENT": "0"], []),
            (["DISPATCH_COMMIT_WINDOW_MS": "-1"], []), (["DISPATCH_COMMIT_WINDOW_MS": "101"], []), (["DISPATCH_COMMIT_WINDOW_MS": "2.5"], []),
            (["DISPATCH_BOOTSTRAP_KEY": "short"], []), (["DISPATCH_BOOTSTRAP_KEY": "has a space in it ok"], []),
            (["DISPATCH_DATA_DIR": ""], []),
            (["DISPATCH_CORS_ORIGINS": "ops.example"], []), (["DISPATCH_CORS_ORIGINS": "https://ops.example/app"], []),
            (["DISPATCH_CORS_ORIGINS": "*,https://ops.example"], []), (["DISPATCH_CORS_ORIGINS": "ftp://ops.example"], []),
            (["DISPATCH_WEBHOOK_SECRET": "too-short"], []), (["DISPATCH_WEBHOOK_SECRET": "has a space in it, ok?"], []),
            (["DISPATCH_WEBHOOK_ALLOW_PRIVATE": "maybe"], []),
            (["DISPATCH_TRUSTED_PROXIES": "10.0.0.0/33"], []), (["DISPATCH_TRUSTED_PROXIES": "proxy.example"], []),
            (["DISPATCH_DB_TIMEOUT": "0"], []), (["DISPATCH_DB_TIMEOUT": "0.4"], []), (["DISPATCH_DB_TIMEOUT": "301"], []),
            (["DISPATCH_DB_TIMEOUT": "nan"], []), (["DISPATCH_WEBHOOK_TIMEOUT": "0.5"], []), (["DISPATCH_WEBHOOK_TIMEOUT": "61"], []),
            ([:], ["--bogus"]), ([:], ["--workers"]), ([:], ["serve"]), ([:], ["--workers", "0"]),
            ([:], ["-workers", "2"]), ([:], ["--heartbeat=abc"]),
        ]
        for (env, args) in table {
            if case .success = parse(env, args) { XCTFail("accepted \(env) \(args)") }
        }
    }

    func testCORSOrigins() {
        XCTAssertEqual(config(["DISPATCH_CORS_ORIGINS": "*"])?.cors, CORSPolicy(origins: [], anyOrigin: true))
        XCTAssertEqual(config(["DISPATCH_CORS_ORIGINS": ""])?.cors, CORSPolicy.none, "empty: none")
        XCTAssertEqual(config(["DISPATCH_CORS_ORIGINS": "HTTPS://Ops.Example:8443"])?.cors.origins, ["https://ops.example:8443"])
    }

    func testUsageListsEverySetting() {
        let usage = ServerConfig.usage()
        for s in ServerConfig.settings {
            XCTAssertTrue(usage.contains(s.flag) && usage.contains(s.env), s.env)
        }
    }
}

/// `DISPATCH_NATS_URL` and the settings that go with it (contract §10).
final class CarrierConfigTests: XCTestCase {
    func parse(_ env: [String: String]) throws(ConfigError) -> ServerConfig {
        try ServerConfig.parse(environment: env, arguments: [], cores: 1)
    }

    func testWithoutNATSTheCarrierIsListenNotify() throws {
        XCTAssertNil(try parse([:]).carrier)
        XCTAssertNil(try parse(["DISPATCH_NATS_URL": ""]).carrier, "empty, as docker compose passes it")
    }

    func testURLsPrefixAndCheck() throws {
        let c = try parse(["DISPATCH_NATS_URL": "nats://10.0.0.5:4222, nats://nats-2:4222",
                           "DISPATCH_NATS_SUBJECT_PREFIX": "prod.dispatch_1", "DISPATCH_CARRIER_CHECK": "0.5"]).carrier
        XCTAssertEqual(c?.servers, ["nats://10.0.0.5:4222", "nats://nats-2:4222"])
        XCTAssertEqual(c?.subjectPrefix, "prod.dispatch_1")
        XCTAssertEqual(c?.checkSeconds, 0.5)
        XCTAssertEqual(try parse(["DISPATCH_NATS_URL": "nats://127.0.0.1:4222"]).carrier?.subjectPrefix, "dispatch")
    }

    func testBadValuesAreRefusedWithTheSettingsName() {
        let bad: [[String: String]] = [
            ["DISPATCH_NATS_URL": "http://127.0.0.1:4222"], ["DISPATCH_NATS_URL": "nats://:4222"],
            ["DISPATCH_NATS_URL": "nats://host"], ["DISPATCH_NATS_URL": "nats://host:99999"], ["DISPATCH_NATS_URL": ","],
            ["DISPATCH_NATS_URL": "nats://h:1", "DISPATCH_NATS_SUBJECT_PREFIX": "a..b"],
            ["DISPATCH_NATS_URL": "nats://h:1", "DISPATCH_NATS_SUBJECT_PREFIX": "a.*"],
            ["DISPATCH_NATS_URL": "nats://h:1", "DISPATCH_CARRIER_CHECK": "0"],
            ["DISPATCH_CARRIER_CHECK": "1"], ["DISPATCH_NATS_SUBJECT_PREFIX": "x"],
        ]
        for env in bad {
            do {
                _ = try parse(env)
                XCTFail("accepted \(env)")
            } catch {
                let named = env.keys.contains { error.message.contains($0) } || error.message.contains("DISPATCH_NATS_URL")
                XCTAssertTrue(named, error.message)
            }
        }
    }
}

/// Issue 24 item 9: secrets from files, and a warning for secrets on the command line.
final class SecretFileConfigTests: XCTestCase {
    let files = ["/run/secrets/webhook": "whsec-from-a-file-0123456789\n", "/run/secrets/bootstrap": "bootstrap-from-a-file-0123\n",
                 "/run/secrets/two-lines": "one-line-0123456789\nanother-0123456789\n"]

    func parse(_ env: [String: String], _ args: [String] = []) -> Result<ServerConfig, ConfigError> {
        do throws(ConfigError) {
            return .success(try ServerConfig.parse(environment: env, arguments: args, cores: 1, readFile: { self.files[$0] }))
        } catch {
            return .failure(error)
        }
    }

    func testSecretsAreReadFromFilesNamedByEnvironmentOrFlag() throws {
        let fromEnv = try parse(["DISPATCH_WEBHOOK_SECRET_FILE": "/run/secrets/webhook", "DISPATCH_BOOTSTRAP_KEY_FILE": "/run/secrets/bootstrap"]).get()
        XCTAssertEqual(fromEnv.webhookSecret, "whsec-from-a-file-0123456789", "the trailing newline is not part of it")
        XCTAssertEqual(fromEnv.bootstrapKey, "bootstrap-from-a-file-0123")
        XCTAssertEqual(fromEnv.secretsOnCommandLine, [])
        let fromFlags = try parse([:], ["--webhook-secret-file", "/run/secrets/webhook", "--bootstrap-key-file=/run/secrets/bootstrap"]).get()
        XCTAssertEqual(fromFlags.webhookSecret, "whsec-from-a-file-0123456789")
        XCTAssertEqual(fromFlags.bootstrapKey, "bootstrap-from-a-file-0123")
        XCTAssertEqual(fromFlags.secretsOnCommandLine, [], "a file's path is no secret")
    }

    func testTheValueAndItsFileTogetherOrAnUnreadableFileAreRefused() {
        for (env, expected) in [
            (["DISPATCH_WEBHOOK_SECRET": "whsec-inline-0123456789", "DISPATCH_WEBHOOK_SECRET_FILE": "/run/secrets/webhook"], "not both"),
            (["DISPATCH_BOOTSTRAP_KEY_FILE": "/run/secrets/missing"], "cannot read /run/secrets/missing"),
            (["DISPATCH_WEBHOOK_SECRET_FILE": "/run/secrets/two-lines"], "one line"),
        ] {
            switch parse(env) {
            case .success: XCTFail("accepted \(env)")
            case .failure(let e): XCTAssertTrue(e.message.contains(expected), e.message)
            }
        }
        // A file's secret gets the same checks as the value itself.
        if case .success = parse(["DISPATCH_WEBHOOK_SECRET_FILE": "/run/secrets/short"]) { XCTFail("unreadable accepted") }
    }

    func testSecretFlagsOnTheCommandLineAreNamedForAWarning() throws {
        let c = try parse([:], ["--webhook-secret", "whsec-inline-0123456789", "--bootstrap-key=bootstrap-inline-0123"]).get()
        XCTAssertEqual(c.secretsOnCommandLine, ["--webhook-secret", "--bootstrap-key"])
        XCTAssertEqual(c.webhookSecret, "whsec-inline-0123456789")
        let env = try parse(["DISPATCH_WEBHOOK_SECRET": "whsec-inline-0123456789"]).get()
        XCTAssertEqual(env.secretsOnCommandLine, [], "the environment does not show in ps")
    }

    func testHelpListsTheFileSettings() {
        let usage = ServerConfig.usage()
        for s in ["--webhook-secret-file", "DISPATCH_WEBHOOK_SECRET_FILE", "--bootstrap-key-file", "DISPATCH_BOOTSTRAP_KEY_FILE",
                  "--db-timeout", "DISPATCH_DB_TIMEOUT"] {
            XCTAssertTrue(usage.contains(s), s)
        }
    }
}
