// Long because it is one state machine; its states split over files would hide the transitions.
/// The one HTTP/1.1 response parser: the CLI, the benchmark's load generator and the tests
/// all read answers with it. It only frames (RFC 9112): the status line and header fields,
/// then the body delimited by chunked coding, Content-Length or the end of the connection.
/// What a body means (JSON, SSE) is the caller's business.

/// The status line and header fields of a response.
public struct HTTPResponseHead: Equatable, Sendable {
    public var status: Int
    public var reason: String
    /// The `x` of `HTTP/1.x`.
    public var minorVersion: Int
    /// Names lower-cased, values without surrounding spaces and tabs, in arrival order.
    public var headers: [(String, String)]

    public init(status: Int, reason: String = "", minorVersion: Int = 1, headers: [(String, String)] = []) {
        self.status = status
        self.reason = reason
        self.minorVersion = minorVersion
        self.headers = headers
    }

    public static func == (a: HTTPResponseHead, b: HTTPResponseHead) -> Bool {
        a.status == b.status && a.reason == b.reason && a.minorVersion == b.minorVersion
            && a.headers.elementsEqual(b.headers, by: { $0 == $1 })
    }

    /// The first value of a header field (`name` in any case).
    public func header(_ name: String) -> String? {
        let lower = name.lowercased()
        return headers.first { $0.0 == lower }?.1
    }

    /// Whether the connection may carry another request once this response is read:
    /// HTTP/1.1 unless `Connection: close`, HTTP/1.0 only with `Connection: keep-alive`.
    /// (A body read until the connection closes ends it whatever this says.)
    public var keepAlive: Bool {
        var keep = minorVersion >= 1
        for (name, value) in headers where name == "connection" {
            for token in value.split(separator: ",") {
                switch HTTPResponseParser.trimmed(token).lowercased() {
                case "close": return false
                case "keep-alive": keep = true
                default: break
                }
            }
        }
        return keep
    }
}

/// A whole response: its head and its body with the framing removed.
public struct HTTPResponse: Sendable {
    public var head: HTTPResponseHead
    public var body: [UInt8]

    public init(head: HTTPResponseHead, body: [UInt8]) {
        self.head = head
        self.body = body
    }
}

/// One step of a response, body pieces copied (see `HTTPResponseParser.Part` for the zero-copy form).
public enum HTTPResponseEvent: Equatable, Sendable {
    case head(HTTPResponseHead)
    case body([UInt8])
    case end
}

/// Why a response could not be read.
public struct HTTPParseError: Error, Equatable, Sendable {
    public enum Kind: Sendable {
        /// The connection ended before the response was complete (worth a retry).
        case truncated
        /// What arrived is not HTTP this parser accepts.
        case malformed
    }

    public var kind: Kind
    public var message: String

    public init(_ kind: Kind, _ message: String) {
        self.kind = kind
        self.message = message
    }

    public var truncated: Bool { kind == .truncated }

    static func malformed(_ message: String) -> HTTPParseError { HTTPParseError(.malformed, message) }
}

/// An incremental HTTP/1.1 response parser for one response, as a small fixed state.
///
/// Feed it bytes as they arrive (split anywhere); it yields the head, body pieces and the end.
/// Interim 1xx answers are skipped; answers to HEAD and 204/304 have no body. The head and
/// trailers are held to `maxHeadBytes`. Input from the network never traps: it is a
/// `malformed` error, and a connection that ends too soon is `truncated`.
///
/// The zero-copy form, `next(in:at:)` and `feed(_:_:)`, hands out body pieces that point into
/// the caller's buffer: nothing is allocated while a body streams (the benchmark holds 50,000
/// streams with it). The head is gathered into an array only when it spans reads. The
/// collecting form, `feed(_:) -> [HTTPResponseEvent]` and `response(in:)`, copies.
///
/// A parser reads one response: bytes after its end are left unused (the next answer on a
/// kept-alive connection: start a new parser there).
public struct HTTPResponseParser: Sendable {
    public static let defaultMaxHeadBytes = 64 * 1024
    /// A chunk-size line (size and extensions) longer than this is refused.
    static let maxChunkLineBytes: Int32 = 1024

    /// One step of the response. A body piece points into the bytes being fed and is valid
    /// only until the call that returned it returns.
    public enum Part {
        case head(HTTPResponseHead)
        case body(UnsafeRawBufferPointer)
        case end
    }

    private enum State: Equatable, Sendable {
        case head
        case fixedBody
        case chunkSizeLine(ChunkSizeLine)
        case chunkData
        /// CRLF after a chunk's data.
        case chunkDataCR
        case chunkDataLF
        case trailers
        case untilClose
        /// The response is complete; `.end` is still to be handed out.
        case ending
        case done
        case failed
    }

    /// Where in `HEX [BWS] [; extensions] CRLF` a chunk-size line is.
    private enum ChunkSizeLine: Equatable, Sendable {
        case digits
        /// After the digits: spaces or tabs, then `;` or the line's end.
        case space
        case extensions
    }

    private var state: State = .head
    private let isHeadRequest: Bool
    private let maxHeadBytes: Int32
    /// Bytes in the current line of the head or trailers, CR not counted (0 at a blank line);
    /// hex digits of a chunk size.
    private var lineLength: Int32 = 0
    /// Bytes of the head, the trailers or the chunk-size line so far, for their limits.
    private var sectionBytes: Int32 = 0
    /// Body bytes left in a Content-Length body or the current chunk; a chunk size being read.
    private var remaining = 0
    /// The head gathered across reads (empty while it arrives in one).
    private var headBuffer: [UInt8] = []

    /// `isHeadRequest`: the response answers a HEAD request, so it has no body.
    public init(isHeadRequest: Bool = false, maxHeadBytes: Int = HTTPResponseParser.defaultMaxHeadBytes) {
        self.isHeadRequest = isHeadRequest
        self.maxHeadBytes = Int32(clamping: maxHeadBytes)
    }

    /// The response has been read to its end (and `.end` handed out).
    public var isComplete: Bool { state == .done }

    // MARK: - Zero-copy

    /// The next part of the response in `bytes[index...]`, moving `index` past the bytes it used.
    /// Nil when all of `bytes` is used (feed the next read), or when the response is complete;
    /// then `index` is where the bytes that follow the response begin.
    public mutating func next(in bytes: UnsafeRawBufferPointer, at index: inout Int) throws(HTTPParseError) -> Part? {
        let n = bytes.count
        while true {
            switch state {
            case .done:
                return nil
            case .failed:
                throw .malformed("the response was already refused as malformed")
            case .ending:
                state = .done
                return .end
            case .untilClose:
                guard index < n else { return nil }
                let piece = UnsafeRawBufferPointer(rebasing: bytes[index..<n])
                index = n
                return .body(piece)
            case .fixedBody, .chunkData:
                guard index < n else { return nil }
                let take = min(remaining, n - index)
                let piece = UnsafeRawBufferPointer(rebasing: bytes[index..<(index + take)])
                index += take
                remaining -= take
                if remaining == 0 { state = state == .fixedBody ? .ending : .chunkDataCR }
                return .body(piece)
            case .head:
                guard index < n else { return nil }
                if let head = try readHead(bytes, &index) { return .head(head) }
            case .chunkSizeLine(let part):
                guard index < n else { return nil }
                try readChunkSizeLine(part, bytes, &index)
            case .chunkDataCR:
                guard index < n else { return nil }
                let b = bytes[index]
                index += 1
                if b == 0x0D {
                    state = .chunkDataLF
                } else if b == 0x0A {
                    startChunkSize()
                } else {
                    throw fail("missing CRLF after chunk")
                }
            case .chunkDataLF:
                guard index < n else { return nil }
                guard bytes[index] == 0x0A else { throw fail("missing CRLF after chunk") }
                index += 1
                startChunkSize()
            case .trailers:
                guard index < n else { return nil }
                try readTrailers(bytes, &index)
            }
        }
    }

    /// Feeds `bytes`, handing each part to `emit` as it is found. Returns how many bytes the
    /// response used: all of them, unless it ended within them.
    @discardableResult
    public mutating func feed(_ bytes: UnsafeRawBufferPointer, _ emit: (Part) -> Void) throws(HTTPParseError) -> Int {
        var index = 0
        while let part = try next(in: bytes, at: &index) { emit(part) }
        return index
    }

    /// The connection ended: completes a body read until close (`.end`); anything else
    /// unfinished is `truncated`.
    public mutating func finish(_ emit: (Part) -> Void) throws(HTTPParseError) {
        switch state {
        case .done:
            return
        case .untilClose, .ending:
            state = .done
            emit(.end)
        case .failed:
            throw .malformed("the response was already refused as malformed")
        case .head, .fixedBody, .chunkSizeLine, .chunkData, .chunkDataCR, .chunkDataLF, .trailers:
            state = .failed
            throw HTTPParseError(.truncated, "connection closed before the response was complete")
        }
    }

    // MARK: - Collecting

    /// Feeds bytes as they arrive; returns what they completed, body pieces copied (one piece
    /// per call at most). Bytes after the end of the response are ignored.
    public mutating func feed<C: Collection>(_ bytes: C) throws(HTTPParseError) -> [HTTPResponseEvent] where C.Element == UInt8 {
        var events: [HTTPResponseEvent] = []
        var body: [UInt8] = []
        func take(_ part: Part) {
            switch part {
            case .head(let h): events.append(.head(h))
            case .body(let piece): body.append(contentsOf: piece)
            case .end:
                if !body.isEmpty { events.append(.body(body)); body = [] }
                events.append(.end)
            }
        }
        _ = try Self.withBytes(bytes) { raw throws(HTTPParseError) in try feed(raw, take) }
        if !body.isEmpty { events.append(.body(body)) }
        return events
    }

    /// The connection ended: `[.end]` for a body read until close, `[]` once complete;
    /// throws `truncated` when the response is unfinished.
    public mutating func finish() throws(HTTPParseError) -> [HTTPResponseEvent] {
        var events: [HTTPResponseEvent] = []
        try finish { if case .end = $0 { events.append(.end) } }
        return events
    }

    /// Reads one whole response from the start of `bytes`, which end where the connection
    /// closed (a one-shot client, tests). `rest` is what follows it (a pipelined answer).
    public static func response(in bytes: ArraySlice<UInt8>, isHeadRequest: Bool = false,
                                maxHeadBytes: Int = defaultMaxHeadBytes) throws(HTTPParseError) -> (response: HTTPResponse, rest: ArraySlice<UInt8>) {
        var parser = HTTPResponseParser(isHeadRequest: isHeadRequest, maxHeadBytes: maxHeadBytes)
        var head: HTTPResponseHead?
        var body: [UInt8] = []
        func take(_ part: Part) {
            switch part {
            case .head(let h): head = h
            case .body(let piece): body.append(contentsOf: piece)
            case .end: break
            }
        }
        let used = try withBytes(bytes) { raw throws(HTTPParseError) in try parser.feed(raw, take) }
        if !parser.isComplete { try parser.finish(take) }
        guard let head else { throw HTTPParseError(.truncated, "connection closed before the response was complete") }
        return (HTTPResponse(head: head, body: body), bytes.dropFirst(used))
    }

    // MARK: - Head

    /// Gathers head bytes up to the blank line; returns the head once it is complete, and sets
    /// the body's framing. Interim 1xx answers are dropped and the next head read.
    private mutating func readHead(_ bytes: UnsafeRawBufferPointer, _ index: inout Int) throws(HTTPParseError) -> HTTPResponseHead? {
        let start = index
        let n = bytes.count
        var i = index
        var complete = false
        var line = lineLength
        while i < n {
            let b = bytes[i]
            i += 1
            if b == 0x0A {
                if line == 0 { complete = true; break }
                line = 0
            } else if b != 0x0D {
                line += 1
            }
        }
        lineLength = line
        index = i
        let size = Int(sectionBytes) + (i - start)
        guard size <= Int(maxHeadBytes) else { throw fail("response head too large") }
        sectionBytes = Int32(size)
        let piece = UnsafeRawBufferPointer(rebasing: bytes[start..<i])
        guard complete else {
            headBuffer.append(contentsOf: piece)
            return nil
        }
        let parsed: Result<HTTPResponseHead, HTTPParseError>
        if headBuffer.isEmpty {
            parsed = Result { () throws(HTTPParseError) in try Self.parseHead(piece) }
        } else {
            headBuffer.append(contentsOf: piece)
            let gathered = headBuffer
            headBuffer = []  // an idle stream keeps no head bytes
            parsed = gathered.withUnsafeBytes { raw in Result { () throws(HTTPParseError) in try Self.parseHead(raw) } }
        }
        let head: HTTPResponseHead
        switch parsed {
        case .success(let h): head = h
        case .failure(let error): throw fail(error.message)
        }
        lineLength = 0
        sectionBytes = 0
        if (100...199).contains(head.status) { return nil }  // interim: the real answer follows
        try startBody(head)
        return head
    }

    /// The body's framing (RFC 9112 §6.3).
    private mutating func startBody(_ head: HTTPResponseHead) throws(HTTPParseError) {
        if isHeadRequest || head.status == 204 || head.status == 304 {
            state = .ending
            return
        }
        if let te = head.header("transfer-encoding") {
            // Chunked must be the last coding; otherwise the body runs to the end of the connection.
            let last = te.split(separator: ",").last.map { Self.trimmed($0).lowercased() }
            if last == "chunked" { startChunkSize() } else { state = .untilClose }
            return
        }
        var length: Int?
        for (name, value) in head.headers where name == "content-length" {
            guard !value.isEmpty, value.utf8.count <= 18, value.utf8.allSatisfy({ (0x30...0x39).contains($0) }),
                  let n = Int(value), length == nil || length == n else { throw fail("bad Content-Length") }
            length = n
        }
        if let length {
            remaining = length
            state = length == 0 ? .ending : .fixedBody
        } else {
            state = .untilClose
        }
    }

    /// `HTTP/1.x SP 3DIGIT [SP reason]` CRLF, then `name: value` lines, then the blank line.
    private static func parseHead(_ bytes: UnsafeRawBufferPointer) throws(HTTPParseError) -> HTTPResponseHead {
        var lines: [Range<Int>] = []
        var start = 0
        for i in 0..<bytes.count where bytes[i] == 0x0A {
            lines.append(start..<(i > start && bytes[i - 1] == 0x0D ? i - 1 : i))
            start = i + 1
        }
        guard let statusLine = lines.first, !statusLine.isEmpty else { throw .malformed("empty response") }
        let s = statusLine.lowerBound
        let prefix: StaticString = "HTTP/1."
        guard statusLine.count >= 12, (0..<7).allSatisfy({ bytes[s + $0] == prefix.utf8Start[$0] }),
              isDigit(bytes[s + 7]), bytes[s + 8] == 0x20, (9..<12).allSatisfy({ isDigit(bytes[s + $0]) }),
              statusLine.count == 12 || bytes[s + 12] == 0x20 else {
            throw .malformed("not an HTTP response")
        }
        let status = (9..<12).reduce(0) { $0 * 10 + Int(bytes[s + $1] - 0x30) }
        guard (100...599).contains(status) else { throw .malformed("not an HTTP response") }
        let reason = statusLine.count > 13 ? text(bytes, (s + 13)..<statusLine.upperBound) : ""
        var headers: [(String, String)] = []
        headers.reserveCapacity(lines.count - 1)
        for line in lines.dropFirst() where !line.isEmpty {
            let first = bytes[line.lowerBound]
            if first == 0x20 || first == 0x09 {
                // obs-fold: a continuation of the previous value, joined with a space.
                guard let last = headers.popLast() else { throw .malformed("bad header line") }
                let more = text(bytes, trim(bytes, line))
                headers.append((last.0, last.1.isEmpty ? more : last.1 + " " + more))
                continue
            }
            var colon = line.lowerBound
            while colon < line.upperBound, bytes[colon] != UInt8(ascii: ":") {
                guard bytes[colon] != 0x20 && bytes[colon] != 0x09 else { throw .malformed("bad header line") }
                colon += 1
            }
            guard colon < line.upperBound, colon > line.lowerBound else { throw .malformed("bad header line") }
            headers.append((text(bytes, line.lowerBound..<colon).lowercased(), text(bytes, trim(bytes, (colon + 1)..<line.upperBound))))
        }
        return HTTPResponseHead(status: status, reason: reason, minorVersion: Int(bytes[s + 7] - 0x30), headers: headers)
    }

    /// Calls `body` with `bytes` as one contiguous buffer (copied only if they are not).
    private static func withBytes<C: Collection>(_ bytes: C, _ body: (UnsafeRawBufferPointer) throws(HTTPParseError) -> Int) throws(HTTPParseError) -> Int
    where C.Element == UInt8 {
        var result: Result<Int, HTTPParseError> = .success(0)
        let contiguous: Void? = bytes.withContiguousStorageIfAvailable { buffer in
            result = Result { () throws(HTTPParseError) in try body(UnsafeRawBufferPointer(buffer)) }
        }
        if contiguous == nil {
            Array(bytes).withUnsafeBytes { raw in result = Result { () throws(HTTPParseError) in try body(raw) } }
        }
        return try result.get()
    }

    // MARK: - Chunked

    private mutating func startChunkSize() {
        state = .chunkSizeLine(.digits)
        remaining = 0
        lineLength = 0
        sectionBytes = 0
    }

    /// `HEX [BWS] [; extensions] CRLF`, a byte at a time (it may be split across reads).
    private mutating func readChunkSizeLine(_ part: ChunkSizeLine, _ bytes: UnsafeRawBufferPointer, _ index: inout Int) throws(HTTPParseError) {
        let n = bytes.count
        var part = part
        while index < n {
            let b = bytes[index]
            index += 1
            sectionBytes += 1
            if sectionBytes > Self.maxChunkLineBytes { throw fail("chunk size line too long") }
            if b == 0x0A {
                guard lineLength > 0 else { throw fail("bad chunk size") }
                if remaining == 0 {
                    state = .trailers
                    lineLength = 0
                    sectionBytes = 0
                } else {
                    state = .chunkData
                }
                return
            }
            switch part {
            case .digits:
                if let d = Self.hexValue(b) {
                    guard lineLength < 15 else { throw fail("bad chunk size") }
                    remaining = remaining << 4 | d
                    lineLength += 1
                } else if lineLength > 0, b == 0x20 || b == 0x09 || b == 0x0D {
                    part = .space
                } else if lineLength > 0, b == UInt8(ascii: ";") {
                    part = .extensions
                } else {
                    throw fail("bad chunk size")
                }
            case .space:
                if b == UInt8(ascii: ";") {
                    part = .extensions
                } else if b != 0x20 && b != 0x09 && b != 0x0D {
                    throw fail("bad chunk size")
                }
            case .extensions:
                break  // skipped up to the line's end
            }
        }
        state = .chunkSizeLine(part)
    }

    /// Trailer fields are skipped up to the blank line that ends the response.
    private mutating func readTrailers(_ bytes: UnsafeRawBufferPointer, _ index: inout Int) throws(HTTPParseError) {
        let n = bytes.count
        while index < n {
            let b = bytes[index]
            index += 1
            sectionBytes += 1
            if sectionBytes > maxHeadBytes { throw fail("trailers too large") }
            if b == 0x0A {
                if lineLength == 0 { state = .ending; return }
                lineLength = 0
            } else if b != 0x0D {
                lineLength += 1
            }
        }
    }

    // MARK: - Helpers

    private mutating func fail(_ message: String) -> HTTPParseError {
        state = .failed
        headBuffer = []
        return .malformed(message)
    }

    private static func isDigit(_ b: UInt8) -> Bool { (0x30...0x39).contains(b) }

    private static func hexValue(_ b: UInt8) -> Int? {
        switch b {
        case 0x30...0x39: return Int(b - 0x30)
        case 0x41...0x46: return Int(b - 0x41 + 10)
        case 0x61...0x66: return Int(b - 0x61 + 10)
        default: return nil
        }
    }

    private static func text(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>) -> String {
        String(decoding: UnsafeRawBufferPointer(rebasing: bytes[range]), as: UTF8.self)
    }

    /// `range` without the spaces and tabs at either end.
    private static func trim(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>) -> Range<Int> {
        var lo = range.lowerBound, hi = range.upperBound
        while lo < hi, bytes[lo] == 0x20 || bytes[lo] == 0x09 { lo += 1 }
        while hi > lo, bytes[hi - 1] == 0x20 || bytes[hi - 1] == 0x09 { hi -= 1 }
        return lo..<hi
    }

    static func trimmed(_ s: Substring) -> String {
        var t = s
        while let f = t.first, f == " " || f == "\t" { t = t.dropFirst() }
        while let l = t.last, l == " " || l == "\t" { t = t.dropLast() }
        return String(t)
    }
}
