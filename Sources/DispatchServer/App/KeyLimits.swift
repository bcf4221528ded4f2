import DispatchCore

/// Limits per key (contract §6), so that one key cannot crowd out the others. Admin keys
/// (the operator's) are not limited. See docs/security.md.
public struct KeyLimits: Equatable, Sendable {
    /// Live activities one key may hold; a start past it is `429 too_many_live_activities`.
    public var maxLivePerKey = KeyRules.defaultMaxLive
    /// Devices one key may register; a new one past it is `429 too_many_devices`.
    public var maxDevicesPerKey = KeyRules.defaultMaxDevices
    /// Device registrations and deletions per second per key and worker (bursts of twice that).
    public var deviceRatePerSecond: Double = 10
    /// A device registration nobody refreshed for this long is forgotten.
    public var deviceRetentionDays: Double = 90

    public init() {}

    public static let settings: [ServerConfig.Setting] = [
        .init(env: "DISPATCH_MAX_LIVE_PER_KEY", flag: "--max-live-per-key", help: "live activities one key may hold (default 10000)"),
        .init(env: "DISPATCH_MAX_DEVICES_PER_KEY", flag: "--max-devices-per-key", help: "devices one key may register (default 1000)"),
        .init(env: "DISPATCH_DEVICE_RATE", flag: "--device-rate", help: "device registrations per second per key and worker, 0 for no limit (default 10)"),
        .init(env: "DISPATCH_DEVICE_RETENTION_DAYS", flag: "--device-retention-days", help: "days a device registration nobody refreshed is kept (default 90)"),
    ]

    static func parse(_ values: [String: String]) throws(ConfigError) -> KeyLimits {
        var l = KeyLimits()
        if let v = values["DISPATCH_MAX_LIVE_PER_KEY"] {
            guard let n = Int(v), (1...100_000_000).contains(n) else { throw ConfigError("DISPATCH_MAX_LIVE_PER_KEY must be a positive integer, not \(v)") }
            l.maxLivePerKey = n
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
        return l
    }
}
