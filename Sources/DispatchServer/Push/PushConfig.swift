import DispatchCore
import DispatchCrypto
import DispatchSystem

/// How the server reaches APNs (contract §5.2). All of key file, key id, team id and topic, or
/// none of them (then nothing is pushed and nothing is queued).
public struct APNsSettings: Equatable, Sendable {
    /// Apple's `AuthKey_XXXXXXXXXX.p8` (an EC P-256 key, PKCS#8 PEM).
    public var keyFile: String
    public var keyID: String
    public var teamID: String
    /// The app's bundle id; requests carry `<topic>.push-type.liveactivity`.
    public var topic: String
    public var url = "https://api.push.apple.com"
    public var sandboxURL = "https://api.sandbox.push.apple.com"
    /// Broadcast channel management (contract §5.5), per environment.
    public var manageURL = "https://api-manage-broadcast.push.apple.com:2196"
    public var manageSandboxURL = "https://api-manage-broadcast.sandbox.push.apple.com:2195"
    /// The environment broadcast channels live in.
    public var broadcastEnvironment: APNsEnvironment = .production
    /// Seconds between two pushes of one activity to one phone when the second only moves
    /// progress or status (state changes and ends go at once): the phone shows only the
    /// newest, and APNs throttles floods. 0: no pace beyond whole-second timestamps.
    public var pace: Double = 1
    /// Extra trusted CAs (a local stand-in for APNs in tests).
    public var caFile: String?
    /// Push-to-start pushes per device in any hour (contract §5.2): APNs keeps an undocumented,
    /// small budget per device and answers 200 to starts past it that the phone never shows.
    public var pushToStartLimit = 8
    /// Seconds of quiet after which, and between which, an idle APNs connection gets an HTTP/2
    /// PING; one that does not answer is closed, and the next push opens a new one
    /// (`H2Client.Options.apns`).
    public var idleSeconds = 15

    public var apnsTopic: String { topic + ".push-type.liveactivity" }

    /// The push host of `environment`.
    public func pushURL(_ environment: APNsEnvironment) -> String {
        switch environment {
        case .production: return url
        case .sandbox: return sandboxURL
        }
    }

    /// The channel management host of `environment`.
    public func manageHost(_ environment: APNsEnvironment) -> String {
        switch environment {
        case .production: return manageURL
        case .sandbox: return manageSandboxURL
        }
    }

    static let required = ["DISPATCH_APNS_KEY_FILE", "DISPATCH_APNS_KEY_ID", "DISPATCH_APNS_TEAM_ID", "DISPATCH_APNS_TOPIC"]
    static let optional = ["DISPATCH_APNS_URL", "DISPATCH_APNS_SANDBOX_URL", "DISPATCH_APNS_MANAGE_URL", "DISPATCH_APNS_MANAGE_SANDBOX_URL",
                           "DISPATCH_APNS_BROADCAST_ENV", "DISPATCH_APNS_CA_FILE"]

    static let settings: [ServerConfig.Setting] = [
        .init(env: "DISPATCH_APNS_KEY_FILE", flag: "--apns-key-file", help: "APNs auth key (.p8 from the Apple Developer account); with the three below turns Live Activity pushes on"),
        .init(env: "DISPATCH_APNS_KEY_ID", flag: "--apns-key-id", help: "the .p8 key's id (10 characters, the JWT's kid)"),
        .init(env: "DISPATCH_APNS_TEAM_ID", flag: "--apns-team-id", help: "the Apple developer team id (the JWT's iss)"),
        .init(env: "DISPATCH_APNS_TOPIC", flag: "--apns-topic", help: "the iOS app's bundle id (.push-type.liveactivity is appended)"),
        .init(env: "DISPATCH_APNS_URL", flag: "--apns-url", help: "APNs production push host (default https://api.push.apple.com)"),
        .init(env: "DISPATCH_APNS_SANDBOX_URL", flag: "--apns-sandbox-url", help: "APNs sandbox push host, for devices registered with environment sandbox (default https://api.sandbox.push.apple.com)"),
        .init(env: "DISPATCH_APNS_MANAGE_URL", flag: "--apns-manage-url", help: "APNs broadcast channel management host (default https://api-manage-broadcast.push.apple.com:2196)"),
        .init(env: "DISPATCH_APNS_MANAGE_SANDBOX_URL", flag: "--apns-manage-sandbox-url", help: "the sandbox's channel management host (default https://api-manage-broadcast.sandbox.push.apple.com:2195)"),
        .init(env: "DISPATCH_APNS_BROADCAST_ENV", flag: "--apns-broadcast-env", help: "the APNs environment of broadcast channels: production (default) or sandbox"),
        .init(env: "DISPATCH_APNS_CA_FILE", flag: "--apns-ca-file", help: "extra trusted CA certificates (PEM) for the APNs connection (tests)"),
        .init(env: "DISPATCH_TOKEN_KEY", flag: "--token-key", help: "32 bytes (64 hex digits or base64) sealing device tokens at rest; embedded default: generated under the data dir"),
        .init(env: "DISPATCH_PUSH_DISMISSAL", flag: "--push-dismissal", help: "seconds an ended Live Activity stays on the Lock Screen, 0-14400 (default 14400)"),
        .init(env: "DISPATCH_PUSH_PACE", flag: "--push-pace", help: "seconds between progress-only pushes of one activity to a phone, 0-60 (default 1; state changes and ends go at once)"),
        .init(env: "DISPATCH_PUSH_TO_START_LIMIT", flag: "--push-to-start-limit", help: "push-to-start pushes per device in any hour, 0-1000 (default 8); starts past it are not sent to that device"),
        .init(env: "DISPATCH_APNS_IDLE", flag: "--apns-idle", help: "seconds of quiet after which an idle APNs connection gets an HTTP/2 PING (and again every as many seconds); one that does not answer is closed, 1-3600 (default 15)"),
        .init(env: "DISPATCH_PUSH_LEASE", flag: "--push-lease", help: "seconds a claimed push stays reserved for its sender before another may send it, 4-600 (default 60)"),
    ]

    /// The settings from `values` (environment names → values), nil when none is given.
    static func parse(_ values: [String: String]) throws(ConfigError) -> APNsSettings? {
        let given = (required + optional).filter { !(values[$0] ?? "").isEmpty }
        guard !given.isEmpty else { return nil }
        let missing = required.filter { (values[$0] ?? "").isEmpty }
        guard missing.isEmpty else {
            throw ConfigError("APNs is partly configured: \(given.joined(separator: ", ")) set but \(missing.joined(separator: ", ")) missing; set all four of \(required.joined(separator: ", ")) or none")
        }
        let keyID = values["DISPATCH_APNS_KEY_ID"]!, teamID = values["DISPATCH_APNS_TEAM_ID"]!
        for (name, v) in [("DISPATCH_APNS_KEY_ID", keyID), ("DISPATCH_APNS_TEAM_ID", teamID)] {
            guard (1...64).contains(v.utf8.count), v.utf8.allSatisfy(isAlphanumeric) else {
                throw ConfigError("\(name) must be letters and digits (as Apple shows it, e.g. ABC123DEFG), not \(v)")
            }
        }
        let topic = values["DISPATCH_APNS_TOPIC"]!
        guard topic.utf8.count <= 200, topic.utf8.allSatisfy({ isAlphanumeric($0) || $0 == 0x2E || $0 == 0x2D }) else {
            throw ConfigError("DISPATCH_APNS_TOPIC must be the app's bundle id (letters, digits, . and -), not \(topic)")
        }
        guard !topic.hasSuffix(".push-type.liveactivity") else {
            throw ConfigError("DISPATCH_APNS_TOPIC is the bare bundle id; the server appends .push-type.liveactivity itself")
        }
        var s = APNsSettings(keyFile: values["DISPATCH_APNS_KEY_FILE"]!, keyID: keyID, teamID: teamID, topic: topic)
        for (name, path) in [("DISPATCH_APNS_URL", \APNsSettings.url), ("DISPATCH_APNS_SANDBOX_URL", \APNsSettings.sandboxURL),
                             ("DISPATCH_APNS_MANAGE_URL", \APNsSettings.manageURL),
                             ("DISPATCH_APNS_MANAGE_SANDBOX_URL", \APNsSettings.manageSandboxURL)] {
            guard let url = values[name], !url.isEmpty else { continue }
            var u = url
            while u.hasSuffix("/") { u.removeLast() }
            guard u.lowercased().hasPrefix("https://"), u.utf8.count > 8, u.utf8.allSatisfy({ (0x21...0x7E).contains($0) }),
                  !u.dropFirst(8).contains("/") else {
                throw ConfigError("\(name) must be https://host[:port] (APNs speaks HTTP/2 over TLS only), not \(url)")
            }
            s[keyPath: path] = u
        }
        if let v = values["DISPATCH_APNS_BROADCAST_ENV"], !v.isEmpty {
            guard let env = APNsEnvironment(rawValue: v) else {
                throw ConfigError("DISPATCH_APNS_BROADCAST_ENV must be production or sandbox, not \(v)")
            }
            s.broadcastEnvironment = env
        }
        if let ca = values["DISPATCH_APNS_CA_FILE"], !ca.isEmpty { s.caFile = ca }
        return s
    }

    private static func isAlphanumeric(_ b: UInt8) -> Bool {
        (0x30...0x39).contains(b) || (0x41...0x5A).contains(b) || (0x61...0x7A).contains(b)
    }

    /// The signer for the provider token, or why the key file cannot be used (checked at start,
    /// so a bad key is a configuration error, not a push-time surprise).
    public func loadSigner() throws(ConfigError) -> ES256Signer {
        guard let pem = Files.read(keyFile) else { throw ConfigError("DISPATCH_APNS_KEY_FILE \(keyFile) cannot be read") }
        do {
            return try ES256Signer(pem: pem)
        } catch {
            throw ConfigError("DISPATCH_APNS_KEY_FILE \(keyFile) is not an APNs auth key (an unencrypted EC P-256 .p8): \(error.message)")
        }
    }
}

/// The key that seals device tokens at rest: 32 bytes, as 64 hex digits or base64.
public enum TokenKey {
    public static func parse(_ text: String) throws(ConfigError) -> [UInt8] {
        let t = text.trimmingNewlines
        if t.utf8.count == 64, let bytes = Hex.decode(t) { return bytes }
        if let bytes = Base64.decode(t) ?? Base64.urlDecode(t), bytes.count == AESGCM.keyCount { return bytes }
        throw ConfigError("DISPATCH_TOKEN_KEY must be 32 bytes written as 64 hex digits or base64 (make one with: openssl rand -hex 32)")
    }

    /// A new key, as stored in the embedded default's `token-key` file.
    public static func generate() -> String { Hex.encode(SecureRandom.bytes(AESGCM.keyCount)) }
}

extension APNsSettings {
    /// The push settings of `values` into `c` (ServerConfig.parse's share of the work).
    static func parsePush(_ values: [String: String], into c: inout ServerConfig) throws(ConfigError) {
        c.apns = try parse(values)
        if let v = values["DISPATCH_TOKEN_KEY"], !v.isEmpty { c.tokenKey = try TokenKey.parse(v) }
        if let v = values["DISPATCH_PUSH_DISMISSAL"] {
            guard let n = Int(v), (0...14_400).contains(n) else {
                throw ConfigError("DISPATCH_PUSH_DISMISSAL must be seconds from 0 to 14400 (iOS removes an ended Live Activity after 4 hours anyway), not \(v)")
            }
            c.pushDismissalSeconds = n
        }
        if let v = values["DISPATCH_PUSH_PACE"], !v.isEmpty {
            guard let n = Double(v), n.isFinite, (0...60).contains(n) else {
                throw ConfigError("DISPATCH_PUSH_PACE must be seconds from 0 to 60, not \(v)")
            }
            c.apns?.pace = n
        }
        if let v = values["DISPATCH_PUSH_TO_START_LIMIT"], !v.isEmpty {
            guard let n = Int(v), (0...1000).contains(n) else {
                throw ConfigError("DISPATCH_PUSH_TO_START_LIMIT must be a number of starts per device and hour from 0 to 1000, not \(v)")
            }
            c.apns?.pushToStartLimit = n
        }
        if let v = values["DISPATCH_APNS_IDLE"], !v.isEmpty {
            guard let n = Int(v), (1...3600).contains(n) else {
                throw ConfigError("DISPATCH_APNS_IDLE must be seconds from 1 to 3600, not \(v)")
            }
            c.apns?.idleSeconds = n
        }
        if let v = values["DISPATCH_PUSH_LEASE"] {
            guard let n = Int(v), (4...600).contains(n) else { throw ConfigError("DISPATCH_PUSH_LEASE must be seconds from 4 to 600, not \(v)") }
            c.pushLeaseSeconds = n
        }
    }
}
