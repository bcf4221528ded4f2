/// What the benchmark pulls out of one SSE event (or one plain response body): the
/// numeric `id:`, the `"seq":N` and the publish timestamp `t=<ns>` found in `data:`.
/// Fields that are absent are -1.
public struct BenchEvent: Equatable, Sendable {
    public enum Kind: UInt8, Sendable {
        /// Any event that does not end the stream.
        case message
        /// `completed`, `error` or `cancelled`: the last event of a Dispatch stream.
        case terminal
        /// `not_found`.
        case notFound
        /// A whole non-SSE response body (a publish answer, an nchan long-poll message).
        case body
    }
    public var id: Int64
    public var seq: Int64
    public var t: Int64
    public var kind: Kind

    public init(id: Int64 = -1, seq: Int64 = -1, t: Int64 = -1, kind: Kind = .message) {
        self.id = id
        self.seq = seq
        self.t = t
        self.kind = kind
    }
}

/// One step of an HTTP response as the benchmark client sees it.
public enum BenchParseOutput: Equatable, Sendable {
    /// The status line and headers are complete.
    case headers(status: Int, eventStream: Bool)
    case event(BenchEvent)
    /// The response is complete; `keepAlive` says whether the connection may carry another request.
    case end(keepAlive: Bool)
    /// The bytes are not HTTP the parser understands; the connection should be closed.
    case malformed
}

/// An incremental HTTP/1.1 response parser with an SSE reader behind it, built for
/// holding tens of thousands of streams: it is a small value (no allocation while lines
/// fit in one read), understands chunked, `Content-Length` and read-until-close bodies,
/// CR / LF / CRLF line ends, comments, and events split across reads and chunks.
/// It extracts only what the benchmark checks instead of materialising strings.
public struct BenchStreamParser: Sendable {
    private enum Phase: UInt8, Sendable {
        case headers, chunkSize, chunkExt, chunkData, chunkDataEnd, trailers, lengthBody, untilClose, failed
    }

    private var phase: Phase = .headers
    /// Header bytes, then a partial SSE line or a plain body.
    private var carry: [UInt8] = []
    private var remaining: Int = 0
    private var sawCR = false
    private var trailerLineLength = 0
    private var eventStream = false
    private var keepAlive = true
    /// The current SSE event's fields.
    private var event = BenchEvent()
    private var hasData = false

    /// Plain bodies longer than this are cut (only their start is scanned).
    public static let maxPlainBody = 64 * 1024
    static let maxHeaderBytes = 16 * 1024

    public init() {}

    /// Feeds bytes from the socket; appends what they completed to `out`.
    public mutating func feed(_ buffer: UnsafeRawBufferPointer, into out: inout [BenchParseOutput]) {
        guard let base = buffer.baseAddress?.assumingMemoryBound(to: UInt8.self) else { return }
        let bytes = UnsafeBufferPointer(start: base, count: buffer.count)
        var i = 0
        let n = bytes.count
        while i < n {
            switch phase {
            case .failed:
                return
            case .headers:
                // Collect up to the blank line ("\n\n" or "\n\r\n").
                var complete = false
                while i < n {
                    let b = bytes[i]
                    i += 1
                    carry.append(b)
                    if b == 0x0A {
                        let c = carry.count
                        if c >= 2, carry[c - 2] == 0x0A { complete = true; break }
                        if c >= 3, carry[c - 2] == 0x0D, carry[c - 3] == 0x0A { complete = true; break }
                    }
                }
                if !complete {
                    if carry.count > Self.maxHeaderBytes { fail(&out) }
                    continue
                }
                parseHeaders(&out)
            case .chunkSize:
                let b = bytes[i]
                i += 1
                if let d = Self.hexValue(b) {
                    if remaining > (Int.max >> 5) { fail(&out); continue }
                    remaining = remaining << 4 | d
                } else if b == 0x0D || b == 0x20 || b == 0x09 {
                    continue
                } else if b == 0x3B {
                    phase = .chunkExt
                } else if b == 0x0A {
                    endChunkSize()
                } else {
                    fail(&out)
                }
            case .chunkExt:
                let b = bytes[i]
                i += 1
                if b == 0x0A { endChunkSize() }
            case .chunkData:
                let take = min(remaining, n - i)
                body(UnsafeBufferPointer(rebasing: bytes[i..<(i + take)]), &out)
                i += take
                remaining -= take
                if remaining == 0 { phase = .chunkDataEnd }
            case .chunkDataEnd:
                let b = bytes[i]
                i += 1
                if b == 0x0A { phase = .chunkSize; remaining = 0 } else if b != 0x0D { fail(&out) }
            case .trailers:
                let b = bytes[i]
                i += 1
                if b == 0x0A {
                    if trailerLineLength == 0 { finishResponse(&out) } else { trailerLineLength = 0 }
                } else if b != 0x0D {
                    trailerLineLength += 1
                }
            case .lengthBody:
                let take = min(remaining, n - i)
                body(UnsafeBufferPointer(rebasing: bytes[i..<(i + take)]), &out)
                i += take
                remaining -= take
                if remaining == 0 { finishResponse(&out) }
            case .untilClose:
                body(UnsafeBufferPointer(rebasing: bytes[i..<n]), &out)
                i = n
            }
        }
    }

    /// The connection reached end of file: a read-until-close body is complete now.
    public mutating func finish(into out: inout [BenchParseOutput]) {
        if phase == .untilClose {
            if eventStream {
                if !carry.isEmpty { processLine(carry[...], &out); carry.removeAll() }
                processLine([][...], &out)
            } else {
                emitPlainBody(&out)
            }
            keepAlive = false
            out.append(.end(keepAlive: false))
            phase = .headers
        }
    }

    // MARK: - Framing

    private mutating func fail(_ out: inout [BenchParseOutput]) {
        phase = .failed
        carry = []
        out.append(.malformed)
    }

    private mutating func endChunkSize() {
        if remaining == 0 {
            phase = .trailers
            trailerLineLength = 0
        } else {
            phase = .chunkData
        }
    }

    private static func hexValue(_ b: UInt8) -> Int? {
        switch b {
        case 0x30...0x39: return Int(b - 0x30)
        case 0x41...0x46: return Int(b - 0x41 + 10)
        case 0x61...0x66: return Int(b - 0x61 + 10)
        default: return nil
        }
    }

    private mutating func parseHeaders(_ out: inout [BenchParseOutput]) {
        let text = carry
        carry = []
        // Status line: HTTP/1.x SP code SP reason
        var lines: [ArraySlice<UInt8>] = []
        var s = 0
        for (k, b) in text.enumerated() where b == 0x0A {
            var e = k
            if e > s, text[e - 1] == 0x0D { e -= 1 }
            lines.append(text[s..<e])
            s = k + 1
        }
        guard let statusLine = lines.first, statusLine.count >= 12,
              statusLine.starts(with: "HTTP/1.".utf8) else { fail(&out); return }
        let http10 = statusLine[statusLine.startIndex + 7] == UInt8(ascii: "0")
        let codeBytes = statusLine[(statusLine.startIndex + 9)..<(statusLine.startIndex + 12)]
        guard codeBytes.allSatisfy({ (0x30...0x39).contains($0) }) else { fail(&out); return }
        let status = codeBytes.reduce(0) { $0 * 10 + Int($1 - 0x30) }
        var chunked = false
        var length = -1
        keepAlive = !http10
        eventStream = false
        for line in lines.dropFirst() {
            guard let colon = line.firstIndex(of: UInt8(ascii: ":")) else { continue }
            let name = String(decoding: line[line.startIndex..<colon], as: UTF8.self).lowercased()
            let value = String(decoding: line[(colon + 1)...], as: UTF8.self)
                .benchTrimmingSpaces().lowercased()
            switch name {
            case "transfer-encoding": chunked = value.hasSuffix("chunked")
            case "content-length": length = Int(value) ?? -1
            case "content-type": eventStream = value.hasPrefix("text/event-stream")
            case "connection":
                if value.contains("close") { keepAlive = false }
                if value.contains("keep-alive") { keepAlive = true }
            default: break
            }
        }
        out.append(.headers(status: status, eventStream: eventStream))
        event = BenchEvent()
        hasData = false
        sawCR = false
        if status == 204 || status == 304 || (100...199).contains(status) {
            length = 0
            chunked = false
        }
        if chunked {
            phase = .chunkSize
            remaining = 0
        } else if length >= 0 {
            remaining = length
            phase = .lengthBody
            if length == 0 { finishResponse(&out) }
        } else {
            keepAlive = false
            phase = .untilClose
        }
    }

    private mutating func finishResponse(_ out: inout [BenchParseOutput]) {
        if eventStream {
            if !carry.isEmpty { processLine(carry[...], &out); carry = [] }
            // A stream that ends mid-event drops that event, as EventSource does.
            hasData = false
        } else {
            emitPlainBody(&out)
        }
        out.append(.end(keepAlive: keepAlive))
        phase = .headers
        carry = []
    }

    private mutating func emitPlainBody(_ out: inout [BenchParseOutput]) {
        var e = BenchEvent(kind: .body)
        carry.withUnsafeBufferPointer { Self.scanData($0[...], into: &e) }
        out.append(.event(e))
        carry = []
    }

    // MARK: - Body and SSE lines

    private mutating func body(_ bytes: UnsafeBufferPointer<UInt8>, _ out: inout [BenchParseOutput]) {
        guard eventStream else {
            let room = Self.maxPlainBody - carry.count
            if room > 0 { carry.append(contentsOf: UnsafeBufferPointer(rebasing: bytes.prefix(room))) }
            return
        }
        var start = 0
        var i = 0
        let n = bytes.count
        while i < n {
            let b = bytes[i]
            if sawCR {
                sawCR = false
                if b == 0x0A { i += 1; start = i; continue }
            }
            if b == 0x0A || b == 0x0D {
                if carry.isEmpty {
                    processLine(bytes[start..<i], &out)
                } else {
                    carry.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[start..<i]))
                    let line = carry
                    carry.removeAll(keepingCapacity: true)
                    processLine(line[...], &out)
                }
                sawCR = b == 0x0D
                i += 1
                start = i
            } else {
                i += 1
            }
        }
        if start < n {
            if carry.count + (n - start) > Self.maxPlainBody { carry = []; phase = .failed; out.append(.malformed); return }
            carry.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[start..<n]))
        } else if carry.isEmpty, carry.capacity > 256 {
            carry = []  // do not keep a big line buffer on an idle stream
        }
    }

    private mutating func processLine<C: Collection>(_ line: C, _ out: inout [BenchParseOutput])
    where C.Element == UInt8, C.Index == Int {
        if line.isEmpty {
            if hasData { out.append(.event(event)) }
            event = BenchEvent()
            hasData = false
            return
        }
        let first = line[line.startIndex]
        if first == UInt8(ascii: ":") { return }
        var colon = line.startIndex
        while colon < line.endIndex, line[colon] != UInt8(ascii: ":") { colon += 1 }
        var v = colon < line.endIndex ? colon + 1 : colon
        if v < line.endIndex, line[v] == 0x20 { v += 1 }
        let nameLength = colon - line.startIndex
        let value = line[v..<line.endIndex]
        switch nameLength {
        case 2 where Self.matches(line, "id"):
            event.id = Self.parseInt(value) ?? -1
        case 4 where Self.matches(line, "data"):
            hasData = true
            var e = event
            Self.scanData(value, into: &e)
            event = e
        case 5 where Self.matches(line, "event"):
            event.kind = Self.kind(of: value)
        default:
            break
        }
    }

    private static func matches<C: Collection>(_ line: C, _ name: StaticString) -> Bool
    where C.Element == UInt8, C.Index == Int {
        let p = name.utf8Start
        for k in 0..<name.utf8CodeUnitCount where line[line.startIndex + k] != p[k] { return false }
        return true
    }

    private static func kind<C: Collection>(of value: C) -> BenchEvent.Kind where C.Element == UInt8 {
        switch String(decoding: value, as: UTF8.self) {
        case "completed", "error", "cancelled": return .terminal
        case "not_found": return .notFound
        default: return .message
        }
    }

    static func parseInt<C: Collection>(_ value: C) -> Int64? where C.Element == UInt8 {
        if value.isEmpty || value.count > 18 { return nil }
        var r: Int64 = 0
        for b in value {
            guard b >= 0x30, b <= 0x39 else { return nil }
            r = r * 10 + Int64(b - 0x30)
        }
        return r
    }

    /// Finds `"seq":N` and `t=<digits>` (the benchmark's status) in a data line.
    static func scanData<C: Collection>(_ data: C, into e: inout BenchEvent)
    where C.Element == UInt8, C.Index == Int {
        if let k = find(data, "\"seq\":") { e.seq = digits(data, from: k) ?? e.seq }
        if let k = find(data, "\"status\":\"t=") { e.t = digits(data, from: k) ?? e.t }
    }

    private static func find<C: Collection>(_ data: C, _ pattern: StaticString) -> Int?
    where C.Element == UInt8, C.Index == Int {
        let p = pattern.utf8Start
        let m = pattern.utf8CodeUnitCount
        var i = data.startIndex
        let last = data.endIndex - m
        while i <= last {
            if data[i] == p[0] {
                var k = 1
                while k < m, data[i + k] == p[k] { k += 1 }
                if k == m { return i + m }
            }
            i += 1
        }
        return nil
    }

    private static func digits<C: Collection>(_ data: C, from: Int) -> Int64?
    where C.Element == UInt8, C.Index == Int {
        var i = from
        var r: Int64 = 0
        var any = false
        while i < data.endIndex, data[i] >= 0x30, data[i] <= 0x39, r < Int64.max / 10 - 10 {
            r = r * 10 + Int64(data[i] - 0x30)
            any = true
            i += 1
        }
        return any ? r : nil
    }
}

extension String {
    fileprivate func benchTrimmingSpaces() -> String {
        var s = Substring(self)
        while let f = s.first, f == " " || f == "\t" { s = s.dropFirst() }
        while let l = s.last, l == " " || l == "\t" { s = s.dropLast() }
        return String(s)
    }
}
