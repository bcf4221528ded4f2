import DispatchCore
import DispatchCrypto
import DispatchIO
import DispatchSystem
import Synchronization

/// The push sender of one worker: performs what `PushSenderMachine` decides, with its own
/// database session (claims and marks never queue behind publishing or reads) and one
/// multiplexed HTTP/2 connection to APNs (`H2Client.Options.apns`).
///
/// What wakes it: this worker's commits that marked the outbox (`kick`), and a poll every
/// `pollInterval` for everything else (retries coming due, other processes' marks, leases of
/// a sender that died).
final class PushService {
    /// What a claimed row needs for its request, carried through the machine.
    struct Prepared {
        let token: String
        let body: [UInt8]
        let priority: Int
        let expiration: Int64
        /// A broadcast start naming its channel: the body for the other environment (tried after
        /// `BadDeviceToken`), which asks for an update token instead (a channel lives in one).
        var otherEnvironmentBody: [UInt8]? = nil
    }

    typealias Machine = PushSenderMachine<Prepared>

    static let pollInterval = 0.2
    /// How long a broadcast activity's push-to-start waits for its channel.
    static let channelWaitMs: Int64 = 30_000
    static let depthInterval = 5.0

    let metrics: PushMetrics
    private let loop: LoopScheduling
    private let db: PGConnection
    private let client: HTTPRequestSending
    /// Unix seconds: what the machine's times (and the provider token's `iat`) are measured in.
    private let clock: () -> Double
    private let settings: APNsSettings
    private let signer: ES256Signer
    private let vault: TokenVault
    private let log: Logger
    private let dismissalSeconds: Int64
    private let leaseMs: Int
    private let requestTimeout: Double
    /// `APNsSettings.pushToStartLimit`.
    private var startLimit: Int { settings.pushToStartLimit }
    private var machine: Machine
    private var providerToken: (generation: Int, jwt: String)?
    private let tokenStore: ProviderTokenStore
    private let broadcasts: BroadcastService
    /// Sends waiting for the provider token of their generation.
    private var waitingForToken: [(job: PushJob, prepared: Prepared, generation: Int)] = []
    private var timers: [Timer] = []
    /// Backoff jitter only: seeded once, so an answer costs no getrandom call.
    private var rng = SeededGenerator(seed: UInt64.random(in: 1...UInt64.max))
    /// Per answer class: when it was last logged, and how many went unlogged since.
    private var logGate: [String: (last: Double, count: Int)] = [:]
    private var closed = false
    /// Names claimed rows in this process (the machine's handle for a row).
    private var nextLocalID: Int64 = 0
    /// When the one-shot wake-up timer fires (nil: none armed).
    private var wakeAt: Double?

    /// `driver` carries the sender's own database session (`LibpqDriver` on the worker's loop),
    /// `makeClient` builds the APNs client from its options (`H2Client` on that loop), and
    /// `clock` tells the time in Unix seconds; unit tests pass a scripted driver and sender
    /// and a manual loop's clock.
    init(loop: LoopScheduling, driver: PGDriver, conninfo: String, settings: APNsSettings, signer: ES256Signer, vault: TokenVault,
         dismissalSeconds: Int, leaseSeconds: Int, log: Logger, clock: @escaping () -> Double = PushService.wallClock,
         makeClient: (H2Client.Options) -> HTTPRequestSending) {
        self.loop = loop
        self.clock = clock
        self.settings = settings
        self.signer = signer
        self.vault = vault
        self.log = log
        self.dismissalSeconds = Int64(dismissalSeconds)
        leaseMs = leaseSeconds * 1000
        // A push must be answered (or given up) well inside its lease, or a second sender
        // could claim it while the first still waits.
        requestTimeout = min(10, Double(leaseSeconds) / 3)
        db = PGConnection(loop: loop, driver: driver, conninfo: conninfo, name: "push", log: log)
        client = makeClient(.apns(caFile: settings.caFile, idleSeconds: settings.idleSeconds))
        machine = Machine()
        tokenStore = ProviderTokenStore(db: db, settings: settings, signer: signer, vault: vault,
                                        policy: machine.settings.providerToken, log: log, clock: clock)
        metrics = PushMetrics()
        broadcasts = BroadcastService(loop: loop, db: db, curl: client, settings: settings, tokenStore: tokenStore, metrics: metrics,
                                      dismissalSeconds: Int64(dismissalSeconds), leaseMs: leaseMs, requestTimeout: requestTimeout, log: log,
                                      clock: clock)
        broadcasts.onPaused = { [unowned self] until in
            self.perform(self.machine.pausedByBroadcasts(until: Double(until), now: self.now()))
        }
        // Open HTTP/2 connections are the HTTP/2 client's to count (a scripted one has none).
        metrics.connections = { [client] in (client as? H2Client)?.openConnections ?? 0 }
        metrics.replaced = { [client] in
            guard let c = client as? H2Client else { return [:] }
            return Dictionary(uniqueKeysWithValues: c.replaced.map { ($0.key.rawValue, $0.value) })
        }
        metrics.pings = { [client] in (client as? H2Client)?.pingsSent ?? 0 }
    }

    /// Whether this process already said how its idle APNs connections are checked.
    private static let upkeepAnnounced = Mutex(false)

    /// Says once per process how idle APNs connections are checked (HTTP/2 PING).
    private func announceUpkeep() {
        guard let c = client as? H2Client, Self.upkeepAnnounced.withLock({ done in defer { done = true }; return !done }) else { return }
        log.info("apns.idle_ping", [("ping_after_s", settings.idleSeconds), ("answer_within_s", c.options.pingAnswerSeconds)])
    }

    /// Settings of the sender's session, sent before anything else on each (re)connection.
    /// Its commits need not wait for the disk: after a database crash a lost claim is a lease
    /// that runs out, a lost mark a push sent again, never a push lost (the changes that make
    /// pushes are committed durably by the publish path). Its statements are written to have
    /// good generic plans, so they are not planned again on every execution.
    static let sessionSettings = [PGQuery("SET synchronous_commit TO off"), PGQuery("SET plan_cache_mode TO force_generic_plan")]

    func start() {
        db.onReady = { [unowned self] in
            self.db.execute(Self.sessionSettings) { _ in }
            self.perform(self.machine.tick(now: now()))
            self.broadcasts.poll()
        }
        db.start()
        timers.append(loop.timer(after: Self.pollInterval, repeating: true) { [unowned self] in
            self.perform(self.machine.tick(now: now()))
            self.broadcasts.poll()
        })
        timers.append(loop.timer(after: 0.05) { [unowned self] in self.readDepth() })
        timers.append(loop.timer(after: Self.depthInterval, repeating: true) { [unowned self] in self.readDepth() })
        announceUpkeep()
        log.info("push.started", [("apns", settings.url), ("apns_sandbox", settings.sandboxURL), ("topic", settings.apnsTopic), ("key_id", settings.keyID),
                                  ("lease_s", leaseMs / 1000)])
    }

    /// This worker committed changes (or a registration) that marked the outbox.
    func kick() {
        guard !closed else { return }
        perform(machine.kick(now: now()))
        broadcasts.kick()
    }

    /// Arms the wake-up timer for `at` unless it fires sooner already.
    private func wake(at: Double) {
        if let armed = wakeAt, armed <= at { return }
        wakeAt = at
        loop.timer(after: max(0, at - now())) { [weak self] in
            guard let self, !self.closed, self.wakeAt == at else { return }
            self.wakeAt = nil
            self.perform(self.machine.tick(now: now()))
        }
    }

    /// Stops claiming; what is answered from now on is still marked until `close`.
    func shutdown() {
        perform(machine.stop(now: now()))
    }

    /// Ends every request and the database session. Pushes still unanswered stay leased and
    /// are sent again when the lease ends (APNs may have taken them: a duplicate push of the
    /// same state, which the phone shows once).
    func close() {
        guard !closed else { return }
        closed = true
        broadcasts.close()
        for t in timers { t.cancel() }
        timers.removeAll()
        client.close()
        db.close()
    }

    static func wallClock() -> Double { Double(Clock.nowMilliseconds()) / 1000 }

    private func now() -> Double { clock() }

    // MARK: - Performing the machine's actions

    private func perform(_ actions: [Machine.Action]) {
        for action in actions {
            switch action {
            case .claim(let limit): claim(limit)
            case .obtainProviderToken(let generation, let renew): obtainToken(generation, renew: renew)
            case .send(let job, let prepared, let generation): send(job, prepared, generation: generation)
            case .mark(let marks): mark(marks)
            case .report(let report): self.report(report)
            case .wake(let at): wake(at: at)
            }
        }
        metrics.inFlight = machine.inFlightCount
    }

    /// Claims rows and entries and reads the entries' activities and tokens in one batch (one
    /// round trip: the reads are later statements, so they see what committed before the
    /// claim); the rows, rare in steady state, are read by a second trip.
    private func claim(_ limit: Int) {
        guard !closed else { return }
        // An entry fans out to several tokens: fewer entries than rows per claim.
        let entryLimit = max(1, limit / 4)
        db.execute([PushOutboxRepository.claim(limit: limit, leaseMs: leaseMs), PushFanOutRepository.claim(limit: entryLimit, leaseMs: leaseMs),
                    PushFanOutRepository.readActivities(), PushFanOutRepository.readTargets()]) { [weak self] result in
            guard let self, !self.closed else { return }
            switch result {
            case .success(let rs) where rs.count == 4 && rs.allSatisfy(\.ok):
                let rows = rs[0].rows.compactMap { r -> PushOutboxRepository.ClaimedRow? in
                    self.nextLocalID += 1
                    return PushOutboxRepository.decodeClaim(r, localID: self.nextLocalID)
                }
                var entries = rs[1].rows.compactMap { r -> PushFanOutRepository.ClaimedEntry? in
                    self.nextLocalID += 1
                    return PushFanOutRepository.decodeClaim(r, localID: self.nextLocalID)
                }
                PushFanOutRepository.complete(&entries, activities: rs[2], targets: rs[3])
                let fannedOut = entries.flatMap(self.fanOut)
                let full = rows.count >= limit || entries.count >= entryLimit
                if rows.isEmpty { return self.perform(self.machine.claimed(fannedOut, requested: limit, full: full, now: now())) }
                self.read(rows, then: fannedOut, requested: limit, full: full)
            case .success(let rs):
                self.log.error("push.claim_failed", [("error", (rs.first { !$0.ok }?.errorMessage ?? "").trimmingNewlines)])
                self.perform(self.machine.claimFailed(now: now()))
            case .failure:
                self.perform(self.machine.claimFailed(now: now()))
            }
        }
    }

    /// Reads what the claimed rows push (a later snapshot than their claim's).
    private func read(_ claimed: [PushOutboxRepository.ClaimedRow], then fannedOut: [Machine.Claimed], requested: Int, full: Bool) {
        db.execute([PushOutboxRepository.read(claimed)]) { [weak self] result in
            guard let self, !self.closed else { return }
            guard case .success(let rs) = result, rs.count == 1, rs[0].ok else {
                // The rows stay leased; give them back when the database answers again.
                let items = claimed.map { Machine.Claimed.settle(.retry($0.job, afterSeconds: 1, status: .database, countsAsAttempt: false)) }
                return self.perform(self.machine.claimed(items + fannedOut, requested: requested, full: full, now: now()))
            }
            var byKey: [String: PGRow] = [:]
            for r in rs[0].rows { if let k = PushOutboxRepository.readKey(r) { byKey[k] = r } }
            // Starts of this batch count against their device's budget as they are planned.
            var starts = StartBudget(limit: self.startLimit)
            let items = claimed.map { row -> Machine.Claimed in
                var row = row
                if let r = byKey[row.key] { PushOutboxRepository.complete(&row, with: r) }
                return self.prepare(row, starts: &starts)
            }
            self.perform(self.machine.claimed(items + fannedOut, requested: requested, full: full, now: now()))
        }
    }

    /// A claimed entry becomes one request body shared by a push per token (the devices whose
    /// own row carries the newest state, or carried it already, passed over), or is settled.
    /// A token that will not open is retired on its own.
    private func fanOut(_ claimed: PushFanOutRepository.ClaimedEntry) -> [Machine.Claimed] {
        var entry = claimed.entry
        // A touch asked for a new stale-date and nothing newer is waiting: the same
        // content-state goes again, to the devices that have it too (contract §5.4).
        let refreshOnly = claimed.staleRefresh && entry.seq <= claimed.sentSeq
        switch PushPlan.make(kind: .update, snapshot: claimed.snapshot, hasToken: true, lastTimestamp: claimed.lastTimestamp,
                             priority: refreshOnly ? 5 : claimed.priority, dismissalDelaySeconds: dismissalSeconds,
                             staleDeadlineMs: claimed.staleDeadlineMs, sentAtSeconds: Int64(now())) {
        case .drop, .skip:
            return [.settle(.dropEntry(entry))]
        case .send(let body, let timestamp, let priority, let expiration):
            entry.timestamp = timestamp
            // A refresh is paced like progress from when it goes, not from the old change.
            entry.changedAtMs = refreshOnly ? entry.claimedAtMs : (claimed.snapshot?.updatedAt ?? entry.claimedAtMs)
            entry.staleDate = claimed.staleDeadlineMs.map(LiveActivityPayload.seconds) ?? 0
            var jobs: [(PushJob, Prepared)] = []
            var unreadable: [Machine.Claimed] = []
            for t in claimed.targets {
                if t.rowPending || (!refreshOnly && (t.rowSentSeq ?? 0) >= entry.seq) {
                    entry.passedOver.append(t.deviceID)
                    continue
                }
                nextLocalID += 1
                var job = PushJob(outboxID: nextLocalID, leaseID: entry.leaseID, kind: .update, activityID: entry.activityID, deviceID: t.deviceID,
                                  seq: entry.seq, timestamp: timestamp, attempts: 1, pendingSinceMs: entry.pendingSinceMs,
                                  claimedAtMs: entry.claimedAtMs, tokenMac: t.mac, tokenHint: t.hint)
                job.environment = t.environment
                job.changedAtMs = entry.changedAtMs
                job.entryID = entry.entryID
                job.priority = priority
                job.clearsFailedRow = t.rowFailed
                job.staleDate = entry.staleDate
                guard let token = vault.open(t.sealed, mac: t.mac) else {
                    log.error("push.token_unreadable", [("activity", job.activityID), ("device", job.deviceID), ("kind", job.kind.rawValue),
                                                        ("hint", "DISPATCH_TOKEN_KEY changed? the token is retired; the phone registers it again")])
                    unreadable.append(.settle(.retire(job, invalidSinceMs: job.claimedAtMs, status: .unreadableToken)))
                    continue
                }
                jobs.append((job, Prepared(token: token, body: body, priority: priority, expiration: expiration)))
            }
            return [.fanOut(entry, jobs)] + unreadable
        }
    }

    /// A claimed row becomes a request, or is settled without one.
    private func prepare(_ row: PushOutboxRepository.ClaimedRow, starts: inout StartBudget) -> Machine.Claimed {
        var job = row.job
        // A broadcast activity's push-to-start names its channel: it waits while the channel is
        // made, at most `channelWait` (APNs unreachable: the start goes without one).
        if job.kind == .start, let a = row.snapshot, a.broadcast, a.channelId == nil, row.channelPhase == .create, !a.state.isTerminal,
           job.claimedAtMs - a.createdAt < Self.channelWaitMs {
            return .settle(.retry(job, afterSeconds: 0.2, status: .waitingForChannel, countsAsAttempt: false))
        }
        // A channel lives in one environment: only a device registered there can subscribe to
        // it; the others are asked for an update token instead (contract §5.2).
        let channel = row.snapshot?.channelId.flatMap { job.environment == settings.broadcastEnvironment ? $0 : nil }
        switch PushPlan.make(kind: job.kind, snapshot: row.snapshot, hasToken: row.tokenSealed != nil, lastTimestamp: row.lastTimestamp,
                             priority: row.priority, dismissalDelaySeconds: dismissalSeconds, staleDeadlineMs: row.staleDeadlineMs,
                             channelID: channel, sentAtSeconds: Int64(now())) {
        case .drop:
            return .settle(.drop(job))
        case .skip:
            return .settle(.skipped(job))
        case .send(let body, let timestamp, let priority, let expiration):
            if job.kind == .start && !starts.take(device: job.deviceID, sentLastHour: row.startsLastHour) {
                // Past the device's budget: APNs would answer 200 and the phone show nothing.
                metrics.startsOverBudget += 1
                log.warning("push.start_over_budget", [("activity", job.activityID), ("device", job.deviceID), ("token", job.tokenHint),
                                                       ("limit", startLimit), ("hint", "DISPATCH_PUSH_TO_START_LIMIT starts in the last hour; not sent")])
                return .settle(.skipped(job))
            }
            job.timestamp = timestamp
            job.priority = priority
            job.staleDate = row.staleDeadlineMs.map(LiveActivityPayload.seconds) ?? 0
            job.changedAtMs = row.snapshot?.updatedAt ?? job.claimedAtMs
            guard let sealed = row.tokenSealed, let token = vault.open(sealed, mac: job.tokenMac) else {
                log.error("push.token_unreadable", [("activity", job.activityID), ("device", job.deviceID), ("kind", job.kind.rawValue),
                                                    ("hint", "DISPATCH_TOKEN_KEY changed? the token is retired; the phone registers it again")])
                return .settle(.retire(job, invalidSinceMs: job.claimedAtMs, status: .unreadableToken))
            }
            var prepared = Prepared(token: token, body: body, priority: priority, expiration: expiration)
            if channel != nil, case .send(let other, _, _, _) = PushPlan.make(
                kind: job.kind, snapshot: row.snapshot, hasToken: true, lastTimestamp: row.lastTimestamp, priority: row.priority,
                dismissalDelaySeconds: dismissalSeconds, staleDeadlineMs: row.staleDeadlineMs, channelID: nil, sentAtSeconds: Int64(now())) {
                prepared.otherEnvironmentBody = other
            }
            return .send(job, prepared)
        }
    }

    /// The deployment's token for `generation` (ProviderTokenStore); the sends of that
    /// generation wait for it.
    private func obtainToken(_ generation: Int, renew: Bool) {
        let refused = renew ? providerToken?.jwt : nil
        tokenStore.obtain(refused: refused, now: Int64(now())) { [weak self] result in
            guard let self, !self.closed else { return }
            switch result {
            case .success(let token):
                if (self.providerToken?.generation ?? 0) < generation { self.providerToken = (generation, token.jwt) }
                self.perform(self.machine.providerTokenReady(generation: generation, issuedAt: Double(token.issuedAt),
                                                             pausedUntil: token.pausedUntil.map(Double.init), now: now()))
            case .failure(let failure):
                self.log.error("apns.provider_token_failed", [("error", "\(failure)")])
                self.perform(self.machine.providerTokenFailed(generation: generation, now: now()))
            }
            self.sendWaiting(failed: { if case .failure = result { return true } else { return false } }())
        }
    }

    /// Sends what waited for a token now there; with `failed`, answers what cannot be sent.
    private func sendWaiting(failed: Bool) {
        let have = providerToken?.generation ?? 0
        let waiting = waitingForToken
        waitingForToken = []
        for w in waiting {
            if w.generation <= have {
                send(w.job, w.prepared, generation: w.generation)
            } else if failed {
                perform(machine.answered(w.job.outboxID, .transport(.cancelled), now: now(), random: 0))
            } else {
                waitingForToken.append(w)
            }
        }
    }

    private func send(_ job: PushJob, _ p: Prepared, generation: Int) {
        guard let token = providerToken, token.generation >= generation else {
            return waitingForToken.append((job, p, generation))
        }
        let jwt = token.jwt
        let body = job.environment != settings.broadcastEnvironment ? p.otherEnvironmentBody ?? p.body : p.body
        let request = APNsRequest.make(settings, environment: job.environment, token: p.token, providerToken: jwt, body: body, priority: p.priority,
                                       expiration: p.expiration, timeout: requestTimeout)
        client.send(request) { [weak self] result in
            guard let self else { return }
            let answer: APNsAnswer
            switch result {
            case .success(let response): answer = APNsAnswer.parse(status: response.status, body: response.body)
            case .failure(let failure): answer = .transport(APNsRequest.failure(failure.kind))
            }
            if self.closed { return }
            self.perform(self.machine.answered(job.outboxID, answer, now: now(), random: Double.random(in: 0..<1, using: &self.rng)))
        }
    }

    private func mark(_ marks: [PushMark]) {
        db.execute(PushOutboxRepository.marks(marks, paceSeconds: settings.pace)) { [weak self] result in
            guard let self, !self.closed else { return }
            var ok = false
            switch result {
            case .success(let rs):
                ok = rs.allSatisfy(\.ok)
                if let e = rs.first(where: { !$0.ok })?.errorMessage { self.log.error("push.mark_failed", [("error", e.trimmingNewlines)]) }
            case .failure(let e):
                self.log.warning("push.mark_failed", [("error", e.message.trimmingNewlines)])
            }
            self.perform(self.machine.marked(ok: ok, now: now()))
        }
    }

    private func readDepth() {
        guard db.isReady else { return }
        db.execute([DeviceRepository.depth]) { [weak self] result in
            if case .success(let rs) = result, let n = rs.first?.first?.int("depth") { self?.metrics.outboxDepth = n }
        }
    }

    // MARK: - Reports: metrics and logs (never a token, only its last digits)

    private func report(_ report: Machine.Report) {
        switch report {
        case .answered(let job, let result, let answer, let latency):
            metrics.sent[result, default: 0] += 1
            if let latency { metrics.observeLatency(latency) }
            let fields: [(String, Any)] = [("activity", job.activityID), ("device", job.deviceID), ("kind", job.kind.rawValue),
                                           ("token", job.tokenHint), ("status", Machine.label(answer)), ("attempt", job.attempts)]
            switch result {
            case .delivered:
                break
            case .retired:
                log.info("push.token_retired", fields)
            case .rejected:
                log.error("push.rejected", fields + [("hint", "APNs refused the request itself: a bug in the payload or headers; not retried")])
            case .throttled, .serverError, .connectionError, .providerTokenExpired, .providerTokenRejected, .providerTokenThrottled:
                gatedLog(result.rawValue, fields)
            }
        case .sendingStopped(let until, let answer):
            log.error("apns.provider_token_rejected", [
                ("status", Machine.label(answer)), ("paused_s", Int(until - now())),
                ("check", "DISPATCH_APNS_KEY_ID, DISPATCH_APNS_TEAM_ID and DISPATCH_APNS_KEY_FILE must belong together and the key must allow APNs"),
            ])
        case .sendingPaused(let until):
            tokenStore.pause(until: Int64(until.rounded(.up)))
            log.error("apns.sending_paused", [("paused_s", Int(until - now())),
                                              ("why", "429 TooManyProviderTokenUpdates: the team's provider token changed too often; is another deployment using this key?")])
        case .sendingResumed:
            log.info("apns.sending_resumed")
        case .triedOtherEnvironment(let job):
            log.info("push.other_environment", [("activity", job.activityID), ("device", job.deviceID), ("token", job.tokenHint),
                                                ("registered", job.environment.rawValue), ("trying", job.environment.other.rawValue)])
        case .providerTokenStillExpired:
            log.warning("apns.provider_token_expired_again", [("hint", "a fresh token was called expired: is this machine's clock right?")])
        case .claimFailed:
            gatedLog("claim_failed", [])
        case .markFailed(let count):
            log.warning("push.marks_deferred", [("count", count)])
        }
    }

    /// One line per answer class per 10 seconds, with how many there were since the last.
    private func gatedLog(_ kind: String, _ fields: [(String, Any)]) {
        let now = Clock.monotonic()
        var gate = logGate[kind] ?? (last: -100, count: 0)
        gate.count += 1
        if now - gate.last >= 10 {
            log.warning("push.not_delivered", [("class", kind), ("count", gate.count)] + fields)
            gate = (now, 0)
        }
        logGate[kind] = gate
    }
}
