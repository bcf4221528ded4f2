// The iOS app's side of Dispatch's Live Activity pushes (contract §5.2): copy this file into
// the app and its widget extension, or depend on the package's `DispatchLiveActivity` library.
// No Foundation: times are numbers of Unix seconds, because a default JSONDecoder reads a
// `Date` as seconds since 2001 and every Live Activity would show the wrong time.

#if canImport(ActivityKit)
import ActivityKit
#endif

/// What stays fixed for one Live Activity: the push-to-start payload's `attributes`
/// (`attributes-type: "DispatchAttributes"`).
public struct DispatchAttributes: Codable, Hashable, Sendable {
    public var activityId: String
    public var taskName: String
    /// The machine the job runs on (`shodan`), if the publisher said.
    public var machine: String?
    /// An SF Symbol name (`arrow.down.circle.fill`), if the publisher gave one.
    public var systemImage: String?

    public init(activityId: String, taskName: String, machine: String? = nil, systemImage: String? = nil) {
        self.activityId = activityId
        self.taskName = taskName
        self.machine = machine
        self.systemImage = systemImage
    }

    /// What changes: every push's `content-state`.
    public struct ContentState: Codable, Hashable, Sendable {
        /// `queued`, `processing`, `retrying`, `idle`, or a final one: `completed`, `error`,
        /// `cancelled`, `rejected`. Kept as text so a state added later still decodes.
        public var state: String
        /// 0...1, or nil when unknown.
        public var progress: Double?
        public var status: String?
        public var attempt: Int
        /// The change's number: strictly increasing per activity.
        public var seq: Int
        /// When the change was made, in Unix seconds.
        public var updatedAt: Double
        /// Someone asked to cancel the job (contract §5.3); it runs until its publisher ends it,
        /// so show "Cancelling…" rather than an end. `false` when a push (from a server before
        /// this key existed) does not carry it.
        public var cancelRequested: Bool

        public init(state: String, progress: Double? = nil, status: String? = nil, attempt: Int = 1, seq: Int, updatedAt: Double,
                    cancelRequested: Bool = false) {
            self.state = state
            self.progress = progress
            self.status = status
            self.attempt = attempt
            self.seq = seq
            self.updatedAt = updatedAt
            self.cancelRequested = cancelRequested
        }

        enum CodingKeys: String, CodingKey {
            case state, progress, status, attempt, seq, updatedAt, cancelRequested
        }

        /// Decodes pushes with or without `cancelRequested` (a Live Activity started before the
        /// server knew the key keeps decoding its updates).
        public init(from decoder: any Decoder) throws {
            let c = try decoder.container(keyedBy: CodingKeys.self)
            state = try c.decode(String.self, forKey: .state)
            progress = try c.decodeIfPresent(Double.self, forKey: .progress)
            status = try c.decodeIfPresent(String.self, forKey: .status)
            attempt = try c.decode(Int.self, forKey: .attempt)
            seq = try c.decode(Int.self, forKey: .seq)
            updatedAt = try c.decode(Double.self, forKey: .updatedAt)
            cancelRequested = try c.decodeIfPresent(Bool.self, forKey: .cancelRequested) ?? false
        }

        /// The job is over (its Live Activity ends with this content).
        public var isFinal: Bool { ["completed", "error", "cancelled", "rejected"].contains(state) }
        /// The job failed or was refused (the end push carries an alert).
        public var isFailure: Bool { state == "error" || state == "rejected" }
    }
}

#if canImport(ActivityKit)
@available(iOS 16.1, *)
extension DispatchAttributes: ActivityAttributes {}
#endif

/// A whole push as the server sends it (contract §5.2, §5.5): the `aps` dictionary's Live
/// Activity keys, for an app or a test that wants to read a push itself (ActivityKit reads
/// them on its own). Decode `LiveActivityPush.Envelope` with a default `JSONDecoder`.
public struct LiveActivityPush: Decodable, Hashable, Sendable {
    /// Unix seconds; grows push after push for one activity (the phone keeps the newest).
    public var timestamp: Int
    /// `start`, `update` or `end`.
    public var event: String
    public var contentState: DispatchAttributes.ContentState
    /// `"DispatchAttributes"`, with `start` only.
    public var attributesType: String?
    /// With `start` only.
    public var attributes: DispatchAttributes?
    /// With `start`, and with an `end` in `error` or `rejected`.
    public var alert: Alert?
    /// `1` on a `start` (iOS 18): the started Live Activity gets an update token at once.
    public var inputPushToken: Int?
    /// On the `start` of a broadcast activity (iOS 18): the channel the Live Activity subscribes to.
    public var inputPushChannel: String?
    /// On every push of an activity with a stale deadline (the start included): Unix seconds
    /// from which it shows as stale, the time the server would end it. A `touch` that moves
    /// the deadline far enough sends an update with a later one.
    public var staleDate: Int?
    /// With `end` only: Unix seconds until which the ended Live Activity stays on the Lock Screen.
    public var dismissalDate: Int?

    public struct Alert: Decodable, Hashable, Sendable {
        public var title: String
        public var body: String
    }

    /// The JSON body of a push: `{"aps": {...}}`.
    public struct Envelope: Decodable, Hashable, Sendable {
        public var aps: LiveActivityPush
    }

    enum CodingKeys: String, CodingKey {
        case timestamp, event, attributes, alert
        case contentState = "content-state"
        case attributesType = "attributes-type"
        case inputPushToken = "input-push-token"
        case inputPushChannel = "input-push-channel"
        case staleDate = "stale-date"
        case dismissalDate = "dismissal-date"
    }
}
