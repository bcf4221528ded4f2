import CLibevent
import CLibpq
import Glibc

/// One parameterised statement. A `name` makes it a prepared statement, prepared once per connection.
public struct PGQuery: Sendable {
    public var name: String?
    public var sql: String
    public var params: [String?]

    public init(_ sql: String, _ params: [String?] = [], name: String? = nil) {
        self.sql = sql
        self.params = params
        self.name = name
    }
}

/// A statement's outcome, copied out of libpq: rows of text values, or the server's error.
public struct PGResult: Sendable {
    public var rows: [[String?]] = []
    public var columns: [String] = []
    public var errorMessage: String?
    public var sqlState: String?
    public var affectedRows: Int = 0

    public var ok: Bool { errorMessage == nil }

    public func column(_ name: String) -> Int? { columns.firstIndex(of: name) }
}

public struct PGError: Error, Sendable, CustomStringConvertible {
    public let message: String
    public var description: String { message }
    public init(_ message: String) { self.message = message }
}

/// An asynchronous libpq connection driven by the event loop, in pipeline mode.
///
/// `execute` sends a batch of statements followed by a sync point; batches may overlap in
/// flight and complete in order. A lost connection fails what is in flight and reconnects
/// with backoff by itself; `onReady` runs after every (re)connect, `onLost` after every loss.
public final class PGConnection {
    public typealias Completion = (Result<[PGResult], PGError>) -> Void

    public let name: String
    private let loop: EventLoop
    private let conninfo: String
    private let log: Logger
    private var conn: OpaquePointer?
    private var readEvent: OpaquePointer?
    private var writeEvent: OpaquePointer?
    private var connectEvent: OpaquePointer?
    private var prepared: Set<String> = []
    private var backoff = Backoff(initial: 0.1, maximum: 5)
    private var reconnectTimer: Timer?
    private var stopped = false

    public private(set) var isReady = false
    public var onReady: (() -> Void)?
    public var onLost: ((String) -> Void)?
    public var onNotify: ((String, String) -> Void)?
    /// Observes each batch's round-trip time in seconds (metrics).
    public var onRoundTrip: ((Double) -> Void)?

    private enum Expected {
        case prepare(String)
        case statement(batch: Batch, index: Int)
        case sync(Batch)
    }

    private final class Batch {
        var results: [PGResult]
        let completion: Completion
        let started: Double
        init(count: Int, completion: @escaping Completion) {
            results = Array(repeating: PGResult(), count: count)
            self.completion = completion
            started = Clock.monotonic()
        }
    }

    private var expected: [Expected] = []
    private var expectedHead = 0
    private var inFlightBatches = 0
    public var pendingBatches: Int { inFlightBatches }

    public init(loop: EventLoop, conninfo: String, name: String, log: Logger) {
        self.loop = loop
        self.conninfo = conninfo
        self.name = name
        self.log = log
    }

    public func start() {
        stopped = false
        connect()
    }

    public func close() {
        stopped = true
        teardown(reason: "closed")
    }

    // MARK: - Connecting

    private func connect() {
        guard !stopped else { return }
        // The URL or conninfo is expanded as dbname; application_name tells operators (and
        // tests) which process and connection a backend serves.
        let appName = "dispatchd-\(getpid())-\(name)"
        let keywords: [String?] = ["dbname", "application_name", nil]
        let values: [String?] = [conninfo, appName, nil]
        let started = withCStrings(keywords) { k in withCStrings(values) { v in PQconnectStartParams(k, v, 1) } }
        guard let c = started else { scheduleReconnect("out of memory"); return }
        conn = c
        if PQstatus(c) == CONNECTION_BAD {
            let message = String(cString: PQerrorMessage(c))
            PQfinish(c)
            conn = nil
            scheduleReconnect(message)
            return
        }
        pollConnect(PGRES_POLLING_WRITING)
    }

    private func pollConnect(_ state: PostgresPollingStatusType) {
        guard let c = conn else { return }
        if let e = connectEvent { event_free(e); connectEvent = nil }
        switch state {
        case PGRES_POLLING_OK:
            connected()
        case PGRES_POLLING_FAILED:
            let message = String(cString: PQerrorMessage(c))
            PQfinish(c)
            conn = nil
            scheduleReconnect(message)
        default:
            let what = state == PGRES_POLLING_READING ? EV_READ : EV_WRITE
            connectEvent = event_new(loop.base, PQsocket(c), Int16(what), { _, events, arg in
                let me = Unmanaged<PGConnection>.fromOpaque(arg!).takeUnretainedValue()
                guard let c = me.conn else { return }
                if Int32(events) & EV_TIMEOUT != 0 {
                    // A connect step that hears nothing for 10 s: give up and start over.
                    if let e = me.connectEvent { event_free(e); me.connectEvent = nil }
                    PQfinish(c)
                    me.conn = nil
                    me.scheduleReconnect("connect timed out")
                    return
                }
                me.pollConnect(PQconnectPoll(c))
            }, Unmanaged.passUnretained(self).toOpaque())
            var tv = timeval(seconds: 10)
            event_add(connectEvent, &tv)
        }
    }

    private func connected() {
        guard let c = conn else { return }
        PQsetnonblocking(c, 1)
        PQsetNoticeProcessor(c, { arg, message in
            let me = Unmanaged<PGConnection>.fromOpaque(arg!).takeUnretainedValue()
            var text = message.map { String(cString: $0) } ?? ""
            while text.hasSuffix("\n") { text.removeLast() }
            me.log.info("postgres.notice", [("conn", me.name), ("notice", text)])
        }, Unmanaged.passUnretained(self).toOpaque())
        guard PQenterPipelineMode(c) == 1 else {
            log.error("postgres.pipeline_failed", [("conn", name)])
            teardown(reason: "cannot enter pipeline mode")
            return
        }
        readEvent = event_new(loop.base, PQsocket(c), Int16(EV_READ | EV_PERSIST), { _, _, arg in
            Unmanaged<PGConnection>.fromOpaque(arg!).takeUnretainedValue().readable()
        }, Unmanaged.passUnretained(self).toOpaque())
        event_add(readEvent, nil)
        writeEvent = event_new(loop.base, PQsocket(c), Int16(EV_WRITE), { _, _, arg in
            Unmanaged<PGConnection>.fromOpaque(arg!).takeUnretainedValue().flush()
        }, Unmanaged.passUnretained(self).toOpaque())
        backoff.reset()
        isReady = true
        log.info("postgres.connected", [("conn", name)])
        onReady?()
    }

    private func scheduleReconnect(_ message: String) {
        guard !stopped else { return }
        let delay = backoff.next()
        var text = message
        while text.hasSuffix("\n") { text.removeLast() }
        log.warning("postgres.reconnect", [("conn", name), ("in_s", delay), ("error", text)])
        reconnectTimer = loop.timer(after: delay) { [weak self] in self?.connect() }
    }

    private func teardown(reason: String) {
        let wasReady = isReady
        isReady = false
        if let e = readEvent { event_free(e); readEvent = nil }
        if let e = writeEvent { event_free(e); writeEvent = nil }
        if let e = connectEvent { event_free(e); connectEvent = nil }
        if let c = conn { PQfinish(c); conn = nil }
        prepared.removeAll()
        let failed = expected[expectedHead...]
        expected.removeAll()
        expectedHead = 0
        inFlightBatches = 0
        for item in failed {
            if case .sync(let batch) = item { batch.completion(.failure(PGError(reason))) }
        }
        if wasReady { onLost?(reason) }
        if !stopped { scheduleReconnect(reason) }
    }

    // MARK: - Queries

    /// Sends the statements as one pipeline batch. Fails at once when not connected.
    public func execute(_ queries: [PGQuery], completion: @escaping Completion) {
        guard isReady, let c = conn else {
            completion(.failure(PGError("database connection \(name) is not ready")))
            return
        }
        let batch = Batch(count: queries.count, completion: completion)
        for (i, q) in queries.enumerated() {
            let ok: Bool
            if let stmt = q.name {
                if !prepared.contains(stmt) {
                    guard PQsendPrepare(c, stmt, q.sql, Int32(q.params.count), nil) == 1 else {
                        return sendFailed(batch)
                    }
                    prepared.insert(stmt)
                    expected.append(.prepare(stmt))
                }
                ok = withCStrings(q.params) { PQsendQueryPrepared(c, stmt, Int32(q.params.count), $0, nil, nil, 0) } == 1
            } else {
                ok = withCStrings(q.params) { PQsendQueryParams(c, q.sql, Int32(q.params.count), nil, $0, nil, nil, 0) } == 1
            }
            guard ok else { return sendFailed(batch) }
            expected.append(.statement(batch: batch, index: i))
        }
        guard PQpipelineSync(c) == 1 else { return sendFailed(batch) }
        expected.append(.sync(batch))
        inFlightBatches += 1
        flush()
    }

    private func sendFailed(_ batch: Batch) {
        let message = conn.map { String(cString: PQerrorMessage($0)) } ?? "no connection"
        // The pipeline's state is unknown now: start over on a fresh connection.
        expected.append(.sync(batch))
        teardown(reason: "send failed: \(message)")
    }

    private func flush() {
        guard let c = conn else { return }
        let r = PQflush(c)
        if r == 1 {
            event_add(writeEvent, nil)
        } else if r < 0 {
            teardown(reason: String(cString: PQerrorMessage(c)))
        }
    }

    private func readable() {
        guard let c = conn else { return }
        guard PQconsumeInput(c) == 1 else {
            teardown(reason: String(cString: PQerrorMessage(c)))
            return
        }
        drainResults()
        guard let c2 = conn else { return }
        while let n = PQnotifies(c2) {
            let channel = String(cString: n.pointee.relname)
            let payload = String(cString: n.pointee.extra)
            PQfreemem(n)
            onNotify?(channel, payload)
        }
    }

    private func drainResults() {
        while let c = conn, expectedHead < expected.count, PQisBusy(c) == 0 {
            let item = expected[expectedHead]
            let r = PQgetResult(c)
            switch item {
            case .sync(let batch):
                guard let r else { continue }
                let status = PQresultStatus(r)
                PQclear(r)
                guard status == PGRES_PIPELINE_SYNC else { continue }
                advance()
                inFlightBatches -= 1
                onRoundTrip?(Clock.monotonic() - batch.started)
                batch.completion(.success(batch.results))
            case .prepare(let stmt):
                guard let r else { advance(); continue }
                // A Parse skipped or refused (an earlier error in the batch) prepared nothing.
                if PQresultStatus(r) != PGRES_COMMAND_OK { prepared.remove(stmt) }
                PQclear(r)
            case .statement(let batch, let index):
                guard let r else { advance(); continue }
                batch.results[index] = PGConnection.copy(r)
                PQclear(r)
            }
        }
        if expectedHead > 1024 && expectedHead * 2 > expected.count {
            expected.removeFirst(expectedHead)
            expectedHead = 0
        }
    }

    private func advance() { expectedHead += 1 }

    static func copy(_ r: OpaquePointer) -> PGResult {
        var out = PGResult()
        let status = PQresultStatus(r)
        switch status {
        case PGRES_TUPLES_OK, PGRES_COMMAND_OK, PGRES_SINGLE_TUPLE:
            let nrows = PQntuples(r), ncols = PQnfields(r)
            out.columns = (0..<ncols).map { String(cString: PQfname(r, $0)) }
            out.rows.reserveCapacity(Int(nrows))
            for i in 0..<nrows {
                var row: [String?] = []
                row.reserveCapacity(Int(ncols))
                for j in 0..<ncols {
                    row.append(PQgetisnull(r, i, j) == 1 ? nil : String(cString: PQgetvalue(r, i, j)))
                }
                out.rows.append(row)
            }
            out.affectedRows = Int(String(cString: PQcmdTuples(r))) ?? 0
        case PGRES_PIPELINE_ABORTED:
            out.errorMessage = "statement skipped: an earlier statement in the batch failed"
        default:
            let message = PQresultErrorMessage(r).map { String(cString: $0) } ?? "query failed"
            out.errorMessage = message.isEmpty ? "query failed (status \(status.rawValue))" : message
            if let state = PQresultErrorField(r, Int32(UInt8(ascii: "C"))) { out.sqlState = String(cString: state) }
        }
        return out
    }
}

/// Passes Swift strings as a C `const char * const *` array (NULL for SQL NULL).
func withCStrings<R>(_ values: [String?], _ body: (UnsafePointer<UnsafePointer<CChar>?>?) -> R) -> R {
    if values.isEmpty { return body(nil) }
    var pointers: [UnsafeMutablePointer<CChar>?] = values.map { $0.map { strdup($0) } ?? nil }
    defer { for p in pointers { free(p) } }
    return pointers.withUnsafeMutableBufferPointer { buf in
        buf.baseAddress!.withMemoryRebound(to: UnsafePointer<CChar>?.self, capacity: max(buf.count, 1)) { body($0) }
    }
}

/// Exponential backoff with a cap; `reset` after a success.
public struct Backoff {
    let initial: Double
    let maximum: Double
    var current: Double

    public init(initial: Double, maximum: Double) {
        self.initial = initial
        self.maximum = maximum
        current = initial
    }

    public mutating func next() -> Double {
        let d = current
        current = min(current * 2, maximum)
        return d
    }

    public mutating func reset() { current = initial }
}
