/// Whether a carrier that says it is connected still delivers (contract §10): a worker sends
/// itself a probe through the carrier every `interval` and must hear it back within
/// `deadline`. A LISTEN session whose backend is stuck, or a NATS server that stopped reading,
/// keeps its socket open and looks up; only a round trip shows it. Pure: the shell sends,
/// hears, and performs what this returns.
public struct CarrierProbe: Sendable {
    public struct Settings: Sendable {
        public var interval: Double
        public var deadline: Double

        public init(interval: Double = 1, deadline: Double = 3) {
            self.interval = interval
            self.deadline = deadline
        }
    }

    public enum Action: Equatable, Sendable {
        /// Send probe number `n` through the carrier.
        case send(UInt64)
        /// No probe came back within the deadline: report it (readiness, metric), read what
        /// was missed from PostgreSQL, and reconnect the carrier.
        case stalled
        /// A probe came back after a stall.
        case recovered
    }

    public let settings: Settings
    public private(set) var isStalled = false
    /// Stalls seen since the start (a metric).
    public private(set) var stalls = 0
    /// Seconds the last probe took to come back (a metric).
    public private(set) var lastRoundTrip: Double?
    private var next: UInt64 = 1
    /// The oldest probe not heard back: its number and when it was sent.
    private var oldestOutstanding: (n: UInt64, at: Double)?
    private var lastSentAt: Double?
    private var connected = false

    public init(settings: Settings = Settings()) {
        self.settings = settings
    }

    /// The carrier connected (or reconnected): probes start at once.
    public mutating func connected(now: Double) -> [Action] {
        connected = true
        oldestOutstanding = nil
        lastSentAt = nil
        return tick(now: now)
    }

    /// The carrier says it is down: that is reported by its own status, not as a stall.
    public mutating func disconnected() {
        connected = false
        oldestOutstanding = nil
        isStalled = false
    }

    public mutating func tick(now: Double) -> [Action] {
        guard connected else { return [] }
        var actions: [Action] = []
        if let o = oldestOutstanding, now - o.at >= settings.deadline, !isStalled {
            isStalled = true
            stalls += 1
            actions.append(.stalled)
            // Probes sent before the repair say nothing about the carrier after it.
            oldestOutstanding = nil
        }
        if lastSentAt.map({ now - $0 >= settings.interval }) ?? true {
            let n = next
            next += 1
            lastSentAt = now
            if oldestOutstanding == nil { oldestOutstanding = (n, now) }
            actions.append(.send(n))
        }
        return actions
    }

    /// Probe `n` came back. A forged or repeated number changes nothing but the outstanding
    /// probe it names: a number not sent yet is ignored.
    public mutating func heard(_ n: UInt64, now: Double, sentAt: Double? = nil) -> [Action] {
        guard connected, n < next else { return [] }
        if let o = oldestOutstanding, n >= o.n {
            lastRoundTrip = now - o.at
            oldestOutstanding = nil
        }
        guard isStalled else { return [] }
        isStalled = false
        return [.recovered]
    }
}
