/// One push on its way to APNs: to one token, from a claimed per-device outbox row (fenced by
/// that row's lease) or from a claimed activity entry fanned out to its tokens (`entryID`).
public struct PushJob: Equatable, Sendable {
    /// This process's handle for the push (unique among its pushes in flight).
    public var outboxID: Int64
    /// The lease this claim holds; every mark is fenced by it, so a sender whose lease expired
    /// (and whose row another sender claimed) changes nothing. For a fanned-out push, the
    /// entry's lease.
    public var leaseID: Int64
    public var kind: PushKind
    public var activityID: String
    public var deviceID: Int64
    /// The activity's seq in the snapshot pushed (the newest at claim time).
    public var seq: Int64
    /// The push's `aps.timestamp`.
    public var timestamp: Int64
    /// Tries of this row so far, this one included.
    public var attempts: Int
    /// When the oldest change this push carries was committed (ms since the epoch).
    public var pendingSinceMs: Int64?
    public var claimedAtMs: Int64
    /// The look-up MAC of the token pushed to (a retirement removes exactly that token).
    public var tokenMac: [UInt8]
    /// The token's last digits, for logs.
    public var tokenHint: String
    /// The APNs environment this push goes to (the device's, or the other one on the retry
    /// after `BadDeviceToken`).
    public var environment: APNsEnvironment = .production
    /// This is that retry: when it is delivered, the device's environment is corrected.
    public var switchedEnvironment = false
    /// When the change pushed was made (ms): the pace counts from it, not from the send, so a
    /// job reporting exactly once per pace is never held back by its own push's latency.
    public var changedAtMs: Int64 = 0
    /// The claimed activity entry this push is one of (nil: its own outbox row).
    public var entryID: Int64?
    /// `apns-priority` (a retry of a fanned-out push keeps it on its own row).
    public var priority = 5
    /// The device's own row is flagged failed (our bug once): a delivery clears the flag.
    public var clearsFailedRow = false
    /// The `stale-date` this push carries (Unix seconds; 0: none): what the phone shows, which
    /// a touch compares its new deadline with (contract §5.4).
    public var staleDate: Int64 = 0

    public init(outboxID: Int64, leaseID: Int64, kind: PushKind, activityID: String, deviceID: Int64, seq: Int64,
                timestamp: Int64, attempts: Int, pendingSinceMs: Int64?, claimedAtMs: Int64, tokenMac: [UInt8] = [], tokenHint: String = "") {
        self.outboxID = outboxID
        self.leaseID = leaseID
        self.kind = kind
        self.activityID = activityID
        self.deviceID = deviceID
        self.seq = seq
        self.timestamp = timestamp
        self.attempts = attempts
        self.pendingSinceMs = pendingSinceMs
        self.claimedAtMs = claimedAtMs
        self.tokenMac = tokenMac
        self.tokenHint = tokenHint
    }
}

/// One claimed activity entry (`push_activity_outbox`): the newest state of an activity, to be
/// pushed to each of its tokens from memory.
public struct PushEntry: Equatable, Sendable {
    /// This process's handle for the entry.
    public var entryID: Int64
    public var leaseID: Int64
    public var activityID: String
    /// The activity's seq in the snapshot pushed.
    public var seq: Int64
    /// The pushes' `aps.timestamp` (0: nothing to push).
    public var timestamp: Int64
    public var attempts: Int
    public var pendingSinceMs: Int64?
    public var claimedAtMs: Int64
    public var changedAtMs: Int64
    /// Devices passed over: their own row is pending (its push carries the newest state when it
    /// goes) or pushed this seq already. Their rows' `wanted_seq` is raised to `seq` with the
    /// entry's mark, so a row being sent meanwhile with an older state pushes again.
    public var passedOver: [Int64]
    /// The `stale-date` the fan-out carries (Unix seconds; 0: none).
    public var staleDate: Int64 = 0

    public init(entryID: Int64, leaseID: Int64, activityID: String, seq: Int64, timestamp: Int64, attempts: Int,
                pendingSinceMs: Int64?, claimedAtMs: Int64, changedAtMs: Int64 = 0, passedOver: [Int64] = []) {
        self.entryID = entryID
        self.leaseID = leaseID
        self.activityID = activityID
        self.seq = seq
        self.timestamp = timestamp
        self.attempts = attempts
        self.pendingSinceMs = pendingSinceMs
        self.claimedAtMs = claimedAtMs
        self.changedAtMs = changedAtMs
        self.passedOver = passedOver
    }
}

/// Why an outbox row or entry holds what it holds, as `last_status` and logs show it.
public enum PushStatus: Equatable, Sendable {
    /// APNs' answer (`200`, `410 Unregistered`, `timeout`, ...).
    case answer(APNsAnswer)
    /// Nothing to push (a push-to-start for an activity that ended first).
    case skipped
    /// Claimed while the process was stopping: given back, not sent.
    case shutdown
    /// A broadcast activity's push-to-start waits for its channel.
    case waitingForChannel
    /// The read after the claim failed: given back.
    case database
    /// The sealed token would not open (the token key changed).
    case unreadableToken

    public var label: String {
        switch self {
        case .answer(let a): return PushSenderMachine<Void>.label(a)
        case .skipped: return "skipped"
        case .shutdown: return "not sent (shutdown)"
        case .waitingForChannel: return "waiting for the channel"
        case .database: return "database"
        case .unreadableToken: return "unreadable token"
        }
    }
}

/// What the sender writes back (fenced by the lease): per push, or per fanned-out entry.
public enum PushMark: Equatable, Sendable {
    /// Pushed: the row's seq and timestamp advance; the row is due again at once if a newer
    /// change arrived meanwhile (not before `PushTimestamp.nextAllowed`). Of a fanned-out push,
    /// written only when it changes the device (environment corrected, failed flag cleared).
    case delivered(PushJob)
    /// Nothing to push (a push-to-start for an activity that ended first): counts as sent.
    case skipped(PushJob)
    /// Of a fanned-out push: the device gets (or keeps) its own row, due after the delay.
    case retry(PushJob, afterSeconds: Double, status: PushStatus, countsAsAttempt: Bool)
    /// Retire the token unless it was registered again after `invalidSinceMs`, cancelling
    /// its pending pushes; if it was registered again, the row is due again at once.
    case retire(PushJob, invalidSinceMs: Int64, status: PushStatus)
    /// Our bug: kept, flagged failed, not retried (a newer change clears the flag).
    case failed(PushJob, status: PushStatus)
    /// The activity or the token no longer exists: the row goes.
    case drop(PushJob)
    /// Every push of the entry's fan-out was answered: the entry has pushed `seq`
    /// (`delivered` of `devices` tokens; the others have rows of their own now).
    case fannedOut(PushEntry, devices: Int, delivered: Int)
    /// The entry goes back unsent, due after the delay, the claim not counted.
    case releaseEntry(PushEntry, afterSeconds: Double, status: PushStatus)
    /// The activity is gone: the entry goes.
    case dropEntry(PushEntry)

    /// The push this mark is about (nil: an entry's).
    public var job: PushJob? {
        switch self {
        case .delivered(let j), .skipped(let j), .drop(let j): return j
        case .retry(let j, _, _, _), .retire(let j, _, _), .failed(let j, _): return j
        case .fannedOut, .releaseEntry, .dropEntry: return nil
        }
    }

    /// The entry this mark is about (nil: a push's).
    public var entry: PushEntry? {
        switch self {
        case .fannedOut(let e, _, _), .releaseEntry(let e, _, _), .dropEntry(let e): return e
        case .delivered, .skipped, .drop, .retry, .retire, .failed: return nil
        }
    }
}
