/// What travels between server processes over the NATS carrier (contract §10), as bytes.
/// Nothing here is the truth: every message only says that PostgreSQL already holds a change,
/// and a receiver that misses one repairs from the database.
///
/// Lines are separated by `\n` and fields by `\t`. Neither can appear inside a field: ids and
/// event names have no control characters, and a snapshot is compact JSON, where both are
/// escaped.
public enum CarrierMessage {
    /// One committed change: on an activity's subject (no position: the sequencer has not
    /// numbered it yet) or inside a feed announcement (with its position).
    public struct Change: Equatable, Sendable {
        public var position: Int64
        public var activityID: String
        public var seq: Int64
        public var event: String
        public var json: String

        public init(position: Int64 = 0, activityID: String, seq: Int64, event: String, json: String) {
            self.position = position
            self.activityID = activityID
            self.seq = seq
            self.event = event
            self.json = json
        }
    }

    /// A run of feed positions the sequencer numbered, `after` being the last position of the
    /// announcement before it: a receiver whose last position is not `after` missed one.
    public struct Announcement: Equatable, Sendable {
        public var after: Int64
        public var changes: [Change]
        public var through: Int64 { changes.last?.position ?? after }

        public init(after: Int64, changes: [Change]) {
            self.after = after
            self.changes = changes
        }
    }

    // MARK: - A change on an activity's subject: `id \t seq \t event \t json`

    public static func encode(_ c: Change) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(c.activityID.utf8.count + c.event.utf8.count + c.json.utf8.count + 24)
        out += c.activityID.utf8; out.append(tab)
        out += String(c.seq).utf8; out.append(tab)
        out += c.event.utf8; out.append(tab)
        out += c.json.utf8
        return out
    }

    public static func decodeChange(_ bytes: [UInt8]) -> Change? {
        decodeFields(bytes[...], position: 0)
    }

    // MARK: - A feed announcement: `F \t after` then one `position \t id \t seq \t event \t json` line each

    /// The announcements for one numbering pass, each at most about `maxBytes`, chained: the
    /// first continues from `after`, each next one from the last position of the one before.
    public static func announcements(after: Int64, _ changes: [Change], maxBytes: Int = 256 * 1024) -> [[UInt8]] {
        var messages: [[UInt8]] = []
        var current: [UInt8] = []
        var previous = after
        func begin() {
            current = Array("F\t\(previous)\n".utf8)
        }
        begin()
        var count = 0
        for c in changes {
            let line = lineBytes(c)
            if count > 0 && current.count + line.count > maxBytes {
                messages.append(current)
                begin()
                count = 0
            }
            current += line
            previous = c.position
            count += 1
        }
        if count > 0 { messages.append(current) }
        return messages
    }

    public static func decodeAnnouncement(_ bytes: [UInt8]) -> Announcement? {
        var lines = bytes.split(separator: newline, omittingEmptySubsequences: true)[...]
        guard let header = lines.popFirst() else { return nil }
        let parts = header.split(separator: tab, omittingEmptySubsequences: false)
        guard parts.count == 2, parts[0].elementsEqual("F".utf8), let after = int64(parts[1]) else { return nil }
        var changes: [Change] = []
        changes.reserveCapacity(lines.count)
        var last = after
        for line in lines {
            guard let tabIndex = line.firstIndex(of: tab), let position = int64(line[line.startIndex..<tabIndex]),
                  position > last,
                  let c = decodeFields(line[line.index(after: tabIndex)...], position: position) else { return nil }
            changes.append(c)
            last = position
        }
        return Announcement(after: after, changes: changes)
    }

    // MARK: - Internals

    static let tab = UInt8(ascii: "\t")
    static let newline = UInt8(ascii: "\n")

    static func lineBytes(_ c: Change) -> [UInt8] {
        var out = Array(String(c.position).utf8)
        out.append(tab)
        out += encode(c)
        out.append(newline)
        return out
    }

    static func decodeFields(_ bytes: ArraySlice<UInt8>, position: Int64) -> Change? {
        let parts = bytes.split(separator: tab, maxSplits: 3, omittingEmptySubsequences: false)
        guard parts.count == 4, !parts[0].isEmpty, let seq = int64(parts[1]), seq > 0, !parts[2].isEmpty,
              !parts[3].contains(newline) else { return nil }
        return Change(position: position, activityID: String(decoding: parts[0], as: UTF8.self), seq: seq,
                      event: String(decoding: parts[2], as: UTF8.self), json: String(decoding: parts[3], as: UTF8.self))
    }

    static func int64(_ bytes: ArraySlice<UInt8>) -> Int64? {
        guard !bytes.isEmpty, bytes.count <= 19 else { return nil }
        var v: Int64 = 0
        for b in bytes {
            guard b >= 48 && b <= 57 else { return nil }
            v = v * 10 + Int64(b - 48)
        }
        return v
    }
}

/// The carrier's subject names under one deployment's prefix (`DISPATCH_NATS_SUBJECT_PREFIX`,
/// default `dispatch`). Activity ids may hold `.` (NATS's token separator) and other
/// characters subjects do not take, so an id becomes one token of lowercase hex.
public struct CarrierSubjects: Sendable {
    public let prefix: String

    public init(prefix: String = "dispatch") { self.prefix = prefix }

    /// Changes of one activity, published by the worker that committed them.
    public func activity(_ id: String) -> String { prefix + ".activity." + Self.token(id) }
    /// Feed announcements, published by the sequencer once it numbered committed changes.
    public var feed: String { prefix + ".feed" }
    /// "Something was committed": wakes the sequencer (it also polls, so a lost one costs latency only).
    public var sequencer: String { prefix + ".sequencer" }

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
