import CLibpq
import DispatchSystem
import Glibc

/// Synchronous libpq, for start-up and admin commands only (never on the event loop).
///
/// Each round trip, and the connection itself, has a deadline (`timeout` seconds): a database
/// that stops answering makes the call throw instead of hanging the process forever.
public final class BlockingPG {
    private let conn: OpaquePointer
    /// Seconds one round trip (or the connection) may take.
    public var timeout: Double

    public init(_ conninfo: String, timeout: Double = 30) throws(PGError) {
        self.timeout = timeout
        // connect_timeout first: a value in the URL or conninfo itself wins (expanded later).
        let keywords: [String?] = ["connect_timeout", "dbname", nil]
        let values: [String?] = [String(max(2, Int(timeout.rounded(.up)))), conninfo, nil]
        guard let c = withCStrings(keywords, { k in withCStrings(values) { v in PQconnectdbParams(k, v, 1) } }) else {
            throw PGError("out of memory")
        }
        guard PQstatus(c) == CONNECTION_OK else {
            let message = String(cString: PQerrorMessage(c))
            PQfinish(c)
            throw PGError(message.trimmingNewlines)
        }
        conn = c
        PQsetNoticeProcessor(c, { _, _ in }, nil)
        PQsetnonblocking(c, 1)
    }

    deinit { PQfinish(conn) }

    @discardableResult
    public func query(_ sql: String, _ params: [String?] = []) throws(PGError) -> PGResult {
        let sent = withCStrings(params) { PQsendQueryParams(conn, sql, Int32(params.count), nil, $0, nil, nil, 0) }
        let out = try awaitResult(sent == 1)
        if let e = out.errorMessage { throw PGError(e.trimmingNewlines) }
        return out
    }

    @discardableResult
    public func query(_ q: PGQuery) throws(PGError) -> PGResult { try query(q.sql, q.params) }

    /// Runs a script of several statements (a migration file).
    public func script(_ sql: String) throws(PGError) {
        let out = try awaitResult(PQsendQuery(conn, sql) == 1)
        if let e = out.errorMessage { throw PGError(e.trimmingNewlines) }
    }

    /// Flushes what was sent and reads every result until the query is done, within the
    /// deadline; returns the first failed result, else the last one (as `PQexec` would).
    private func awaitResult(_ sent: Bool) throws(PGError) -> PGResult {
        guard sent else { throw PGError(errorMessage) }
        let deadline = Clock.monotonic() + timeout
        var last: PGResult?
        var failed: PGResult?
        while true {
            let flushed = PQflush(conn)
            if flushed < 0 { throw PGError(errorMessage) }
            if flushed == 0 {
                guard PQconsumeInput(conn) == 1 else { throw PGError(errorMessage) }
                while PQisBusy(conn) == 0 {
                    guard let r = PQgetResult(conn) else { return failed ?? last ?? PGResult() }
                    let copied = LibpqDriver.copy(r)
                    PQclear(r)
                    if copied.errorMessage != nil, failed == nil { failed = copied }
                    last = copied
                }
            }
            let remaining = deadline - Clock.monotonic()
            guard remaining > 0 else {
                throw PGError("no answer from the database within \(PGConnectionMachine<Void>.seconds(timeout))")
            }
            var fd = pollfd(fd: PQsocket(conn), events: Int16(POLLIN | (flushed == 1 ? POLLOUT : 0)), revents: 0)
            _ = poll(&fd, 1, Int32(min(remaining * 1000, 1000).rounded(.up)))
        }
    }

    private var errorMessage: String { String(cString: PQerrorMessage(conn)).trimmingNewlines }
}
