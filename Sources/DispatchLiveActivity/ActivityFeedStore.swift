// The iOS app's Activities tab, kept by the feed (contract §8): a pure store that takes the
// feed's events (a snapshot, `synced`, `reset`) and keeps the ordered list the tab shows and
// the position to resume from. No I/O and no Foundation: the transport is the app's
// (`URLSession.bytes(for:)` into `FeedStreamParser`, the snapshot decoded with `JSONDecoder`), so the
// same code builds for iOS and is tested here. docs/clients.md shows the whole loop.

/// One activity as the feed sends it (the contract's snapshot; fields the tab does not need
/// are left out, and unknown ones ignored by `Decodable`). Times stay the server's ISO 8601
/// text (`2026-11-29T22:53:26.123Z`): fixed width in UTC, so they sort as text.
public struct FeedActivity: Codable, Hashable, Sendable {
    public var activityId: String
    public var taskName: String
    public var systemImage: String?
    public var machine: String?
    /// Kept as text so a state added later still decodes.
    public var state: String
    public var progress: Double?
    public var status: String?
    public var attempt: Int
    public var seq: Int
    public var cancelRequested: Bool?
    public var createdAt: String
    public var updatedAt: String
    public var endedAt: String?
    public var error: String?

    public init(activityId: String, taskName: String, systemImage: String? = nil, machine: String? = nil, state: String,
                progress: Double? = nil, status: String? = nil, attempt: Int = 1, seq: Int, cancelRequested: Bool? = nil,
                createdAt: String, updatedAt: String, endedAt: String? = nil, error: String? = nil) {
        self.activityId = activityId
        self.taskName = taskName
        self.systemImage = systemImage
        self.machine = machine
        self.state = state
        self.progress = progress
        self.status = status
        self.attempt = attempt
        self.seq = seq
        self.cancelRequested = cancelRequested
        self.createdAt = createdAt
        self.updatedAt = updatedAt
        self.endedAt = endedAt
        self.error = error
    }

    /// `completed`, `error`, `cancelled`, `rejected`: it never changes again.
    public var isFinished: Bool { ["completed", "error", "cancelled", "rejected"].contains(state) }
}

/// What the feed said, decoded by the app from one SSE message.
public enum FeedEvent: Hashable, Sendable {
    /// A change (or, before `synced`, a current snapshot); `position` is the message's `id:`.
    case snapshot(FeedActivity, position: String?)
    /// What follows is live; resume after `position`.
    case synced(position: String)
    /// The server starts over (the position was too old or never issued).
    case reset
}

/// What one event changed, for the view to redraw.
public enum FeedChange: Hashable, Sendable {
    /// Nothing (an older or repeated snapshot).
    case none
    /// This activity is new or changed (and may have moved in the list).
    case updated(String)
    /// The list is live (after a reset: the activities the server no longer sent are gone).
    case synced(removed: [String])
    /// Starting over: the list stays as it is until `synced`.
    case reset
}

/// The Activities tab's list, kept by the feed. Feed it every event in order with `apply`,
/// read `activities` (active ones newest first, then finished ones, last finished first), and
/// reconnect with `Last-Event-ID: position`.
public struct ActivityFeedStore: Sendable {
    /// Where to resume: the `id:` of the last event applied (nil before the first one).
    public private(set) var position: String?
    /// True once the stream said `synced` since it (re)started: the list is live.
    public private(set) var isSynced = false
    /// The list the tab shows, in order.
    public private(set) var activities: [FeedActivity] = []
    private var byID: [String: FeedActivity] = [:]
    /// Activities read outside the feed (older than its 24 hours): kept across a reset.
    private var pinned: Set<String> = []
    /// After a reset: ids not sent again yet, removed at `synced`.
    private var unseen: Set<String>?

    public init(position: String? = nil) {
        self.position = position
    }

    public subscript(id: String) -> FeedActivity? { byID[id] }
    public var count: Int { byID.count }

    /// Adds an activity read elsewhere (`GET /v1/activities?state=finished` for older ones).
    /// A newer snapshot from the feed replaces it; a reset does not remove it.
    @discardableResult
    public mutating func insert(_ activity: FeedActivity) -> FeedChange {
        guard upsert(activity) else { return .none }
        pinned.insert(activity.activityId)
        return .updated(activity.activityId)
    }

    /// Applies one feed event, in the order the stream sent it.
    @discardableResult
    public mutating func apply(_ event: FeedEvent) -> FeedChange {
        switch event {
        case .snapshot(let activity, let position):
            if let position { self.position = position }
            unseen?.remove(activity.activityId)
            return upsert(activity) ? .updated(activity.activityId) : .none
        case .synced(let position):
            self.position = position
            isSynced = true
            guard let gone = unseen else { return .synced(removed: []) }
            unseen = nil
            let removed = gone.sorted()
            for id in removed { remove(id) }
            return .synced(removed: removed)
        case .reset:
            isSynced = false
            unseen = Set(byID.keys).subtracting(pinned)
            return .reset
        }
    }

    /// Newer seq wins; the same seq again changes nothing.
    private mutating func upsert(_ a: FeedActivity) -> Bool {
        if let old = byID[a.activityId], old.seq >= a.seq { return false }
        if byID[a.activityId] != nil { removeFromList(a.activityId) }
        byID[a.activityId] = a
        let at = insertionIndex(a)
        activities.insert(a, at: at)
        return true
    }

    private mutating func remove(_ id: String) {
        guard byID.removeValue(forKey: id) != nil else { return }
        removeFromList(id)
    }

    private mutating func removeFromList(_ id: String) {
        if let i = activities.firstIndex(where: { $0.activityId == id }) { activities.remove(at: i) }
    }

    private func insertionIndex(_ a: FeedActivity) -> Int {
        var lo = 0, hi = activities.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if Self.precedes(activities[mid], a) { lo = mid + 1 } else { hi = mid }
        }
        return lo
    }

    /// The tab's order: active before finished; active newest started first; finished last
    /// ended first; ties by id, so the order never depends on arrival.
    public static func precedes(_ x: FeedActivity, _ y: FeedActivity) -> Bool {
        if x.isFinished != y.isFinished { return !x.isFinished }
        let kx = x.isFinished ? (x.endedAt ?? x.updatedAt) : x.createdAt
        let ky = y.isFinished ? (y.endedAt ?? y.updatedAt) : y.createdAt
        if kx != ky { return kx > ky }
        return x.activityId < y.activityId
    }
}

/// One Server-Sent Events message (WHATWG HTML §9.2).
public struct FeedMessage: Hashable, Sendable {
    /// The `id:` field of this message, if it had one.
    public var id: String?
    /// The `event:` field, `message` when absent.
    public var event: String
    /// The `data:` lines joined by newlines.
    public var data: String
}

/// A byte-at-a-time SSE parser for `URLSession.bytes(for:)`, which yields bytes (its `lines`
/// view drops the empty lines that end SSE messages, so it cannot be used for SSE). Lines end
/// in LF, CR or CRLF; comments (heartbeats) are skipped; `retry:` is kept in `retryMilliseconds`.
public struct FeedStreamParser: Sendable {
    private var line: [UInt8] = []
    private var afterCR = false
    private var id: String?
    private var event: String?
    private var data: [String] = []
    private var hasData = false
    /// The server's reconnection delay, once it sent one.
    public private(set) var retryMilliseconds: Int?

    public init() {}

    /// Takes one byte; returns a message when this byte ended one.
    public mutating func push(_ byte: UInt8) -> FeedMessage? {
        if afterCR {
            afterCR = false
            if byte == 0x0A { return nil }  // CRLF: the line already ended at CR
        }
        switch byte {
        case 0x0A: return endLine()
        case 0x0D:
            afterCR = true
            return endLine()
        default:
            line.append(byte)
            return nil
        }
    }

    /// Takes many bytes; returns the messages they ended.
    public mutating func push<S: Sequence>(contentsOf bytes: S) -> [FeedMessage] where S.Element == UInt8 {
        var out: [FeedMessage] = []
        for b in bytes { if let m = push(b) { out.append(m) } }
        return out
    }

    private mutating func endLine() -> FeedMessage? {
        defer { line.removeAll(keepingCapacity: true) }
        if line.isEmpty {
            defer { id = nil; event = nil; data = []; hasData = false }
            guard hasData else { return nil }
            return FeedMessage(id: id, event: event ?? "message", data: data.joined(separator: "\n"))
        }
        if line.first == UInt8(ascii: ":") { return nil }
        let text = String(decoding: line, as: UTF8.self)
        let field: Substring, value: Substring
        if let colon = text.firstIndex(of: ":") {
            field = text[..<colon]
            var v = text[text.index(after: colon)...]
            if v.first == " " { v = v.dropFirst() }
            value = v
        } else {
            field = Substring(text)
            value = ""
        }
        switch field {
        case "id": if !value.contains("\0") { id = String(value) }
        case "event": event = String(value)
        case "data":
            data.append(String(value))
            hasData = true
        case "retry": if let ms = Int(value), ms >= 0 { retryMilliseconds = ms }
        default: break
        }
        return nil
    }
}
