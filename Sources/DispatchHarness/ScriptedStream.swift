import DispatchIO

/// A `StreamTransport` with no socket: what a session writes is recorded as text, and a test
/// decides when the socket is full, drains, fails or the peer leaves. Its rules are
/// `HTTPStream`'s: a write goes out at once while nothing is queued, queues while the socket
/// is full, and past `maxBacklog` is refused; nothing is written after the stream ended.
public final class ScriptedStream: StreamTransport {
    public enum Ending: Equatable {
        case ended
        case aborted
        case responded(Int)
        /// The peer went away.
        case peerClosed
    }

    public private(set) var started = false
    public private(set) var headers: [(String, String)] = []
    /// Bytes queued in user space (the socket took no more).
    public private(set) var backlog = 0
    public weak var delegate: HTTPStreamDelegate?
    public var tag = 0
    public var drainMark = 32 * 1024
    public var priority = EventPriority.normal
    /// Every payload that went out or was queued, as its event text (no chunk framing).
    public private(set) var written: [String] = []
    public private(set) var ending: Ending?
    /// While true the socket takes nothing: writes queue in the backlog.
    public var socketFull = false
    /// The next writes fail (a reset connection) while positive.
    public var failingWrites = 0

    public init() {}

    public var isOpen: Bool { ending == nil }

    public func begin(headers: [(String, String)], writeTimeout: Double, maxInputBuffer: Int) {
        guard isOpen, !started else { return }
        self.headers = headers
        started = true
    }

    public func write(_ payload: StreamPayload, maxBacklog: Int) -> HTTPStream.WriteResult {
        guard isOpen else { return .failed }
        if failingWrites > 0 {
            failingWrites -= 1
            return .failed
        }
        if backlog == 0 && !socketFull {
            written.append(ScriptedStream.text(payload))
            return .written
        }
        if backlog > 0 && backlog + payload.size > maxBacklog { return .backlogExceeded }
        backlog += payload.size
        written.append(ScriptedStream.text(payload))
        return .queued
    }

    public func respond(status: Int, headers: [(String, String)], body: [UInt8]) {
        guard isOpen, !started else { return }
        ending = .responded(status)
    }

    public func end() {
        guard isOpen, started else { return }
        ending = .ended
    }

    public func abort() {
        guard isOpen else { return }
        ending = .aborted
    }

    // MARK: - What a test does

    /// The socket took everything queued: the delegate hears the stream drained.
    public func drain() {
        socketFull = false
        backlog = 0
        if isOpen { delegate?.streamDrained(tag) }
    }

    /// The socket took all but `remaining` bytes of what was queued. The delegate is not told
    /// here: libevent tells it on a later turn, and only when bytes left and the backlog is
    /// below `drainMark`, which this returns.
    public func drain(leaving remaining: Int) -> Bool {
        socketFull = false
        guard remaining < backlog else { return false }
        backlog = remaining
        return backlog < drainMark
    }

    /// The client goes away (FIN, RST): the delegate hears it once, as from HTTPConnection.
    public func peerLeaves() {
        guard isOpen else { return }
        ending = .peerClosed
        let told = delegate
        delegate = nil
        told?.streamPeerClosed(tag)
    }

    /// The payload's bytes as an HTTP/1.0 stream would carry them: its text.
    static func text(_ payload: StreamPayload) -> String {
        let bytes = payload.chunked
        let lineEnd = bytes.firstIndex(of: 0x0A).map { $0 + 1 } ?? 0
        return String(decoding: bytes[lineEnd..<(bytes.count - 2)], as: UTF8.self)
    }
}
