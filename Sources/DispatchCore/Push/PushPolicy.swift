/// What came back for one push: an HTTP answer from APNs, or no answer at all.
public enum APNsAnswer: Equatable, Sendable {
    /// `reason` and `timestamp` (milliseconds, 410 only) from the error body `{"reason": ...}`.
    case status(Int, reason: String?, timestampMs: Int64?)
    case transport(TransportFailure)

    public enum TransportFailure: String, Sendable {
        /// The connection died or sent GOAWAY under the request: retry on a new connection.
        case connectionLost
        /// No answer before the request's deadline.
        case timeout
        /// Could not resolve, connect or agree on TLS.
        case connect
        /// The request could not even be sent (a malformed URL or header): our bug.
        case invalidRequest
        /// The client was closed (shutdown): the push was not attempted.
        case cancelled
        case other
    }

    /// An APNs answer from its status and body (`{"reason": "...", "timestamp": ms}`).
    public static func parse(status: Int, body: [UInt8]) -> APNsAnswer {
        guard status != 200, !body.isEmpty, let value = try? JSONParser.parse(body) else {
            return .status(status, reason: nil, timestampMs: nil)
        }
        var reason: String?
        if case .string(let r)? = value["reason"] { reason = r }
        var timestamp: Int64?
        if case .number(let t)? = value["timestamp"], t.isFinite, abs(t) < 1e15 { timestamp = Int64(t) }
        return .status(status, reason: reason, timestampMs: timestamp)
    }
}

/// The class of an answer, as the `result` label of `dispatch_push_sent_total` and in logs.
public enum PushResult: String, Sendable, CaseIterable {
    case delivered
    /// 410, or 400 `BadDeviceToken`: the token is retired.
    case retired
    /// 429: APNs asks us to slow down for that token.
    case throttled
    /// 5xx.
    case serverError = "server_error"
    /// No answer: the connection died, a timeout, a failed connect.
    case connectionError = "connection_error"
    /// 403 `ExpiredProviderToken`: a new JWT, then the push again.
    case providerTokenExpired = "jwt_expired"
    /// 403 `InvalidProviderToken`/`MissingProviderToken`/other 403: misconfiguration, sending stops.
    case providerTokenRejected = "jwt_rejected"
    /// 429 `TooManyProviderTokenUpdates`: the team's token changed too often; sending pauses.
    case providerTokenThrottled = "jwt_throttled"
    /// Any other 4xx: a payload or header APNs refused, i.e. our bug. Not retried.
    case rejected
}

/// What to do with a push after its answer: the outbox's result → next-action policy.
public enum PushDecision: Equatable, Sendable {
    case delivered
    /// Retire the token (unless registered again after `invalidSinceMs`; nil: the time the
    /// push was claimed) and cancel its pending pushes.
    case retire(invalidSinceMs: Int64?)
    /// Try again later (backoff with jitter); the newest state is pushed then.
    case retry(PushResult)
    /// Mint a new provider token (JWT) and send again.
    case renewProviderToken
    /// The provider token is refused: stop sending, say so loudly, no retry loop.
    case stopSending
    /// The team's provider token changed too often: no sending until a token may be made.
    case pauseForProviderToken
    /// Our bug: log loudly, mark the push failed, never retry it.
    case reject
    /// Not attempted (shutdown): due again at once, the attempt not counted.
    case release

    public static func decide(_ answer: APNsAnswer) -> PushDecision {
        switch answer {
        case .status(200, _, _):
            return .delivered
        case .status(410, _, let since):
            return .retire(invalidSinceMs: since)
        case .status(400, "BadDeviceToken"?, _):
            return .retire(invalidSinceMs: nil)
        case .status(403, "ExpiredProviderToken"?, _):
            return .renewProviderToken
        case .status(403, _, _):
            return .stopSending
        case .status(429, "TooManyProviderTokenUpdates"?, _):
            return .pauseForProviderToken
        case .status(429, _, _):
            return .retry(.throttled)
        case .status(let s, _, _) where s >= 500:
            return .retry(.serverError)
        case .status(let s, _, _) where (400..<500).contains(s):
            return .reject
        case .status:
            // 1xx/2xx other than 200, 3xx: not something APNs sends; retry rather than lose it.
            return .retry(.serverError)
        case .transport(let failure):
            switch failure {
            case .connectionLost, .timeout, .connect, .other: return .retry(.connectionError)
            case .invalidRequest: return .reject
            case .cancelled: return .release
            }
        }
    }

    /// The metric label of this decision's answer.
    public var result: PushResult {
        switch self {
        case .delivered: return .delivered
        case .retire: return .retired
        case .retry(let r): return r
        case .renewProviderToken: return .providerTokenExpired
        case .stopSending: return .providerTokenRejected
        case .pauseForProviderToken: return .providerTokenThrottled
        case .reject: return .rejected
        case .release: return .connectionError
        }
    }

    /// Seconds until the next try after `attempts` failed tries (1 for the first). A lost
    /// connection is retried at once the first time (on a new connection, as GOAWAY asks);
    /// everything else backs off with full jitter.
    public static func retryDelay(_ result: PushResult, attempts: Int, policy: Backoff, random: Double) -> Double {
        if result == .connectionError && attempts <= 1 { return 0 }
        return policy.delay(afterAttempt: attempts, random: random)
    }
}

/// `aps.timestamp` per push, and how soon the next push of the same (activity, token) may go.
/// The phone drops a push whose timestamp is older than the content it shows, so timestamps
/// must increase push after push. They are whole seconds: pushing more than once a second
/// would make them run ahead of the clock, so a push that would lead the clock by more than
/// `maxLead` seconds waits (the changes meanwhile are coalesced: the newest state goes).
public enum PushTimestamp {
    public static let maxLead: Int64 = 1

    /// The timestamp of a push of a change made at `changeMs`, after one sent with `last` (0: none).
    public static func next(changeMs: Int64, last: Int64) -> Int64 {
        max(LiveActivityPayload.seconds(changeMs), last + 1)
    }

    /// The earliest Unix second at which the push after one with `timestamp` may go.
    public static func nextAllowed(after timestamp: Int64) -> Int64 { timestamp + 1 - maxLead }
}

/// When the provider token (the ES256 JWT) is made again. One token serves the whole
/// deployment (shared through the database): it is used for `renewAfter` after its `iat`
/// (inside the contract's 20–50 minutes), renewed early only when APNs answers
/// `ExpiredProviderToken` for it, but never twice within `minRenewInterval` for that reason
/// (a clock that is wrong would otherwise make one per request, which APNs answers with 429).
/// After `429 TooManyProviderTokenUpdates` nothing is sent until `minRenewAge` after the
/// current token's `iat`: the earliest a token may change again.
public struct ProviderTokenPolicy: Equatable, Sendable {
    public var renewAfter: Double = 40 * 60
    public var minRenewAge: Double = 20 * 60
    public var minRenewInterval: Double = 60

    public init() {}

    public enum Verdict: Equatable, Sendable {
        /// Mint a new one, then resend.
        case renew
        /// A newer token exists already: resend with it.
        case resend
        /// Renewed for this reason moments ago: back off instead.
        case backOff
    }

    /// APNs said the token of `generation` expired; the current one is `current`, minted at
    /// `mintedAt` because the one before it expired (`renewedForExpiry`).
    public func onExpired(generation: Int, current: Int, mintedAt: Double, renewedForExpiry: Bool, now: Double) -> Verdict {
        if generation < current { return .resend }
        if renewedForExpiry && now - mintedAt < minRenewInterval { return .backOff }
        return .renew
    }

    public func isDue(mintedAt: Double?, now: Double) -> Bool {
        guard let mintedAt else { return true }
        return now - mintedAt >= renewAfter || now < mintedAt - 60
    }
}

/// The push-to-start budget of the devices in one claimed batch (contract §5.2): at most
/// `limit` starts per device in any hour, counting those sent already (read with the batch)
/// and those of the batch planned before.
public struct StartBudget: Equatable, Sendable {
    public let limit: Int
    private var planned: [Int64: Int] = [:]

    public init(limit: Int) { self.limit = limit }

    /// Whether one more start may go to `device`, which was sent `sentLastHour` starts in the
    /// last hour; if so, it counts from now on.
    public mutating func take(device: Int64, sentLastHour: Int) -> Bool {
        let mine = planned[device, default: 0]
        guard sentLastHour + mine < limit else { return false }
        planned[device] = mine + 1
        return true
    }
}
