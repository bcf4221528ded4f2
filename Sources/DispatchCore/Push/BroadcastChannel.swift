/// Where a broadcast activity's channel is in its life (contract §5.5; the `phase` of
/// `broadcast_outbox`).
public enum BroadcastPhase: String, Sendable, CaseIterable {
    /// The channel is to be made (nothing that needs it is sent before).
    case create
    /// The channel exists: every change is one broadcast push.
    case live
    /// The activity ended and its end was pushed (or refused): the channel goes at its dismissal date.
    case delete
    /// APNs would not make the channel: the activity runs without one. (Rows of an older
    /// server flagged here after a refused push with a channel are moved back to `live` by
    /// Migrations/0020.)
    case failed
}

/// One claimed `broadcast_outbox` row.
public struct BroadcastJob: Equatable, Sendable {
    public var activityID: String
    public var leaseID: Int64
    public var phase: BroadcastPhase
    public var channelID: String?
    public var environment: APNsEnvironment
    public var attempts: Int
    /// Whether a state change or an end is among the changes waiting (priority 10).
    public var priority: Int
    public var lastTimestamp: Int64
    public var pendingSinceMs: Int64?
    public var claimedAtMs: Int64
    /// When the change pushed was made (ms; 0 until known): the pace counts from it.
    public var changedAtMs: Int64 = 0
    /// The `stale-date` the push carries (Unix seconds; 0: none), kept with the row so that a
    /// touch knows what the phones show (contract §5.4).
    public var staleDate: Int64 = 0

    public init(activityID: String, leaseID: Int64, phase: BroadcastPhase, channelID: String?, environment: APNsEnvironment,
                attempts: Int, priority: Int, lastTimestamp: Int64, pendingSinceMs: Int64?, claimedAtMs: Int64) {
        self.activityID = activityID
        self.leaseID = leaseID
        self.phase = phase
        self.channelID = channelID
        self.environment = environment
        self.attempts = attempts
        self.priority = priority
        self.lastTimestamp = lastTimestamp
        self.pendingSinceMs = pendingSinceMs
        self.claimedAtMs = claimedAtMs
    }
}

/// What a claimed row asks of APNs, decided from the row and the activity as it is now.
public enum BroadcastRequest: Equatable, Sendable {
    /// `POST /1/apps/<bundle id>/channels`, body `{"message-storage-policy": 1, "push-type": "LiveActivity"}`.
    case create
    /// `POST /4/broadcasts/apps/<bundle id>` on the push host. `ends`: the activity's end,
    /// after which the channel goes at `deleteAt` (Unix seconds).
    case push(body: [UInt8], priority: Int, expiration: Int64, timestamp: Int64, seq: Int64, ends: Bool, deleteAt: Int64)
    /// `DELETE /1/apps/<bundle id>/channels`.
    case delete(channelID: String)
    /// The activity is gone: delete the channel if there is one, else forget the row.
    case forget

    /// The message storage policy of every channel made: the newest message is kept (up to
    /// 8 hours) for phones that subscribe late.
    public static let storagePolicy = 1
    public static let createBody: [UInt8] = Array(#"{"message-storage-policy":1,"push-type":"LiveActivity"}"#.utf8)
    /// APNs' limit for a broadcast body (the payload builder keeps to 4,096 anyway).
    public static let maxBytes = 5120

    /// `nowSeconds` (Unix seconds, nil: unknown) is when the request goes: `apns-expiration`
    /// counts from it, and an ended activity whose dismissal date has passed has its channel
    /// deleted whatever happened to its pushes (an end that failed and is still retrying is not
    /// sent any more; the first try of an end always goes).
    public static func make(_ job: BroadcastJob, snapshot: Activity?, staleDeadlineMs: Int64?, dismissalDelaySeconds: Int64,
                            nowSeconds: Int64? = nil) -> BroadcastRequest {
        guard let snapshot else {
            if let channel = job.channelID { return .delete(channelID: channel) }
            return .forget
        }
        switch job.phase {
        case .create:
            return .create
        case .delete, .failed:
            if let channel = job.channelID { return .delete(channelID: channel) }
            return .forget
        case .live:
            guard let channel = job.channelID else { return .forget }
            let ends = snapshot.state.isTerminal
            let deleteAt = LiveActivityPayload.seconds(snapshot.endedAt ?? snapshot.updatedAt) + max(0, dismissalDelaySeconds)
            // The end is always tried once; after a failed try, past the dismissal date, the
            // phones are no longer showing the activity: the channel goes without it.
            if ends, job.attempts > 1, let now = nowSeconds, now >= deleteAt { return .delete(channelID: channel) }
            // A channel never starts an activity: a start is pushed as an update.
            guard case .send(let body, let timestamp, let priority, let expiration) = PushPlan.make(
                kind: .update, snapshot: snapshot, hasToken: true, lastTimestamp: job.lastTimestamp, priority: job.priority,
                dismissalDelaySeconds: dismissalDelaySeconds, staleDeadlineMs: staleDeadlineMs, sentAtSeconds: nowSeconds) else { return .forget }
            return .push(body: body, priority: priority, expiration: expiration, timestamp: timestamp, seq: snapshot.seq,
                         ends: ends, deleteAt: deleteAt)
        }
    }
}

/// What a claimed row becomes once APNs answered (written back fenced by the lease).
public enum BroadcastOutcome: Equatable, Sendable {
    case created(channelID: String)
    /// APNs would not make the channel (`FeatureNotEnabled`, `CannotCreateChannelConfig`, ...).
    case refused(status: String)
    /// Pushed up to `seq`; with `deleteAt`, the activity ended and the channel goes then.
    case pushed(seq: Int64, timestamp: Int64, deleteAt: Int64?)
    /// The channel is gone at APNs, or the row has nothing left to do: the row goes.
    case deleted
    /// APNs refused the push for its content (`400`, `413`): it is dropped, not retried, and
    /// the channel goes on with the next change as if it had been pushed (with `deleteAt`: it
    /// was the end, and the channel still goes at the dismissal date).
    case dropped(seq: Int64, timestamp: Int64, deleteAt: Int64?, status: String)
    /// `429 TooManyProviderTokenUpdates`: every sender of the deployment pauses (the caller
    /// knows until when), this row is tried again after the pause.
    case paused(status: String)
    case retry(afterSeconds: Double, status: String)

    public static func decide(_ request: BroadcastRequest, _ answer: APNsAnswer, channelHeader: String?, attempts: Int,
                              policy: Backoff, random: Double) -> BroadcastOutcome {
        let label = PushSenderMachine<Void>.label(answer)
        let retry = BroadcastOutcome.retry(afterSeconds: policy.delay(afterAttempt: max(1, attempts), random: random), status: label)
        switch (request, answer) {
        case (.forget, _):
            return .deleted
        case (.create, .status(201, _, _)), (.create, .status(200, _, _)):
            guard let channel = channelHeader, !channel.isEmpty else { return retry }
            return .created(channelID: channel)
        case (.create, .status(400, _, _)):
            return .refused(status: label)
        case (.push(_, _, _, let timestamp, let seq, let ends, let deleteAt), .status(200, _, _)):
            return .pushed(seq: seq, timestamp: timestamp, deleteAt: ends ? deleteAt : nil)
        case (.push(_, _, _, let timestamp, let seq, let ends, let deleteAt), .status(400, _, _)),
             (.push(_, _, _, let timestamp, let seq, let ends, let deleteAt), .status(413, _, _)):
            return .dropped(seq: seq, timestamp: timestamp, deleteAt: ends ? deleteAt : nil, status: label)
        case (_, .status(429, "TooManyProviderTokenUpdates"?, _)):
            return .paused(status: label)
        case (.delete, .status(let s, _, _)) where s == 200 || s == 204:
            return .deleted
        case (.delete, .status(400, "ChannelNotRegistered"?, _)), (.delete, .status(400, "BadChannelId"?, _)):
            return .deleted
        case (_, .transport(.cancelled)):
            return .retry(afterSeconds: 0, status: label)
        default:
            // 403, 429, 5xx, no answer, and a delete APNs refused otherwise: later, with backoff.
            return retry
        }
    }
}
