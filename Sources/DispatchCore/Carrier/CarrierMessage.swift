/// What travels between server processes over the NATS carrier (contract §10), as bytes.
///
/// Nothing here is the truth, and nothing here is believed: every message is a *hint* that
/// says where to look in PostgreSQL, never what to show. A receiver reads what the hint points
/// at from the database and sends only what it read, so a message copied off the wire and
/// altered (a raised seq, a final state, a position near 2^63) costs at most one read and
/// changes nothing any client sees. No snapshot travels, so a subscriber to `>` learns no
/// activity's content either. A lost hint is repaired by the periodic check against the
/// database.
public enum CarrierMessage {
    /// "Activity X changed; its newest committed seq is at least `seq`", on the activity's
    /// subject. `event` is the change's event name, used only as a wake-up (a cancel request
    /// wakes the webhook sender, which reads its outbox from the database).
    public struct ActivityHint: Equatable, Sendable {
        public var seq: Int64
        public var event: String

        public init(seq: Int64, event: String) {
            self.seq = seq
            self.event = event
        }
    }

    /// Most seqs and positions a hint may name: more would not fit PostgreSQL's bigint anyway.
    static let maxDigits = 19

    // MARK: - An activity's hint: `seq \t event`

    public static func encode(_ h: ActivityHint) -> [UInt8] {
        Array("\(h.seq)\t\(h.event)".utf8)
    }

    public static func decodeActivityHint(_ bytes: [UInt8]) -> ActivityHint? {
        let parts = bytes.split(separator: tab, maxSplits: 1, omittingEmptySubsequences: false)
        guard parts.count == 2, let seq = int64(parts[0]), seq > 0, (1...64).contains(parts[1].count),
              parts[1].allSatisfy({ ($0 >= 0x61 && $0 <= 0x7A) || $0 == 0x5F }) else { return nil }
        return ActivityHint(seq: seq, event: String(decoding: parts[1], as: UTF8.self))
    }

    // MARK: - The feed's hint: `F \t through`: positions up to `through` were numbered

    public static func feedHint(through: Int64) -> [UInt8] {
        Array("F\t\(through)".utf8)
    }

    public static func decodeFeedHint(_ bytes: [UInt8]) -> Int64? {
        let parts = bytes.split(separator: tab, omittingEmptySubsequences: false)
        guard parts.count == 2, parts[0].elementsEqual("F".utf8), let p = int64(parts[1]), p > 0 else { return nil }
        return p
    }

    // MARK: - Internals

    static let tab = UInt8(ascii: "\t")

    static func int64(_ bytes: ArraySlice<UInt8>) -> Int64? {
        guard !bytes.isEmpty, bytes.count <= maxDigits else { return nil }
        var v: Int64 = 0
        for b in bytes {
            guard b >= 48 && b <= 57 else { return nil }
            let (m, o1) = v.multipliedReportingOverflow(by: 10)
            let (s, o2) = m.addingReportingOverflow(Int64(b - 48))
            guard !o1, !o2 else { return nil }
            v = s
        }
        return v
    }
}

/// The carrier's subject names under one deployment's prefix (`DISPATCH_NATS_SUBJECT_PREFIX`,
/// default `dispatch`). Activity ids may hold `.` (NATS's token separator) and other
/// characters subjects do not take, so an id becomes one token of lowercase hex. Every subject
/// is under the prefix: a deployment's NATS permissions can be granted as `<prefix>.>`.
public struct CarrierSubjects: Sendable {
    public let prefix: String

    public init(prefix: String = "dispatch") { self.prefix = prefix }

    /// Hints of one activity's changes, published by the worker that committed them.
    public func activity(_ id: String) -> String { prefix + ".activity." + Self.token(id) }
    /// Hints that positions were numbered, published by whichever server ran the pass.
    public var feed: String { prefix + ".feed" }
    /// "Something was committed": wakes the numbering passes (they also poll, so a lost one
    /// costs latency only).
    public var sequencer: String { prefix + ".sequencer" }
    /// Every start's activity id: a worker forgets what it cached of an older activity of the
    /// same id (an id used again after its old activity was pruned).
    public var starts: String { prefix + ".starts" }
    /// One worker's liveness probe: it publishes here and must hear it back.
    public func probe(_ worker: String) -> String { prefix + ".probe." + worker }

    static let hex = Array("0123456789abcdef".utf8)

    public static func token(_ id: String) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(id.utf8.count * 2)
        for b in id.utf8 {
            out.append(hex[Int(b >> 4)])
            out.append(hex[Int(b & 0x0f)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    public static func id(fromToken token: Substring) -> String? {
        let bytes = Array(token.utf8)
        guard !bytes.isEmpty, bytes.count % 2 == 0 else { return nil }
        func nibble(_ c: UInt8) -> UInt8? {
            switch c {
            case 48...57: return c - 48
            case 97...102: return c - 87
            default: return nil
            }
        }
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count / 2)
        var i = 0
        while i < bytes.count {
            guard let h = nibble(bytes[i]), let l = nibble(bytes[i + 1]) else { return nil }
            out.append(h << 4 | l)
            i += 2
        }
        return String(validating: out, as: UTF8.self)
    }

    /// The activity id of a subject from `activity(_:)`, or nil.
    public func activityID(inSubject subject: String) -> String? {
        let head = prefix + ".activity."
        guard subject.hasPrefix(head) else { return nil }
        return Self.id(fromToken: subject.dropFirst(head.count))
    }
}
