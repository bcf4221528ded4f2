import DispatchCore

/// Limits per key (contract §6), so that one key cannot crowd out the others. Admin keys
/// (the operator's) are not limited. See docs/security.md.
public struct KeyLimits: Equatable, Sendable {
    /// Live activities one key may hold; a start past it is `429 too_many_live_activities`.
    public var maxLivePerKey = KeyRules.defaultMaxLive
    /// Activities one key may finish in any 24 hours (the feed's window); a start while the key
    /// has finished that many is `429 too_many_finished_activities` + `Retry-After`.
    public var maxFinishedPerKey = KeyRules.defaultMaxFinished
    /// Devices one key may register; a new one past it is `429 too_many_devices`.
    public var maxDevicesPerKey = KeyRules.defaultMaxDevices
    /// Device registrations and deletions per second per key and worker (bursts of twice that).
    public var deviceRatePerSecond: Double = 10
    /// A device registration nobody refreshed for this long is forgotten.
    public var deviceRetentionDays: Double = 90
    /// Live Activity tokens one device keeps (every key, admin too: it bounds what a phone's
    /// registration costs every publish); one more forgets the least recently changed one.
    public var maxActivityTokensPerDevice = KeyRules.defaultMaxActivityTokensPerDevice
    /// Browser sessions one key may hold (every key); a sign-in past it is `429 too_many_sessions`.
    public var maxSessionsPerKey = KeyRules.defaultMaxSessionsPerKey
    /// Sign-in attempts per minute per client address and per key, per worker; 0: no limit.
    public var signInsPerMinute = KeyRules.defaultSignInsPerMinute

    public init() {}

    public static let settings: [ServerConfig.Setting] = [
        .init(env: "DISPATCH_MAX_LIVE_PER_KEY", flag: "--max-live-per-key", help: "live activities one key may hold (default 10000)"),
        .init(env: "DISPATCH_MAX_FINISHED_PER_KEY", flag: "--max-finished-per-key",
              help: "activities one key may finish in any 24 hours; a start past it is refused (default 20000)"),
        .init(env: "DISPATCH_MAX_DEVICES_PER_KEY", flag: "--max-devices-per-key", help: "devices one key may register (default 1000)"),
        .init(env: "DISPATCH_DEVICE_RATE", flag: "--device-rate", help: "device registrations per second per key and worker, 0 for no limit (default 10)"),
        .init(env: "DISPATCH_DEVICE_RETENTION_DAYS", flag: "--device-retention-days", help: "days a device registration nobody refreshed is kept (default 90)"),
        .init(env: "DISPATCH_MAX_ACTIVITY_TOKENS_PER_DEVICE", flag: "--max-activity-tokens-per-device",
              help: "Live Activity tokens one device keeps; one more forgets the least recently changed activity's (default 64)"),
        .init(env: "DISPATCH_MAX_SESSIONS_PER_KEY", flag: "--max-sessions-per-key", help: "browser sessions one key may hold (default 100)"),
        .init(env: "DISPATCH_SIGNIN_RATE", flag: "--signin-rate",
              help: "sign-in attempts per minute per client address and per key, per worker, 0 for no limit (default 20)"),
    ]

    static func parse(_ values: [String: String]) throws(ConfigError) -> KeyLimits {
        var l = KeyLimits()
        if let v = values["DISPATCH_MAX_LIVE_PER_KEY"] {
            guard let n = Int(v), (1...100_000_000).contains(n) else { throw ConfigError("DISPATCH_MAX_LIVE_PER_KEY must be a positive integer, not \(v)") }
            l.maxLivePerKey = n
        }
        if let v = values["DISPATCH_MAX_FINISHED_PER_KEY"] {
            guard let n = Int(v), (1...100_000_000).contains(n) else { throw ConfigError("DISPATCH_MAX_FINISHED_PER_KEY must be a positive integer, not \(v)") }
            l.maxFinishedPerKey = n
        }
        if let v = values["DISPATCH_MAX_DEVICES_PER_KEY"] {
            guard let n = Int(v), (1...100_000_000).contains(n) else { throw ConfigError("DISPATCH_MAX_DEVICES_PER_KEY must be a positive integer, not \(v)") }
            l.maxDevicesPerKey = n
        }
        if let v = values["DISPATCH_DEVICE_RATE"] {
            guard let d = Double(v), d.isFinite, d >= 0 else { throw ConfigError("DISPATCH_DEVICE_RATE must be a number >= 0, not \(v)") }
            l.deviceRatePerSecond = d
        }
        if let v = values["DISPATCH_DEVICE_RETENTION_DAYS"] {
            guard let d = Double(v), d.isFinite, d > 0, d <= 36500 else { throw ConfigError("DISPATCH_DEVICE_RETENTION_DAYS must be a positive number of days, not \(v)") }
            l.deviceRetentionDays = d
        }
        if let v = values["DISPATCH_MAX_ACTIVITY_TOKENS_PER_DEVICE"] {
            guard let n = Int(v), (1...100_000).contains(n) else { throw ConfigError("DISPATCH_MAX_ACTIVITY_TOKENS_PER_DEVICE must be an integer 1-100000, not \(v)") }
            l.maxActivityTokensPerDevice = n
        }
        if let v = values["DISPATCH_MAX_SESSIONS_PER_KEY"] {
            guard let n = Int(v), (1...100_000_000).contains(n) else { throw ConfigError("DISPATCH_MAX_SESSIONS_PER_KEY must be a positive integer, not \(v)") }
            l.maxSessionsPerKey = n
        }
        if let v = values["DISPATCH_SIGNIN_RATE"] {
            guard let d = Double(v), d.isFinite, d >= 0 else { throw ConfigError("DISPATCH_SIGNIN_RATE must be a number >= 0 (attempts a minute), not \(v)") }
            l.signInsPerMinute = d
        }
        return l
    }
}
