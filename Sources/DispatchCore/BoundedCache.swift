/// A cache bounded by the bytes its values take (as the caller measures them), evicting the
/// oldest insertions first. Counting entries is not enough: one entry may be a few hundred
/// bytes or many kilobytes.
public struct BoundedCache<Key: Hashable, Value> {
    public let maxBytes: Int
    private var entries: [Key: (value: Value, bytes: Int, stamp: UInt64)] = [:]
    /// Insertion order; entries replaced or removed since leave stale stamps, skipped on eviction.
    private var order: [(key: Key, stamp: UInt64)] = []
    private var head = 0
    private var nextStamp: UInt64 = 0
    public private(set) var bytes = 0

    public init(maxBytes: Int) { self.maxBytes = maxBytes }

    public var count: Int { entries.count }

    public subscript(_ key: Key) -> Value? { entries[key]?.value }

    public mutating func set(_ key: Key, _ value: Value, bytes size: Int) {
        remove(key)
        nextStamp += 1
        entries[key] = (value, size, nextStamp)
        order.append((key, nextStamp))
        bytes += size
        while bytes > maxBytes, head < order.count {
            let (oldest, stamp) = order[head]
            head += 1
            if let e = entries[oldest], e.stamp == stamp { entries[oldest] = nil; bytes -= e.bytes }
        }
        if head > 1024 && head * 2 > order.count {
            order.removeFirst(head)
            head = 0
        }
        // Under the budget nothing is evicted, so replaced entries' stamps would pile up (one
        // per set: a leak for a cache of a few keys set often); dropped once they outnumber
        // the live ones.
        if order.count - head > 2 * entries.count + 1024 {
            order = order[head...].filter { entries[$0.key]?.stamp == $0.stamp }
            head = 0
        }
    }

    /// Insertions remembered for eviction (live and stale): bounded by the live count.
    var orderLength: Int { order.count - head }

    public mutating func remove(_ key: Key) {
        guard let e = entries.removeValue(forKey: key) else { return }
        bytes -= e.bytes
    }

    public mutating func removeAll() {
        entries.removeAll()
        order.removeAll()
        head = 0
        bytes = 0
    }
}
