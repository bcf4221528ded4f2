import CLibpq
import DispatchSystem

/// Synchronous libpq, for start-up and admin commands only (never on the event loop).
public final class BlockingPG {
    private let conn: OpaquePointer

    public init(_ conninfo: String) throws(PGError) {
        guard let c = PQconnectdb(conninfo) else { throw PGError("out of memory") }
        guard PQstatus(c) == CONNECTION_OK else {
            let message = String(cString: PQerrorMessage(c))
            PQfinish(c)
            throw PGError(message.trimmingNewlines)
        }
        conn = c
        PQsetNoticeProcessor(c, { _, _ in }, nil)
    }

    deinit { PQfinish(conn) }

    @discardableResult
    public func query(_ sql: String, _ params: [String?] = []) throws(PGError) -> PGResult {
        let r = withCStrings(params) { PQexecParams(conn, sql, Int32(params.count), nil, $0, nil, nil, 0) }
        guard let r else { throw PGError(String(cString: PQerrorMessage(conn)).trimmingNewlines) }
        defer { PQclear(r) }
        let out = PGConnection.copy(r)
        if let e = out.errorMessage { throw PGError(e.trimmingNewlines) }
        return out
    }

    @discardableResult
    public func query(_ q: PGQuery) throws(PGError) -> PGResult { try query(q.sql, q.params) }

    /// Runs a script of several statements (a migration file).
    public func script(_ sql: String) throws(PGError) {
        guard let r = PQexec(conn, sql) else { throw PGError(String(cString: PQerrorMessage(conn)).trimmingNewlines) }
        defer { PQclear(r) }
        let out = PGConnection.copy(r)
        if let e = out.errorMessage { throw PGError(e.trimmingNewlines) }
    }
}
