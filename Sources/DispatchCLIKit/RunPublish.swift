import DispatchCore

/// What `dispatch run` publishes, in which order and when, while its command runs from the
/// first instant: the start, the latest progress (coalesced), touches while nothing else is
/// said, and the end once the command is over. Pure: the shell's publishing thread asks `next`,
/// performs the step, and reports back; the clock is passed in.
///
/// Order is the server's: nothing before the start is accepted (the activity would not exist),
/// and nothing after the end. A step that failed for a passing reason (server down, 503) is
/// tried again after a growing pause, with the same Idempotency-Key (the shell keeps it per
/// step), so a retried publish lands once. A step refused for good is dropped: a refused start
/// leaves the command untracked, a refused progress value is skipped.
public struct CLIRunPublishQueue: Equatable, Sendable {
    public enum Step: Equatable, Sendable {
        case start
        case progress(Double)
        /// A new status line (`--status-from-output`), with the progress pending at the time.
        case status(String, progress: Double?)
        case touch
        case end(CLIEndOptions)
    }

    public enum Next: Equatable, Sendable {
        case send(Step)
        /// Nothing to do before this monotonic time (`.infinity`: until something is offered).
        case wait(until: Double)
        /// The end is published (or refused), or the start was refused and the command is over.
        case finished
        /// The end could not be published within the budget given after the command ended.
        case gaveUp
    }

    /// At most this often a progress value goes out (seconds).
    public static let progressInterval = 0.25
    /// The pause between two tries of a failing step: 0.5 s, 1 s, 2 s, 4 s, then 5 s.
    public static let retryBackoff = Backoff(initial: 0.5, maximum: 5)

    /// Seconds between touches when nothing else was accepted (nil: no touches).
    public let touchInterval: Double?
    public private(set) var started = false
    /// The start was refused for good: nothing is sent any more.
    public private(set) var untracked = false
    public private(set) var ended = false
    private var touching: Bool
    private var pending: Double?
    private var lastSentProgress: Double?
    private var pendingStatus: String?
    private var lastSentStatus: String?
    private var lastProgressAt = -Double.infinity
    /// When the server last accepted a step (it renews the stale deadline, like a touch).
    private var lastAcceptedAt: Double
    private var end: CLIEndOptions?
    private var giveUpAt = Double.infinity
    private var triedSinceEnd = false
    private var retryAt: Double?
    /// Failures in a row (the pause before the next try grows with them).
    public private(set) var failures = 0

    public init(touchInterval: Double?, now: Double) {
        self.touchInterval = touchInterval
        touching = touchInterval != nil
        lastAcceptedAt = now
    }

    /// A new progress value from the command's output; replaces one not yet sent.
    public mutating func offer(progress: Double) {
        guard !ended, end == nil else { return }
        pending = progress
    }

    /// A new status line from the command's output; replaces one not yet sent. It goes out
    /// with the progress pending then, at the pace of progress updates.
    public mutating func offer(status: String) {
        guard !ended, end == nil else { return }
        pendingStatus = status
    }

    /// The command is over: publish `end` after what is still pending, trying for `budget`
    /// seconds from `now` (at least once).
    public mutating func requestEnd(_ end: CLIEndOptions, now: Double, budget: Double) {
        guard self.end == nil else { return }
        self.end = end
        giveUpAt = now + max(budget, 0)
        triedSinceEnd = false
        retryAt = nil  // one more try at once, whatever the pause under way
    }

    public func next(now: Double) -> Next {
        if ended { return .finished }
        if untracked { return end == nil ? .wait(until: .infinity) : .finished }
        // Past the budget, a server that still fails is given up on; one that answers is not
        // cut off in the middle of catching up.
        let failing = end != nil && triedSinceEnd && failures > 0
        if failing, now >= giveUpAt { return .gaveUp }
        if let r = retryAt, now < r { return .wait(until: failing ? min(r, giveUpAt) : r) }
        if !started { return .send(.start) }
        let progressDue = pending.map { $0 != lastSentProgress } ?? false
        let statusDue = pendingStatus.map { $0 != lastSentStatus } ?? false
        if progressDue || statusDue {
            let due = lastProgressAt + Self.progressInterval
            guard now >= due else { return .wait(until: due) }
            if statusDue, let line = pendingStatus { return .send(.status(line, progress: progressDue ? pending : nil)) }
            return .send(.progress(pending!))
        }
        if let end { return .send(.end(end)) }
        if touching, let t = touchInterval {
            let due = lastAcceptedAt + t
            return now >= due ? .send(.touch) : .wait(until: due)
        }
        return .wait(until: .infinity)
    }

    public mutating func succeeded(_ step: Step, now: Double) {
        failures = 0
        retryAt = nil
        lastAcceptedAt = now
        if end != nil { triedSinceEnd = true }
        switch step {
        case .start:
            started = true
        case .progress, .status:
            sent(step, now: now)
        case .touch:
            break
        case .end:
            ended = true
        }
    }

    /// `transient`: worth another try (unreachable, 5xx, 429); otherwise the server refused it.
    public mutating func failed(_ step: Step, transient: Bool, now: Double) {
        if end != nil { triedSinceEnd = true }
        if transient {
            failures += 1
            retryAt = now + Self.retryBackoff.step(afterAttempt: failures)
            return
        }
        failures = 0
        retryAt = nil
        switch step {
        case .start:
            untracked = true
        case .progress, .status:
            sent(step, now: now)  // refused for good: skipped, not tried again
        case .touch:
            touching = false  // the activity is over (ended elsewhere, or stale) or not ours
        case .end:
            ended = true
        }
    }

    private mutating func sent(_ step: Step, now: Double) {
        lastProgressAt = now
        var progress: Double?
        switch step {
        case .progress(let p): progress = p
        case .status(let line, let p):
            progress = p
            lastSentStatus = line
            if pendingStatus == line { pendingStatus = nil }
        case .start, .touch, .end: break
        }
        if let p = progress {
            lastSentProgress = p
            if pending == p { pending = nil }
        }
    }

}

/// Activity ids `run` makes itself, so it can name the activity (and start the command) before
/// the server has answered: random (version 4) UUIDs, as the server would make.
public enum CLIActivityID {
    public static func uuid(_ a: UInt64, _ b: UInt64) -> String {
        let high = (a & 0xFFFF_FFFF_FFFF_0FFF) | 0x0000_0000_0000_4000  // version 4
        let low = (b & 0x3FFF_FFFF_FFFF_FFFF) | 0x8000_0000_0000_0000   // RFC 4122 variant
        let hex = CLIIdempotencyKey.hex(high) + CLIIdempotencyKey.hex(low)
        let c = Array(hex)
        return String(c[0..<8]) + "-" + String(c[8..<12]) + "-" + String(c[12..<16]) + "-" + String(c[16..<20]) + "-" + String(c[20..<32])
    }
}

/// `run`'s machine tag when none is given: the host name, when it fits the field's rules.
public enum CLIRunMachine {
    public static func fromHostName(_ name: String) -> String? {
        Validation.isTag(name) ? name : nil
    }

    /// A start refused with 403 while its machine was the host name `run` filled in: the key
    /// is bound to another machine (the server fills that one in when none is named), so the
    /// start is tried once more without it.
    public static func retryWithoutMachine(status: Int?, guessed: Bool) -> Bool {
        guessed && status == 403
    }
}

/// `run --status-from-output`: the status shown is the command's last output line.
public enum CLIRunStatus {
    public static let maxCharacters = 200

    /// The text of an output line as a status: what a terminal would show last on it (after the
    /// last carriage return), without escape sequences or control characters, trimmed, cut to
    /// 200 characters; nil for a line with nothing to show.
    public static func fromOutput(_ line: String) -> String? {
        var shown = Substring(line)
        while let cr = shown.lastIndex(of: "\r") {
            let after = shown[shown.index(after: cr)...]
            if after.contains(where: { $0 != " " && $0 != "\t" }) { shown = after; break }
            shown = shown[..<cr]
        }
        var out = String.UnicodeScalarView()
        var scalars = shown.unicodeScalars.makeIterator()
        while let u = scalars.next() {
            if u == "\u{1B}" {
                // CSI (ESC [ ... final byte 0x40-0x7E) or a two-character escape: dropped whole.
                guard let next = scalars.next(), next == "[" else { continue }
                while let c = scalars.next(), !(0x40...0x7E).contains(c.value) {}
                continue
            }
            if u.value < 0x20 || u.value == 0x7F || (0x80...0x9F).contains(u.value) {
                if u == "\t" { out.append(" ") }
                continue
            }
            out.append(u)
        }
        let text = String(out).cliTrimmed()
        guard !text.isEmpty else { return nil }
        return text.count <= maxCharacters ? text : String(text.prefix(maxCharacters - 1)) + "…"
    }
}
