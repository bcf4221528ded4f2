/// A log-linear latency histogram (64 sub-buckets per power of two, under 1.6% error),
/// cheap to record into from a hot loop and to merge across load-generator processes.
public struct BenchHistogram: Sendable, Equatable {
    static let subBuckets = 64
    static let bucketCount = 64 + 57 * 64
    public private(set) var counts: [Int]
    public private(set) var total = 0
    public private(set) var maxValue: Int64 = 0

    public init() { counts = Array(repeating: 0, count: Self.bucketCount) }

    static func index(_ v: Int64) -> Int {
        if v < 64 { return Int(max(v, 0)) }
        let e = 63 - v.leadingZeroBitCount  // >= 6
        let mantissa = Int((v >> (e - 6)) & 63)
        return 64 + (e - 6) * 64 + mantissa
    }

    /// The middle of bucket `i`, the value a percentile reports.
    static func value(_ i: Int) -> Int64 {
        if i < 64 { return Int64(i) }
        let e = (i - 64) / 64 + 6
        let mantissa = Int64((i - 64) % 64)
        let low = (64 + mantissa) << (e - 6)
        let width = Int64(1) << (e - 6)
        return low + width / 2
    }

    public mutating func record(_ v: Int64) {
        counts[Self.index(v)] += 1
        total += 1
        if v > maxValue { maxValue = v }
    }

    public mutating func merge(_ other: BenchHistogram) {
        for i in 0..<counts.count where other.counts[i] != 0 { counts[i] += other.counts[i] }
        total += other.total
        maxValue = max(maxValue, other.maxValue)
    }

    public mutating func add(bucket: Int, count: Int) {
        guard bucket >= 0, bucket < counts.count, count > 0 else { return }
        counts[bucket] += count
        total += count
        maxValue = max(maxValue, Self.value(bucket))
    }

    /// The value below which `p` (0...1) of the samples fall; nil when empty.
    public func percentile(_ p: Double) -> Int64? {
        guard total > 0 else { return nil }
        let rank = max(1, Int((p * Double(total)).rounded(.up)))
        var seen = 0
        for i in 0..<counts.count where counts[i] != 0 {
            seen += counts[i]
            if seen >= rank { return min(Self.value(i), maxValue) }
        }
        return maxValue
    }

    /// Non-empty buckets as `(index, count)`, the form sent between processes.
    public var sparse: [(Int, Int)] {
        var r: [(Int, Int)] = []
        for i in 0..<counts.count where counts[i] != 0 { r.append((i, counts[i])) }
        return r
    }

    public mutating func reset() {
        for i in 0..<counts.count { counts[i] = 0 }
        total = 0
        maxValue = 0
    }
}

/// Small statistics used to report repeated runs.
public enum BenchStats {
    /// The median of the values (the mean of the middle two for an even count); nil when empty.
    public static func median(_ values: [Double]) -> Double? {
        guard !values.isEmpty else { return nil }
        let s = values.sorted()
        let m = s.count / 2
        return s.count % 2 == 1 ? s[m] : (s[m - 1] + s[m]) / 2
    }

    /// The nearest-rank percentile (p in 0...1) of the values; nil when empty.
    public static func percentile(_ values: [Double], _ p: Double) -> Double? {
        guard !values.isEmpty else { return nil }
        let s = values.sorted()
        let rank = max(1, Int((p * Double(s.count)).rounded(.up)))
        return s[min(rank, s.count) - 1]
    }
}
