import DispatchCore
import DispatchIO
import DispatchSystem

/// One server-sent-events response, written the way status streams and feeds both write:
/// a live event goes straight to the socket when nothing waits, pages queue in the outbox and
/// go out as the socket drains, and the next page is read only once there is room for it.
final class SSEConnection {
    enum Failure { case slowClient, writeFailed }
    enum Pumped { case open, finished, failed }

    static let headers: [(String, String)] = [
        ("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache"), ("X-Accel-Buffering", "no"),
    ]
    static let retryMilliseconds = 3000
    /// `retry: 3000`, framed once for every stream (a payload is immutable once made).
    nonisolated(unsafe) static let retryPayload = StreamPayload(SSE.retry(milliseconds: retryMilliseconds))

    let http: StreamTransport
    private let loop: LoopScheduling
    /// CORS headers of the request, for every answer the stream gives.
    let extraHeaders: [(String, String)]
    private(set) var outbox: StreamOutbox<StreamPayload>
    private(set) var lastWrite: Double
    private let maxBacklog: Int
    private let writeTimeout: Double
    /// The next page of a replay, read once the outbox has drained (paced) and the memory
    /// budget has room for it.
    private var deferredRead: (() -> Void)?
    /// The process-wide budget this stream's unsent bytes count against.
    private var memory: ReplayMemory?
    private var budgetID = BudgetedStream(kind: .status, id: 0)
    /// The budget has not granted the deferred read yet (it calls `granted`).
    private var awaitingBudget = false
    /// Page reads granted and not yet over (`pageDone`).
    private var reservations = 0

    /// `http`: an `HTTPStream` attached to its request, or a test's scripted stream.
    init(_ http: StreamTransport, loop: LoopScheduling, tag: Int, delegate: HTTPStreamDelegate, extraHeaders: [(String, String)],
         maxBacklog: Int, writeTimeout: Double, pageCap: Int) {
        self.http = http
        self.loop = loop
        self.extraHeaders = extraHeaders
        self.maxBacklog = maxBacklog
        self.writeTimeout = writeTimeout
        outbox = StreamOutbox(maxBacklog: maxBacklog, lowWater: min(16 * 1024, maxBacklog / 4), pageBudget: min(pageCap, maxBacklog / 2))
        lastWrite = loop.now
        http.tag = tag
        http.drainMark = outbox.lowWater
        http.delegate = delegate
    }

    /// Counts this stream against the process's memory budget, until `detach`.
    func budgeted(by memory: ReplayMemory, as id: BudgetedStream, key: Int64) {
        self.memory = memory
        budgetID = id
        memory.open(id, key: key, connection: self)
    }

    /// Bytes this stream holds unsent: queued here and in the socket's output buffer.
    var heldBytes: Int { http.backlog + outbox.queuedBytes }

    private func reportHeld() {
        memory?.hold(budgetID, bytes: heldBytes)
    }

    /// A page read is over and its rows (if any) were queued: its reservation ends.
    func pageDone() {
        guard reservations > 0 else { return }
        reservations -= 1
        memory?.hold(budgetID, bytes: heldBytes, release: reservation)
    }

    /// Bytes asked of the budget for one page: a page may pass its budget by one row, and
    /// framing adds a little.
    private var reservation: Int { outbox.pageBudget + outbox.pageBudget / 8 + 512 }

    /// Whether this stream takes shared pages as they come: at most about two pages behind.
    var keepsUp: Bool { heldBytes <= outbox.lowWater + 2 * outbox.pageBudget }

    var started: Bool { http.started }
    /// How many bytes the next history page may bring.
    var pageBudget: Int { outbox.pageBudget }

    /// Sends the headers and the reconnect delay, once.
    func begin() {
        guard !http.started else { return }
        http.begin(headers: extraHeaders.isEmpty ? SSEConnection.headers : SSEConnection.headers + extraHeaders,
                   writeTimeout: writeTimeout, maxInputBuffer: 4096)
        _ = http.write(SSEConnection.retryPayload, maxBacklog: maxBacklog)
    }

    /// Offers one payload (a live event, a heartbeat, a control event), counted against the
    /// slow-client cap; nil when it was written or queued.
    func offer(_ payload: StreamPayload) -> Failure? {
        begin()
        defer { reportHeld() }
        switch outbox.offer(payload, size: payload.size, socketBacklog: http.backlog, live: true) {
        case .writeNow(let p):
            switch http.write(p, maxBacklog: maxBacklog) {
            case .written, .queued:
                lastWrite = loop.now
                return nil
            case .backlogExceeded: return .slowClient
            case .failed: return .writeFailed
            }
        case .queued: return nil
        case .overCap: return .slowClient
        }
    }

    /// Queues a page; `pump` writes it.
    func enqueue(_ payloads: [StreamPayload]) {
        begin()
        outbox.enqueue(payloads.map { ($0, $0.size) })
        reportHeld()
    }

    /// Writes queued payloads while the connection stays under the low-water mark, then runs
    /// the replay's next read if one waits and there is room.
    func pump() -> Pumped {
        while let payload = outbox.next(socketBacklog: http.backlog) {
            switch http.write(payload, maxBacklog: Int.max) {
            case .written, .queued: lastWrite = loop.now
            case .backlogExceeded, .failed: return .failed
            }
        }
        reportHeld()
        if outbox.isFinished { return .finished }
        if let read = deferredRead, !awaitingBudget, outbox.wantsMore(socketBacklog: http.backlog) {
            deferredRead = nil
            runAdmitted(read)
        }
        return .open
    }

    /// Runs a page read now if the outbox has room and the memory budget admits a page, else
    /// once the outbox drains or the budget grants it.
    func whenRoom(_ read: @escaping () -> Void) {
        if outbox.wantsMore(socketBacklog: http.backlog) {
            runAdmitted(read)
        } else {
            deferredRead = read
        }
    }

    private func runAdmitted(_ read: @escaping () -> Void) {
        guard let memory else { return read() }
        if memory.admit(budgetID, bytes: reservation) {
            reservations += 1
            read()
        } else {
            awaitingBudget = true
            deferredRead = read
        }
    }

    /// The memory budget granted the read this stream waited for.
    func granted() {
        awaitingBudget = false
        reservations += 1
        guard let read = deferredRead else { return pageDone() }
        deferredRead = nil
        read()
    }

    /// Ends the response after what is queued; true when that is already the case.
    func finishWhenDrained() -> Bool { outbox.finishWhenDrained() }

    func needsHeartbeat(now: Double, after seconds: Double) -> Bool {
        http.started && now - lastWrite >= seconds
    }

    /// Called once, on teardown: no more reads or callbacks reach the service.
    func detach() {
        deferredRead = nil
        http.delegate = nil
        memory?.close(budgetID)
        memory = nil
    }
}

/// A stream some API key opened.
protocol KeyedStream: AnyObject {
    var keyID: Int64 { get }
    /// The browser session (SHA-256 of its secret) that opened it, when a cookie did: signing
    /// out or the session's expiry ends it (contract §7).
    var sessionHash: String? { get }
    var connection: SSEConnection { get }
}

/// The open streams of one kind, by id and by the API key that opened them (per-key caps,
/// and closing on revocation).
struct StreamTable<Session: KeyedStream> {
    private(set) var byID: [Int: Session] = [:]
    private var perKey: [Int64: Int] = [:]
    private var perSession: [String: Int] = [:]
    private var nextID = 1

    var count: Int { byID.count }
    var ids: [Int] { Array(byID.keys) }
    subscript(id: Int) -> Session? { byID[id] }
    func streams(forKey key: Int64) -> Int { perKey[key] ?? 0 }
    /// The keys that hold streams here (to re-check after missed revocations).
    var keys: [Int64] { Array(perKey.keys) }
    /// The browser sessions that hold streams here (re-checked every second).
    var sessions: [String] { Array(perSession.keys) }
    func ids(ofSession hash: String) -> [Int] {
        guard perSession[hash] != nil else { return [] }
        return byID.compactMap { $0.value.sessionHash == hash ? $0.key : nil }
    }
    func ids(ofKey key: Int64) -> [Int] {
        guard perKey[key] != nil else { return [] }
        return byID.compactMap { $0.value.keyID == key ? $0.key : nil }
    }
    func needingHeartbeat(now: Double, after seconds: Double) -> [Int] {
        byID.compactMap { $0.value.connection.needsHeartbeat(now: now, after: seconds) ? $0.key : nil }
    }

    mutating func add(_ make: (Int) -> Session) -> Session {
        let session = make(nextID)
        byID[nextID] = session
        nextID += 1
        perKey[session.keyID, default: 0] += 1
        if let hash = session.sessionHash { perSession[hash, default: 0] += 1 }
        return session
    }

    mutating func remove(_ id: Int) -> Session? {
        guard let session = byID.removeValue(forKey: id) else { return nil }
        let remaining = (perKey[session.keyID] ?? 1) - 1
        perKey[session.keyID] = remaining > 0 ? remaining : nil
        if let hash = session.sessionHash {
            let left = (perSession[hash] ?? 1) - 1
            perSession[hash] = left > 0 ? left : nil
        }
        return session
    }
}
