import DispatchSystem
import Glibc

/// Bytes written to many streams, framed once as an HTTP/1.1 chunk; an HTTP/1.0 stream (no
/// chunking) is sent the same bytes without the chunk's size line and trailing CRLF.
public final class StreamPayload {
    public let chunked: [UInt8]
    let plainStart: Int

    public init(_ plain: [UInt8]) {
        var c = Array(String(plain.count, radix: 16).utf8)
        c.append(contentsOf: [0x0D, 0x0A])
        plainStart = c.count
        c.append(contentsOf: plain)
        c.append(contentsOf: [0x0D, 0x0A])
        chunked = c
    }

    /// Bytes on the wire when chunked.
    public var size: Int { chunked.count }

    func append(to out: inout [UInt8], chunked isChunked: Bool) {
        if isChunked { out.append(contentsOf: chunked) } else { out.append(contentsOf: chunked[plainStart..<(chunked.count - 2)]) }
    }

    func withBytes<R>(chunked isChunked: Bool, _ body: (UnsafeRawBufferPointer) -> R) -> R {
        chunked.withUnsafeBytes { raw in
            body(isChunked ? raw : UnsafeRawBufferPointer(rebasing: raw[plainStart..<(raw.count - 2)]))
        }
    }
}

public protocol HTTPStreamDelegate: AnyObject {
    func streamPeerClosed(_ tag: Int)
    func streamDrained(_ tag: Int)
}

/// A connection collecting what is written to it (`StreamTransport.cork`) until `uncork`.
public protocol StreamCork: AnyObject {
    func uncork()
}

/// What a server-sent-events session writes to: `HTTPStream` in dispatchd, DispatchHarness's
/// `ScriptedStream` in unit tests (no socket).
public protocol StreamTransport: AnyObject {
    var started: Bool { get }
    /// Bytes waiting in user space for this client.
    var backlog: Int { get }
    var delegate: HTTPStreamDelegate? { get set }
    var tag: Int { get set }
    /// `delegate.streamDrained` is called when the backlog falls below this.
    var drainMark: Int { get set }
    /// Of the connection's socket events once the stream began (`.background`: a bulk
    /// transfer, whose queued bytes go out on turns with nothing else ready).
    var priority: EventPriority { get set }
    func begin(headers: [(String, String)], writeTimeout: Double, maxInputBuffer: Int)
    func write(_ payload: StreamPayload, maxBacklog: Int) -> HTTPStream.WriteResult
    func respond(status: Int, headers: [(String, String)], body: [UInt8])
    func end()
    func abort()
    /// From now until the returned cork's `uncork`, what is written (this stream's bytes, and
    /// an answer on its connection after it ended) collects and goes out in one send; nil when
    /// nothing is collected (no connection, or one already corked or with bytes waiting).
    func cork() -> StreamCork?
}

extension StreamTransport {
    public func cork() -> StreamCork? { nil }
}

/// A long-lived streamed response (SSE): a connection whose answer never ends. The status line
/// and headers go out once, then frames: chunks on HTTP/1.1, raw bytes on HTTP/1.0 (framed by
/// the close). Writes go straight to the socket while nothing is queued and queue in the
/// connection's output otherwise. Exactly one of `end`, `abort`, or the peer closing ends it;
/// after that the connection is never touched again.
public final class HTTPStream: StreamTransport {
    public enum WriteResult { case written, queued, backlogExceeded, failed }

    private let loop: LoopScheduling
    private var connection: HTTPConnection?
    /// Until the stream begins (or answers plainly).
    private var request: HTTPRequest?
    private var chunked = true
    private var aborting = false
    /// Told when the peer goes away (FIN, RST, write timeout; not after end or abort) and when
    /// queued output drained below `drainMark` (a delegate and a tag rather than closures: two
    /// fewer allocations per stream). Not counted: its owner clears it when it lets the stream
    /// go (`SSEConnection.detach`), and a stream cannot outlive an owner while it is open (it
    /// must be ended first, `deinit`).
    public unowned(unsafe) var delegate: HTTPStreamDelegate?
    public var tag = 0
    public var drainMark = 32 * 1024
    public var priority = EventPriority.normal
    private var drainScheduled = false
    public private(set) var isOpen = false
    public private(set) var started = false

    public init(loop: LoopScheduling) {
        self.loop = loop
    }

    /// The connection points at this object (uncounted) while it streams: it must be ended first.
    deinit { precondition(connection == nil, "HTTPStream released while its connection is open") }

    /// Watches the request's connection from now on, before anything is answered: a client
    /// that leaves while its stream waits for the database is noticed too.
    public func attach(_ req: HTTPRequest) {
        guard req.connection.isCurrent(req) else { return }
        request = req
        connection = req.connection
        req.connection.stream = self
        isOpen = true
    }

    /// Sends the status line and headers; the connection's write deadline becomes
    /// `writeTimeout`, and at most `maxInputBuffer` bytes the client sends meanwhile are read.
    public func begin(headers: [(String, String)], writeTimeout: Double, maxInputBuffer: Int = 4096) {
        guard isOpen, !aborting, !started, let req = request, let connection else { return }
        chunked = req.minor >= 1
        started = true
        request = nil
        _ = connection.beginStream(req, headers: headers, chunked: chunked, writeTimeout: writeTimeout, maxInput: maxInputBuffer, priority: priority)
    }

    /// Answers with a plain response instead of a stream (204, or an error before streaming).
    public func respond(status: Int, headers: [(String, String)] = [], body: [UInt8]) {
        guard isOpen, !aborting, !started, let req = request else { return }
        release()
        req.respond(status: status, headers: headers, body: body)
    }

    /// The connection closed (the peer went away, a deadline, or our own abort).
    func connectionClosed(notify: Bool) {
        let wasAborting = aborting
        forget()
        if notify && !wasAborting { delegate?.streamPeerClosed(tag) }
        delegate = nil
    }

    /// Queued output fell below `drainMark`: tell the delegate on a later turn.
    func drained() {
        guard !drainScheduled, delegate != nil, backlog < drainMark else { return }
        drainScheduled = true
        loop.soon(priority) { [self] in
            self.drainScheduled = false
            if self.isOpen { self.delegate?.streamDrained(self.tag) }
        }
    }

    public func cork() -> StreamCork? {
        guard isOpen, !aborting, let connection, connection.cork() else { return nil }
        return connection
    }

    /// Gives the connection back (keep-alive or a plain answer) and forgets it.
    private func release() {
        if let connection, connection.stream === self { connection.stream = nil }
        forget()
    }

    private func forget() {
        isOpen = false
        started = false
        request = nil
        connection = nil
    }

    /// Bytes waiting in user space for this client.
    public var backlog: Int { connection?.backlog ?? 0 }

    public func write(_ payload: StreamPayload, maxBacklog: Int) -> WriteResult {
        guard isOpen, !aborting, let connection else { return .failed }
        return payload.withBytes(chunked: chunked) { bytes in
            if connection.backlog > 0 && connection.backlog + bytes.count > maxBacklog { return .backlogExceeded }
            switch connection.write(bytes) {
            case .written: return .written
            case .queued: return .queued
            case .failed: return .failed
            }
        }
    }

    /// Ends the response cleanly (terminal chunk); the connection may serve further requests.
    public func end() {
        guard isOpen, !aborting, started, let connection else { return }
        let wasChunked = chunked
        release()
        connection.endStream(chunked: wasChunked)
    }

    /// Drops the connection on a later loop turn (never inside the caller's callback).
    public func abort() {
        guard isOpen, !aborting else { return }
        aborting = true
        loop.soon { [self] in
            guard let connection else { return }  // the peer closed first
            connection.close(notify: false)
        }
    }
}
