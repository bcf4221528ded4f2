import DispatchCore
import DispatchCrypto
import DispatchIO
import DispatchSystem

/// Broadcast channels of one worker (contract §5.5): claims due `broadcast_outbox` rows,
/// asks APNs for what each needs (make the channel, push the newest state to it, delete it),
/// and writes the outcomes back, one cycle at a time (claim → read → send → mark). There are
/// few broadcast activities and one push per change each, so cycles are cheap; any number of
/// processes run one, the lease keeping a row with one of them.
final class BroadcastService {
    static let claimLimit = 100

    private let db: PGConnection
    private let curl: HTTPRequestSending
    private let settings: APNsSettings
    private let tokenStore: ProviderTokenStore
    private let metrics: PushMetrics
    private let log: Logger
    private let dismissalSeconds: Int64
    private let leaseMs: Int
    private let requestTimeout: Double
    private let retry = Backoff(initial: 1, maximum: 300, jitter: .equal)
    private var token: ProviderTokenStore.Token?
    /// The JWT APNs last called expired: not to be used again.
    private var refusedJWT: String?
    private var busy = false
    private var wanted = false
    private var closed = false
    /// Whether any channel is being made or live, as of the last claim: commits wake the
    /// service only then (a claim per commit would cost every publish a query for nothing).
    private var active = false
    private var lastClaim = 0.0
    private var wakeArmed = false
    private let loop: LoopScheduling
    /// Unix seconds (the push sender's clock): token ages, stale dates, latencies, pauses.
    private let clock: () -> Double
    static let minClaimInterval = 0.01
    /// The deployment was paused by a broadcast's `TooManyProviderTokenUpdates` (until, Unix
    /// seconds): the token sender of this process stops claiming too.
    var onPaused: (Int64) -> Void = { _ in }

    init(loop: LoopScheduling, db: PGConnection, curl: HTTPRequestSending, settings: APNsSettings, tokenStore: ProviderTokenStore, metrics: PushMetrics,
         dismissalSeconds: Int64, leaseMs: Int, requestTimeout: Double, log: Logger, clock: @escaping () -> Double) {
        self.loop = loop
        self.clock = clock
        self.db = db
        self.curl = curl
        self.settings = settings
        self.tokenStore = tokenStore
        self.metrics = metrics
        self.dismissalSeconds = dismissalSeconds
        self.leaseMs = leaseMs
        self.requestTimeout = requestTimeout
        self.log = log
    }

    func close() { closed = true }

    /// A commit marked the outbox: a broadcast may be due, if any channel is in use.
    func kick() {
        if active { poll() }
    }

    /// Something may be due: claim unless a cycle runs (then another follows it), at most
    /// once per `minClaimInterval`.
    func poll() {
        wanted = true
        guard !busy, !closed, db.isReady else { return }
        let now = loop.now
        if now - lastClaim < Self.minClaimInterval {
            if !wakeArmed {
                wakeArmed = true
                loop.timer(after: Self.minClaimInterval) { [weak self] in
                    guard let self, !self.closed else { return }
                    self.wakeArmed = false
                    if self.wanted { self.poll() }
                }
            }
            return
        }
        lastClaim = now
        busy = true
        wanted = false
        db.execute([BroadcastRepository.claim(limit: Self.claimLimit, leaseMs: leaseMs, teamID: settings.teamID, keyID: settings.keyID),
                    BroadcastRepository.inUse]) { [weak self] result in
            guard let self, !self.closed else { return }
            guard case .success(let rs) = result, rs.count == 2, rs[0].ok else { return self.idle() }
            self.active = rs[1].first?.bool("in_use") ?? true
            let jobs = rs[0].rows.compactMap { BroadcastRepository.decode($0, defaultEnvironment: self.settings.broadcastEnvironment) }
            if jobs.isEmpty { return self.idle() }
            if jobs.count >= Self.claimLimit { self.wanted = true }
            self.read(jobs)
        }
    }

    private func idle() {
        busy = false
        if wanted { poll() }
    }

    private func read(_ jobs: [BroadcastJob]) {
        db.execute([BroadcastRepository.read(jobs.map(\.activityID))]) { [weak self] result in
            guard let self, !self.closed else { return }
            guard case .success(let rs) = result, rs[0].ok else {
                return self.mark(jobs.map { ($0, .retry(afterSeconds: 1, status: "database")) })
            }
            var byID: [String: StoredActivity] = [:]
            for r in rs[0].rows { if let s = StoredActivity(row: r) { byID[s.activity.activityId] = s } }
            self.withToken(refused: self.refusedJWT) { jwt in self.send(jobs, byID, jwt: jwt) }
        }
    }

    /// The deployment's provider token (shared with the token pushes through the database).
    private func withToken(refused: String? = nil, _ body: @escaping (String?) -> Void) {
        let now = nowSeconds()
        if let t = token, t.jwt != refused, !ProviderTokenPolicy().isDue(mintedAt: Double(t.issuedAt), now: Double(now)) {
            return body(t.jwt)
        }
        tokenStore.obtain(refused: refused, now: now) { [weak self] result in
            guard let self, !self.closed else { return }
            if case .success(let t) = result {
                self.token = t
                if t.jwt != refused { self.refusedJWT = nil }
            }
            body(self.token?.jwt)
        }
    }

    private func send(_ jobs: [BroadcastJob], _ activities: [String: StoredActivity], jwt: String?) {
        var outcomes: [(BroadcastJob, BroadcastOutcome)] = []
        var remaining = jobs.count
        func done(_ job: BroadcastJob, _ outcome: BroadcastOutcome) {
            outcomes.append((job, outcome))
            remaining -= 1
            if remaining == 0 { mark(outcomes) }
        }
        let unixNow = nowSeconds()
        for var job in jobs {
            let stored = activities[job.activityID]
            let stale = stored.flatMap { LiveActivityPayload.staleDeadline($0.activity, staleAfterSeconds: $0.staleAfter, touchedMs: $0.touchedMs) }
            if job.phase == .create { job.environment = settings.broadcastEnvironment }
            job.changedAtMs = stored?.activity.updatedAt ?? job.claimedAtMs
            job.staleDate = stale.map(LiveActivityPayload.seconds) ?? 0
            let request = BroadcastRequest.make(job, snapshot: stored?.activity, staleDeadlineMs: stale, dismissalDelaySeconds: dismissalSeconds,
                                                nowSeconds: unixNow)
            guard let jwt, let http = httpRequest(request, job, jwt: jwt) else {
                let outcome: BroadcastOutcome = request == .forget ? .deleted : .retry(afterSeconds: 1, status: "no provider token")
                done(job, outcome)
                continue
            }
            curl.send(http) { [weak self] result in
                guard let self, !self.closed else { return }
                let answer: APNsAnswer, channel: String?
                switch result {
                case .success(let r):
                    answer = APNsAnswer.parse(status: r.status == 201 || r.status == 204 ? 200 : r.status, body: r.body)
                    channel = r.header("apns-channel-id")
                case .failure(let f):
                    answer = .transport(APNsRequest.failure(f.kind))
                    channel = nil
                }
                if case .status(403, "ExpiredProviderToken"?, _) = answer, let t = self.token, t.jwt == jwt {
                    self.refusedJWT = t.jwt
                    self.token = nil
                }
                var outcome = BroadcastOutcome.decide(request, answer, channelHeader: channel, attempts: job.attempts, policy: self.retry,
                                                      random: Double.random(in: 0..<1))
                self.report(job, request, outcome, answer)
                if case .paused(let status) = outcome {
                    // The whole deployment waits until a token may be made again (as the
                    // token sender does): stored, so every process's claims see it.
                    let now = nowSeconds()
                    let until = max(now + 1, (self.token?.issuedAt ?? now) + Int64(ProviderTokenPolicy().minRenewAge))
                    self.tokenStore.pause(until: until)
                    self.onPaused(until)
                    outcome = .retry(afterSeconds: Double(until - now), status: status)
                }
                done(job, outcome)
            }
        }
    }

    private func nowSeconds() -> Int64 { Int64(clock()) }
    private func nowMilliseconds() -> Int64 { Int64((clock() * 1000).rounded()) }

    private func httpRequest(_ request: BroadcastRequest, _ job: BroadcastJob, jwt: String) -> CurlClient.Request? {
        let auth = ("authorization", "bearer " + jwt)
        let channels = settings.manageHost(job.environment) + "/1/apps/" + settings.topic + "/channels"
        switch request {
        case .forget:
            return nil
        case .create:
            return CurlClient.Request(url: channels, method: "POST", headers: [auth, ("content-type", "application/json")],
                                      body: BroadcastRequest.createBody, timeout: requestTimeout)
        case .delete(let channel):
            return CurlClient.Request(url: channels, method: "DELETE", headers: [auth, ("apns-channel-id", channel)], timeout: requestTimeout)
        case .push(let body, let priority, let expiration, _, _, _, _):
            guard let channel = job.channelID else { return nil }
            return CurlClient.Request(url: settings.pushURL(job.environment) + "/4/broadcasts/apps/" + settings.topic, method: "POST", headers: [
                auth, ("apns-channel-id", channel), ("apns-push-type", "liveactivity"), ("apns-priority", String(priority)),
                ("apns-expiration", String(expiration)), ("content-type", "application/json"),
            ], body: body, timeout: requestTimeout)
        }
    }

    private func mark(_ outcomes: [(BroadcastJob, BroadcastOutcome)]) {
        db.execute(BroadcastRepository.marks(outcomes, paceSeconds: settings.pace)) { [weak self] result in
            guard let self, !self.closed else { return }
            if case .success(let rs) = result, let e = rs.first(where: { !$0.ok })?.errorMessage {
                self.log.error("push.broadcast_mark_failed", [("error", e.trimmingNewlines)])
            }
            // A created channel or a pushed change may have made the row due again at once.
            if outcomes.contains(where: { if case .created = $0.1 { return true }; if case .pushed = $0.1 { return true }; return false }) {
                self.wanted = true
            }
            self.idle()
        }
    }

    private func report(_ job: BroadcastJob, _ request: BroadcastRequest, _ outcome: BroadcastOutcome, _ answer: APNsAnswer) {
        let result: String
        switch outcome {
        case .created: result = "created"
        case .refused: result = "refused"
        case .pushed: result = "pushed"
        case .deleted: result = "deleted"
        case .dropped: result = "dropped"
        case .paused: result = "paused"
        case .retry: result = "retry"
        }
        metrics.broadcasts[result, default: 0] += 1
        if case .push(_, _, _, _, _, _, _) = request, case .pushed = outcome, let since = job.pendingSinceMs {
            metrics.observeBroadcastLatency(max(0, Double(nowMilliseconds() - since) / 1000))
        }
        let fields: [(String, Any)] = [("activity", job.activityID), ("status", PushSenderMachine<Void>.label(answer)),
                                       ("environment", job.environment.rawValue)]
        switch outcome {
        case .created(let channel):
            log.info("push.channel_created", fields + [("channel", channel)])
        case .refused:
            log.error("push.channel_refused", fields + [("hint", "the activity runs without a channel (channelId null); is the broadcast capability enabled for the App ID, or are 10,000 channels in use?")])
        case .dropped(let seq, _, let deleteAt, _):
            log.error("push.broadcast_dropped", fields + [("seq", seq), ("end", deleteAt != nil),
                                                          ("hint", "APNs refused this push for its content; dropped, the channel goes on with the next change")])
        case .paused:
            log.error("apns.sending_paused", fields + [("why", "429 TooManyProviderTokenUpdates on a broadcast request: every sender waits until a token may be made again")])
        case .deleted:
            log.info("push.channel_deleted", fields)
        case .pushed, .retry:
            break
        }
    }
}
