/// One budget of bytes for what every stream of a server process holds and its socket has not
/// taken yet (replay pages, live events queued behind a slow reader), shared fairly between
/// the API keys that opened the streams. Pure: the shell reports what each stream holds,
/// asks before reading a page, ticks with the time, and performs the answers.
///
/// - A page read is admitted when its bytes fit under the limit; otherwise the stream waits
///   (its reservation is granted later, keys taking turns) and, to make room for every waiting
///   read, streams that are *stalled* (holding bytes without the socket taking any for
///   `stallSeconds`) are disconnected: first from the key holding the most, the stream holding the most first,
///   so a key holding less never loses a stream while another with stalled streams holds more.
///   Within a key, streams whose sockets have taken bytes (readers) wait ahead of streams that
///   never took any, so stalled newcomers do not slow the readers down.
/// - Past the limit for any reason (live events queued to stalled readers), the same choice
///   disconnects stalled streams until the total is back under it.
/// - A disconnected stream resumes with Last-Event-ID and loses nothing; `close` forgets a
///   stream exactly once, whichever path ends it first.
public struct MemoryBudget<Key: Hashable, Stream: Hashable> {
    public struct Decision {
        /// Streams to disconnect (each once; the shell closes them and then calls `close`).
        public var disconnect: [Stream] = []
        /// Waiting streams whose page read is now granted (its bytes reserved).
        public var wake: [Stream] = []
        public var isEmpty: Bool { disconnect.isEmpty && wake.isEmpty }
    }

    struct Holding {
        let key: Key
        var bytes = 0
        var reserved = 0
        /// The last time the socket took something (or the stream held nothing).
        var lastProgress: Double
        /// Bytes of the page it waits to read; nil when not waiting.
        var waitingFor: Int?
        /// Already handed to the shell to disconnect.
        var condemned = false
        /// Its socket has taken bytes: a reader, whose next page waits ahead of new streams.
        var reads = false
        var held: Int { bytes + reserved }
    }

    public let limit: Int
    public let stallSeconds: Double
    public private(set) var total = 0
    /// Streams disconnected for the budget since the start.
    public private(set) var disconnections = 0
    private var streams: [Stream: Holding] = [:]
    private var perKey: [Key: Int] = [:]
    private var keyStreams: [Key: Set<Stream>] = [:]
    /// Waiting streams per key, first come first served within a key; keys take turns.
    private var waiting: [Key: [Stream]] = [:]
    private var turns: [Key] = []
    /// How many at the front of each key's line are readers.
    private var ahead: [Key: Int] = [:]
    /// What every waiting read needs: readers that want to read come before stalled ones.
    private var waitingBytes = 0
    /// What condemned streams hold until the shell closes them (in all, and per key): later
    /// decisions count it as freed, so they never condemn more than the total needs.
    private var condemnedHeld = 0
    private var condemnedPerKey: [Key: Int] = [:]
    /// The stalled streams found by the last scan, per key, smallest first, and the instant
    /// of that scan. No stream becomes stalled without time passing, so the decisions of one
    /// instant (a fan-out's writes, one after another) share one scan instead of one each.
    private var stalledAt: Double = -.infinity
    private var stalled: [Key: [Stream]] = [:]

    public init(limit: Int, stallSeconds: Double = 2) {
        precondition(limit > 0 && stallSeconds >= 0)
        self.limit = limit
        self.stallSeconds = stallSeconds
    }

    public var count: Int { streams.count }
    public var waitingCount: Int { waiting.values.reduce(0) { $0 + $1.count } }
    public func held(byKey key: Key) -> Int { perKey[key] ?? 0 }
    public func held(by s: Stream) -> Int? { streams[s]?.held }
    public func isOpen(_ s: Stream) -> Bool { streams[s] != nil }

    /// A new stream of `key`, holding nothing yet.
    public mutating func open(_ s: Stream, key: Key, now: Double) {
        precondition(streams[s] == nil, "stream opened twice")
        streams[s] = Holding(key: key, lastProgress: now)
        keyStreams[key, default: []].insert(s)
    }

    /// What the stream holds now (queued and in its socket's buffer). `release`: a page read
    /// it was granted is over (its rows, if any, are in `bytes`), so that many reserved bytes
    /// are no longer reserved.
    public mutating func hold(_ s: Stream, bytes: Int, now: Double, release: Int = 0) -> Decision {
        guard var h = streams[s] else { return Decision() }
        // Less than before is progress; starting to hold starts the clock.
        if bytes < h.bytes || h.bytes == 0 { h.lastProgress = now }
        if bytes < h.bytes { h.reads = true }
        change(s, &h, bytes: bytes, reserved: max(0, h.reserved - release))
        var d = Decision()
        // Only past the limit here (this runs on every write); waiting reads make room on a
        // new wait and on each tick.
        reclaim(now: now, need: 0, into: &d)
        grant(into: &d)
        return d
    }

    /// Whether the stream may read a page of `bytes` now (reserved until a `hold` says the
    /// page is done). If not, it waits and is named in a later decision's `wake`.
    public mutating func admit(_ s: Stream, bytes: Int, now: Double) -> (granted: Bool, decision: Decision) {
        guard var h = streams[s] else { return (false, Decision()) }
        var d = Decision()
        if h.waitingFor != nil { return (false, d) }
        if waitingCount == 0 && total + bytes <= limit {
            change(s, &h, bytes: h.bytes, reserved: h.reserved + bytes)
            return (true, d)
        }
        h.waitingFor = bytes
        waitingBytes += bytes
        streams[s] = h
        let first = waitingBytes == bytes
        if waiting[h.key] == nil { turns.append(h.key) }
        if h.reads {
            // Readers go ahead of streams that never took a byte (a stalled one never does).
            let at = ahead[h.key] ?? 0
            waiting[h.key, default: []].insert(s, at: at)
            ahead[h.key] = at + 1
        } else {
            waiting[h.key, default: []].append(s)
        }
        // The first to wait makes room at once; later ones on the next tick (a storm of
        // waits does not scan every stream once each).
        if first { reclaim(now: now, need: waitingBytes, into: &d) }
        grant(into: &d)
        guard let i = d.wake.firstIndex(of: s) else { return (false, d) }
        d.wake.remove(at: i)
        return (true, d)
    }

    /// Forgets a stream and frees what it held; true only the first time.
    public mutating func close(_ s: Stream) -> (closed: Bool, decision: Decision) {
        guard var h = streams[s] else { return (false, Decision()) }
        change(s, &h, bytes: 0, reserved: 0)
        streams[s] = nil
        keyStreams[h.key]?.remove(s)
        if keyStreams[h.key]?.isEmpty == true { keyStreams[h.key] = nil }
        if let w = h.waitingFor {
            waitingBytes -= w
            unqueue(s, key: h.key)
        }
        var d = Decision()
        grant(into: &d)
        return (true, d)
    }

    /// Time passes: streams that stopped taking bytes become stalled and may be disconnected.
    public mutating func tick(now: Double) -> Decision {
        var d = Decision()
        reclaim(now: now, need: waitingBytes, into: &d)
        grant(into: &d)
        return d
    }

    // MARK: - Internals

    private mutating func change(_ s: Stream, _ h: inout Holding, bytes: Int, reserved: Int) {
        let delta = bytes + reserved - h.held
        h.bytes = bytes
        h.reserved = reserved
        streams[s] = h
        total += delta
        perKey[h.key, default: 0] += delta
        if perKey[h.key] == 0 { perKey[h.key] = nil }
        if h.condemned {
            condemnedHeld += delta
            condemnedPerKey[h.key, default: 0] += delta
            if condemnedPerKey[h.key] == 0 { condemnedPerKey[h.key] = nil }
        }
    }



    /// Disconnects stalled streams until `need` more bytes fit under the limit, or none is left
    /// to take: always from the key holding the most (not counting what was already taken),
    /// the stream holding the most first.
    private mutating func reclaim(now: Double, need: Int, into d: inout Decision) {
        var over = total + need - limit - condemnedHeld
        guard over > 0 else { return }
        if stalledAt != now {
            stalledAt = now
            stalled = [:]
            for (key, members) in keyStreams {
                let found = members.filter { s in
                    guard let h = streams[s] else { return false }
                    return !h.condemned && h.bytes > 0 && now - h.lastProgress >= stallSeconds
                }
                if !found.isEmpty { stalled[key] = found.sorted { streams[$0]!.held < streams[$1]!.held } }
            }
        }
        func standing(_ k: Key) -> Int { (perKey[k] ?? 0) - (condemnedPerKey[k] ?? 0) }
        while over > 0 {
            guard let key = stalled.keys.max(by: { standing($0) < standing($1) }), let s = stalled[key]?.popLast() else { return }
            if stalled[key]?.isEmpty == true { stalled[key] = nil }
            // Closed, condemned or taking bytes again since the scan (this same instant).
            guard var h = streams[s], !h.condemned, h.bytes > 0, now - h.lastProgress >= stallSeconds else { continue }
            h.condemned = true
            streams[s] = h
            condemnedHeld += h.held
            condemnedPerKey[key, default: 0] += h.held
            disconnections += 1
            d.disconnect.append(s)
            over -= h.held
        }
    }

    /// Grants waiting reads while they fit, keys taking turns. What condemned streams hold is
    /// freed only when the shell closes them (then `close` grants), so the total never counts
    /// a page before its room exists.
    private mutating func grant(into d: inout Decision) {
        var room = limit - total
        while let key = turns.first, let s = waiting[key]?.first, var h = streams[s], let bytes = h.waitingFor {
            guard bytes <= room else { return }
            room -= bytes
            waitingBytes -= bytes
            h.waitingFor = nil
            change(s, &h, bytes: h.bytes, reserved: h.reserved + bytes)
            unqueue(s, key: key)
            // The key goes to the back of the line if it still waits.
            if waiting[key] != nil, let i = turns.firstIndex(of: key) {
                turns.remove(at: i)
                turns.append(key)
            }
            d.wake.append(s)
        }
    }

    private mutating func unqueue(_ s: Stream, key: Key) {
        if let i = waiting[key]?.firstIndex(of: s) {
            waiting[key]?.remove(at: i)
            if i < (ahead[key] ?? 0) { ahead[key]! -= 1 }
        }
        if waiting[key]?.isEmpty == true {
            waiting[key] = nil
            ahead[key] = nil
            turns.removeAll { $0 == key }
        }
    }
}
