/// Which APNs token a push goes to: a device's push-to-start token (`start`) or the update
/// token the device registered for one activity (`update`, which carries the end too).
public enum PushKind: String, Sendable, CaseIterable {
    case start, update
}

/// The `aps` payload of a Live Activity push (contract §5.2), exactly the contract's keys:
/// `content-state` always; `attributes-type`, `attributes`, `alert` and `input-push-token: 1`
/// (or `input-push-channel` for a broadcast activity) with `start`; `stale-date` with `start`
/// and `update` when the activity has a stale deadline; `dismissal-date` with `end`, and `alert` with an
/// `end` in `error` or `rejected`. Times
/// are Unix seconds (numbers). At most 4096 bytes: a long status (then the error text, then
/// the task name) is shortened to fit, never refused.
public enum LiveActivityPayload {
    public static let maxBytes = 4096
    /// The name of the app's `ActivityAttributes` type (DispatchLiveActivity's `DispatchAttributes`).
    public static let attributesType = "DispatchAttributes"
    /// How an end's `dismissal-date` is set when the configuration says nothing: APNs and
    /// iOS keep an ended Live Activity at most 4 hours anyway.
    public static let defaultDismissalDelaySeconds: Int64 = 4 * 3600
    static let ellipsis = "…"

    public enum Event: String, Sendable {
        case start, update, end
    }

    /// What a payload carries beyond the snapshot.
    public struct Extras: Equatable, Sendable {
        /// When the server would end the activity as stale (Unix seconds): `stale-date` on starts and updates.
        public var staleDate: Int64?
        /// The activity's broadcast channel: a start then asks the phone to subscribe to it
        /// (`input-push-channel`) instead of asking for an update token (`input-push-token`).
        public var channelID: String?

        public init(staleDate: Int64? = nil, channelID: String? = nil) {
            self.staleDate = staleDate
            self.channelID = channelID
        }
    }

    public static func event(kind: PushKind, state: ActivityState) -> Event {
        switch kind {
        case .start: return .start
        case .update: return state.isTerminal ? .end : .update
        }
    }

    /// Whether a finished activity is reported with an alert (it failed, or was refused).
    public static func alertsOnEnd(_ state: ActivityState) -> Bool { state == .error || state == .rejected }

    /// The payload for `snapshot` as `event`; `timestamp` is the push's `aps.timestamp`.
    public static func build(_ snapshot: Activity, event: Event, timestamp: Int64,
                             dismissalDelaySeconds: Int64 = defaultDismissalDelaySeconds, extras: Extras = Extras()) -> [UInt8] {
        var texts = Texts(status: snapshot.status, error: snapshot.error, taskName: snapshot.taskName)
        var out = render(snapshot, texts, event: event, timestamp: timestamp, dismissalDelay: dismissalDelaySeconds, extras: extras)
        if out.count <= maxBytes { return out }
        // Too long: shorten one text after another, each as little as needed.
        for field in Texts.Field.allCases {
            guard let full = texts[field] else { continue }
            let characters = Array(full)
            // The longest prefix that fits, by bisection over characters (render is cheap).
            var low = 0, high = characters.count
            while low < high {
                let mid = (low + high + 1) / 2
                var trial = texts
                trial[field] = String(characters[..<mid]) + ellipsis
                if render(snapshot, trial, event: event, timestamp: timestamp, dismissalDelay: dismissalDelaySeconds, extras: extras).count <= maxBytes {
                    low = mid
                } else {
                    high = mid - 1
                }
            }
            texts[field] = low == characters.count ? full : String(characters[..<low]) + ellipsis
            out = render(snapshot, texts, event: event, timestamp: timestamp, dismissalDelay: dismissalDelaySeconds, extras: extras)
            if out.count <= maxBytes { return out }
        }
        // Unreachable with the contract's field limits (ids, machine and symbol are short
        // ASCII), kept so that no input can ever produce an oversized body.
        texts = Texts(status: nil, error: nil, taskName: ellipsis)
        return render(snapshot, texts, event: event, timestamp: timestamp, dismissalDelay: dismissalDelaySeconds, extras: extras)
    }

    /// The texts that may be shortened, in the order they are.
    struct Texts {
        enum Field: CaseIterable { case status, error, taskName }
        var status: String?
        var error: String?
        var taskName: String

        subscript(field: Field) -> String? {
            get {
                switch field {
                case .status: return status
                case .error: return error
                case .taskName: return taskName
                }
            }
            set {
                switch field {
                case .status: status = newValue
                case .error: error = newValue
                case .taskName: taskName = newValue ?? ""
                }
            }
        }
    }

    static func render(_ a: Activity, _ texts: Texts, event: Event, timestamp: Int64, dismissalDelay: Int64, extras: Extras) -> [UInt8] {
        var w = JSONWriter(capacity: 512)
        w.beginObject()
        w.key("aps")
        w.beginObject()
        w.field("timestamp", timestamp)
        w.field("event", event.rawValue)
        w.key("content-state")
        w.beginObject()
        w.field("state", a.state.rawValue)
        w.field("progress", a.progress)
        w.field("status", texts.status)
        w.field("attempt", a.attempt)
        w.field("seq", a.seq)
        w.field("updatedAt", seconds(a.updatedAt))
        w.field("cancelRequested", a.cancelRequested)
        w.endObject()
        switch event {
        case .start:
            w.field("attributes-type", attributesType)
            w.key("attributes")
            w.beginObject()
            w.field("activityId", a.activityId)
            w.field("taskName", texts.taskName)
            w.field("machine", a.machine)
            w.field("systemImage", a.systemImage)
            w.endObject()
            alert(&w, title: texts.taskName, body: texts.status ?? stateText(a))
            if let channel = extras.channelID {
                w.field("input-push-channel", channel)
            } else {
                w.field("input-push-token", Int64(1))
            }
            if let stale = extras.staleDate { w.field("stale-date", stale) }
        case .update:
            if let stale = extras.staleDate { w.field("stale-date", stale) }
        case .end:
            w.field("dismissal-date", seconds(a.endedAt ?? a.updatedAt) + max(0, dismissalDelay))
            if alertsOnEnd(a.state) {
                alert(&w, title: texts.taskName, body: texts.error ?? texts.status ?? stateText(a))
            }
        }
        w.endObject()
        w.endObject()
        return w.bytes
    }

    private static func alert(_ w: inout JSONWriter, title: String, body: String) {
        w.key("alert")
        w.beginObject()
        w.field("title", title)
        w.field("body", body)
        w.endObject()
    }

    /// When an activity that changed at `updatedMs` and was touched at `touchedMs` (0: never)
    /// would be ended as stale (contract §5.4), nil when it has no stale deadline or has ended.
    public static func staleDeadline(_ a: Activity, staleAfterSeconds: Int, touchedMs: Int64) -> Int64? {
        guard staleAfterSeconds > 0, !a.state.isTerminal else { return nil }
        return max(a.updatedAt, touchedMs) + Int64(staleAfterSeconds) * 1000
    }

    /// Unix seconds of a millisecond time (whole seconds, as APNs and the contract show them).
    public static func seconds(_ milliseconds: Int64) -> Int64 {
        milliseconds >= 0 ? milliseconds / 1000 : -((-milliseconds + 999) / 1000)
    }

    /// An alert's body when the activity has no status to show.
    static func stateText(_ a: Activity) -> String {
        switch a.state {
        case .queued: return "Queued"
        case .processing: return "In progress"
        case .retrying: return "Retrying (attempt \(a.attempt))"
        case .idle: return "Waiting"
        case .completed: return "Completed"
        case .error: return "Failed"
        case .cancelled: return "Cancelled"
        case .rejected: return "Rejected"
        }
    }
}

/// What a claimed outbox row becomes: the decision between claim and send, pure.
public enum PushPlan: Equatable, Sendable {
    /// The request: its body, `aps.timestamp`, `apns-priority` and `apns-expiration` (Unix seconds).
    case send(body: [UInt8], timestamp: Int64, priority: Int, expiration: Int64)
    /// Nothing to push, and nothing will be: a push-to-start for an activity that already ended.
    case skip
    /// The activity or the token is gone: forget the row.
    case drop

    /// How long APNs keeps trying to reach an offline phone with a start or an update (a
    /// newer update supersedes it anyway); an end is kept until its dismissal date.
    public static let expirationSeconds: Int64 = 3600

    /// `snapshot` is the activity at claim time (nil: gone), `lastTimestamp` the row's last
    /// pushed timestamp, `priority` the row's (changes' highest since the last push).
    /// `staleDeadlineMs` is when the server would end the activity as stale (nil: never).
    /// `sentAtSeconds` is when the push goes (Unix seconds): `apns-expiration` counts from it,
    /// not from the change, so a push made long after its change (a token that arrived late)
    /// still gets its full hour at APNs. Nil: from the timestamp (tests of the payload only).
    public static func make(kind: PushKind, snapshot: Activity?, hasToken: Bool, lastTimestamp: Int64, priority: Int,
                            dismissalDelaySeconds: Int64, staleDeadlineMs: Int64? = nil, channelID: String? = nil,
                            sentAtSeconds: Int64? = nil) -> PushPlan {
        guard let snapshot, hasToken else { return .drop }
        if kind == .start && snapshot.state.isTerminal { return .skip }
        let event = LiveActivityPayload.event(kind: kind, state: snapshot.state)
        let timestamp = PushTimestamp.next(changeMs: snapshot.updatedAt, last: lastTimestamp)
        let extras = LiveActivityPayload.Extras(staleDate: staleDeadlineMs.map(LiveActivityPayload.seconds), channelID: channelID)
        let body = LiveActivityPayload.build(snapshot, event: event, timestamp: timestamp, dismissalDelaySeconds: dismissalDelaySeconds,
                                             extras: extras)
        let sent = sentAtSeconds ?? timestamp
        switch event {
        case .start:
            return .send(body: body, timestamp: timestamp, priority: 10, expiration: sent + expirationSeconds)
        case .update:
            return .send(body: body, timestamp: timestamp, priority: priority == 10 ? 10 : 5, expiration: sent + expirationSeconds)
        case .end:
            let dismissal = LiveActivityPayload.seconds(snapshot.endedAt ?? snapshot.updatedAt) + max(0, dismissalDelaySeconds)
            return .send(body: body, timestamp: timestamp, priority: 10, expiration: max(dismissal, sent + 60))
        }
    }
}
