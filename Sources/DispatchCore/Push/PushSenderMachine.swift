/// One claimed outbox row on its way to APNs: which row under which lease, and what it pushes.
public struct PushJob: Equatable, Sendable {
    public var outboxID: Int64
    /// The lease this claim holds; every mark is fenced by it, so a sender whose lease expired
    /// (and whose row another sender claimed) changes nothing.
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

/// What the sender writes back to an outbox row (fenced by its lease).
public enum PushMark: Equatable, Sendable {
    /// Pushed: the row's seq and timestamp advance; the row is due again at once if a newer
    /// change arrived meanwhile (not before `PushTimestamp.nextAllowed`).
    case delivered(PushJob)
    /// Nothing to push (a push-to-start for an activity that ended first): counts as sent.
    case skipped(PushJob)
    case retry(PushJob, afterSeconds: Double, status: String, countsAsAttempt: Bool)
    /// Retire the token unless it was registered again after `invalidSinceMs`, cancelling
    /// its pending pushes; if it was registered again, the row is due again at once.
    case retire(PushJob, invalidSinceMs: Int64, status: String)
    /// Our bug: kept, flagged failed, not retried (a newer change clears the flag).
    case failed(PushJob, status: String)
    /// The activity or the token no longer exists: the row goes.
    case drop(PushJob)

    public var job: PushJob {
        switch self {
        case .delivered(let j), .skipped(let j), .drop(let j): return j
        case .retry(let j, _, _, _), .retire(let j, _, _), .failed(let j, _): return j
        }
    }
}

/// The push sender of one server process, as a pure state machine: claims due outbox rows
/// in batches, sends each (many in flight on one HTTP/2 connection), decides from each
/// answer what to write back, and writes marks in batches. The shell (`PushService`)
/// performs the actions; `Payload` is whatever it attaches to a job (request body, token)
/// and gets back in `.send`. Time is Unix seconds, passed in.
///
/// Any number of processes run one each: claims are `FOR UPDATE SKIP LOCKED` with a lease,
/// so a row is with one sender at a time, and a sender that dies leaves its rows to be
/// claimed again when the lease ends.
public struct PushSenderMachine<Payload> {
    public struct Settings: Sendable {
        /// Rows per claim.
        public var claimBatch = 500
        /// Pushes awaiting an answer at most (the APNs client's streams).
        public var maxInFlight = 1000
        public var retry = Backoff(initial: 1, maximum: 300, jitter: .equal)
        public var providerToken = ProviderTokenPolicy()
        /// How long sending stops after APNs refuses the provider token as invalid.
        public var rejectedTokenPause: Double = 600
        /// How long after a failed claim or mark the database is tried again.
        public var databaseRetry: Double = 1
        /// At most one claim per interval (unless the last one came back full): every commit
        /// that marks the outbox wakes the sender, and a claim per commit would make the
        /// database's work grow with the push rate instead of with this rate.
        public var claimInterval: Double = 0.01
        /// At most one batch of marks per interval, for the same reason.
        public var markInterval: Double = 0.01

        public init() {}
    }

    public enum Claimed {
        case send(PushJob, Payload)
        /// Settled without a push (skipped, dropped, an unreadable token).
        case settle(PushMark)
    }

    public enum Action {
        case claim(limit: Int)
        /// Get the deployment's provider token (JWT) for this generation and send with it from
        /// now on (sends of this generation wait for it); `renew`: the current one was refused
        /// (expired, or invalid before a pause), so a newer one is needed. Answer with
        /// `providerTokenReady` or `providerTokenFailed`.
        case obtainProviderToken(generation: Int, renew: Bool)
        case send(PushJob, Payload, tokenGeneration: Int)
        /// Write these marks in one transaction; answer with `marked(ok:)`.
        case mark([PushMark])
        case report(Report)
        /// Call `tick` at this time (something waits for its interval).
        case wake(at: Double)
    }

    public enum Report: Equatable, Sendable {
        /// An answer and what it became; `latency` (commit → answer, seconds) for deliveries.
        case answered(PushJob, PushResult, APNsAnswer, latency: Double?)
        /// APNs refused the provider token: nothing is sent until `until`.
        case sendingStopped(until: Double, APNsAnswer)
        /// APNs said the team's token changed too often: nothing is sent until `until`.
        case sendingPaused(until: Double)
        case sendingResumed
        /// A renewal for `ExpiredProviderToken` came back expired again at once.
        case providerTokenStillExpired
        /// `BadDeviceToken` in the device's environment: tried once in the other one.
        case triedOtherEnvironment(PushJob)
        case claimFailed
        case markFailed(count: Int)
    }

    public let settings: Settings
    public private(set) var running = true
    public private(set) var claiming = false
    /// Marks written now, awaiting `marked(ok:)`.
    public private(set) var marking: [PushMark]?
    public private(set) var pendingMarks: [PushMark] = []
    private var inFlight: [Int64: (job: PushJob, payload: Payload, generation: Int)] = [:]
    /// Rows may be due: claim as soon as there is room and no claim runs.
    private var wantClaim = true
    private var claimRetryAt: Double = 0
    private var markRetryAt: Double = 0
    public private(set) var stoppedUntil: Double?
    public private(set) var tokenGeneration = 0
    private var tokenMintedAt: Double?
    private var tokenRenewedForExpiry = false
    /// The pause was for a refused token: resume with a new one, not the stored one.
    private var renewOnResume = false
    private var lastClaimAt = -Double.infinity
    private var lastClaimFull = false
    private var lastMarkAt = -Double.infinity

    public init(settings: Settings = Settings()) { self.settings = settings }

    public var inFlightCount: Int { inFlight.count }

    // MARK: - Inputs

    /// The periodic poll: rows whose retry came due, rows another process marked, leases of
    /// a dead sender that ran out.
    public mutating func tick(now: Double) -> [Action] {
        // A claim running now covers what is due; a kick meanwhile is different (its commit
        // may have come after that claim's snapshot).
        if !claiming { wantClaim = true }
        return flushMarks(now: now) + maybeClaim(now: now)
    }

    /// This process committed changes that marked the outbox (or registered a token).
    public mutating func kick(now: Double) -> [Action] {
        wantClaim = true
        return maybeClaim(now: now)
    }

    /// A claim came back: `requested` rows were asked for.
    public mutating func claimed(_ items: [Claimed], requested: Int, now: Double) -> [Action] {
        claiming = false
        // A full batch: more may be waiting, at once.
        lastClaimFull = items.count >= requested
        if lastClaimFull { wantClaim = true }
        var actions: [Action] = []
        for item in items {
            switch item {
            case .settle(let mark):
                pendingMarks.append(mark)
            case .send(let job, let payload):
                if !running {
                    pendingMarks.append(.retry(job, afterSeconds: 0, status: "not sent (shutdown)", countsAsAttempt: false))
                    continue
                }
                actions += ensureProviderToken(now: now)
                inFlight[job.outboxID] = (job, payload, tokenGeneration)
                actions.append(.send(job, payload, tokenGeneration: tokenGeneration))
            }
        }
        return actions + flushMarks(now: now) + maybeClaim(now: now)
    }

    public mutating func claimFailed(now: Double) -> [Action] {
        claiming = false
        claimRetryAt = now + settings.databaseRetry
        return [.report(.claimFailed)]
    }

    /// The answer (or failure) for the push of outbox row `outboxID`; `random` in [0, 1) for jitter.
    public mutating func answered(_ outboxID: Int64, _ answer: APNsAnswer, now: Double, random: Double) -> [Action] {
        guard let entry = inFlight.removeValue(forKey: outboxID) else { return [] }
        let job = entry.job
        let decision = PushDecision.decide(answer)
        var actions: [Action] = []
        var latency: Double?
        switch decision {
        case .delivered:
            pendingMarks.append(.delivered(job))
            if let since = job.pendingSinceMs { latency = max(0, now - Double(since) / 1000) }
        case .retire(let since):
            // "Bad token" also means "wrong environment": one try in the other before the
            // token goes (a device registered with the wrong environment keeps its tokens).
            if case .status(400, _, _) = answer, !job.switchedEnvironment, running {
                var other = job
                other.environment = job.environment.other
                other.switchedEnvironment = true
                inFlight[outboxID] = (other, entry.payload, tokenGeneration)
                return [.report(.triedOtherEnvironment(job)), .send(other, entry.payload, tokenGeneration: tokenGeneration)]
            }
            pendingMarks.append(.retire(job, invalidSinceMs: since ?? job.claimedAtMs, status: Self.label(answer)))
        case .retry(let result):
            let delay = PushDecision.retryDelay(result, attempts: job.attempts, policy: settings.retry, random: random)
            pendingMarks.append(.retry(job, afterSeconds: delay, status: Self.label(answer), countsAsAttempt: true))
        case .renewProviderToken:
            switch settings.providerToken.onExpired(generation: entry.generation, current: tokenGeneration,
                                                    mintedAt: tokenMintedAt ?? now, renewedForExpiry: tokenRenewedForExpiry, now: now) {
            case .renew:
                actions.append(mint(now: now, forExpiry: true))
                fallthrough
            case .resend:
                if running {
                    inFlight[outboxID] = (job, entry.payload, tokenGeneration)
                    actions.append(.send(job, entry.payload, tokenGeneration: tokenGeneration))
                } else {
                    pendingMarks.append(.retry(job, afterSeconds: 0, status: Self.label(answer), countsAsAttempt: false))
                }
            case .backOff:
                actions.append(.report(.providerTokenStillExpired))
                let delay = settings.retry.delay(afterAttempt: job.attempts, random: random)
                pendingMarks.append(.retry(job, afterSeconds: delay, status: Self.label(answer), countsAsAttempt: true))
            }
        case .stopSending:
            let until: Double
            if let s = stoppedUntil, s > now {
                until = s
            } else {
                until = now + settings.rejectedTokenPause
                stoppedUntil = until
                renewOnResume = true
                actions.append(.report(.sendingStopped(until: until, answer)))
            }
            pendingMarks.append(.retry(job, afterSeconds: until - now, status: Self.label(answer), countsAsAttempt: false))
        case .pauseForProviderToken:
            let until: Double
            if let s = stoppedUntil, s > now {
                until = s
            } else {
                until = max(now + settings.databaseRetry, (tokenMintedAt ?? now) + settings.providerToken.minRenewAge)
                stoppedUntil = until
                actions.append(.report(.sendingPaused(until: until)))
            }
            pendingMarks.append(.retry(job, afterSeconds: until - now, status: Self.label(answer), countsAsAttempt: false))
        case .reject:
            pendingMarks.append(.failed(job, status: Self.label(answer)))
        case .release:
            pendingMarks.append(.retry(job, afterSeconds: 0, status: Self.label(answer), countsAsAttempt: false))
        }
        actions.append(.report(.answered(job, decision.result, answer, latency: latency)))
        return actions + flushMarks(now: now) + maybeClaim(now: now)
    }

    /// The marks handed out last were written (`ok`) or not (they are written again later;
    /// their leases keep the rows from other senders meanwhile).
    public mutating func marked(ok: Bool, now: Double) -> [Action] {
        guard let batch = marking else { return [] }
        marking = nil
        var actions: [Action] = []
        if ok {
            // A delivered row may be due again (a change arrived during its push), a released
            // or re-registered one is due at once.
            if batch.contains(where: Self.mayBeDueAgain) { wantClaim = true }
        } else {
            pendingMarks = batch + pendingMarks
            markRetryAt = now + settings.databaseRetry
            actions.append(.report(.markFailed(count: batch.count)))
        }
        return actions + flushMarks(now: now) + maybeClaim(now: now)
    }

    /// The provider token of `generation` is there: made at `issuedAt` (its `iat`, which may be
    /// older than this process), and sending is paused until `pausedUntil` deployment-wide.
    public mutating func providerTokenReady(generation: Int, issuedAt: Double, pausedUntil: Double?, now: Double) -> [Action] {
        guard generation == tokenGeneration else { return [] }
        tokenMintedAt = issuedAt
        guard let pausedUntil, pausedUntil > now, (stoppedUntil ?? 0) < pausedUntil else { return [] }
        stoppedUntil = pausedUntil
        return [.report(.sendingPaused(until: pausedUntil))]
    }

    /// The provider token of `generation` could not be had (the database): the sends waiting
    /// for it come back answered `.transport(.cancelled)`; the next claim tries again.
    public mutating func providerTokenFailed(generation: Int, now: Double) -> [Action] {
        guard generation == tokenGeneration else { return [] }
        tokenMintedAt = nil
        claimRetryAt = now + settings.databaseRetry
        return [.wake(at: claimRetryAt)]
    }

    /// Shutting down: no more claims; what is answered is still marked.
    public mutating func stop(now: Double) -> [Action] {
        running = false
        return flushMarks(now: now)
    }

    // MARK: - Decisions

    private mutating func maybeClaim(now: Double) -> [Action] {
        guard running, wantClaim, !claiming, now >= claimRetryAt else { return [] }
        if let until = stoppedUntil {
            guard now >= until else { return [] }
            stoppedUntil = nil
            // The next send gets the token again (a new one if the old one was refused).
            tokenMintedAt = nil
            return [.report(.sendingResumed)] + maybeClaim(now: now)
        }
        let room = settings.maxInFlight - inFlight.count
        let limit = min(settings.claimBatch, room)
        // Wait for room rather than claim a handful at a time.
        guard limit > 0, limit * 4 >= min(settings.claimBatch, settings.maxInFlight) || inFlight.isEmpty else { return [] }
        let next = lastClaimAt + settings.claimInterval
        if !lastClaimFull && now < next { return [.wake(at: next)] }
        claiming = true
        wantClaim = false
        lastClaimAt = now
        return [.claim(limit: limit)]
    }

    private mutating func flushMarks(now: Double) -> [Action] {
        guard marking == nil, !pendingMarks.isEmpty, now >= markRetryAt else { return [] }
        let next = lastMarkAt + settings.markInterval
        if now < next { return [.wake(at: next)] }
        lastMarkAt = now
        marking = pendingMarks
        pendingMarks = []
        return [.mark(marking!)]
    }

    private mutating func ensureProviderToken(now: Double) -> [Action] {
        guard settings.providerToken.isDue(mintedAt: tokenMintedAt, now: now) else { return [] }
        let renew = renewOnResume
        renewOnResume = false
        return [mint(now: now, forExpiry: false, renew: renew)]
    }

    private mutating func mint(now: Double, forExpiry: Bool, renew: Bool? = nil) -> Action {
        tokenGeneration += 1
        tokenMintedAt = now
        tokenRenewedForExpiry = forExpiry
        return .obtainProviderToken(generation: tokenGeneration, renew: renew ?? forExpiry)
    }

    static func mayBeDueAgain(_ mark: PushMark) -> Bool {
        switch mark {
        case .delivered, .retire: return true
        case .retry(_, let after, _, _): return after <= 0
        case .skipped, .failed, .drop: return false
        }
    }

    /// The answer as the outbox's `last_status` and logs show it: `410 Unregistered`, `timeout`.
    public static func label(_ answer: APNsAnswer) -> String {
        switch answer {
        case .status(let s, let reason, _): return reason.map { "\(s) \($0)" } ?? String(s)
        case .transport(let f): return f.rawValue
        }
    }
}
