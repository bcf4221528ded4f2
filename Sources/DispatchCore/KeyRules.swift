/// What a key may see and do beyond its scope's name (contract §6): a key that may not read
/// never gets a snapshot, registering an activity token needs `read` as well as `device`,
/// and the per-key limits' defaults and answers.
public enum KeyRules {
    /// `read`, `publish` and `admin` may read every activity.
    public static func mayRead(_ scopes: Set<Scope>) -> Bool {
        !scopes.isDisjoint(with: [.read, .publish, .admin])
    }

    /// A registration this key may not make: an activity token from a key that may not read
    /// (it would follow, through its pushes, an activity it may not see). Forgetting a token
    /// (`null`) and the device and push-to-start tokens need `device` only.
    public static func registrationRefusal(_ r: DeviceRegistration, mayRead: Bool) -> DispatchError? {
        guard !mayRead else { return nil }
        let follows = r.activityTokens.contains { if case .set = $0.change { return true } else { return false } }
        guard follows else { return nil }
        return DispatchError(.forbidden, "registering an activity token needs the read scope as well as device (a key cannot follow what it may not read)")
    }

    /// `error` as a key that may not read may see it: without the stored snapshot.
    public static func visible(_ error: DispatchError, mayRead: Bool) -> DispatchError {
        guard !mayRead, error.snapshot != nil else { return error }
        var e = error
        e.snapshot = nil
        return e
    }

    /// The `202` of a cancel request to a key that may not read: what it asked for, not the
    /// activity (`{"activityId": ..., "cancelRequested": true}`).
    public static func cancelAccepted(activityID: String) -> [UInt8] {
        var w = JSONWriter()
        w.beginObject()
        w.field("activityId", activityID)
        w.field("cancelRequested", true)
        w.endObject()
        return w.bytes
    }

    public static let defaultMaxLive = 10_000
    public static let defaultMaxDevices = 1_000
    /// Activities one key may finish in any `finishedWindowMs` (issue 36): a start is refused
    /// while the key has finished that many in the window, so one key's churn adds at most
    /// this (plus its live activities) to every feed's initial set.
    public static let defaultMaxFinished = 20_000
    /// The window of `defaultMaxFinished`: the feed's initial set holds the activities finished
    /// in the last 24 hours (contract §8), so the limit bounds exactly what a key puts there.
    public static let finishedWindowMs: Int64 = 24 * 3_600_000
    /// Live Activity tokens one device keeps (contract §5.1); one more forgets the token of
    /// the activity that changed least recently.
    public static let defaultMaxActivityTokensPerDevice = 64
    /// Browser sessions one key may hold (contract §7).
    public static let defaultMaxSessionsPerKey = 100
    /// Sign-in attempts (`POST /v1/session`) per minute per client address and per key.
    public static let defaultSignInsPerMinute: Double = 20
    /// What a refused sign-in is told to wait when the key holds too many sessions: they end
    /// by sign-out or after 12 idle hours, so a minute is as good a guess as any.
    public static let sessionsFullRetryAfter = 60

    public static func tooManySessions(max: Int) -> DispatchError {
        var e = DispatchError(.tooManySessions, "this key already holds \(max) browser sessions (DISPATCH_MAX_SESSIONS_PER_KEY): sign out elsewhere, or wait for idle ones to end")
        e.retryAfterSeconds = sessionsFullRetryAfter
        return e
    }

    public static func tooManySignIns(perMinute: Double, by who: String, wait: Double) -> DispatchError {
        var e = DispatchError(.rateLimited, "too many sign-in attempts \(who) (DISPATCH_SIGNIN_RATE, \(perMinute.rounded() == perMinute ? String(Int(perMinute)) : String(perMinute)) a minute): try again later")
        e.retryAfterSeconds = max(1, Int(wait.rounded(.up)))
        return e
    }

    public static func tooManyLive(max: Int) -> DispatchError {
        DispatchError(.tooManyLiveActivities, "this key already has \(max) live activities (DISPATCH_MAX_LIVE_PER_KEY): end some first")
    }

    /// The refusal of a start while the key has finished `max` activities in the window;
    /// `freeAtMs`: when enough of them will have left the window for one more start.
    public static func tooManyFinished(max: Int, freeAtMs: Int64?, now: Int64) -> DispatchError {
        var e = DispatchError(.tooManyFinishedActivities, "this key finished \(max) activities in the last 24 hours (DISPATCH_MAX_FINISHED_PER_KEY): try again later")
        e.retryAfterSeconds = finishedRetryAfter(freeAtMs: freeAtMs, now: now)
        return e
    }

    /// Seconds until a key's oldest counted end leaves the window (at least 1, at most the window).
    public static func finishedRetryAfter(freeAtMs: Int64?, now: Int64) -> Int {
        guard let freeAtMs else { return 1 }
        let ms = min(max(freeAtMs + finishedWindowMs - now, 1), finishedWindowMs)
        return Int((ms + 999) / 1000)
    }

    public static func tooManyDevices(max: Int) -> DispatchError {
        DispatchError(.tooManyDevices, "this key already registered \(max) devices (DISPATCH_MAX_DEVICES_PER_KEY): forget some first")
    }
}
