/// The values the write path passes around: what a caller asks, what the database holds, what a
/// batch writes and how it ended. Pure data; the SQL for them is the server's ActivityRepository.

/// The kinds of call that change an activity (and may carry an Idempotency-Key).
public enum PublishCallKind: String, Sendable {
    case start, update, end, cancel
}

/// One publish request: a change to one activity, as a caller asked for it.
public struct PublishOp: Equatable, Sendable {
    public enum Kind: Equatable, Sendable {
        case start(StartCommand)
        case update(UpdateCommand)
        case end(EndCommand)
        /// A remote cancel request, with its optional reason and the delivery id its webhook
        /// gets (drawn by the caller: the machine draws no random numbers; one id per request,
        /// since a write that did not apply queued no webhook).
        case cancel(reason: String?, deliveryID: String)
    }

    public enum Outcome: Equatable, Sendable {
        /// Nothing to write: the stored snapshot answers (an identical start, a repeated end,
        /// a repeated cancel request).
        case ok(Activity)
        /// Committed now: the snapshot's JSON is the one already written to the database.
        case committed(json: [UInt8], created: Bool)
        /// A repeat of an already applied request: the stored answer, as JSON.
        case replay(String)
        case failed(DispatchError)
    }

    public let activityID: String
    public let kind: Kind
    public let idempotencyKey: String?
    /// The key the change is made with (a start's owner).
    public let ownerKeyID: Int64?
    public let access: PublishAccess

    public init(activityID: String, kind: Kind, idempotencyKey: String? = nil, ownerKeyID: Int64?, access: PublishAccess) {
        self.activityID = activityID
        self.kind = kind
        self.idempotencyKey = idempotencyKey
        self.ownerKeyID = ownerKeyID
        self.access = access
    }

    public var callKind: PublishCallKind {
        switch kind {
        case .start: return .start
        case .update: return .update
        case .end: return .end
        case .cancel: return .cancel
        }
    }
}

/// Who may change an existing activity.
public enum PublishAccess: Equatable, Sendable {
    /// Any activity (an admin key; a device key's cancel).
    case anyActivity
    /// Only an activity this key started.
    case startedBy(keyID: Int64)
    /// The stale sweeper's end: only if the activity is still as its claim saw it. Planned on a
    /// fresh read (never the cache), and written only if `touched_ms` still holds `touchedMs`.
    case staleClaim(seq: Int64, touchedMs: Int64)

    /// Why `stored` may not be changed; nil when it may.
    public func denial(_ stored: StoredActivity) -> DispatchError? {
        switch self {
        case .anyActivity:
            return nil
        case .startedBy(let keyID):
            if stored.ownerKeyID == keyID { return nil }
            return DispatchError(.forbidden, "this key did not start activity \(stored.activity.activityId)")
        case .staleClaim(let seq, let touchedMs):
            if stored.activity.seq == seq && stored.touchedMs == touchedMs { return nil }
            return DispatchError(.conflict, "activity \(stored.activity.activityId) changed or was touched after it went stale")
        }
    }

    /// The touch time the write must still find (the stale sweeper's end only).
    var staleTouch: Int64? {
        switch self {
        case .anyActivity, .startedBy: return nil
        case .staleClaim(_, let touchedMs): return touchedMs
        }
    }
}

extension DispatchError {
    public static let unavailable = DispatchError(.databaseUnavailable, "the database is unavailable, retry shortly")
    public static let refusesWrites = DispatchError(
        .databaseUnavailable, "the database refuses writes (read-only or out of space); reads still work")
}

/// An activity row with what the publishing rules need beyond the snapshot.
public struct StoredActivity: Equatable, Sendable {
    public var activity: Activity
    public var lastEvent: String
    public var ownerKeyID: Int64?
    public var startFingerprint: String
    public var endFingerprint: String?
    /// Seconds without a change before the server ends it as stale; 0: never.
    public var staleAfter: Int
    /// When it was last touched (ms since epoch; 0: never), when read from the database: the
    /// stale sweeper's end applies only if it did not change since its claim.
    public var touchedMs: Int64 = 0

    public init(activity: Activity, lastEvent: String, ownerKeyID: Int64?, startFingerprint: String, endFingerprint: String?,
                staleAfter: Int, touchedMs: Int64 = 0) {
        self.activity = activity
        self.lastEvent = lastEvent
        self.ownerKeyID = ownerKeyID
        self.startFingerprint = startFingerprint
        self.endFingerprint = endFingerprint
        self.staleAfter = staleAfter
        self.touchedMs = touchedMs
    }

    /// Roughly what this takes in memory (cache budgets).
    public var approximateBytes: Int {
        let a = activity
        return 256 + a.activityId.utf8.count + a.taskName.utf8.count + (a.systemImage?.utf8.count ?? 0) + (a.machine?.utf8.count ?? 0)
            + (a.cancelURL?.utf8.count ?? 0) + (a.status?.utf8.count ?? 0) + (a.error?.utf8.count ?? 0)
            + startFingerprint.utf8.count + (endFingerprint?.utf8.count ?? 0)
    }
}

/// A change already applied under an Idempotency-Key: its stored answer and what it was.
public struct PublishReplay: Equatable, Sendable {
    public let json: String
    public let event: String
    public let seq: Int64

    public init(json: String, event: String, seq: Int64) {
        self.json = json
        self.event = event
        self.seq = seq
    }

    /// Which call made it: the first event is the start's, `cancel_requested` a cancel's, a
    /// terminal state an end's, anything else an update's.
    public var call: PublishCallKind {
        if seq == 1 { return .start }
        switch EventName(rawValue: event) {
        case .cancelRequested: return .cancel
        case .state(let state) where state.isTerminal: return .end
        default: return .update
        }
    }
}

/// What a publish read found: the row to plan against, and what this request's
/// Idempotency-Key already applied to it, if anything.
public struct PublishRead: Equatable, Sendable {
    public var stored: StoredActivity
    public var replay: PublishReplay?

    public init(stored: StoredActivity, replay: PublishReplay?) {
        self.stored = stored
        self.replay = replay
    }
}

/// One group commit's values: new activities, changes to existing ones, and for each change
/// what its history row and the push outbox need. The server turns them into statements.
public struct PublishBatch: Equatable, Sendable {
    /// A new activity.
    public struct Start: Equatable, Sendable {
        public let event: ActivityEvent
        public let ownerKeyID: Int64?
        public let fingerprint: String
        public let staleAfter: Int

        public init(event: ActivityEvent, ownerKeyID: Int64?, fingerprint: String, staleAfter: Int) {
            self.event = event
            self.ownerKeyID = ownerKeyID
            self.fingerprint = fingerprint
            self.staleAfter = staleAfter
        }
    }

    /// A signed webhook to queue with a change (a cancel request to an activity with a cancelURL).
    public struct Webhook: Equatable, Sendable {
        public let deliveryID: String
        public let body: String

        public init(deliveryID: String, body: String) {
            self.deliveryID = deliveryID
            self.body = body
        }
    }

    /// A change to an existing activity, planned against `expectedSeq`.
    public struct Update: Equatable, Sendable {
        public let event: ActivityEvent
        public let expectedSeq: Int64
        public let endFingerprint: String?
        public let cancelReason: String?
        /// Queued in the same statement when the activity has a cancelURL.
        public let webhook: Webhook?
        public let idempotencyKey: String?
        /// The stale sweeper's end applies only if nobody touched the activity since its claim
        /// (`touched_ms` still holds this value).
        public let staleTouch: Int64?

        public init(event: ActivityEvent, expectedSeq: Int64, endFingerprint: String?, cancelReason: String?, webhook: Webhook?,
                    idempotencyKey: String?, staleTouch: Int64?) {
            self.event = event
            self.expectedSeq = expectedSeq
            self.endFingerprint = endFingerprint
            self.cancelReason = cancelReason
            self.webhook = webhook
            self.idempotencyKey = idempotencyKey
            self.staleTouch = staleTouch
        }
    }

    /// One change as the batch's finalize step needs it: the history row to write (when the
    /// change applied) and what the push outbox needs.
    public struct Change: Equatable, Sendable {
        public let activityID: String
        public let seq: Int64
        public let event: String
        public let data: String
        public let idempotencyKey: String?
        public let createdMs: Int64
        public let pushPriority: Int

        public init(activityID: String, seq: Int64, event: String, data: String, idempotencyKey: String?, createdMs: Int64, pushPriority: Int) {
            self.activityID = activityID
            self.seq = seq
            self.event = event
            self.data = data
            self.idempotencyKey = idempotencyKey
            self.createdMs = createdMs
            self.pushPriority = pushPriority
        }
    }

    public var starts: [Start] = []
    public var updates: [Update] = []
    /// Every change of the batch, starts included, in the order they were queued.
    public var changes: [Change] = []
    /// Mark the push outbox for each change (APNs is configured).
    public var marksPushes: Bool
    /// When the batch was sent (ms since epoch): the push outbox's pending time.
    public var now: Int64

    public init(starts: [Start] = [], updates: [Update] = [], changes: [Change] = [], marksPushes: Bool, now: Int64) {
        self.starts = starts
        self.updates = updates
        self.changes = changes
        self.marksPushes = marksPushes
        self.now = now
    }
}

/// How a batch's round trip ended, as the machine needs to know it.
public enum PublishBatchResult: Equatable, Sendable {
    /// Committed. `applied`: the activities whose writes took (the writes' RETURNING listed
    /// them); the others missed their compare-and-set. `pushesMarked`: push outbox rows the finalize marked. `overLimit`: starts refused because
    /// their key already holds its most live activities (nothing of them was written).
    /// `overFinished`: starts refused because their key finished its most activities in the
    /// window, each with when one more start may pass (ms; 0 when unknown).
    case committed(applied: Set<String>, pushesMarked: Int64, overLimit: Set<String> = [],
                   overFinished: [String: Int64] = [:])
    /// The database refuses writes (read-only, a standby, out of space): the batch rolled back.
    case refused(String)
    /// A statement failed: the whole batch rolled back.
    case rolledBack(String)
    /// The connection failed: whether the batch committed is unknown.
    case connectionFailed
}
