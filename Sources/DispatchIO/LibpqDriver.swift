import CLibevent
import CLibpq
import Glibc

/// Where a connection attempt stands (`PQconnectPoll`).
public enum PGPollStatus: Equatable, Sendable {
    /// Call `continueConnecting` once the socket is readable.
    case reading
    /// Call `continueConnecting` once the socket is writable.
    case writing
    case connected
    case failed(String)
}

/// What `PQflush` said.
public enum PGFlushStatus: Equatable, Sendable {
    case done
    /// Output remains: flush again once the socket is writable.
    case more
    case failed
}

/// The seam between `PGConnection`'s shell and libpq: one connection at a time, its socket
/// watched on the loop. `LibpqDriver` is the one dispatchd uses; DispatchHarness's
/// `ScriptedPGDriver` plays a server from a test's script (results split over reads, errors,
/// a lost connection) with no database and no socket.
///
/// Every call is made on the loop's thread. The callbacks given to `await…`/`watch…` run on
/// later loop turns and never after `finish()`.
public protocol PGDriver: AnyObject {
    /// Whether a connection (attempt) is open: between `connect` and `finish`.
    var isOpen: Bool { get }
    /// The connection's last error, one line.
    var errorMessage: String { get }

    /// Starts a non-blocking connection attempt (`PQconnectStartParams`).
    func connect(conninfo: String, applicationName: String) -> PGPollStatus
    /// Advances the attempt (`PQconnectPoll`).
    func continueConnecting() -> PGPollStatus
    /// Calls `ready` once, when the socket is ready for what the attempt waits on (`.reading`
    /// or `.writing`); replaces an earlier wait.
    func awaitSocket(_ status: PGPollStatus, _ ready: @escaping () -> Void)

    /// Non-blocking pipeline mode, with server notices passed to `notice`; false if refused.
    func enterPipelineMode(notice: @escaping (String) -> Void) -> Bool
    /// Calls `readable` every time the socket has input, until `finish`.
    func watchReadable(_ readable: @escaping () -> Void)
    /// Queues one command (`PQsendPrepare`, `PQsendQueryPrepared`, `PQsendQueryParams`,
    /// `PQpipelineSync`); false when libpq refused it.
    func send(_ command: PGCommand) -> Bool
    func flush() -> PGFlushStatus
    /// Calls `writable` once, when the socket can take more output.
    func awaitWritable(_ writable: @escaping () -> Void)

    /// Reads what the socket holds into libpq's buffer (`PQconsumeInput`); false: the
    /// connection is broken.
    func consumeInput() -> Bool
    /// `PQisBusy`: the next `nextResult` would block (a result is only partly read).
    var isBusy: Bool { get }
    /// `PQgetResult`, copied out of libpq; call only when not busy.
    func nextResult() -> PGInput
    /// `PQnotifies`: a notification read with the last input, if any.
    func nextNotification() -> (channel: String, payload: String)?

    /// Closes the connection (`PQfinish`) and every watch on its socket.
    func finish()
}

/// `PGDriver` over libpq, its socket watched with libevent events on `loop`.
public final class LibpqDriver: PGDriver {
    private let loop: EventLoop
    private var conn: OpaquePointer?
    private var readEvent: OpaquePointer?
    private var writeEvent: OpaquePointer?
    private var connectEvent: OpaquePointer?
    private var onReadable: (() -> Void)?
    private var onWritable: (() -> Void)?
    private var onConnectSocket: (() -> Void)?
    private var onNotice: ((String) -> Void)?

    /// The priority of the session's socket events: the callbacks that hand results over run
    /// at it (`.background` for a session that reads bulk pages).
    private let priority: EventPriority

    public init(loop: EventLoop, priority: EventPriority = .normal) {
        self.loop = loop
        self.priority = priority
    }

    deinit { finish() }

    public var isOpen: Bool { conn != nil }

    public var errorMessage: String {
        conn.map { String(cString: PQerrorMessage($0)).trimmingNewlines } ?? "no connection"
    }

    public func connect(conninfo: String, applicationName: String) -> PGPollStatus {
        // The URL or conninfo is expanded as dbname.
        let keywords: [String?] = ["dbname", "application_name", nil]
        let values: [String?] = [conninfo, applicationName, nil]
        let started = withCStrings(keywords) { k in withCStrings(values) { v in PQconnectStartParams(k, v, 1) } }
        guard let c = started else { return .failed("out of memory") }
        conn = c
        if PQstatus(c) == CONNECTION_BAD { return .failed(errorMessage) }
        return .writing
    }

    public func continueConnecting() -> PGPollStatus {
        guard let c = conn else { return .failed("no connection") }
        let status = PQconnectPoll(c)
        freeEvent(&connectEvent)
        switch status {
        case PGRES_POLLING_OK: return .connected
        case PGRES_POLLING_FAILED: return .failed(errorMessage)
        case PGRES_POLLING_READING: return .reading
        default: return .writing
        }
    }

    public func awaitSocket(_ status: PGPollStatus, _ ready: @escaping () -> Void) {
        guard let c = conn else { return }
        freeEvent(&connectEvent)
        onConnectSocket = ready
        let what = status == .reading ? EV_READ : EV_WRITE
        connectEvent = event_new(loop.base, PQsocket(c), Int16(what), { _, _, arg in
            Unmanaged<LibpqDriver>.fromOpaque(arg!).takeUnretainedValue().onConnectSocket?()
        }, Unmanaged.passUnretained(self).toOpaque())
        event_priority_set(connectEvent, priority.rawValue)
        event_add(connectEvent, nil)
    }

    public func enterPipelineMode(notice: @escaping (String) -> Void) -> Bool {
        guard let c = conn else { return false }
        PQsetnonblocking(c, 1)
        onNotice = notice
        PQsetNoticeProcessor(c, { arg, message in
            let me = Unmanaged<LibpqDriver>.fromOpaque(arg!).takeUnretainedValue()
            me.onNotice?(message.map { String(cString: $0) } ?? "")
        }, Unmanaged.passUnretained(self).toOpaque())
        return PQenterPipelineMode(c) == 1
    }

    public func watchReadable(_ readable: @escaping () -> Void) {
        guard let c = conn else { return }
        onReadable = readable
        let me = Unmanaged.passUnretained(self).toOpaque()
        readEvent = event_new(loop.base, PQsocket(c), Int16(EV_READ | EV_PERSIST), { _, _, arg in
            Unmanaged<LibpqDriver>.fromOpaque(arg!).takeUnretainedValue().onReadable?()
        }, me)
        event_priority_set(readEvent, priority.rawValue)
        event_add(readEvent, nil)
        writeEvent = event_new(loop.base, PQsocket(c), Int16(EV_WRITE), { _, _, arg in
            Unmanaged<LibpqDriver>.fromOpaque(arg!).takeUnretainedValue().onWritable?()
        }, me)
        event_priority_set(writeEvent, priority.rawValue)
    }

    public func send(_ command: PGCommand) -> Bool {
        guard let c = conn else { return false }
        switch command {
        case .prepare(let stmt, let sql, let count):
            return PQsendPrepare(c, stmt, sql, Int32(count), nil) == 1
        case .executePrepared(let stmt, let params):
            return withCStrings(params) { PQsendQueryPrepared(c, stmt, Int32(params.count), $0, nil, nil, 0) } == 1
        case .execute(let sql, let params):
            return withCStrings(params) { PQsendQueryParams(c, sql, Int32(params.count), nil, $0, nil, nil, 0) } == 1
        case .sync:
            return PQpipelineSync(c) == 1
        }
    }

    public func flush() -> PGFlushStatus {
        guard let c = conn else { return .failed }
        switch PQflush(c) {
        case 0: return .done
        case 1: return .more
        default: return .failed
        }
    }

    public func awaitWritable(_ writable: @escaping () -> Void) {
        onWritable = writable
        event_add(writeEvent, nil)
    }

    public func consumeInput() -> Bool {
        guard let c = conn else { return false }
        return PQconsumeInput(c) == 1
    }

    public var isBusy: Bool { conn.map { PQisBusy($0) != 0 } ?? false }

    public func nextResult() -> PGInput {
        guard let c = conn, let r = PQgetResult(c) else { return .endOfQuery }
        defer { PQclear(r) }
        return PQresultStatus(r) == PGRES_PIPELINE_SYNC ? .sync : .result(LibpqDriver.copy(r))
    }

    public func nextNotification() -> (channel: String, payload: String)? {
        guard let c = conn, let n = PQnotifies(c) else { return nil }
        defer { PQfreemem(n) }
        return (String(cString: n.pointee.relname), String(cString: n.pointee.extra))
    }

    public func finish() {
        freeEvent(&readEvent)
        freeEvent(&writeEvent)
        freeEvent(&connectEvent)
        onReadable = nil
        onWritable = nil
        onConnectSocket = nil
        if let c = conn { PQfinish(c) }
        conn = nil
        onNotice = nil
    }

    private func freeEvent(_ event: inout OpaquePointer?) {
        if let e = event { event_free(e) }
        event = nil
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
