import DispatchCore

/// What the benchmark pulls out of one SSE event (or one plain response body): the
/// numeric `id:`, the `"seq":N` and the publish timestamp `t=<ns>` found in `data:`.
/// Fields that are absent are -1. An id of the form `A:B` (nchan's `<time>:<tag>`) is kept in
/// `pairID` as `A << 24 | B` (see `BenchEvent.idText`), so a client can send it back as
/// `Last-Event-ID`.
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
    /// An `A:B` id as `A << 24 | B`; -1 when the id was not of that form.
    public var pairID: Int64

    public init(id: Int64 = -1, seq: Int64 = -1, t: Int64 = -1, kind: Kind = .message, pairID: Int64 = -1) {
        self.id = id
        self.seq = seq
        self.t = t
        self.kind = kind
        self.pairID = pairID
    }

    /// The id as the server sent it (for `Last-Event-ID`), or nil when it had none we kept.
    public var idText: String? {
        if id >= 0 { return String(id) }
        if pairID >= 0 { return Self.pairText(pairID) }
        return nil
    }

    /// `A << 24 | B` back to `A:B`.
    public static func pairText(_ v: Int64) -> String { "\(v >> 24):\(v & 0xFFFFFF)" }
}

/// One step of an HTTP response as the benchmark client sees it.
public enum BenchParseOutput: Equatable, Sendable {
    /// The status line and headers are complete.
    case headers(status: Int, eventStream: Bool)
    case event(BenchEvent)
    /// A `retry:` field: the reconnection time an EventSource must use from now on (ms).
    case retry(Int64)
    /// The response is complete; `keepAlive` says whether the connection may carry another request.
    case end(keepAlive: Bool)
    /// The bytes are not HTTP the parser understands; the connection should be closed.
    case malformed
}

/// The benchmark client's reader, built for holding tens of thousands of streams: DispatchCore's
/// `HTTPResponseParser` frames each response (zero-copy), and this reads what the benchmark
/// checks out of the body: SSE lines (CR / LF / CRLF ends, comments, events split across reads
/// and chunks) or a plain body, without materialising strings. A small value that allocates
/// nothing while lines fit in one read. Responses follow one another on a kept-alive connection.
public struct BenchStreamParser: Sendable {
    // Fields in this order pack into 70 bytes (one per stream, 50,000 streams).
    private var http = HTTPResponseParser(maxHeadBytes: BenchStreamParser.maxHeaderBytes)
    /// A partial SSE line or a plain body.
    private var carry: [UInt8] = []
    /// The current SSE event's fields.
    private var event = BenchEvent()
    private var hasData = false
    private var sawCR = false
    private var eventStream = false
    private var keepAlive = true
    /// Set once the bytes were not HTTP: nothing more is read.
    private var failed = false

    /// Plain bodies longer than this are cut (only their start is scanned).
    public static let maxPlainBody = 64 * 1024
    static let maxHeaderBytes = 16 * 1024

    public init() {}

    /// Feeds bytes from the socket; appends what they completed to `out`.
    public mutating func feed(_ buffer: UnsafeRawBufferPointer, into out: inout [BenchParseOutput]) {
        var index = 0
        while !failed {
            let part: HTTPResponseParser.Part?
            do {
                part = try http.next(in: buffer, at: &index)
            } catch {
                fail(&out)
                return
            }
            switch part {
            case nil:
                return
            case .head(let head)?:
                headers(head, &out)
            case .body(let bytes)?:
                guard let base = bytes.baseAddress else { continue }
                body(UnsafeBufferPointer(start: base.assumingMemoryBound(to: UInt8.self), count: bytes.count), &out)
            case .end?:
                finishResponse(&out)
                // The next answer on this connection, if any, starts right after.
                http = HTTPResponseParser(maxHeadBytes: Self.maxHeaderBytes)
            }
        }
    }

    /// The connection reached end of file: a read-until-close body is complete now.
    public mutating func finish(into out: inout [BenchParseOutput]) {
        guard !failed else { return }
        var closed = false
        // Anything but a body read until close is simply cut off (the caller sees the close).
        try? http.finish { if case .end = $0 { closed = true } }
        guard closed else { return }
        if eventStream {
            if !carry.isEmpty { processLine(carry[...], &out); carry.removeAll() }
            processLine([][...], &out)
        } else {
            emitPlainBody(&out)
        }
        keepAlive = false
        out.append(.end(keepAlive: false))
        http = HTTPResponseParser(maxHeadBytes: Self.maxHeaderBytes)
    }

    // MARK: - Responses

    private mutating func fail(_ out: inout [BenchParseOutput]) {
        failed = true
        carry = []
        out.append(.malformed)
    }

    private mutating func headers(_ head: HTTPResponseHead, _ out: inout [BenchParseOutput]) {
        eventStream = head.header("content-type")?.lowercased().hasPrefix("text/event-stream") ?? false
        keepAlive = head.keepAlive
        out.append(.headers(status: head.status, eventStream: eventStream))
        event = BenchEvent()
        hasData = false
        sawCR = false
        carry = []
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
            if carry.count + (n - start) > Self.maxPlainBody { fail(&out); return }
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
            event.pairID = event.id < 0 ? Self.parsePair(value) ?? -1 : -1
        case 4 where Self.matches(line, "data"):
            hasData = true
            var e = event
            Self.scanData(value, into: &e)
            event = e
        case 5 where Self.matches(line, "event"):
            event.kind = Self.kind(of: value)
        case 5 where Self.matches(line, "retry"):
            // WHATWG: only ASCII digits set the reconnection time; anything else is ignored.
            if let ms = Self.parseInt(value) { out.append(.retry(ms)) }
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

    /// `A:B` (both decimal, B < 2^24) as `A << 24 | B`.
    static func parsePair<C: Collection>(_ value: C) -> Int64? where C.Element == UInt8, C.Index == Int {
        guard let colon = value.firstIndex(of: UInt8(ascii: ":")),
              let a = parseInt(value[value.startIndex..<colon]), a < (Int64(1) << 38),
              let b = parseInt(value[(colon + 1)..<value.endIndex]), b < (Int64(1) << 24) else { return nil }
        return a << 24 | b
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
