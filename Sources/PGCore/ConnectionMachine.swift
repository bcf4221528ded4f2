import DispatchCore

/// A PostgreSQL connection's life, as a pure state machine (postgres-nio's shape): every input
/// is a `mutating func` returning the actions the libpq shell performs, in order. The state is
/// committed before any action runs, so a completion that calls back in sees the new state.
///
/// The connection reconnects by itself with capped exponential backoff; queries sent while it
/// is not ready fail (on a later loop turn: the shell never calls a completion from inside
/// `execute`).
///
/// Deadlines (contract §6, `DISPATCH_DB_TIMEOUT`): a caller waits at most `timeout` seconds
/// for its batch, and a connection attempt gets as long. The shell calls `tick(now:)` a few
/// times a second; a server that stops answering (a stuck disk, a network black hole) fails
/// what waits on it and the connection starts over.
public struct PGConnectionMachine<Completion> {
    public enum State: Equatable, Sendable {
        /// Not started yet.
        case idle
        case connecting
        case ready
        /// Waiting to reconnect after a failure.
        case backingOff
        /// Closed by its owner; nothing more happens.
        case closed
    }

    public enum Action {
        /// Start a connection attempt (`PQconnectStartParams` and polling).
        case connect
        /// Enter pipeline mode, watch the socket, and tell the owner (`onReady`).
        case becomeReady
        /// Put these commands on the wire, then flush.
        case send([PipelineQueue<Completion>.Command])
        /// Complete a batch with its results.
        case complete(Completion, [PGResult], elapsed: Double)
        /// Fail these queries' completions (on a later loop turn when they come from `execute`).
        case fail([Completion], PGError)
        /// Free the socket's events and `PQfinish` the connection.
        case closeConnection
        /// Tell the owner the connection was lost (`onLost`): LISTENs are gone, NOTIFYs missed.
        case reportLost(String)
        /// Call `reconnectDue()` after this many seconds.
        case scheduleReconnect(after: Double, reason: String)
    }

    public private(set) var state: State = .idle
    public private(set) var queue = PipelineQueue<Completion>()
    private let backoff: Backoff
    /// Connects that failed (or connections lost) since the last one that became ready.
    private var failuresInARow = 0
    /// Seconds a caller waits for its batch unless it asks otherwise, and a connect may take.
    public let timeout: Double
    private var connectDeadline = Double.infinity

    public init(backoff: Backoff = Backoff(initial: 0.1, maximum: 5), timeout: Double = 5) {
        self.backoff = backoff
        self.timeout = timeout
    }

    public var isReady: Bool { state == .ready }

    /// Whether a batch in flight is past its deadline (`/readyz` fails meanwhile).
    public func isOverdue(now: Double) -> Bool { state == .ready && queue.isOverdue(now: now) }

    public mutating func start(now: Double) -> [Action] {
        guard state == .idle || state == .closed else { return [] }
        state = .connecting
        connectDeadline = now + timeout
        return [.connect]
    }

    /// Time passed: fails what waited past its deadline; drops a connection that stopped
    /// answering or a connect that takes too long.
    public mutating func tick(now: Double) -> [Action] {
        switch state {
        case .connecting:
            guard now >= connectDeadline else { return [] }
            return connectFailed("no answer to the connection attempt within \(Self.seconds(timeout))")
        case .ready:
            switch queue.expire(now: now) {
            case .none: return []
            case .abandon(let completions): return [.fail(completions, timedOut)]
            case .unresponsive: return lost(timedOut.message)
            }
        case .idle, .backingOff, .closed:
            return []
        }
    }

    private var timedOut: PGError { PGError("no answer from the database within \(Self.seconds(timeout))") }

    public static func seconds(_ s: Double) -> String {
        s == s.rounded() ? "\(Int(s)) s" : "\(s) s"
    }

    public mutating func connected() -> [Action] {
        guard state == .connecting else { return [.closeConnection] }
        state = .ready
        failuresInARow = 0
        return [.becomeReady]
    }

    public mutating func connectFailed(_ reason: String) -> [Action] {
        guard state == .connecting else { return [] }
        state = .backingOff
        return [.closeConnection, .scheduleReconnect(after: nextBackoff(), reason: reason)]
    }

    public mutating func reconnectDue(now: Double) -> [Action] {
        guard state == .backingOff else { return [] }
        state = .connecting
        connectDeadline = now + timeout
        return [.connect]
    }

    /// Sends a batch whose caller waits `timeout` seconds at most (the machine's own when nil:
    /// background work that may run longer passes its own).
    public mutating func execute(_ queries: [PGQuery], completion: Completion, now: Double, timeout: Double? = nil) -> [Action] {
        guard state == .ready else {
            return [.fail([completion], PGError("the database connection is not ready"))]
        }
        return [.send(queue.enqueue(queries, completion: completion, now: now, deadline: now + (timeout ?? self.timeout)))]
    }

    public mutating func received(_ input: PipelineQueue<Completion>.Input, now: Double) -> [Action] {
        guard state == .ready else { return [] }
        var actions: [Action] = []
        for action in queue.receive(input, now: now) {
            switch action {
            case .complete(let c, let results, let elapsed):
                actions.append(.complete(c, results, elapsed: elapsed))
            case .protocolViolation(let why):
                return actions + lost("protocol violation: \(why)")
            }
        }
        return actions
    }

    /// The socket failed: a read, a write, a flush or a send.
    public mutating func connectionLost(_ reason: String) -> [Action] {
        switch state {
        case .ready: return lost(reason)
        case .connecting: return connectFailed(reason)
        case .idle, .backingOff, .closed: return []
        }
    }

    public mutating func close() -> [Action] {
        let wasOpen = state == .ready || state == .connecting
        state = .closed
        let failed = queue.fail()
        var actions: [Action] = wasOpen ? [.closeConnection] : []
        if !failed.isEmpty { actions.append(.fail(failed, PGError("the database connection was closed"))) }
        return actions
    }

    private mutating func lost(_ reason: String) -> [Action] {
        state = .backingOff
        let failed = queue.fail()
        var actions: [Action] = [.closeConnection]
        if !failed.isEmpty { actions.append(.fail(failed, PGError(reason))) }
        actions.append(.reportLost(reason))
        actions.append(.scheduleReconnect(after: nextBackoff(), reason: reason))
        return actions
    }

    private mutating func nextBackoff() -> Double {
        failuresInARow += 1
        return backoff.delay(afterAttempt: failuresInARow, random: 0)
    }
}
