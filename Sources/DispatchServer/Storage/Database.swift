import DispatchCore
import DispatchIO

/// One worker's database sessions: a writer for group-committed changes, a reader for point
/// reads and the rest, and a feed reader for feed pages and replays, each pipelined. A session
/// answers its statements in order, so feed pages (many, each walking an index) get a session
/// of their own: a point read never waits behind them. Its results are handled at the loop's
/// `.background` priority, so framing and sending pages waits while requests, commits or live
/// changes are ready. (The LISTEN session is the worker's own.)
///
/// Every round trip a caller waits on has a deadline, `DISPATCH_DB_TIMEOUT` (contract §6):
/// past it the caller gets 503 and a session that stopped answering starts over. Background
/// work that may legitimately run longer (retention) passes `backgroundTimeout`.
final class Database {
    let writer: PGConnection
    let reader: PGConnection
    let feedReader: PGConnection

    convenience init(loop: EventLoop, conninfo: String, log: Logger, metrics: Metrics, timeout: Double = 5) {
        self.init(writer: PGConnection(loop: loop, conninfo: conninfo, name: "writer", log: log, timeout: timeout),
                  reader: PGConnection(loop: loop, conninfo: conninfo, name: "reader", log: log, timeout: timeout),
                  feedReader: PGConnection(loop: loop, conninfo: conninfo, name: "feed_reader", log: log, timeout: timeout,
                                              priority: .background),
                  metrics: metrics)
    }

    /// On given sessions (a test's, on scripted drivers).
    init(writer: PGConnection, reader: PGConnection, feedReader: PGConnection, metrics: Metrics) {
        self.writer = writer
        self.reader = reader
        self.feedReader = feedReader
        writer.onRoundTrip = { [metrics] in metrics.writerRoundTrips.observe($0) }
        reader.onRoundTrip = { [metrics] in metrics.readerRoundTrips.observe($0) }
        feedReader.onRoundTrip = { [metrics] in metrics.readerRoundTrips.observe($0) }
        for session in [writer, reader, feedReader] { session.onDeadlineMissed = { [metrics] in metrics.dbTimeouts += 1 } }
    }

    /// Every session up, and no round trip past its deadline.
    var isReady: Bool {
        writer.isReady && reader.isReady && feedReader.isReady && !writer.isOverdue && !reader.isOverdue && !feedReader.isOverdue
    }

    /// Seconds a background batch (retention) may run: longer than a caller waits, bounded
    /// so that a server that stopped answering is still noticed.
    var backgroundTimeout: Double { max(60, reader.timeout) }

    func start() {
        writer.start()
        reader.start()
        feedReader.start()
    }

    func close() {
        writer.close()
        reader.close()
        feedReader.close()
    }

    /// Runs one statement on the reader and hands back its rows, or the client-facing error:
    /// 503 when the database cannot answer, 500 when it refused the statement.
    func read(_ query: PGQuery, timeout: Double? = nil, _ completion: @escaping (Result<PGResult, DispatchError>) -> Void) {
        read(query, on: reader, timeout: timeout, completion)
    }

    /// The same on the feed session (feed pages, replays and catch-up reads).
    func readFeed(_ query: PGQuery, _ completion: @escaping (Result<PGResult, DispatchError>) -> Void) {
        read(query, on: feedReader, timeout: nil, completion)
    }

    private func read(_ query: PGQuery, on session: PGConnection, timeout: Double?,
                      _ completion: @escaping (Result<PGResult, DispatchError>) -> Void) {
        session.execute([query], timeout: timeout) { result in
            switch result {
            case .failure: completion(.failure(Database.unavailable))
            case .success(let rs) where !rs[0].ok: completion(.failure(DispatchError(.internalError, "the database refused the query")))
            case .success(let rs): completion(.success(rs[0]))
            }
        }
    }

    /// Run first on each (re)connected feed session: feed pages are short index walks, and the
    /// generic plan of their prepared statements chose a parallel scan whose workers' start-up
    /// cost 50-80 ms a page (0.9 ms without).
    static let feedSessionSetup = PGQuery("SET max_parallel_workers_per_gather = 0")

    static let unavailable = DispatchError.unavailable
    static let refusesWrites = DispatchError.refusesWrites

    /// Whether the database was reachable but refused a write: a read-only server or replica
    /// (25006), or no space left (53100) or other insufficient resources (class 53).
    static func refusedWrite(_ sqlState: String?) -> Bool {
        guard let s = sqlState else { return false }
        return s == "25006" || s.hasPrefix("53")
    }

    /// Whether writes would be refused right now (a read-only session or a standby).
    static let writableProbe = PGQuery(
        "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only')::boolean AS read_only", name: "writable_probe")
}

/// What `/readyz` says of one worker.
enum Readiness: String, Equatable {
    case ready
    /// A database session is down (or the LISTEN session is not established).
    case databaseUnavailable = "database"
    /// The database answers but refuses writes: reads and streams work, publishes do not.
    case writesRefused = "writes_refused"
    /// The carrier (NATS, or the LISTEN session) is down, refuses this server's credentials, or
    /// is connected but silent: streams and feeds still deliver, from PostgreSQL every second.
    case carrierUnavailable = "carrier"
}

extension Database {
}

/// NOTIFY channels: constants, never built from input.
enum Channel {
    /// Every committed change: `position \n id \n seq \n event \n snapshot-json` (json empty
    /// when too long).
    static let events = "dispatch_events"
    /// A key was revoked: payload is its id.
    static let keys = "dispatch_keys"
    /// A worker's liveness probe of its own LISTEN session: `pid:n`.
    static let probe = "dispatch_probe"
}

/// One committed change as NOTIFY carries it to every server process.
struct ChangeNotice {
    let position: Int64
    let activityID: String
    let seq: Int64
    let event: String
    /// The snapshot after the change; empty when it did not fit the payload (read history).
    let json: String

    init(position: Int64, activityID: String, seq: Int64, event: String, json: String) {
        self.position = position
        self.activityID = activityID
        self.seq = seq
        self.event = event
        self.json = json
    }

    init?(payload: String) {
        let parts = payload.split(separator: "\n", maxSplits: 4, omittingEmptySubsequences: false)
        guard parts.count == 5, let position = Int64(parts[0]), let seq = Int64(parts[2]) else { return nil }
        self.init(position: position, activityID: String(parts[1]), seq: seq, event: String(parts[3]), json: String(parts[4]))
    }
}
