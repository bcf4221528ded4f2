/// An activity's state. Live: queued, processing, retrying, idle (alive but waiting: paused,
/// throttled, waiting for a resource). Terminal: completed, error, cancelled, rejected (refused
/// before it ran). The names are also the event names of the changes that reach them.
public enum ActivityState: String, Sendable, CaseIterable {
    case queued, processing, retrying, idle, completed, error, cancelled, rejected

    public var isTerminal: Bool {
        switch self {
        case .queued, .processing, .retrying, .idle: return false
        case .completed, .error, .cancelled, .rejected: return true
        }
    }

    public static let live = allCases.filter { !$0.isTerminal }
    public static let terminal = allCases.filter(\.isTerminal)
}

/// The snapshot of one tracked job: what every stream and read shows.
public struct Activity: Equatable, Sendable {
    public var activityId: String
    public var taskName: String
    public var systemImage: String?
    public var machine: String?
    public var cancelURL: String?
    public var state: ActivityState
    public var progress: Double?
    public var status: String?
    public var attempt: Int64
    public var seq: Int64
    public var cancelRequested: Bool
    /// The reason given with the cancel request, if any (in the JSON once a cancel was requested).
    public var cancelReason: String?
    /// The start asked for a Live Activity on registered iPhones (push-to-start).
    public var liveActivity: Bool
    /// The start asked for an APNs broadcast channel (contract §5.5).
    public var broadcast: Bool
    /// That channel's id once it exists (base64, as APNs gave it).
    public var channelId: String?
    public var createdAt: Int64
    public var updatedAt: Int64
    public var endedAt: Int64?
    public var error: String?

    public init(activityId: String, taskName: String, systemImage: String? = nil, machine: String? = nil,
                cancelURL: String? = nil, state: ActivityState, progress: Double? = nil, status: String? = nil,
                attempt: Int64 = 1, seq: Int64 = 1, cancelRequested: Bool = false, liveActivity: Bool = false, createdAt: Int64,
                updatedAt: Int64, endedAt: Int64? = nil, error: String? = nil, cancelReason: String? = nil,
                broadcast: Bool = false, channelId: String? = nil) {
        self.activityId = activityId
        self.taskName = taskName
        self.systemImage = systemImage
        self.machine = machine
        self.cancelURL = cancelURL
        self.state = state
        self.progress = progress
        self.status = status
        self.attempt = attempt
        self.seq = seq
        self.cancelRequested = cancelRequested
        self.liveActivity = liveActivity
        self.broadcast = broadcast
        self.channelId = channelId
        self.createdAt = createdAt
        self.updatedAt = updatedAt
        self.endedAt = endedAt
        self.error = error
        self.cancelReason = cancelReason
    }

    /// The snapshot as one line of JSON, fields in the contract's order.
    public func json() -> [UInt8] {
        var w = JSONWriter(capacity: 384)
        w.beginObject()
        w.field("activityId", activityId)
        w.field("taskName", taskName)
        w.field("systemImage", systemImage)
        w.field("machine", machine)
        w.field("cancelURL", cancelURL)
        w.field("state", state.rawValue)
        w.field("progress", progress)
        w.field("status", status)
        w.field("attempt", attempt)
        w.field("seq", seq)
        w.field("cancelRequested", cancelRequested)
        // Only after a cancel request, so every other snapshot keeps the contract's exact shape:
        // the publisher (`dispatch run`) and people watching learn why from the stream itself.
        if cancelRequested { w.field("cancelReason", cancelReason) }
        w.field("liveActivity", liveActivity)
        w.field("broadcast", broadcast)
        w.field("channelId", channelId)
        w.field("createdAt", timestamp: createdAt)
        w.field("updatedAt", timestamp: updatedAt)
        w.field("endedAt", timestamp: endedAt)
        w.field("error", error)
        w.endObject()
        return w.bytes
    }

    /// Reads back what `json()` wrote (snapshots carried by NOTIFY and stored history).
    public static func decode(_ value: JSONValue) -> Activity? {
        func str(_ k: String) -> String?? {
            switch value[k] {
            case .some(.string(let s)): return .some(s)
            case .some(.null): return .some(nil)
            default: return nil
            }
        }
        func num(_ k: String) -> Double?? {
            switch value[k] {
            case .some(.number(let d)): return .some(d)
            case .some(.null): return .some(nil)
            default: return nil
            }
        }
        guard case .string(let id)? = value["activityId"], case .string(let name)? = value["taskName"],
              case .string(let stateText)? = value["state"], let state = ActivityState(rawValue: stateText),
              case .number(let attemptNumber)? = value["attempt"], let attempt = Int64(exactly: attemptNumber),
              case .number(let seqNumber)? = value["seq"], let seq = Int64(exactly: seqNumber),
              case .bool(let cancel)? = value["cancelRequested"], case .bool(let live)? = value["liveActivity"],
              case .string(let created)? = value["createdAt"], let createdAt = Timestamp.parse(created),
              case .string(let updated)? = value["updatedAt"], let updatedAt = Timestamp.parse(updated),
              let image = str("systemImage"), let machine = str("machine"), let url = str("cancelURL"),
              let progress = num("progress"), let status = str("status"), let ended = str("endedAt")
        else { return nil }
        var endedAt: Int64?
        if let ended { guard let t = Timestamp.parse(ended) else { return nil }; endedAt = t }
        let error: String?
        switch value["error"] {
        case .some(.string(let s)): error = s
        default: error = nil
        }
        var reason: String?
        if case .string(let r)? = value["cancelReason"] { reason = r }
        // Absent in snapshots stored before broadcast channels existed.
        var broadcast = false, channel: String?
        if case .bool(let b)? = value["broadcast"] { broadcast = b }
        if case .string(let c)? = value["channelId"] { channel = c }
        return Activity(activityId: id, taskName: name, systemImage: image, machine: machine, cancelURL: url,
                        state: state, progress: progress, status: status, attempt: attempt, seq: seq,
                        cancelRequested: cancel, liveActivity: live, createdAt: createdAt, updatedAt: updatedAt, endedAt: endedAt,
                        error: error, cancelReason: reason, broadcast: broadcast, channelId: channel)
    }
}

/// One accepted change: the event's name and the snapshot after it.
public struct ActivityEvent: Equatable, Sendable {
    public var seq: Int64 { snapshot.seq }
    public let name: EventName
    public let snapshot: Activity

    public init(name: EventName, snapshot: Activity) {
        self.name = name
        self.snapshot = snapshot
    }

    /// APNs priority of the push that mirrors this change: 10 spends the phone's small budget
    /// and is for what a person must see at once (a new state, the end); 5 for progress,
    /// status and a cancel request (the state does not change: the publisher's end, at 10,
    /// follows; contract §5.2).
    public func pushPriority(previous: ActivityState?) -> Int {
        if snapshot.state.isTerminal || previous != snapshot.state { return 10 }
        return 5
    }
}

/// What an event of an activity's history says happened: the state it is in after the change
/// (a new state, or the same with new progress or status), or a cancel request (the state does
/// not change). Its `rawValue` is the SSE `event:` field and the history's `event` column.
public enum EventName: Hashable, Sendable, RawRepresentable, CustomStringConvertible {
    case state(ActivityState)
    case cancelRequested

    public init?(rawValue: String) {
        if rawValue == "cancel_requested" {
            self = .cancelRequested
        } else if let state = ActivityState(rawValue: rawValue) {
            self = .state(state)
        } else {
            return nil
        }
    }

    public var rawValue: String {
        switch self {
        case .state(let state): state.rawValue
        case .cancelRequested: "cancel_requested"
        }
    }

    public var description: String { rawValue }
}
