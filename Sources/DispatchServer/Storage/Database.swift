import DispatchCore
import DispatchIO

/// One worker's database sessions: a writer for group-committed changes and a reader for
/// everything else, each pipelined. (The LISTEN session is the worker's own.)
final class Database {
    let writer: PGConnection
    let reader: PGConnection

    init(loop: EventLoop, conninfo: String, log: Logger, metrics: Metrics) {
        writer = PGConnection(loop: loop, conninfo: conninfo, name: "writer", log: log)
        reader = PGConnection(loop: loop, conninfo: conninfo, name: "reader", log: log)
        for c in [writer, reader] {
            c.onRoundTrip = { [metrics] in metrics.observeQuery($0) }
        }
    }

    var isReady: Bool { writer.isReady && reader.isReady }

    func start() {
        writer.start()
        reader.start()
    }

    func close() {
        writer.close()
        reader.close()
    }

    /// Runs one statement on the reader and hands back its rows, or the client-facing error:
    /// 503 when the database cannot answer, 500 when it refused the statement.
    func read(_ query: PGQuery, _ completion: @escaping (Result<PGResult, DispatchError>) -> Void) {
        reader.execute([query]) { result in
            switch result {
            case .failure: completion(.failure(Database.unavailable))
            case .success(let rs) where !rs[0].ok: completion(.failure(DispatchError(.internalError, "the database refused the query")))
            case .success(let rs): completion(.success(rs[0]))
            }
        }
    }

    static let unavailable = DispatchError(.databaseUnavailable, "the database is unavailable, retry shortly")
}

/// NOTIFY channels: constants, never built from input.
enum Channel {
    /// Every committed change: `id \n seq \n event \n snapshot-json` (json empty when too long).
    static let events = "dispatch_events"
    /// A key was revoked: payload is its name.
    static let keys = "dispatch_keys"
}
