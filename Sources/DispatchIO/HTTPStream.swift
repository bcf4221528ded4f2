import CLibevent
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
}

/// A long-lived streamed response (SSE). Writes go straight to the socket while its buffer is
/// empty and queue in the connection's output buffer otherwise. Exactly one of `end`, `abort`,
/// or the peer closing ends it; after that the evhttp pointers are never touched again.
public final class HTTPStream: StreamTransport {
    public enum WriteResult { case written, queued, backlogExceeded, failed }

    private let loop: LoopScheduling
    /// The server whose connection this stream took over: its connection guard tells the
    /// stream when the peer goes away (the connection's one close callback is the guard's).
    private var server: HTTPServer?
    private var request: UnsafeMutablePointer<evhttp_request>?
    private var connection: OpaquePointer?
    private var output: OpaquePointer?
    private var fd: Int32 = -1
    private var chunked = true
    private var aborting = false
    /// Runs once when the peer goes away (FIN, RST, write timeout); not after end or abort.
    /// Told when the peer goes away and when queued output drained below `drainMark`
    /// (a delegate and a tag rather than closures: two fewer allocations per stream).
    public weak var delegate: HTTPStreamDelegate?
    public var tag = 0
    public var drainMark = 32 * 1024
    public var priority = EventPriority.normal
    private var drainEntry: OpaquePointer?
    private var drainScheduled = false
    public private(set) var isOpen = false

    private let requestTimeout: Double

    public init(loop: LoopScheduling, requestTimeout: Double = HTTPLimits().requestTimeoutSeconds) {
        self.loop = loop
        self.requestTimeout = requestTimeout
    }

    /// The connection guard points at this object (weakly) while it streams: it must be ended first.
    deinit { precondition(connection == nil, "HTTPStream released while its connection is open") }

    /// Watches the request's connection from now on, before anything is answered: a client
    /// that leaves while its stream waits for the database is noticed too.
    public func attach(_ req: HTTPRequest) {
        let raw = req.raw
        request = raw
        guard let conn = evhttp_request_get_connection(raw) else { return }
        connection = conn
        server = req.server
        req.server.guardian.setStream(self, on: conn)
        isOpen = true
    }

    public private(set) var started = false

    /// Sends the status line and headers, and takes over the connection's timeouts.
    public func begin(headers: [(String, String)], writeTimeout: Double, maxInputBuffer: Int = 4096) {
        guard isOpen, !aborting, !started, let raw = request, let conn = connection else { return }
        if LibeventInternals.isHTTP10(raw) {
            // HTTP/1.0 has no chunking: the stream is framed by closing the connection, so a
            // keep-alive request must not make evhttp announce an empty body.
            evhttp_remove_header(evhttp_request_get_input_headers(raw), "Connection")
        }
        let out = evhttp_request_get_output_headers(raw)
        for (k, v) in headers { evhttp_add_header(out, k, v) }
        evhttp_send_reply_start(raw, 200, "OK")
        started = true
        // The status line and headers are on the wire now: a long-lived stream need not keep
        // them, nor the parsed URI, in memory (evhttp_request_free frees only what is set).
        evhttp_clear_headers(evhttp_request_get_input_headers(raw))
        evhttp_clear_headers(out)
        LibeventInternals.releaseWhatAStartedReplyNoLongerNeeds(raw)
        chunked = LibeventInternals.isChunked(raw)
        let bev = evhttp_connection_get_bufferevent(conn)
        output = bufferevent_get_output(bev)
        fd = Int32(bufferevent_getfd(bev))
        var wtv = timeval(seconds: writeTimeout)
        bufferevent_set_timeouts(bev, nil, &wtv)
        // A fixed kernel send buffer: events are small, and without it autotuning lets a
        // reader that stopped reading park megabytes in the kernel before our cap sees it.
        drainEntry = evbuffer_add_cb(output, { _, info, arg in
            guard let info, info.pointee.n_deleted > 0 else { return }
            Unmanaged<HTTPStream>.fromOpaque(arg!).takeUnretainedValue().drained()
        }, Unmanaged.passUnretained(self).toOpaque())
        var sndbuf: Int32 = 64 * 1024
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, socklen_t(MemoryLayout<Int32>.size))
        bufferevent_setwatermark(bev, Int16(EV_READ), 0, maxInputBuffer)
        if priority != .normal { bufferevent_priority_set(bev, priority.rawValue) }
    }

    /// Answers with a plain response instead of a stream (204, or an error before streaming).
    public func respond(status: Int, headers: [(String, String)] = [], body: [UInt8]) {
        guard isOpen, !aborting, !started, let raw = request, let server else { return }
        release()
        HTTPRequest(raw, server: server).respond(status: status, headers: headers, body: body)
    }

    /// The peer went away (FIN, RST, write timeout): the connection guard calls this from
    /// evhttp's close callback.
    func peerClosed() {
        let wasAborting = aborting
        if let r = request { LibeventInternals.freeReplyDetachedByPeerClose(r, loop: loop) }
        forget()
        if !wasAborting { delegate?.streamPeerClosed(tag) }
        delegate = nil
    }

    private func drained() {
        guard !drainScheduled, delegate != nil, backlog < drainMark else { return }
        drainScheduled = true
        loop.soon(priority) { [weak self] in
            guard let self else { return }
            self.drainScheduled = false
            if self.isOpen { self.delegate?.streamDrained(self.tag) }
        }
    }

    /// Gives the connection back to the server (keep-alive or a plain answer) and forgets it.
    private func release() {
        if let connection { server?.guardian.setStream(nil, on: connection) }
        forget()
    }

    private func forget() {
        if let output, let drainEntry { evbuffer_remove_cb_entry(output, drainEntry) }
        drainEntry = nil
        isOpen = false
        started = false
        request = nil
        connection = nil
        output = nil
        fd = -1
    }

    /// Bytes waiting in user space for this client.
    public var backlog: Int { output.map { evbuffer_get_length($0) } ?? 0 }

    public func write(_ payload: StreamPayload, maxBacklog: Int) -> WriteResult {
        guard isOpen, !aborting, let output else { return .failed }
        let fd = self.fd
        return payload.withBytes(chunked: chunked) { bytes in
            if evbuffer_get_length(output) == 0 {
                let n = send(fd, bytes.baseAddress, bytes.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT))
                if n == bytes.count { return .written }
                if n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR { return .failed }
                let sent = max(n, 0)
                evbuffer_add(output, bytes.baseAddress! + sent, bytes.count - sent)
                return .queued
            }
            if evbuffer_get_length(output) + bytes.count > maxBacklog { return .backlogExceeded }
            evbuffer_add(output, bytes.baseAddress, bytes.count)
            return .queued
        }
    }

    /// Ends the response cleanly (terminal chunk); the connection may serve further requests.
    public func end() {
        guard isOpen, !aborting, started, let request, let connection else { return }
        // The connection may serve further requests: give it back its request deadline and
        // an unlimited read watermark, which the stream had changed.
        let bev = evhttp_connection_get_bufferevent(connection)
        var tv = timeval(seconds: requestTimeout)
        bufferevent_set_timeouts(bev, &tv, &tv)
        bufferevent_setwatermark(bev, Int16(EV_READ), 0, 0)
        if priority != .normal { bufferevent_priority_set(bev, EventPriority.normal.rawValue) }
        release()
        evhttp_send_reply_end(request)
    }

    /// Drops the connection on a later loop turn (never inside a libevent callback).
    public func abort() {
        guard isOpen, !aborting else { return }
        aborting = true
        loop.soon { [self] in
            guard let connection else { return }  // the peer closed first: libevent freed it
            release()
            evhttp_connection_free(connection)
        }
    }
}
