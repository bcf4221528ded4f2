import DispatchCore
import DispatchIO

/// The shell status streams and feeds share: their open sessions, how a payload is written
/// (`SSEConnection`), heartbeats from one timer, the one teardown path, revocation, the
/// spread-out shutdown and the database retry's backoff. Each service keeps what differs:
/// its hub, its reads, its metrics and how each close reason is answered (its
/// `SSESessionsOwner` methods).
final class SSESessions<Session: KeyedStream>: HTTPStreamDelegate {
    let loop: LoopScheduling
    private var table = StreamTable<Session>()
    private let heartbeatSeconds: Double
    private var heartbeatTimer: Timer?
    /// The service these sessions belong to, which alone holds them: not counted (a weak
    /// load on every delivery cost more than the delivery's bookkeeping).
    unowned(unsafe) var owner: (any SSESessionsOwner<Session>)?

    /// Database reads retried while it comes back: at most this many attempts.
    static var maxRetries: Int { 60 }

    init(loop: LoopScheduling, heartbeatSeconds: Double) {
        self.loop = loop
        self.heartbeatSeconds = heartbeatSeconds
        let tick = min(1, heartbeatSeconds / 4)
        heartbeatTimer = loop.timer(after: tick, repeating: true) { [weak self] in self?.heartbeat(tick: tick) }
    }

    var count: Int { table.count }
    var ids: [Int] { table.ids }
    subscript(id: Int) -> Session? { table[id] }
    func streams(forKey key: Int64) -> Int { table.streams(forKey: key) }
    /// The keys that hold streams here (to re-check after missed revocations).
    var keys: [Int64] { table.keys }
    var sessionHashes: [String] { table.sessions }

    func add(_ make: (Int) -> Session) -> Session { table.add(make) }

    // MARK: - Writing

    /// One live event goes straight to the socket when nothing waits (counted against the
    /// slow-client cap); several (a replay page) queue and are written as the socket drains.
    func send(_ id: Int, _ payloads: [StreamPayload]) {
        guard let session = table[id] else { return }
        if payloads.count == 1 { return offer(id, payloads[0], delivered: 1) }
        session.connection.enqueue(payloads)
        owner?.sessionsDelivered(payloads.count)
        pump(id)
    }

    /// Offers one payload (a live event, a heartbeat, a control event) to a stream.
    func offer(_ id: Int, _ payload: StreamPayload, delivered count: Int) {
        guard let session = table[id] else { return }
        if let failure = session.connection.offer(payload) {
            close(id, reason: failure == .slowClient ? .slowClient : .writeFailed)
        } else if count > 0 {
            owner?.sessionsDelivered(count)
        }
    }

    func pump(_ id: Int) {
        switch table[id]?.connection.pump() {
        case .finished?: close(id, reason: .terminal)
        case .failed?: close(id, reason: .writeFailed)
        case .open?, nil: break
        }
    }

    /// Ends the stream once what is queued is written.
    func finishWhenDrained(_ id: Int) {
        guard let session = table[id] else { return }
        if session.connection.finishWhenDrained() { close(id, reason: .terminal) }
    }

    private func heartbeat(tick: Double) {
        let beat = StreamPayload(SSE.heartbeat)
        for id in table.needingHeartbeat(now: loop.now, after: heartbeatSeconds - tick) {
            offer(id, beat, delivered: 0)
        }
    }

    func streamPeerClosed(_ tag: Int) { close(tag, reason: .clientClosed) }
    func streamDrained(_ tag: Int) { pump(tag) }

    // MARK: - The one teardown path

    /// Removes a stream from memory and ends its connection; safe to call more than once.
    func close(_ id: Int, reason: StreamCloseReason) {
        guard let session = table.remove(id) else { return }
        owner?.sessionClosing(session)
        session.connection.detach()
        owner?.sessionClosed(session, reason: reason)
    }

    /// Ends the streams opened with a key that was revoked.
    func closeStreams(ofKey keyID: Int64) {
        for id in table.ids(ofKey: keyID) { close(id, reason: .revoked) }
    }

    /// Ends the streams a browser session opened (signed out, expired, or its key revoked).
    func closeStreams(ofSession hash: String) {
        for id in table.ids(ofSession: hash) { close(id, reason: .revoked) }
    }

    /// Ends every stream (server shutdown). Each started one is told first to reconnect after
    /// its own delay, spread over a window that grows with the number of streams (these and
    /// `otherStreams`), so that tens of thousands of clients do not all come back in the same
    /// second; they resume with Last-Event-ID and lose nothing.
    func shutdown(alongside otherStreams: Int) {
        heartbeatTimer?.cancel()
        let window = SSESessions.reconnectWindow(streams: table.count + otherStreams)
        var rng = SystemRandomNumberGenerator()
        for id in table.ids {
            if table[id]?.connection.started == true {
                let delay = 500 + Int(Double.random(in: 0..<window, using: &rng) * 1000)
                offer(id, StreamPayload(SSE.retry(milliseconds: delay)), delivered: 0)
            }
            close(id, reason: .shutdown)
        }
    }

    /// Seconds over which streams ended by a shutdown are asked to come back: about 2,000
    /// reconnects a second, at least 2 s, at most 30 s.
    static func reconnectWindow(streams: Int) -> Double {
        min(30, max(2, Double(streams) / 2000))
    }

    // MARK: - Database retries

    /// From 0.1 s, doubling, at most 2 s: about two minutes of patience over 60 attempts.
    static var retryBackoff: Backoff { Backoff(initial: 0.1, maximum: 2) }

    /// A read failed while the database may be coming back: runs `again` with the next
    /// attempt's number after `retryBackoff`, or returns false after `maxRetries` attempts
    /// (the caller gives up).
    func retryLater(attempt: Int, _ again: @escaping (Int) -> Void) -> Bool {
        guard attempt < SSESessions.maxRetries else { return false }
        loop.timer(after: SSESessions.retryBackoff.step(afterAttempt: attempt + 1)) { again(attempt + 1) }
        return true
    }
}

/// The part of the shell that differs between status streams and feeds.
protocol SSESessionsOwner<Session>: AnyObject {
    associatedtype Session
    /// Events written or queued (not heartbeats nor control events): the service's metric.
    func sessionsDelivered(_ count: Int)
    /// The service's part of a teardown before the connection is detached (its hub, its
    /// carrier's interest); runs once per session.
    func sessionClosing(_ session: Session)
    /// The rest of it once detached (metrics, log, the HTTP answer for `reason`); runs once.
    func sessionClosed(_ session: Session, reason: StreamCloseReason)
}
