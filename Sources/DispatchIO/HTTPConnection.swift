import CLibevent
import CPicoHTTPParser
import DispatchCore
import Glibc

/// One client connection of `HTTPServer`: its socket as one persistent read `event`
/// (registered at accept, never re-armed), a write `event` added only while bytes wait in its
/// queue, a read buffer from the server's pool only while unparsed bytes exist, and one request
/// at a time: the next pipelined request is parsed only after this one is answered, so answers
/// go out in order. Exactly one path closes it (`close`), which tells an attached stream.
final class HTTPConnection: StreamCork {
    enum Phase {
        /// Waiting for (the rest of) a request's head.
        case head
        /// Reading a Content-Length body of this many bytes.
        case body(Int)
        case chunked
        /// A request was handed to the server; nothing more is parsed until it is answered.
        case answering
        /// Refused: the answer is out and our side shut; unread input is discarded until the
        /// client closes or this deadline passes (so the refusal is not lost to a reset).
        case lingering(Double)
    }

    enum Watch {
        case fine
        case late
        case waiting(since: Double, requests: Int)
    }

    enum WriteResult { case written, queued, failed }

    /// The server owns its connections and closes them all before it goes: no reference
    /// counting on the hot path (`unowned` checked every access).
    unowned(unsafe) let server: HTTPServer
    let fd: Int32
    /// In the server's table.
    var index: Int
    private var readEvent: OpaquePointer?
    private var writeEvent: OpaquePointer?
    private(set) var isOpen = true

    private var input: UnsafeMutableRawPointer?
    private var inputCapacity = 0
    private var inputStart = 0
    private var inputEnd = 0
    private var readingPaused = false
    /// The client sent its FIN: answer what it asked, then close.
    private var peerFinished = false

    private var phase = Phase.head
    /// The request whose body is being read.
    private var pending: HTTPRequest?
    private var chunkDecoder = phr_chunked_decoder()
    private var chunkedBody: [UInt8] = []
    /// The body limit of the request being read (its path may allow more than the default).
    private var bodyLimit = 0
    /// Which request is being answered: an answer for another one is ignored.
    private(set) var serial: UInt32 = 0
    private var keepAlive = true
    private var processing = false

    /// Accept, or the last answer (the request deadline counts from it).
    private var since: Double
    private var lastRead: Double
    /// The last time queued output moved.
    private var lastWrite: Double
    private(set) var requests = 0

    private var output: [UInt8] = []
    private var outputStart = 0
    /// While the bytes a read causes are being written (`readable`), they collect in `output`
    /// and go out in one `send` at its end: a finished stream's headers, retry, final event
    /// and terminal chunk, or a live stream's headers and snapshot, are one packet, not four.
    private var corked = false
    private var closeAfterFlush = false
    private var lingerAfterFlush = false
    /// The server stops parsing pipelined requests while this much of its answers wait.
    static let outputHighWater = 64 * 1024

    /// The stream this connection carries. Not counted (a weak reference cost a side table per
    /// stream and an atomic load per drain): a stream cannot be freed while it is attached
    /// (`HTTPStream.deinit` checks), and `close` holds it while it tells it.
    unowned(unsafe) var stream: HTTPStream?
    private var streaming = false
    private var streamWriteTimeout: Double = 60
    private var maxStreamInput = 4096

    init(server: HTTPServer, fd: Int32, index: Int, now: Double) {
        self.server = server
        self.fd = fd
        self.index = index
        since = now
        lastRead = now
        lastWrite = now
    }

    func register() -> Bool {
        let me = Unmanaged.passUnretained(self).toOpaque()
        readEvent = event_new(server.loop.base, fd, Int16(EV_READ | EV_PERSIST), { _, _, arg in
            Unmanaged<HTTPConnection>.fromOpaque(arg!).takeUnretainedValue().readable()
        }, me)
        guard let readEvent, event_add(readEvent, nil) == 0 else { return false }
        return true
    }

    /// Bytes queued for the socket (not those collected while corked: they go out at its end).
    var backlog: Int { corked ? 0 : output.count - outputStart }
    private var unsent: Int { output.count - outputStart }

    // MARK: - Reading

    private func readable() {
        guard isOpen else { return }
        if input == nil {
            input = server.pool.take()
            inputCapacity = ReadBufferPool.size
            inputStart = 0
            inputEnd = 0
        }
        if inputEnd == inputCapacity && inputStart > 0 { compact() }
        guard let input, inputEnd < inputCapacity else { return pauseReading() }
        let n = recv(fd, input + inputEnd, inputCapacity - inputEnd, 0)
        if n == 0 { return peerSentFIN() }
        if n < 0 {
            if errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR { return releaseInputIfEmpty() }
            return close(notify: true)
        }
        inputEnd += n
        lastRead = server.loop.now
        switch phase {
        case .lingering:
            inputStart = inputEnd
            releaseInputIfEmpty()
        case .answering:
            // A stream (or a slow answer) keeps reading only to notice the client leaving;
            // what it sends meanwhile waits, up to a bound (the read watermark).
            if inputEnd - inputStart >= (streaming ? maxStreamInput : inputCapacity) { pauseReading() }
        case .head, .body, .chunked:
            // Nothing waits for the socket: what the requests answer now goes out in one send.
            guard unsent == 0 else { return process() }
            corked = true
            process()
            uncork()
        }
    }

    /// Starts collecting writes (a stream's answer from the database: `HTTPStream.cork`);
    /// false when already collecting or bytes wait for the socket.
    func cork() -> Bool {
        guard isOpen, !corked, unsent == 0 else { return false }
        corked = true
        return true
    }

    /// Sends what was collected while corked (what does not fit waits for the write event).
    func uncork() {
        guard corked else { return }
        corked = false
        guard isOpen, unsent > 0 else { return }
        let n = output.withUnsafeBytes { send(fd, $0.baseAddress! + outputStart, $0.count - outputStart, Int32(MSG_NOSIGNAL | MSG_DONTWAIT)) }
        if n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR { return failSoon() }
        outputStart += max(n, 0)
        if outputStart == output.count {
            output = []  // an idle stream holds no buffer
            outputStart = 0
            if closeAfterFlush { flushedForClose() }
            return
        }
        lastWrite = server.loop.now
        armWrite()
    }

    private func peerSentFIN() {
        peerFinished = true
        pauseReading()
        switch phase {
        case .lingering: close(notify: false)
        case .answering: if stream != nil { close(notify: true) }  // else: answered, then closed
        case .head, .body, .chunked: process()
        }
    }

    /// Parses and hands over requests until one is in flight or more bytes are needed.
    private func process() {
        guard !processing else { return }
        processing = true
        defer { processing = false }
        while isOpen {
            let available = inputEnd - inputStart
            switch phase {
            case .answering, .lingering:
                return
            case .head:
                if unsent > HTTPConnection.outputHighWater { return }  // resumed when it drains
                if available == 0 {
                    releaseInputIfEmpty()
                    if peerFinished { close(notify: false) }
                    return
                }
                // Stops when the head is incomplete (it needs more bytes).
                if !parseHead() { return }
            case .body(let length):
                guard available >= length else {
                    if peerFinished { return close(notify: false) }
                    return makeRoom(for: length)
                }
                let req = pending!
                req.bodyBytes = Array(UnsafeRawBufferPointer(start: input! + inputStart, count: length))
                inputStart += length
                hand(req)
            case .chunked:
                if available == 0 {
                    releaseInputIfEmpty()
                    if peerFinished { close(notify: false) }
                    return
                }
                var size = available
                let start = (input! + inputStart).assumingMemoryBound(to: CChar.self)
                let left = phr_decode_chunked(&chunkDecoder, start, &size)
                if left == -1 { return refuse(.malformed("malformed chunked body")) }
                chunkedBody.append(contentsOf: UnsafeRawBufferPointer(start: start, count: size))
                if chunkedBody.count > bodyLimit { return refuse(.bodyTooLarge) }
                if left == -2 {
                    inputStart = inputEnd
                    continue
                }
                // The decoder compacts the body in place: what follows it (a pipelined
                // request) is the last `left` bytes.
                inputStart = inputEnd - left
                let req = pending!
                req.bodyBytes = chunkedBody
                chunkedBody = []
                hand(req)
            }
        }
    }


    /// False when nothing more can be done until more bytes arrive (or the connection ended).
    private func parseHead() -> Bool {
        let available = inputEnd - inputStart
        let base = input! + inputStart
        var method: UnsafePointer<CChar>?
        var methodLength = 0
        var target: UnsafePointer<CChar>?
        var targetLength = 0
        var minor: Int32 = 0
        var count = HTTPServer.maxHeaders
        let headers = server.headerScratch
        let consumed = Int(phr_parse_request(base.assumingMemoryBound(to: CChar.self), available, &method, &methodLength, &target, &targetLength,
                                             &minor, headers, &count, 0))
        if consumed == -2 {
            let lineEnded = memchr(base, 0x0A, available) != nil
            if let refusal = HTTPFraming.incompleteHead(buffered: available, firstLineEnded: lineEnded, limits: server.framing) {
                refuse(refusal)
                return false
            }
            if peerFinished { close(notify: false) }
            // A head cannot outgrow the standard buffer before its limit refuses it.
            if inputEnd == inputCapacity { compact() }
            return false
        }
        guard consumed > 0, let method, let target else {
            // The parser also fails on more header lines than it has room for.
            if count >= HTTPServer.maxHeaders || HTTPConnection.lines(base, available) > HTTPServer.maxHeaders {
                refuse(.headersTooLarge)
                return false
            }
            refuse(.malformed("malformed request"))
            return false
        }
        var contentLength: [String] = [], transferEncoding: [String] = [], connection: [String] = [], expect: [String] = []
        for i in 0..<count {
            let h = headers[i]
            guard let name = h.name else {
                refuse(.malformed("obsolete line folding in a header"))
                return false
            }
            func value() -> String {
                h.value.map { String(decoding: UnsafeRawBufferPointer(start: $0, count: h.value_len), as: UTF8.self) } ?? ""
            }
            switch h.name_len {
            case 14 where strncasecmp(name, "content-length", 14) == 0: contentLength.append(value())
            case 17 where strncasecmp(name, "transfer-encoding", 17) == 0: transferEncoding.append(value())
            case 10 where strncasecmp(name, "connection", 10) == 0: connection.append(value())
            case 6 where strncasecmp(name, "expect", 6) == 0: expect.append(value())
            default: break
            }
        }
        let methodToken = String(decoding: UnsafeRawBufferPointer(start: method, count: methodLength), as: UTF8.self)
        if let refusal = HTTPFraming.methodRefusal(methodToken) {
            refuse(refusal, minor: Int(minor))
            return false
        }
        let limits = server.framing.forTarget(bytes: UnsafeRawBufferPointer(start: target, count: targetLength))
        bodyLimit = limits.maxBodyBytes
        let decision = HTTPFraming.decide(minorVersion: Int(minor), headBytes: consumed, targetBytes: targetLength, contentLength: contentLength,
                                          transferEncoding: transferEncoding, connection: connection, expect: expect, limits: limits)
        let head: HTTPFraming.Head
        switch decision {
        case .failure(let refusal):
            refuse(refusal, minor: Int(minor))
            return false
        case .success(let h): head = h
        }
        let origin = UnsafeRawPointer(base)
        let req = HTTPRequest(connection: self, head: UnsafeRawBufferPointer(start: base, count: consumed), method: methodToken,
                              target: UnsafeRawPointer(target) - origin, targetLength: targetLength, minor: Int(minor),
                              received: server.loop.now)
        inputStart += consumed
        keepAlive = head.keepAlive
        switch head.body {
        case .none:
            hand(req)
        case .length(let n):
            pending = req
            phase = .body(n)
            if head.expectContinue && inputEnd - inputStart < n { sendContinue() }
        case .chunked:
            pending = req
            chunkDecoder = phr_chunked_decoder()
            chunkDecoder.consume_trailer = 1
            chunkedBody = []
            phase = .chunked
            if head.expectContinue && inputEnd == inputStart { sendContinue() }
        }
        return true
    }

    private func sendContinue() {
        let line: StaticString = "HTTP/1.1 100 Continue\r\n\r\n"
        _ = write(UnsafeRawBufferPointer(start: line.utf8Start, count: line.utf8CodeUnitCount))
    }

    /// Hands a complete request to the server's handler.
    private func hand(_ req: HTTPRequest) {
        pending = nil
        phase = .answering
        serial &+= 1
        req.serial = serial
        requests += 1
        releaseInputIfEmpty()
        server.handler(req)
    }

    /// Refuses the request being read at the HTTP layer: the contract's JSON error, then close.
    private func refuse(_ refusal: HTTPFraming.Refusal, minor: Int = 1) {
        pending = nil
        chunkedBody = []
        phase = .answering
        keepAlive = false
        let bytes = HTTPConnection.response(status: refusal.status, minor: minor, headers: [], contentType: "application/json",
                                            body: refusal.jsonBody, sendBody: true, connection: .close, date: server.dateHeader)
        lingerAfterFlush = true
        answerWritten(bytes, close: true)
    }

    // MARK: - Answers

    func isCurrent(_ req: HTTPRequest) -> Bool {
        guard isOpen, case .answering = phase, !closeAfterFlush, !streaming else { return false }
        return req.serial == serial
    }

    /// The answer to `req`, whole, as one byte array.
    func answer(_ req: HTTPRequest, status: Int, headers: [(String, String)], body: [UInt8]) {
        guard isCurrent(req) else { return }
        var close = !keepAlive || peerFinished
        for (k, v) in headers where k.utf8.count == 10 && k.lowercased() == "connection" && v.lowercased().contains("close") { close = true }
        let bytes = HTTPConnection.response(status: status, minor: req.minor, headers: headers, contentType: "application/json", body: body,
                                            sendBody: req.method != .head, connection: close ? .close : (req.minor == 0 ? .keepAlive : .none),
                                            date: server.dateHeader)
        answerWritten(bytes, close: close)
    }

    private func answerWritten(_ bytes: [UInt8], close: Bool) {
        let r = bytes.withUnsafeBytes { write($0) }
        guard r != .failed, isOpen else { return }
        answered(close: close)
    }

    /// The answer (or the stream's end) is written or queued: the next request may be parsed.
    private func answered(close: Bool) {
        let now = server.loop.now
        since = now
        lastRead = now
        if close {
            closeAfterFlush = true
            // Corked: `uncork` sends what was collected, then closes.
            if unsent == 0 { flushedForClose() }
            return
        }
        phase = .head
        resumeReading()
        if !processing { process() }
    }

    /// A stream whose whole answer is known at once (a finished activity's final event): the
    /// bytes a stream would have sent (head, frames, end) in one write, with no stream object.
    func answerStream(_ req: HTTPRequest, headers: [(String, String)], payloads: [StreamPayload]) {
        guard isCurrent(req) else { return }
        let chunked = req.minor >= 1
        if !chunked { keepAlive = false }
        var bytes = HTTPConnection.streamHead(minor: req.minor, headers: headers, chunked: chunked, close: !keepAlive, date: server.dateHeader)
        for p in payloads { p.append(to: &bytes, chunked: chunked) }
        if chunked { bytes.append(contentsOf: "0\r\n\r\n".utf8) }
        answerWritten(bytes, close: !chunked || !keepAlive || peerFinished)
    }

    /// A stream takes the connection over: the status line and headers, once.
    func beginStream(_ req: HTTPRequest, headers: [(String, String)], chunked: Bool, writeTimeout: Double, maxInput: Int,
                     priority: EventPriority) -> Bool {
        guard isCurrent(req) else { return false }
        streaming = true
        streamWriteTimeout = writeTimeout
        maxStreamInput = maxInput
        if !chunked { keepAlive = false }
        if priority != .normal { setPriority(priority) }
        let bytes = HTTPConnection.streamHead(minor: req.minor, headers: headers, chunked: chunked, close: !keepAlive, date: server.dateHeader)
        return bytes.withUnsafeBytes { write($0) } != .failed
    }

    /// The stream ended cleanly: its terminal chunk, then the connection serves further
    /// requests (HTTP/1.1 keep-alive) or closes (HTTP/1.0, whose stream is framed by the close).
    func endStream(chunked: Bool) {
        guard isOpen, streaming else { return }
        streaming = false
        setPriority(.normal)
        if chunked {
            let last: StaticString = "0\r\n\r\n"
            guard write(UnsafeRawBufferPointer(start: last.utf8Start, count: last.utf8CodeUnitCount)) != .failed, isOpen else { return }
        }
        answered(close: !chunked || !keepAlive || peerFinished)
    }

    private func setPriority(_ p: EventPriority) {
        if let readEvent { event_priority_set(readEvent, p.rawValue) }
        if let writeEvent { event_priority_set(writeEvent, p.rawValue) }
    }

    // MARK: - Writing

    /// Sends at once while nothing is queued; queues the rest (or all, behind what waits).
    /// A failed socket is closed on a later loop turn, never inside the caller's call.
    func write(_ bytes: UnsafeRawBufferPointer) -> WriteResult {
        guard isOpen, !bytes.isEmpty else { return isOpen ? .written : .failed }
        if corked {
            if output.capacity == 0 { output.reserveCapacity(max(1024, bytes.count)) }
            output.append(contentsOf: bytes)
            // A large answer goes out now; corking stays on only while everything was sent.
            if unsent >= HTTPConnection.outputHighWater {
                uncork()
                corked = isOpen && unsent == 0
            }
            return .written
        }
        if backlog > 0 {
            output.append(contentsOf: bytes)
            return .queued
        }
        let n = send(fd, bytes.baseAddress, bytes.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT))
        if n == bytes.count { return .written }
        if n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR {
            failSoon()
            return .failed
        }
        output.removeAll(keepingCapacity: true)
        outputStart = 0
        output.append(contentsOf: UnsafeRawBufferPointer(rebasing: bytes[max(n, 0)...]))
        lastWrite = server.loop.now
        armWrite()
        return .queued
    }

    private var failing = false

    private func failSoon() {
        guard !failing else { return }
        failing = true
        server.loop.soon { [self] in close(notify: true) }
    }

    private func armWrite() {
        if writeEvent == nil {
            let me = Unmanaged.passUnretained(self).toOpaque()
            writeEvent = event_new(server.loop.base, fd, Int16(EV_WRITE | EV_PERSIST), { _, _, arg in
                Unmanaged<HTTPConnection>.fromOpaque(arg!).takeUnretainedValue().writable()
            }, me)
            if streaming, let s = stream, s.priority != .normal, let writeEvent { event_priority_set(writeEvent, s.priority.rawValue) }
        }
        if let writeEvent { event_add(writeEvent, nil) }
    }

    private func writable() {
        guard isOpen else { return }
        let n = output.withUnsafeBytes { send(fd, $0.baseAddress! + outputStart, $0.count - outputStart, Int32(MSG_NOSIGNAL | MSG_DONTWAIT)) }
        if n < 0 {
            if errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR { return }
            return close(notify: true)
        }
        outputStart += n
        lastWrite = server.loop.now
        if outputStart == output.count {
            output = []
            outputStart = 0
            if let writeEvent { event_del(writeEvent) }
            if closeAfterFlush { return flushedForClose() }
        } else if outputStart >= 64 * 1024 && outputStart * 2 >= output.count {
            output.removeFirst(outputStart)
            outputStart = 0
        }
        if let s = stream, backlog < s.drainMark { s.drained() }
        if case .head = phase, backlog <= HTTPConnection.outputHighWater, !processing { process() }
    }

    private func flushedForClose() {
        closeAfterFlush = false
        guard lingerAfterFlush, !peerFinished else { return close(notify: false) }
        shutdown(fd, Int32(SHUT_WR))
        phase = .lingering(server.loop.now + 2)
        inputStart = inputEnd
        releaseInputIfEmpty()
        resumeReading()
    }

    // MARK: - Buffers

    private func pauseReading() {
        guard !readingPaused, let readEvent else { return }
        readingPaused = true
        event_del(readEvent)
    }

    private func resumeReading() {
        guard readingPaused, !peerFinished, let readEvent else { return }
        readingPaused = false
        event_add(readEvent, nil)
    }

    private func compact() {
        guard let input, inputStart > 0 else { return }
        memmove(input, input + inputStart, inputEnd - inputStart)
        inputEnd -= inputStart
        inputStart = 0
    }

    /// A body larger than the standard buffer grows it (up to the body limit).
    private func makeRoom(for length: Int) {
        compact()
        guard let old = input, inputCapacity < length else { return }
        let grown = UnsafeMutableRawPointer.allocate(byteCount: length, alignment: 16)
        grown.copyMemory(from: old, byteCount: inputEnd)
        server.pool.give(old, capacity: inputCapacity)
        input = grown
        inputCapacity = length
    }

    private func releaseInputIfEmpty() {
        guard let p = input, inputStart == inputEnd else { return }
        server.pool.give(p, capacity: inputCapacity)
        input = nil
        inputCapacity = 0
        inputStart = 0
        inputEnd = 0
    }

    // MARK: - Deadlines and the end

    func watch(now: Double, limits: HTTPLimits) -> Watch {
        let writeLimit = streaming ? streamWriteTimeout : limits.requestTimeoutSeconds
        if backlog > 0 && now - lastWrite > writeLimit { return .late }
        switch phase {
        case .lingering(let deadline): return now > deadline ? .late : .fine
        case .answering: return .fine
        case .head, .body, .chunked:
            if now - lastRead > limits.requestTimeoutSeconds { return .late }
            return .waiting(since: since, requests: requests)
        }
    }

    /// The one way a connection ends. `notify`: an attached stream's delegate hears that the
    /// client went away (not when the server itself is being freed).
    func close(notify: Bool) {
        guard isOpen else { return }
        isOpen = false
        if let readEvent { event_free(readEvent) }
        if let writeEvent { event_free(writeEvent) }
        readEvent = nil
        writeEvent = nil
        Glibc.close(fd)
        if let p = input { server.pool.give(p, capacity: inputCapacity) }
        input = nil
        output = []
        pending = nil
        chunkedBody = []
        server.forget(self)
        if let s = stream {
            stream = nil
            s.connectionClosed(notify: notify)
        }
    }
}
