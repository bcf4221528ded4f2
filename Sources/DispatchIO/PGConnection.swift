import CLibevent
import CLibpq
import DispatchSystem
import Glibc
@_exported import PGCore

/// An asynchronous libpq connection in pipeline mode, driven by the event loop.
///
/// The decisions (when to connect, what to send, which batch a result belongs to, what fails
/// when the connection is lost) are `PGConnectionMachine`'s; this class only talks to libpq
/// and libevent and performs the machine's actions in one exhaustive switch. Owners must
/// `close()` it before letting it go: its libevent events and libpq's notice processor point
/// at it.
public final class PGConnection {
    public typealias Completion = (Result<[PGResult], PGError>) -> Void

    public let name: String
    private let loop: EventLoop
    private let conninfo: String
    private let log: Logger
    private var machine: PGConnectionMachine<Completion>
    private var conn: OpaquePointer?
    private var readEvent: OpaquePointer?
    private var writeEvent: OpaquePointer?
    private var connectEvent: OpaquePointer?
    private var reconnectTimer: Timer?
    /// Calls the machine's `tick` a few times a second, from `start()` to `close()`.
    private var deadlineTimer: Timer?

    public var onReady: (() -> Void)?
    public var onLost: ((String) -> Void)?
    public var onNotify: ((String, String) -> Void)?
    /// Observes each batch's round-trip time in seconds (metrics).
    public var onRoundTrip: ((Double) -> Void)?
    /// A round trip or a connection attempt went past its deadline (metrics).
    public var onDeadlineMissed: (() -> Void)?

    public var isReady: Bool { machine.isReady }
    public var pendingBatches: Int { machine.queue.inFlightBatches }
    /// Whether a round trip is past its deadline right now.
    public var isOverdue: Bool { machine.isOverdue(now: Clock.monotonic()) }
    public var timeout: Double { machine.timeout }

    /// `timeout`: seconds a caller waits for its batch (unless it passes its own) and a
    /// connection attempt may take.
    public init(loop: EventLoop, conninfo: String, name: String, log: Logger, timeout: Double = 5) {
        self.loop = loop
        self.conninfo = conninfo
        self.name = name
        self.log = log
        machine = PGConnectionMachine(timeout: timeout)
    }

    deinit {
        precondition(machine.state == .idle || machine.state == .closed, "PGConnection \(name) released without close()")
    }

    public func start() {
        if deadlineTimer == nil {
            deadlineTimer = loop.timer(after: min(0.5, max(0.05, machine.timeout / 10)), repeating: true) { [weak self] in
                guard let self else { return }
                let actions = self.machine.tick(now: Clock.monotonic())
                if !actions.isEmpty { self.onDeadlineMissed?() }
                self.perform(actions)
            }
        }
        perform(machine.start(now: Clock.monotonic()))
    }

    public func close() {
        reconnectTimer?.cancel()
        reconnectTimer = nil
        deadlineTimer?.cancel()
        deadlineTimer = nil
        perform(machine.close())
    }

    /// Sends the statements as one pipeline batch; `completion` runs once, never inside this
    /// call, with a failure when no answer came within `timeout` seconds (the connection's own
    /// when nil).
    public func execute(_ queries: [PGQuery], timeout: Double? = nil, completion: @escaping Completion) {
        perform(machine.execute(queries, completion: completion, now: Clock.monotonic(), timeout: timeout))
    }

    // MARK: - Performing the machine's actions

    private func perform(_ actions: [PGConnectionMachine<Completion>.Action]) {
        for action in actions {
            switch action {
            case .connect:
                connect()
            case .becomeReady:
                becomeReady()
            case .send(let commands):
                send(commands)
            case .complete(let completion, let results, let elapsed):
                onRoundTrip?(elapsed)
                completion(.success(results))
            case .fail(let completions, let error):
                // Later, outside whatever call brought us here (execute, a read, close).
                loop.soon { for c in completions { c(.failure(error)) } }
            case .closeConnection:
                closeConnection()
            case .reportLost(let reason):
                onLost?(reason)
            case .scheduleReconnect(let delay, let reason):
                log.warning("postgres.reconnect", [("conn", name), ("in_s", delay), ("error", reason.trimmingNewlines)])
                reconnectTimer = loop.timer(after: delay) { [weak self] in
                    guard let self else { return }
                    self.perform(self.machine.reconnectDue(now: Clock.monotonic()))
                }
            }
        }
    }

    // MARK: - libpq and libevent

    private func connect() {
        // The URL or conninfo is expanded as dbname; application_name tells operators (and
        // tests) which process and connection a backend serves.
        let keywords: [String?] = ["dbname", "application_name", nil]
        let values: [String?] = [conninfo, "dispatchd-\(getpid())-\(name)", nil]
        let started = withCStrings(keywords) { k in withCStrings(values) { v in PQconnectStartParams(k, v, 1) } }
        guard let c = started else { return perform(machine.connectFailed("out of memory")) }
        conn = c
        if PQstatus(c) == CONNECTION_BAD { return perform(machine.connectFailed(errorMessage)) }
        poll(PGRES_POLLING_WRITING)
    }

    private func poll(_ status: PostgresPollingStatusType) {
        guard let c = conn else { return }
        freeEvent(&connectEvent)
        switch status {
        case PGRES_POLLING_OK:
            perform(machine.connected())
        case PGRES_POLLING_FAILED:
            perform(machine.connectFailed(errorMessage))
        default:
            let what = status == PGRES_POLLING_READING ? EV_READ : EV_WRITE
            // The machine's connect deadline (tick) gives up on a server that never answers.
            connectEvent = event_new(loop.base, PQsocket(c), Int16(what), { _, _, arg in
                let me = Unmanaged<PGConnection>.fromOpaque(arg!).takeUnretainedValue()
                guard let c = me.conn else { return }
                me.poll(PQconnectPoll(c))
            }, Unmanaged.passUnretained(self).toOpaque())
            event_add(connectEvent, nil)
        }
    }

    private func becomeReady() {
        guard let c = conn else { return }
        PQsetnonblocking(c, 1)
        PQsetNoticeProcessor(c, { arg, message in
            let me = Unmanaged<PGConnection>.fromOpaque(arg!).takeUnretainedValue()
            let text = message.map { String(cString: $0) } ?? ""
            me.log.info("postgres.notice", [("conn", me.name), ("notice", text.trimmingNewlines)])
        }, Unmanaged.passUnretained(self).toOpaque())
        guard PQenterPipelineMode(c) == 1 else {
            log.error("postgres.pipeline_failed", [("conn", name)])
            return perform(machine.connectionLost("cannot enter pipeline mode"))
        }
        let me = Unmanaged.passUnretained(self).toOpaque()
        readEvent = event_new(loop.base, PQsocket(c), Int16(EV_READ | EV_PERSIST), { _, _, arg in
            Unmanaged<PGConnection>.fromOpaque(arg!).takeUnretainedValue().readable()
        }, me)
        event_add(readEvent, nil)
        writeEvent = event_new(loop.base, PQsocket(c), Int16(EV_WRITE), { _, _, arg in
            Unmanaged<PGConnection>.fromOpaque(arg!).takeUnretainedValue().flush()
        }, me)
        log.info("postgres.connected", [("conn", name)])
        onReady?()
    }

    private func send(_ commands: [PipelineQueue<Completion>.Command]) {
        guard let c = conn else { return perform(machine.connectionLost("no connection")) }
        for command in commands {
            let ok: Bool
            switch command {
            case .prepare(let stmt, let sql, let count):
                ok = PQsendPrepare(c, stmt, sql, Int32(count), nil) == 1
            case .executePrepared(let stmt, let params):
                ok = withCStrings(params) { PQsendQueryPrepared(c, stmt, Int32(params.count), $0, nil, nil, 0) } == 1
            case .execute(let sql, let params):
                ok = withCStrings(params) { PQsendQueryParams(c, sql, Int32(params.count), nil, $0, nil, nil, 0) } == 1
            case .sync:
                ok = PQpipelineSync(c) == 1
            }
            // The pipeline's state is unknown now: start over on a fresh connection.
            guard ok else { return perform(machine.connectionLost("send failed: \(errorMessage)")) }
        }
        flush()
    }

    private func flush() {
        guard let c = conn else { return }
        let r = PQflush(c)
        if r == 1 {
            event_add(writeEvent, nil)
        } else if r < 0 {
            perform(machine.connectionLost(errorMessage))
        }
    }

    private func readable() {
        guard let c = conn else { return }
        guard PQconsumeInput(c) == 1 else { return perform(machine.connectionLost(errorMessage)) }
        while let c = conn, machine.isReady, machine.queue.awaitingResults, PQisBusy(c) == 0 {
            let input: PipelineQueue<Completion>.Input
            if let r = PQgetResult(c) {
                input = PQresultStatus(r) == PGRES_PIPELINE_SYNC ? .sync : .result(PGConnection.copy(r))
                PQclear(r)
            } else {
                input = .endOfQuery
            }
            perform(machine.received(input, now: Clock.monotonic()))
        }
        guard let c = conn else { return }
        while let n = PQnotifies(c) {
            let channel = String(cString: n.pointee.relname)
            let payload = String(cString: n.pointee.extra)
            PQfreemem(n)
            onNotify?(channel, payload)
            if conn == nil { return }
        }
    }

    private func closeConnection() {
        freeEvent(&readEvent)
        freeEvent(&writeEvent)
        freeEvent(&connectEvent)
        if let c = conn { PQfinish(c) }
        conn = nil
    }

    private func freeEvent(_ event: inout OpaquePointer?) {
        if let e = event { event_free(e) }
        event = nil
    }

    private var errorMessage: String {
        conn.map { String(cString: PQerrorMessage($0)).trimmingNewlines } ?? "no connection"
    }

    /// Copies a libpq result into Swift values (the PGresult is freed by the caller).
    static func copy(_ r: OpaquePointer) -> PGResult {
        let status = PQresultStatus(r)
        switch status {
        case PGRES_TUPLES_OK, PGRES_COMMAND_OK, PGRES_SINGLE_TUPLE:
            let nrows = PQntuples(r), ncols = PQnfields(r)
            let columns = PGColumns((0..<ncols).map { String(cString: PQfname(r, $0)) })
            var rows: [PGRow] = []
            rows.reserveCapacity(Int(nrows))
            for i in 0..<nrows {
                var values: [String?] = []
                values.reserveCapacity(Int(ncols))
                for j in 0..<ncols {
                    values.append(PQgetisnull(r, i, j) == 1 ? nil : String(cString: PQgetvalue(r, i, j)))
                }
                rows.append(PGRow(columns: columns, values: values))
            }
            return PGResult(rows: rows, columns: columns, affectedRows: Int(String(cString: PQcmdTuples(r))) ?? 0)
        case PGRES_PIPELINE_ABORTED:
            return .aborted
        default:
            let message = PQresultErrorMessage(r).map { String(cString: $0) } ?? ""
            let state = PQresultErrorField(r, Int32(UInt8(ascii: "C"))).map { String(cString: $0) }
            return .failure(message.isEmpty ? "query failed (status \(status.rawValue))" : message, sqlState: state)
        }
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
