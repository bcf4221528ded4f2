/// The push sender of one server process, as a pure state machine: claims due outbox rows
/// and activity entries in batches, sends each row's push and each entry's push to every
/// token of its activity (many in flight on one HTTP/2 connection), decides from each
/// answer what to write back, and writes marks in batches. An entry is marked once every push
/// of its fan-out is answered; a push that failed leaves its device a row of its own (its own
/// backoff), so one phone never holds the others back. The shell (`PushService`)
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
        /// Settled without a push (skipped, dropped, an unreadable token, an entry given back).
        case settle(PushMark)
        /// An activity entry and its pushes, one per token (none: the entry is done at once).
        /// Each job's `entryID` is the entry's.
        case fanOut(PushEntry, [(PushJob, Payload)])
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
    /// Fanned-out entries with pushes unanswered.
    private var entries: [Int64: EntryProgress] = [:]
    /// Fanned-out pushes waiting for room under `maxInFlight`, oldest first.
    private var backlog: [(job: PushJob, payload: Payload)] = []
    private var backlogHead = 0
    struct EntryProgress {
        var entry: PushEntry
        var devices: Int
        var outstanding: Int
        var delivered = 0
    }
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
    /// Fanned-out entries with pushes unanswered.
    public var entriesInFlight: Int { entries.count }

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

    /// A claim came back: `requested` rows were asked for (`full`: the shell tells whether a
    /// batch came back full, when it claimed rows and entries apart).
    public mutating func claimed(_ items: [Claimed], requested: Int, full: Bool? = nil, now: Double) -> [Action] {
        claiming = false
        // A full batch: more may be waiting, at once.
        lastClaimFull = full ?? (items.count >= requested)
        if lastClaimFull { wantClaim = true }
        var actions: [Action] = []
        for item in items {
            switch item {
            case .settle(let mark):
                pendingMarks.append(mark)
            case .fanOut(let entry, let jobs):
                if !running {
                    pendingMarks.append(.releaseEntry(entry, afterSeconds: 0, status: .shutdown))
                    continue
                }
                guard !jobs.isEmpty else {
                    pendingMarks.append(.fannedOut(entry, devices: 0, delivered: 0))
                    continue
                }
                actions += ensureProviderToken(now: now)
                entries[entry.entryID] = EntryProgress(entry: entry, devices: jobs.count, outstanding: jobs.count)
                // A fan-out wider than the room left waits here, not in the HTTP/2 client's
                // queue, where its requests' deadlines would run while they wait.
                backlog.append(contentsOf: jobs.map { (job: $0.0, payload: $0.1) })
                actions += sendBacklog()
            case .send(let job, let payload):
                if !running {
                    pendingMarks.append(.retry(job, afterSeconds: 0, status: .shutdown, countsAsAttempt: false))
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
            settle(.delivered(job))
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
            settle(.retire(job, invalidSinceMs: since ?? job.claimedAtMs, status: .answer(answer)))
        case .retry(let result):
            let delay = PushDecision.retryDelay(result, attempts: job.attempts, policy: settings.retry, random: random)
            settle(.retry(job, afterSeconds: delay, status: .answer(answer), countsAsAttempt: true))
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
                    settle(.retry(job, afterSeconds: 0, status: .answer(answer), countsAsAttempt: false))
                }
            case .backOff:
                actions.append(.report(.providerTokenStillExpired))
                let delay = settings.retry.delay(afterAttempt: job.attempts, random: random)
                settle(.retry(job, afterSeconds: delay, status: .answer(answer), countsAsAttempt: true))
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
            settle(.retry(job, afterSeconds: until - now, status: .answer(answer), countsAsAttempt: false))
        case .pauseForProviderToken:
            let until: Double
            if let s = stoppedUntil, s > now {
                until = s
            } else {
                until = max(now + settings.databaseRetry, (tokenMintedAt ?? now) + settings.providerToken.minRenewAge)
                stoppedUntil = until
                actions.append(.report(.sendingPaused(until: until)))
            }
            settle(.retry(job, afterSeconds: until - now, status: .answer(answer), countsAsAttempt: false))
        case .reject:
            settle(.failed(job, status: .answer(answer)))
        case .release:
            settle(.retry(job, afterSeconds: 0, status: .answer(answer), countsAsAttempt: false))
        }
        actions.append(.report(.answered(job, decision.result, answer, latency: latency)))
        return actions + sendBacklog() + flushMarks(now: now) + maybeClaim(now: now)
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

    /// The broadcast sender of this process met `429 TooManyProviderTokenUpdates` and paused
    /// the deployment until `until` (stored, and logged, by it): no claim before then.
    public mutating func pausedByBroadcasts(until: Double, now: Double) -> [Action] {
        guard until > now, (stoppedUntil ?? 0) < until else { return [] }
        stoppedUntil = until
        return []
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
        // Fanned-out pushes not sent yet: their devices get rows of their own, due at once.
        while backlogHead < backlog.count {
            settle(.retry(backlog[backlogHead].job, afterSeconds: 0, status: .shutdown, countsAsAttempt: false))
            backlogHead += 1
        }
        backlog.removeAll()
        backlogHead = 0
        return flushMarks(now: now)
    }

    // MARK: - Decisions

    /// Sends waiting fanned-out pushes while there is room.
    private mutating func sendBacklog() -> [Action] {
        var actions: [Action] = []
        while backlogHead < backlog.count && inFlight.count < settings.maxInFlight && running {
            let (job, payload) = backlog[backlogHead]
            backlogHead += 1
            inFlight[job.outboxID] = (job, payload, tokenGeneration)
            actions.append(.send(job, payload, tokenGeneration: tokenGeneration))
        }
        if backlogHead == backlog.count {
            backlog.removeAll(keepingCapacity: true)
            backlogHead = 0
        } else if backlogHead > 1024 && backlogHead * 2 > backlog.count {
            backlog.removeFirst(backlogHead)
            backlogHead = 0
        }
        return actions
    }

    /// A push is settled: its mark is queued, and its entry's when it was the last of the fan-out.
    /// A fanned-out push delivered writes nothing of its own unless it changes the device.
    private mutating func settle(_ mark: PushMark) {
        guard let job = mark.job, let entryID = job.entryID else { return pendingMarks.append(mark) }
        var delivered = false
        if case .delivered(let j) = mark {
            delivered = true
            if j.switchedEnvironment || j.clearsFailedRow { pendingMarks.append(mark) }
        } else {
            pendingMarks.append(mark)
        }
        guard var progress = entries[entryID] else { return }
        progress.outstanding -= 1
        if delivered { progress.delivered += 1 }
        if progress.outstanding > 0 {
            entries[entryID] = progress
        } else {
            entries[entryID] = nil
            pendingMarks.append(.fannedOut(progress.entry, devices: progress.devices, delivered: progress.delivered))
        }
    }

    private mutating func maybeClaim(now: Double) -> [Action] {
        guard running, wantClaim, !claiming, now >= claimRetryAt else { return [] }
        if let until = stoppedUntil {
            guard now >= until else { return [] }
            stoppedUntil = nil
            // The next send gets the token again (a new one if the old one was refused).
            tokenMintedAt = nil
            return [.report(.sendingResumed)] + maybeClaim(now: now)
        }
        let room = settings.maxInFlight - inFlight.count - (backlog.count - backlogHead)
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
        case .delivered, .retire, .fannedOut: return true
        case .retry(_, let after, _, _), .releaseEntry(_, let after, _): return after <= 0
        case .skipped, .failed, .drop, .dropEntry: return false
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
