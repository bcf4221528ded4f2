/// A token bucket: `rate` per second, bursts up to `burst`. Time is passed in.
public struct TokenBucket: Sendable {
    public let rate: Double
    public let burst: Double
    var tokens: Double
    var last: Double

    public init(rate: Double, burst: Double, now: Double) {
        self.rate = rate
        self.burst = burst
        tokens = burst
        last = now
    }

    /// Takes one token; on refusal, the seconds until one is available.
    public mutating func take(now: Double) -> Double? {
        tokens = min(burst, tokens + max(0, now - last) * rate)
        last = now
        if tokens >= 1 { tokens -= 1; return nil }
        return (1 - tokens) / rate
    }
}

/// One token bucket per key: `rate` per second, bursts of twice that (at least one).
public struct PerKeyRate: Sendable {
    public let rate: Double
    var buckets: [Int64: TokenBucket] = [:]

    public init(rate: Double) { self.rate = rate }

    /// Takes one token of `key`'s; on refusal, the seconds until one is available.
    public mutating func take(_ key: Int64, now: Double) -> Double? {
        var bucket = buckets[key] ?? TokenBucket(rate: rate, burst: max(1, rate * 2), now: now)
        let wait = bucket.take(now: now)
        buckets[key] = bucket
        return wait
    }
}

/// What a key may do. `admin` may do everything; `publish` may also read.
public enum Scope: String, Sendable, CaseIterable {
    case publish, read, device, admin

    public static func parseList(_ text: String) -> Set<Scope>? {
        var out: Set<Scope> = []
        for part in text.split(separator: ",") {
            guard let s = Scope(rawValue: String(part)) else { return nil }
            out.insert(s)
        }
        return out.isEmpty ? nil : out
    }
}
