/// What to put on the wire, in order (one libpq send call each).
public enum PGCommand: Equatable, Sendable {
    case prepare(name: String, sql: String, parameterCount: Int)
    case executePrepared(name: String, params: [String?])
    case execute(sql: String, params: [String?])
    case sync
}

/// One thing `PQgetResult` returned. Not generic (unlike the queue), so the driver that
/// produces it need not know the queue's completion type.
public enum PGInput: Sendable {
    /// A statement's (or a Parse's) result.
    case result(PGResult)
    /// NULL: the current query has no more results.
    case endOfQuery
    /// `PGRES_PIPELINE_SYNC`.
    case sync
}

/// The bookkeeping of libpq's pipeline mode, with no libpq in it.
///
/// A batch is a list of statements followed by a sync point; PostgreSQL runs it as one implicit
/// transaction. Batches may overlap in flight and complete in order. For every statement the
/// server sends one result and libpq then reports the end of that query (`PQgetResult` returns
/// NULL); an error makes each later statement of the batch report "aborted"; the sync point
/// reports `PGRES_PIPELINE_SYNC`. The shell turns each `PQgetResult` into an `Input` and
/// performs the `Action`s this returns; tests feed synthetic inputs.
///
/// A finished batch leaves nothing behind: its results are handed over with its completion
/// and dropped here at once.
public struct PipelineQueue<Completion> {
    public typealias Command = PGCommand
    public typealias Input = PGInput

    public enum Action {
        /// The batch reached its sync point: one result per statement, in order.
        case complete(Completion, [PGResult], elapsed: Double)
        /// The server answered something the pipeline did not expect: close the connection.
        case protocolViolation(String)
    }

    enum Expected: Equatable {
        case prepare(name: String)
        case statement(batch: UInt64, index: Int)
        case sync(batch: UInt64)
    }

    struct Batch {
        /// Nil once abandoned: its caller was answered at its deadline, its results are dropped.
        var completion: Completion?
        var results: [PGResult]
        let started: Double
        /// When its caller stops waiting (monotonic seconds).
        let deadline: Double
    }

    /// What `expire` found past its deadline.
    public enum Expiry {
        case none
        /// These batches' callers stop waiting; the batches stay in flight, their results dropped.
        case abandon([Completion])
        /// The oldest batch, the one the server is working on, is overdue: the server does not answer.
        case unresponsive
    }

    /// Whether the current expected item already got its result (waits for the end of query).
    private var resultSeen = false
    private var expected: [Expected] = []
    private var head = 0
    private var batches: [UInt64: Batch] = [:]
    private var nextBatch: UInt64 = 1
    /// Statements this connection has prepared (or has a Parse in flight for).
    public private(set) var prepared: Set<String> = []

    public init() {}

    public var inFlightBatches: Int { batches.count }
    /// Whether results are owed: the shell reads with `PQgetResult` only then.
    public var awaitingResults: Bool { head < expected.count }

    /// Plans a batch: the commands to send, preparing named statements the first time. Its
    /// caller waits until `deadline` at most (see `expire`).
    public mutating func enqueue(_ queries: [PGQuery], completion: Completion, now: Double, deadline: Double = .infinity) -> [Command] {
        let id = nextBatch
        nextBatch += 1
        var commands: [Command] = []
        commands.reserveCapacity(queries.count + 1)
        for (i, q) in queries.enumerated() {
            if let name = q.name {
                if !prepared.contains(name) {
                    prepared.insert(name)
                    commands.append(.prepare(name: name, sql: q.sql, parameterCount: q.params.count))
                    expected.append(.prepare(name: name))
                }
                commands.append(.executePrepared(name: name, params: q.params))
            } else {
                commands.append(.execute(sql: q.sql, params: q.params))
            }
            expected.append(.statement(batch: id, index: i))
        }
        commands.append(.sync)
        expected.append(.sync(batch: id))
        batches[id] = Batch(completion: completion, results: Array(repeating: .aborted, count: queries.count), started: now,
                            deadline: deadline)
        return commands
    }

    public mutating func receive(_ input: Input, now: Double) -> [Action] {
        guard head < expected.count else {
            return [.protocolViolation("a result arrived with nothing in flight")]
        }
        switch (expected[head], input) {
        case (.prepare(let name), .result(let r)):
            guard !resultSeen else { return [.protocolViolation("a second result for one Parse")] }
            resultSeen = true
            // A Parse refused, or skipped after an earlier error, prepared nothing.
            if !r.ok { prepared.remove(name) }
            return []
        case (.statement(let batch, let index), .result(let r)):
            guard !resultSeen else { return [.protocolViolation("a second result for one statement")] }
            resultSeen = true
            batches[batch]?.results[index] = r
            return []
        case (.prepare, .endOfQuery), (.statement, .endOfQuery):
            advance()
            return []
        case (.sync(let id), .sync):
            advance()
            guard let batch = batches.removeValue(forKey: id), let completion = batch.completion else { return [] }
            return [.complete(completion, batch.results, elapsed: now - batch.started)]
        case (.sync, .endOfQuery):
            // libpq may report a stray end of query before the sync; nothing to account for.
            return []
        case (.sync, .result):
            return [.protocolViolation("a result arrived where the sync point was expected")]
        case (.prepare, .sync), (.statement, .sync):
            return [.protocolViolation("the sync point arrived before every statement answered")]
        }
    }

    /// Whether a batch in flight is past its deadline (abandoned ones included: the server
    /// still owes their answers).
    public func isOverdue(now: Double) -> Bool {
        batches.values.contains { $0.deadline <= now }
    }

    /// Batches past their deadline. Batches complete in order, so when the oldest is overdue
    /// the server has stopped answering (or runs it far too long): the connection must go.
    /// A later batch overdue behind a slower one that is still within its own (longer)
    /// deadline is abandoned instead: its caller is answered now, the server finishes it.
    public mutating func expire(now: Double) -> Expiry {
        guard let oldest = batches.keys.min(), let first = batches[oldest] else { return .none }
        if first.deadline <= now { return .unresponsive }
        var abandoned: [(UInt64, Completion)] = []
        for (id, batch) in batches where batch.deadline <= now {
            if let c = batch.completion { abandoned.append((id, c)) }
            batches[id]?.completion = nil
        }
        return abandoned.isEmpty ? .none : .abandon(abandoned.sorted { $0.0 < $1.0 }.map(\.1))
    }

    /// The connection is gone: every batch in flight fails, in order; nothing stays prepared.
    public mutating func fail() -> [Completion] {
        var failed: [Completion] = []
        for item in expected[head...] {
            if case .sync(let id) = item, let batch = batches.removeValue(forKey: id), let c = batch.completion { failed.append(c) }
        }
        expected.removeAll()
        head = 0
        resultSeen = false
        prepared.removeAll()
        batches.removeAll()
        return failed
    }

    private mutating func advance() {
        head += 1
        resultSeen = false
        if head == expected.count {
            expected.removeAll(keepingCapacity: true)
            head = 0
        } else if head >= 256 && head * 2 >= expected.count {
            expected.removeFirst(head)
            head = 0
        }
    }
}
