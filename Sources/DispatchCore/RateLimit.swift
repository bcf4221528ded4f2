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

/// One token bucket per client (its address, or any other name): `rate` per second, bursts
/// of `burst`. At most `maxClients` are remembered: past that, buckets that have refilled
/// (they say nothing a fresh one would not) are dropped first, then the oldest, so a flood
/// from many addresses costs bounded memory.
public struct PerClientRate: Sendable {
    public let rate: Double
    public let burst: Double
    public let maxClients: Int
    var buckets: [String: TokenBucket] = [:]

    public init(rate: Double, burst: Double, maxClients: Int = 10_000) {
        self.rate = rate
        self.burst = max(1, burst)
        self.maxClients = max(1, maxClients)
    }

    public var clients: Int { buckets.count }

    /// Takes one token of `client`'s; on refusal, the seconds until one is available.
    /// A rate of 0 never refuses.
    public mutating func take(_ client: String, now: Double) -> Double? {
        guard rate > 0 else { return nil }
        if buckets[client] == nil, buckets.count >= maxClients { prune(now: now) }
        var bucket = buckets[client] ?? TokenBucket(rate: rate, burst: burst, now: now)
        let wait = bucket.take(now: now)
        buckets[client] = bucket
        return wait
    }

    private mutating func prune(now: Double) {
        let full = buckets.filter { $0.value.tokens + max(0, now - $0.value.last) * rate >= burst }.map(\.key)
        for k in full { buckets.removeValue(forKey: k) }
        guard buckets.count >= maxClients else { return }
        // Every one is still limited: forget the least recently seen half.
        let oldest = buckets.sorted { $0.value.last < $1.value.last }.prefix(buckets.count / 2 + 1).map(\.key)
        for k in oldest { buckets.removeValue(forKey: k) }
    }
}
