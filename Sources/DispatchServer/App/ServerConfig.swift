import DispatchCore
import DispatchIO
import DispatchSystem

/// Server configuration from the environment, each setting also a flag (flags win).
public struct ServerConfig: Equatable, Sendable {
    public struct Address: Equatable, Sendable {
        public var host: String
        public var port: Int

        public init(host: String, port: Int) {
            self.host = host
            self.port = port
        }
    }

    public var listen: [Address] = [Address(host: "127.0.0.1", port: 8080)]
    public var databaseURL: String?
    public var dataDir = "./.dispatch"
    public var heartbeatSeconds: Double = 15
    public var bootstrapKey: String?
    public var logLevel = "info"
    public var logFormat = Logger.Format.logfmt
    /// Access lines (`DISPATCH_ACCESS_LOG`): all, off, or at most N a second per worker.
    public var accessLog = AccessLogSetting.default
    public var workers: Int
    public var streamBacklogBytes = 256 * 1024
    public var retentionDays: Double = 7
    public var publishRatePerSecond: Double = 200
    public var maxStreamsPerKey = 20_000
    /// Bytes every stream of the server together may hold unsent (replays, stalled readers),
    /// shared by the workers; past it stalled streams are disconnected.
    public var replayMemoryBytes = 64 << 20
    /// Seconds a client may take to deliver a whole request (headers and body).
    public var requestDeadlineSeconds: Double = 30
    /// Connections per client address that may wait for their first complete request.
    public var maxPendingPerClient = 32
    /// Seconds a stop (SIGTERM) may take: streams told to come back, publishes answered.
    public var shutdownTimeoutSeconds: Double = 10
    /// Milliseconds a worker's next batch may wait for more changes while load is present
    /// (after a batch of several publishers' changes); 0: never waits (issue 35).
    public var commitWindowMs = 4
    /// `staleAfter` of starts that give none (seconds; 0: never).
    public var staleAfterSeconds = 86_400
    /// Browsers on these origins may read `/v1` answers (contract §9); default none.
    public var cors = CORSPolicy.none
    /// Proxies whose `X-Forwarded-Proto` is believed (the session cookie's `Secure`); default none.
    public var trustedProxies = TrustedProxies.none
    /// Signs cancel webhooks; nil: generated under the data dir for the embedded database,
    /// none with DATABASE_URL (webhooks then wait in the outbox). See docs/webhooks.md.
    public var webhookSecret: String?
    /// Let cancelURLs reach loopback, private and link-local addresses (tests, trusted networks).
    public var webhookAllowPrivate = false
    /// Live Activity pushes (contract §5.2); nil: none. See Push/PushConfig.swift.
    public var apns: APNsSettings?
    /// Seals device tokens at rest; nil: the embedded default generates one, else no devices API.
    public var tokenKey: [UInt8]?
    public var pushDismissalSeconds = 14_400
    /// Seconds a call waits for its database round trip before it gets 503 (contract §6).
    public var dbTimeoutSeconds: Double = 5
    /// Seconds one cancel webhook attempt may take, connecting included (default 10).
    public var webhookTimeoutSeconds: Double = 10
    /// Secret-bearing flags given on the command line, where every local user sees them in
    /// `ps` (a warning at start names them; the `-file` flags and the environment do not show).
    public var secretsOnCommandLine: [String] = []
    public var pushLeaseSeconds = 60
    /// The NATS carrier between server processes (contract §10); nil: LISTEN/NOTIFY.
    public var carrier: CarrierSettings?
    /// Label activity metrics with the machine (opt-in), for at most this many names per process.
    public var metricsMachineLabel = false
    public var metricsMachineLimit = 50
    /// Live activities and devices per key, device registration rate and retention.
    public var limits = KeyLimits()

    public struct Setting: Sendable {
        public let env: String
        public let flag: String
        public let help: String
    }

    public static let settings: [Setting] = [
        Setting(env: "DISPATCH_LISTEN", flag: "--listen", help: "address:port to listen on, comma-separated for several (default 127.0.0.1:8080)"),
        Setting(env: "DATABASE_URL", flag: "--database-url", help: "PostgreSQL URL or conninfo; unset: a private cluster under the data dir"),
        Setting(env: "DISPATCH_DATA_DIR", flag: "--data-dir", help: "where the embedded PostgreSQL lives (default ./.dispatch)"),
        Setting(env: "DISPATCH_HEARTBEAT", flag: "--heartbeat", help: "seconds between heartbeats on an idle stream (default 15)"),
        Setting(env: "DISPATCH_BOOTSTRAP_KEY", flag: "--bootstrap-key", help: "ensure an admin API key with exactly this secret (development, tests; on the command line it shows in ps)"),
        Setting(env: "DISPATCH_BOOTSTRAP_KEY_FILE", flag: "--bootstrap-key-file", help: "the same, read from this file (one line)"),
        Setting(env: "DISPATCH_LOG_LEVEL", flag: "--log-level", help: "debug, info, warning or error (default info)"),
        Setting(env: "DISPATCH_LOG_FORMAT", flag: "--log-format", help: "logfmt or json (default logfmt)"),
        Setting(env: "DISPATCH_ACCESS_LOG", flag: "--access-log",
                help: "access lines (http.request): all, off, or at most N a second per worker, the rest counted (default 100)"),
        Setting(env: "DISPATCH_WORKERS", flag: "--workers", help: "server processes sharing the port (default: number of cores)"),
        Setting(env: "DISPATCH_STREAM_BACKLOG", flag: "--stream-backlog", help: "bytes queued for one slow stream before it is cut off (default 262144)"),
        Setting(env: "DISPATCH_RETENTION_DAYS", flag: "--retention-days", help: "days a finished activity and its history are kept (default 7)"),
        Setting(env: "DISPATCH_PUBLISH_RATE", flag: "--publish-rate", help: "publishes per second per publish key and worker, 0 for no limit (default 200)"),
        Setting(env: "DISPATCH_REQUEST_DEADLINE", flag: "--request-deadline", help: "seconds a client may take to send a whole request, headers and body (default 30)"),
        Setting(env: "DISPATCH_MAX_PENDING_PER_CLIENT", flag: "--max-pending-per-client", help: "connections one client address may hold before completing a request (default 32)"),
        Setting(env: "DISPATCH_SHUTDOWN_TIMEOUT", flag: "--shutdown-timeout", help: "seconds a graceful stop may take before what is left is cut (default 10)"),
        Setting(env: "DISPATCH_COMMIT_WINDOW_MS", flag: "--commit-window-ms", help: "milliseconds a batch of publishes may wait for more while several publishers are busy, 0-100; 0 never waits (default 4)"),
        Setting(env: "DISPATCH_STALE_AFTER", flag: "--stale-after", help: "seconds without an update before an activity is ended as stale, when its start gives no staleAfter; 0 never (default 86400)"),
        Setting(env: "DISPATCH_CORS_ORIGINS", flag: "--cors-origins", help: "origins whose browser pages may call /v1, comma-separated (https://ops.example), or * for any (default none)"),
        Setting(env: "DISPATCH_TRUSTED_PROXIES", flag: "--trusted-proxies", help: "CIDRs of reverse proxies whose X-Forwarded-Proto is believed, comma-separated (127.0.0.1/32,10.0.0.0/8) (default none)"),
        Setting(env: "DISPATCH_WEBHOOK_SECRET", flag: "--webhook-secret", help: "signs cancel webhooks, 16-512 characters (default: generated in the data dir with the embedded database; none with DATABASE_URL, and webhooks wait; on the command line it shows in ps)"),
        Setting(env: "DISPATCH_WEBHOOK_SECRET_FILE", flag: "--webhook-secret-file", help: "the same, read from this file (one line)"),
        Setting(env: "DISPATCH_WEBHOOK_ALLOW_PRIVATE", flag: "--webhook-allow-private", help: "1: cancelURLs may reach loopback, private and link-local addresses (default 0: refused)"),
        Setting(env: "DISPATCH_WEBHOOK_TIMEOUT", flag: "--webhook-timeout", help: "seconds one cancel webhook attempt may take; connecting and waiting for the answer each get less (default 10)"),
        Setting(env: "DISPATCH_DB_TIMEOUT", flag: "--db-timeout", help: "seconds a call waits for the database before it gets 503 and the session reconnects (default 5)"),
        Setting(env: "DISPATCH_REPLAY_MEMORY_MB", flag: "--replay-memory-mb", help: "megabytes all streams together may hold unsent (replays, stalled readers); past it stalled ones are disconnected and resume (default 64)"),
        Setting(env: "DISPATCH_MAX_STREAMS_PER_KEY", flag: "--max-streams-per-key", help: "concurrent streams one key may hold per worker (default 20000)"),
    ] + CarrierSettings.settings + APNsSettings.settings + MetricsSettings.settings + KeyLimits.settings

    public init(workers: Int) { self.workers = workers }

    /// Settings whose value is a secret, each with the setting that reads it from a file.
    static let secretFiles = [("DISPATCH_BOOTSTRAP_KEY", "DISPATCH_BOOTSTRAP_KEY_FILE"), ("DISPATCH_WEBHOOK_SECRET", "DISPATCH_WEBHOOK_SECRET_FILE")]

    /// Reads `environment`, then `arguments` (`--flag value` or `--flag=value`). `readFile`
    /// reads the `_FILE` settings (nil: unreadable).
    public static func parse(environment: [String: String], arguments: [String], cores: Int,
                             readFile: (String) -> String? = { Files.read($0) }) throws(ConfigError) -> ServerConfig {
        var values: [String: String] = [:]
        var onCommandLine: [String] = []
        for s in settings { if let v = environment[s.env] { values[s.env] = v } }
        var i = 0
        while i < arguments.count {
            let arg = arguments[i]
            let (name, inline) = arg.split(separator: "=", maxSplits: 1).count == 2 && arg.hasPrefix("--")
                ? (String(arg.split(separator: "=", maxSplits: 1)[0]), String(arg.split(separator: "=", maxSplits: 1)[1]))
                : (arg, nil)
            guard let s = settings.first(where: { $0.flag == name }) else { throw ConfigError("unknown option \(arg) (see --help)") }
            if secretFiles.contains(where: { $0.0 == s.env }) { onCommandLine.append(s.flag) }
            if let inline { values[s.env] = inline; i += 1; continue }
            guard i + 1 < arguments.count else { throw ConfigError("\(name) needs a value") }
            values[s.env] = arguments[i + 1]
            i += 2
        }
        for (plain, file) in secretFiles {
            guard let path = values[file], !path.isEmpty else { continue }
            if let v = values[plain], !v.isEmpty { throw ConfigError("give \(plain) or \(file), not both") }
            guard let text = readFile(path) else { throw ConfigError("\(file): cannot read \(path)") }
            var secret = Substring(text)
            while let last = secret.last, last.isNewline || last == " " { secret.removeLast() }
            guard !secret.isEmpty, !secret.contains(where: \.isNewline) else { throw ConfigError("\(file): \(path) must hold the secret on one line") }
            values[plain] = String(secret)
        }
        var c = ServerConfig(workers: max(1, cores))
        c.secretsOnCommandLine = onCommandLine
        if let v = values["DISPATCH_LISTEN"] { c.listen = try parseListen(v) }
        if let v = values["DATABASE_URL"], !v.isEmpty { c.databaseURL = v }
        if let v = values["DISPATCH_DATA_DIR"] {
            guard !v.isEmpty else { throw ConfigError("DISPATCH_DATA_DIR must not be empty") }
            c.dataDir = v
        }
        if let v = values["DISPATCH_HEARTBEAT"] {
            guard let d = Double(v), d.isFinite, d >= 0.05, d <= 3600 else { throw ConfigError("DISPATCH_HEARTBEAT must be seconds from 0.05 to 3600, not \(v)") }
            c.heartbeatSeconds = d
        }
        if let v = values["DISPATCH_BOOTSTRAP_KEY"], !v.isEmpty {
            guard v.utf8.count >= 16, v.utf8.count <= 256, v.utf8.allSatisfy({ (0x21...0x7E).contains($0) }) else {
                throw ConfigError("DISPATCH_BOOTSTRAP_KEY must be 16-256 printable characters without spaces")
            }
            c.bootstrapKey = v
        }
        if let v = values["DISPATCH_LOG_LEVEL"] {
            guard ["debug", "info", "warning", "error"].contains(v.lowercased()) else { throw ConfigError("DISPATCH_LOG_LEVEL must be debug, info, warning or error") }
            c.logLevel = v.lowercased()
        }
        if let v = values["DISPATCH_LOG_FORMAT"] {
            guard let f = Logger.Format(rawValue: v.lowercased()) else { throw ConfigError("DISPATCH_LOG_FORMAT must be logfmt or json") }
            c.logFormat = f
        }
        if let v = values["DISPATCH_ACCESS_LOG"] {
            guard let a = AccessLogSetting.parse(v) else { throw ConfigError("DISPATCH_ACCESS_LOG must be all, off, or a number of lines a second, not \(v)") }
            c.accessLog = a
        }
        if let v = values["DISPATCH_WORKERS"] {
            guard let n = Int(v), (1...64).contains(n) else { throw ConfigError("DISPATCH_WORKERS must be from 1 to 64, not \(v)") }
            c.workers = n
        }
        if let v = values["DISPATCH_STREAM_BACKLOG"] {
            guard let n = Int(v), (4096...(64 << 20)).contains(n) else { throw ConfigError("DISPATCH_STREAM_BACKLOG must be bytes from 4096 to 67108864") }
            c.streamBacklogBytes = n
        }
        if let v = values["DISPATCH_RETENTION_DAYS"] {
            guard let d = Double(v), d.isFinite, d > 0, d <= 36500 else { throw ConfigError("DISPATCH_RETENTION_DAYS must be a positive number of days") }
            c.retentionDays = d
        }
        if let v = values["DISPATCH_PUBLISH_RATE"] {
            guard let d = Double(v), d.isFinite, d >= 0 else { throw ConfigError("DISPATCH_PUBLISH_RATE must be a number >= 0") }
            c.publishRatePerSecond = d
        }
        if let v = values["DISPATCH_REQUEST_DEADLINE"] {
            guard let d = Double(v), d.isFinite, d >= 1, d <= 3600 else { throw ConfigError("DISPATCH_REQUEST_DEADLINE must be seconds from 1 to 3600, not \(v)") }
            c.requestDeadlineSeconds = d
        }
        if let v = values["DISPATCH_MAX_PENDING_PER_CLIENT"] {
            guard let n = Int(v), n >= 1 else { throw ConfigError("DISPATCH_MAX_PENDING_PER_CLIENT must be a positive integer, not \(v)") }
            c.maxPendingPerClient = n
        }
        if let v = values["DISPATCH_SHUTDOWN_TIMEOUT"] {
            guard let d = Double(v), d.isFinite, d >= 0.5, d <= 600 else { throw ConfigError("DISPATCH_SHUTDOWN_TIMEOUT must be seconds from 0.5 to 600, not \(v)") }
            c.shutdownTimeoutSeconds = d
        }
        if let v = values["DISPATCH_COMMIT_WINDOW_MS"] {
            guard let n = Int(v), n >= 0, n <= 100 else { throw ConfigError("DISPATCH_COMMIT_WINDOW_MS must be milliseconds from 0 to 100, not \(v)") }
            c.commitWindowMs = n
        }
        if let v = values["DISPATCH_STALE_AFTER"] {
            guard let n = Int(v), n == 0 || (10...604_800).contains(n) else {
                throw ConfigError("DISPATCH_STALE_AFTER must be 0 (never) or seconds from 10 to 604800, not \(v)")
            }
            c.staleAfterSeconds = n
        }
        if let v = values["DISPATCH_WEBHOOK_SECRET"], !v.isEmpty {
            guard (16...512).contains(v.utf8.count), v.utf8.allSatisfy({ (0x21...0x7E).contains($0) }) else {
                throw ConfigError("DISPATCH_WEBHOOK_SECRET must be 16-512 printable characters without spaces")
            }
            c.webhookSecret = v
        }
        if let v = values["DISPATCH_WEBHOOK_ALLOW_PRIVATE"] {
            switch v.lowercased() {
            case "1", "true", "yes": c.webhookAllowPrivate = true
            case "0", "false", "no", "": c.webhookAllowPrivate = false
            default: throw ConfigError("DISPATCH_WEBHOOK_ALLOW_PRIVATE must be 1 or 0, not \(v)")
            }
        }
        if let v = values["DISPATCH_REPLAY_MEMORY_MB"] {
            guard let n = Int(v), (1...65_536).contains(n) else { throw ConfigError("DISPATCH_REPLAY_MEMORY_MB must be megabytes from 1 to 65536, not \(v)") }
            c.replayMemoryBytes = n << 20
        }
        if let v = values["DISPATCH_MAX_STREAMS_PER_KEY"] {
            guard let n = Int(v), n >= 1 else { throw ConfigError("DISPATCH_MAX_STREAMS_PER_KEY must be a positive integer") }
            c.maxStreamsPerKey = n
        }
        if let v = values["DISPATCH_WEBHOOK_TIMEOUT"] {
            guard let d = Double(v), d.isFinite, d >= 1, d <= 60 else { throw ConfigError("DISPATCH_WEBHOOK_TIMEOUT must be seconds from 1 to 60, not \(v)") }
            c.webhookTimeoutSeconds = d
        }
        if let v = values["DISPATCH_DB_TIMEOUT"] {
            guard let d = Double(v), d.isFinite, d >= 0.5, d <= 300 else { throw ConfigError("DISPATCH_DB_TIMEOUT must be seconds from 0.5 to 300, not \(v)") }
            c.dbTimeoutSeconds = d
        }
        if let v = values["DISPATCH_CORS_ORIGINS"] {
            switch CORSPolicy.parse(v) {
            case .success(let p): c.cors = p
            case .failure(let e): throw ConfigError("DISPATCH_CORS_ORIGINS: \(e.message)")
            }
        }
        c.carrier = try CarrierSettings.parse(values)
        if let v = values["DISPATCH_TRUSTED_PROXIES"] {
            switch TrustedProxies.parse(v) {
            case .success(let p): c.trustedProxies = p
            case .failure(let e): throw ConfigError("DISPATCH_TRUSTED_PROXIES: \(e.message)")
            }
        }
        try APNsSettings.parsePush(values, into: &c)
        try MetricsSettings.parse(values, into: &c)
        c.limits = try KeyLimits.parse(values)
        return c
    }

    public static func parseListen(_ text: String) throws(ConfigError) -> [Address] {
        var out: [Address] = []
        for part in text.split(separator: ",") {
            let p = part.trimmingCharactersSpace
            guard let colon = p.lastIndex(of: ":") else { throw ConfigError("DISPATCH_LISTEN entry \(p) must be host:port") }
            var host = String(p[..<colon])
            if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
            guard !host.isEmpty, let port = Int(p[p.index(after: colon)...]), (0...65535).contains(port) else {
                throw ConfigError("DISPATCH_LISTEN entry \(p) must be host:port with a port from 0 to 65535")
            }
            out.append(Address(host: host, port: port))
        }
        guard !out.isEmpty else { throw ConfigError("DISPATCH_LISTEN is empty") }
        return out
    }

    public static func usage() -> String {
        var s = """
        dispatchd: the Dispatch job-status streaming server

        Usage:
        \(DispatchdCommand.usageLines)
        Every option is also an environment variable:

        """
        for st in settings {
            s += "  \(st.flag.padding(22)) \(st.env.padding(30)) \(st.help)\n"
        }
        s += "\nScopes: publish, read, device, admin. Exit codes: 0 ok, 1 runtime failure, 2 bad configuration.\n"
        return s
    }
}

public struct ConfigError: Error, Equatable, Sendable {
    public let message: String
    public init(_ message: String) { self.message = message }
}

extension StringProtocol {
    var trimmingCharactersSpace: String {
        String(drop { $0 == " " }.reversed().drop { $0 == " " }.reversed())
    }

    func padding(_ width: Int) -> String {
        count >= width ? String(self) : String(self) + String(repeating: " ", count: width - count)
    }
}
