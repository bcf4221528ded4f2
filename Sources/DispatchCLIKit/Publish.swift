import DispatchCore

/// The publishing side of the CLI as values: request bodies, the retry schedule and the
/// idempotency key that makes retrying safe.

public enum CLIRequestBody {
    /// `POST /v1/activities/start`. Only the fields the user gave are sent.
    public static func start(_ o: CLIStartOptions) -> [UInt8] {
        var w = JSONWriter()
        w.beginObject()
        if let v = o.activityID { w.field("activityId", v) }
        w.field("taskName", o.name)
        if let v = o.symbol { w.field("systemImage", v) }
        if let v = o.machine { w.field("machine", v) }
        if let v = o.cancelURL { w.field("cancelURL", v) }
        if let v = o.progress { w.field("initialProgress", v) }
        if let v = o.status { w.field("status", v) }
        if let v = o.state { w.field("state", v) }
        if let v = o.staleAfter { w.field("staleAfter", Int64(v)) }
        if o.liveActivity { w.field("liveActivity", true) }
        if o.broadcast { w.field("broadcast", true) }
        w.endObject()
        return w.bytes
    }

    /// `POST /v1/activities/{id}/update`.
    public static func update(_ o: CLIUpdateOptions) -> [UInt8] {
        var w = JSONWriter()
        w.beginObject()
        if let v = o.progress { w.field("progress", v) }
        if let v = o.status { w.field("status", v) }
        if let v = o.state { w.field("state", v) }
        w.endObject()
        return w.bytes
    }

    /// `POST /v1/activities/{id}/end`.
    public static func end(_ o: CLIEndOptions) -> [UInt8] {
        var w = JSONWriter()
        w.beginObject()
        if let v = o.progress { w.field("progress", v) }
        if let v = o.status { w.field("status", v) }
        if let v = o.state { w.field("state", v) }
        if let v = o.error { w.field("error", v) }
        w.endObject()
        return w.bytes
    }
}

/// When to try a failed request again. Exponential backoff from `initialDelay` to `maxDelay`,
/// bounded by `budget` seconds from the first attempt; the last try lands at the deadline, so a
/// server that comes back just in time still gets the publish.
public struct CLIRetryPolicy: Equatable, Sendable {
    public var budget: Double
    public var initialDelay: Double
    public var maxDelay: Double
    /// A server's `Retry-After` is honoured up to this many seconds.
    public var maxRetryAfter: Double

    public init(budget: Double, initialDelay: Double = 0.1, maxDelay: Double = 2.0, maxRetryAfter: Double = 10) {
        self.budget = budget
        self.initialDelay = initialDelay
        self.maxDelay = maxDelay
        self.maxRetryAfter = maxRetryAfter
    }

    /// The pause before the next attempt, after `failures` failed ones (1 for the first failure),
    /// `elapsed` seconds after the first attempt started; nil: give up.
    public func delay(failures: Int, elapsed: Double, retryAfter: Double? = nil) -> Double? {
        guard failures >= 1, elapsed < budget else { return nil }
        var d = Backoff(initial: initialDelay, maximum: maxDelay).step(afterAttempt: failures)
        if let r = retryAfter, r.isFinite, r > 0 { d = max(d, min(r, maxRetryAfter)) }
        return min(d, budget - elapsed)
    }

    /// Under a whole-call deadline (`progress --deadline`): the time the next attempt may take,
    /// what is left of the deadline but at most `cap`; nil when nothing useful is left.
    public static func attemptTimeout(deadline: Double, elapsed: Double, cap: Double) -> Double? {
        let left = deadline - elapsed
        return left >= 0.05 ? min(cap, left) : nil
    }

    /// The one stderr line of a call that ran out of its deadline.
    public static func deadlineMessage(_ lastError: String, deadline: Double, attempts: Int) -> String {
        let tries = attempts == 1 ? "1 attempt" : "\(attempts) attempts"
        let seconds = deadline == deadline.rounded() ? String(Int(deadline)) : String(deadline)
        return "no answer within the \(seconds) s deadline (\(tries)): \(lastError); the update is dropped"
    }

    /// `Retry-After` in seconds (the HTTP-date form is ignored).
    public static func parseRetryAfter(_ value: String?) -> Double? {
        guard let v = value?.cliTrimmed(), !v.isEmpty, v.utf8.allSatisfy({ (0x30...0x39).contains($0) }), v.count < 8 else { return nil }
        return Double(v)
    }
}

/// The `Idempotency-Key` of one logical publish: made once, sent on every retry of it, so the
/// server applies the publish at most once even when an answer was lost.
public enum CLIIdempotencyKey {
    public static func make(_ a: UInt64, _ b: UInt64) -> String {
        hex(a) + hex(b)
    }

    static func hex(_ v: UInt64) -> String {
        let digits = Array("0123456789abcdef")
        var out = ""
        for shift in stride(from: 60, through: 0, by: -4) { out.append(digits[Int((v >> UInt64(shift)) & 0xF)]) }
        return out
    }
}

/// What `watch` does next: a pure state machine fed with what the connection reports.
/// It remembers the last `seq` shown (sent back as `Last-Event-ID`), drops anything at or
/// below it (so a reconnect never shows an event twice), and decides the exit code.
public struct CLIWatchState: Sendable {
    public enum Action: Equatable, Sendable {
        case display(event: String, view: CLIActivityView)
        /// The stream answered 200: read events.
        case readStream
        /// Reconnect with `Last-Event-ID` after this pause (the server's `retry:`).
        case reconnect(afterMilliseconds: Int)
        /// Transient failure to connect: retry within the budget, else exit `unavailable`.
        case retryConnect
        /// `204`: the stream is over but its end was not seen; read the final snapshot.
        case fetchSnapshot
        /// `watch --wait`: the activity does not exist yet; ask again after this pause.
        case awaitActivity(afterMilliseconds: Int)
        case finish(CLIExitCode)
    }

    /// Whether a `not_found` ends the watch (`no`) or means "not started yet" (`watch --wait`):
    /// until a monotonic deadline, or for as long as it takes.
    public enum WaitForStart: Equatable, Sendable {
        case no
        case until(Double)
        case forever
    }

    /// How often `watch --wait` asks whether the activity exists yet.
    public static let waitPollMilliseconds = 1000

    public static let defaultRetryMilliseconds = 3000

    public private(set) var lastSeq: Int?
    public private(set) var retryMilliseconds = defaultRetryMilliseconds
    public private(set) var latest: CLIActivityView?
    public let activityID: String
    /// Cleared by the first real event: once the activity existed, `not_found` is final.
    public private(set) var waitForStart: WaitForStart

    public init(activityID: String, waitForStart: WaitForStart = .no) {
        self.activityID = activityID
        self.waitForStart = waitForStart
    }

    /// The `Last-Event-ID` header for the next connection, if any event was seen.
    public var lastEventID: String? { lastSeq.map(String.init) }

    public static func exitCode(forTerminalState state: String?) -> CLIExitCode {
        state == "completed" ? .success : .jobFailed
    }

    /// The answer's status line arrived.
    public mutating func answered(status: Int) -> Action {
        if status == 204 { return .fetchSnapshot }
        switch CLIHTTPDisposition.of(status: status) {
        case .success: return .readStream
        case .retry: return .retryConnect
        case .fail(let code): return .finish(code)
        }
    }

    /// The server's `retry:` field changed.
    public mutating func retryAdvised(milliseconds: Int) {
        retryMilliseconds = min(max(milliseconds, 0), 60_000)
    }

    /// An event arrived; `now` (monotonic seconds) decides whether a `--wait` is over.
    public mutating func received(_ event: SSEEvent, now: Double = 0) -> [Action] {
        if event.event == "not_found" {
            switch waitForStart {
            case .forever: return [.awaitActivity(afterMilliseconds: Self.waitPollMilliseconds)]
            case .until(let deadline) where now < deadline:
                return [.awaitActivity(afterMilliseconds: min(Self.waitPollMilliseconds, Int(((deadline - now) * 1000).rounded(.up))))]
            case .until, .no:
                return [.display(event: event.event, view: CLIActivityView(activityID: activityID)), .finish(.notFound)]
            }
        }
        waitForStart = .no
        if let idText = event.id, let seq = Int(idText) {
            if let last = lastSeq, seq <= last { return [] }
            lastSeq = seq
        }
        guard var view = CLIActivityView(jsonText: event.data) else { return [] }
        if view.seq == nil, let last = lastSeq { view.seq = last }
        latest = view
        if view.isTerminal {
            return [.display(event: event.event, view: view), .finish(Self.exitCode(forTerminalState: view.state))]
        }
        return [.display(event: event.event, view: view)]
    }

    /// The connection ended (cleanly or not) without a terminal event.
    public mutating func streamEnded() -> Action {
        .reconnect(afterMilliseconds: retryMilliseconds)
    }

    /// After a `204`: the snapshot read from `GET /v1/activities/{id}`.
    public mutating func snapshotFetched(_ view: CLIActivityView) -> [Action] {
        latest = view
        if view.isTerminal {
            var actions: [Action] = []
            if let seq = view.seq, seq > (lastSeq ?? 0) {
                lastSeq = seq
                actions.append(.display(event: view.state ?? "?", view: view))
            }
            actions.append(.finish(Self.exitCode(forTerminalState: view.state)))
            return actions
        }
        // Not terminal after all (should not happen with a correct server): keep watching.
        return [.reconnect(afterMilliseconds: retryMilliseconds)]
    }
}
