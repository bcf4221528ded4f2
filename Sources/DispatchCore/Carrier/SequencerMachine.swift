/// The feed's sequencer, as a pure state machine (the shell is `Sequencer`; contract §8, §10).
///
/// With the NATS carrier, publish transactions write their history rows without a feed
/// position and take no lock that every writer shares. One process of the whole deployment,
/// the leader, numbers what was committed: a numbering pass is one statement that gives every
/// row still without a position the next positions, in one transaction, and passes run one at
/// a time. A pass can only see committed rows, and the next pass starts after it committed, so
/// positions appear in increasing order for every reader: what §8 needs, without a lock taken
/// by the writers (they pay nothing; each change costs one more row update and one pass of
/// latency).
///
/// Leadership is a PostgreSQL session advisory lock on the sequencer's own session: when the
/// leader's process dies or loses its session, PostgreSQL releases the lock and another
/// candidate takes it at its next claim. After a claim the new leader reads the newest
/// position and announces from there, so a reader that missed what a dead leader numbered
/// but never announced sees a broken chain and re-reads from the database.
public struct SequencerMachine: Sendable {
    public struct Settings: Sendable {
        /// Seconds between claims while another process leads.
        public var claimInterval: Double
        /// Seconds between passes when nothing wakes the leader (a lost wake-up costs this much latency at most).
        public var pollInterval: Double
        /// Rows numbered per pass at most (a full pass is followed by another at once).
        public var batch: Int

        public init(claimInterval: Double = 1, pollInterval: Double = 0.2, batch: Int = 2000) {
            self.claimInterval = claimInterval
            self.pollInterval = pollInterval
            self.batch = batch
        }
    }

    public enum Role: Equatable, Sendable {
        /// Another process leads (or none yet): claim every `claimInterval`.
        case candidate
        /// A claim is out.
        case claiming
        /// This process numbers: `announced` is the last position announced.
        case leader(announced: Int64)
    }

    public enum Action: Equatable, Sendable {
        /// Try to take the lock; then read the newest position. Answer `claimed` or `claimRefused`.
        case claim(generation: UInt64)
        /// Number up to `limit` rows; answer `numbered` or `passFailed`.
        case number(limit: Int, generation: UInt64)
        /// Announce the rows of the pass just committed, continuing from `after`.
        case announce(after: Int64)
        /// Leadership changed (log it, set the gauge).
        case leading(Bool)
    }

    public let settings: Settings
    public private(set) var role: Role = .candidate
    /// Whether the session is up (claims and passes need it).
    public private(set) var sessionUp = false
    var passInFlight = false
    /// A wake-up came during a pass: run another when it ends.
    var dirty = false
    var nextClaimAt: Double = 0
    var nextPassAt: Double = 0
    /// Answers carry the generation they were asked with; a lost session starts a new one,
    /// so a late answer from the old session changes nothing.
    var generation: UInt64 = 0

    public init(settings: Settings = Settings()) {
        self.settings = settings
    }

    public var isLeader: Bool {
        if case .leader = role { return true }
        return false
    }

    // MARK: - Inputs

    public mutating func sessionReady(now: Double) -> [Action] {
        sessionUp = true
        generation += 1
        role = .candidate
        passInFlight = false
        nextClaimAt = now
        return tick(now: now)
    }

    public mutating func sessionLost(now: Double) -> [Action] {
        sessionUp = false
        generation += 1
        passInFlight = false
        let wasLeader = isLeader
        role = .candidate
        return wasLeader ? [.leading(false)] : []
    }

    /// The timer: claim when due, or run a pass when due.
    public mutating func tick(now: Double) -> [Action] {
        guard sessionUp else { return [] }
        switch role {
        case .candidate:
            guard now >= nextClaimAt else { return [] }
            role = .claiming
            return [.claim(generation: generation)]
        case .claiming:
            return []
        case .leader:
            guard !passInFlight, now >= nextPassAt else { return [] }
            return startPass(now: now)
        }
    }

    /// Something was committed somewhere: number it now (or right after the pass under way).
    public mutating func woken(now: Double) -> [Action] {
        guard case .leader = role, sessionUp else { return [] }
        if passInFlight { dirty = true; return [] }
        return startPass(now: now)
    }

    public mutating func claimed(newest: Int64, generation g: UInt64, now: Double) -> [Action] {
        guard g == generation, role == .claiming else { return [] }
        role = .leader(announced: newest)
        return [.leading(true)] + startPass(now: now)
    }

    public mutating func claimRefused(generation g: UInt64, now: Double) -> [Action] {
        guard g == generation, role == .claiming else { return [] }
        role = .candidate
        nextClaimAt = now + settings.claimInterval
        return []
    }

    /// A pass committed: `count` rows numbered, the newest being `through` (nil when none).
    public mutating func numbered(count: Int, through: Int64?, generation g: UInt64, now: Double) -> [Action] {
        guard g == generation, case .leader(let announced) = role, passInFlight else { return [] }
        passInFlight = false
        var actions: [Action] = []
        if count > 0, let through {
            actions.append(.announce(after: announced))
            role = .leader(announced: through)
        }
        if count >= settings.batch || dirty {
            actions += startPass(now: now)
        } else {
            nextPassAt = now + settings.pollInterval
        }
        return actions
    }

    /// A pass failed on a live session (the statement was refused; its transaction rolled
    /// back and numbered nothing): the lock is still this session's, so try again later.
    public mutating func passFailed(generation g: UInt64, now: Double) -> [Action] {
        guard g == generation, isLeader, passInFlight else { return [] }
        passInFlight = false
        nextPassAt = now + settings.pollInterval
        return []
    }

    /// A claim failed on a live session (refused statement): claim again later.
    public mutating func claimFailed(generation g: UInt64, now: Double) -> [Action] {
        claimRefused(generation: g, now: now)
    }

    private mutating func startPass(now: Double) -> [Action] {
        passInFlight = true
        dirty = false
        return [.number(limit: settings.batch, generation: generation)]
    }
}
