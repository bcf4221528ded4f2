/// The feed's numbering passes, as a pure state machine (the shell is `Sequencer`; contract
/// §8, §10).
///
/// With the NATS carrier, publish transactions write their history rows without a feed
/// position and take no lock that every writer shares. Every server runs passes; none is
/// elected, so none can stall the others. A pass is one short transaction that takes the
/// feed's position lock with a *try* (a server that finds it held skips instead of queueing),
/// numbers the committed rows `WHERE position IS NULL` in commit order, and commits. Holding
/// nothing between passes, a server that hangs (a frozen VM, SIGSTOP, a stuck loop) holds the
/// lock at most for the pass it already sent, which PostgreSQL finishes without it, or until
/// the session's idle-in-transaction timeout ends it: the others go on within seconds.
///
/// A pass can only see committed rows and passes run one at a time, so a change committed
/// before a pass always gets a lower position than one committed after it: positions appear
/// in increasing order for every reader, and nothing is numbered twice (`position IS NULL`
/// is checked by the UPDATE itself).
public struct SequencerMachine: Sendable {
    public struct Settings: Sendable {
        /// Seconds between passes when nothing wakes this server (a lost wake-up costs this
        /// much latency at most).
        public var pollInterval: Double
        /// Seconds before trying again when another server held the lock (its pass numbers
        /// what was committed before it; this one numbers what came after).
        public var busyRetry: Double
        /// Rows numbered per pass at most (a full pass is followed by another at once).
        public var batch: Int

        public init(pollInterval: Double = 0.2, busyRetry: Double = 0.02, batch: Int = 2000) {
            self.pollInterval = pollInterval
            self.busyRetry = busyRetry
            self.batch = batch
        }
    }

    public enum Action: Equatable, Sendable {
        /// Run one pass of at most `limit` rows; answer `numbered`, `busy` or `passFailed`.
        case number(limit: Int, generation: UInt64)
        /// Tell the other servers that positions up to `through` exist (a hint: they read).
        case announce(through: Int64)
    }

    public let settings: Settings
    /// Whether the session is up (passes need it).
    public private(set) var sessionUp = false
    public private(set) var passInFlight = false
    /// A wake-up came during a pass: run another when it ends.
    var dirty = false
    var nextPassAt: Double = 0
    /// Answers carry the generation they were asked with; a lost session starts a new one,
    /// so a late answer from the old session changes nothing.
    var generation: UInt64 = 0

    public init(settings: Settings = Settings()) {
        self.settings = settings
    }

    // MARK: - Inputs

    public mutating func sessionReady(now: Double) -> [Action] {
        sessionUp = true
        generation += 1
        passInFlight = false
        return startPass()
    }

    public mutating func sessionLost(now: Double) {
        sessionUp = false
        generation += 1
        passInFlight = false
    }

    /// The timer: a pass when one is due.
    public mutating func tick(now: Double) -> [Action] {
        guard sessionUp, !passInFlight, now >= nextPassAt else { return [] }
        return startPass()
    }

    /// Something was committed somewhere: number it now (or right after the pass under way).
    public mutating func woken(now: Double) -> [Action] {
        guard sessionUp else { return [] }
        if passInFlight { dirty = true; return [] }
        return startPass()
    }

    /// A pass committed: `count` rows numbered, the newest being `through` (nil when none).
    public mutating func numbered(count: Int, through: Int64?, generation g: UInt64, now: Double) -> [Action] {
        guard g == generation, passInFlight else { return [] }
        passInFlight = false
        var actions: [Action] = []
        if count > 0, let through { actions.append(.announce(through: through)) }
        if count >= settings.batch || dirty {
            actions += startPass()
        } else {
            nextPassAt = now + settings.pollInterval
        }
        return actions
    }

    /// Another server held the lock: its pass covers what was committed before it; try again
    /// shortly for what came after.
    public mutating func busy(generation g: UInt64, now: Double) -> [Action] {
        guard g == generation, passInFlight else { return [] }
        passInFlight = false
        nextPassAt = now + (dirty ? settings.busyRetry : min(settings.busyRetry * 5, settings.pollInterval))
        dirty = false
        return []
    }

    /// A pass failed on a live session (the statement was refused or timed out; its
    /// transaction rolled back and numbered nothing): try again after the poll interval.
    public mutating func passFailed(generation g: UInt64, now: Double) -> [Action] {
        guard g == generation, passInFlight else { return [] }
        passInFlight = false
        nextPassAt = now + settings.pollInterval
        return []
    }

    private mutating func startPass() -> [Action] {
        passInFlight = true
        dirty = false
        return [.number(limit: settings.batch, generation: generation)]
    }
}
