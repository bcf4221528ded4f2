/// Server-Sent Events framing (WHATWG HTML §9.2), as pure functions from values to bytes.
public enum SSE {
    /// One event: `id:` and `event:` lines (CR and LF removed, they would end the line),
    /// then `data:` once per line of the payload, split on CRLF, CR and LF; then a blank line.
    public static func encode(id: String?, event: String?, data: String) -> [UInt8] {
        var data = data
        return data.withUTF8 { bytes in
            var out: [UInt8] = []
            out.reserveCapacity(bytes.count + 48)
            if let id {
                out.append(contentsOf: "id: ".utf8)
                appendField(id, to: &out) { $0 == 0x0A || $0 == 0x0D || $0 == 0 }
                out.append(0x0A)
            }
            if let event {
                out.append(contentsOf: "event: ".utf8)
                appendField(event, to: &out) { $0 == 0x0A || $0 == 0x0D }
                out.append(0x0A)
            }
            var lineStart = 0
            var i = 0
            func emitLine(_ end: Int) {
                out.append(contentsOf: "data: ".utf8)
                out.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[lineStart..<end]))
                out.append(0x0A)
            }
            while i < bytes.count {
                if bytes[i] == 0x0D {
                    emitLine(i)
                    i += (i + 1 < bytes.count && bytes[i + 1] == 0x0A) ? 2 : 1
                    lineStart = i
                } else if bytes[i] == 0x0A {
                    emitLine(i)
                    i += 1
                    lineStart = i
                } else {
                    i += 1
                }
            }
            emitLine(bytes.count)
            out.append(0x0A)
            return out
        }
    }

    /// `s` without the bytes `dropped` names (copied whole when it has none, the usual case).
    private static func appendField(_ s: String, to out: inout [UInt8], dropping dropped: (UInt8) -> Bool) {
        var s = s
        s.withUTF8 { b in
            if b.contains(where: dropped) {
                out.append(contentsOf: b.filter { !dropped($0) })
            } else {
                out.append(contentsOf: b)
            }
        }
    }

    /// A comment line: ignored by clients, keeps proxies and the connection alive.
    public static func comment(_ text: String) -> [UInt8] {
        var out: [UInt8] = Array(": ".utf8)
        out.append(contentsOf: text.utf8.filter { $0 != 0x0A && $0 != 0x0D })
        out.append(contentsOf: "\n\n".utf8)
        return out
    }

    public static let heartbeat: [UInt8] = comment("heartbeat")

    /// The reconnection delay a client should use, in milliseconds.
    public static func retry(milliseconds: Int) -> [UInt8] {
        Array("retry: \(milliseconds)\n\n".utf8)
    }
}

/// One event as a client sees it.
public struct SSEEvent: Equatable, Sendable {
    public var id: String?
    public var event: String
    public var data: String
    public init(id: String?, event: String, data: String) {
        self.id = id
        self.event = event
        self.data = data
    }
}

/// An incremental SSE parser for clients (the CLI and the benchmark), following the
/// WHATWG algorithm: fields, comments, CR/LF/CRLF line ends, `retry`, last event id.
public struct SSEParser {
    public private(set) var lastEventID: String?
    public private(set) var retryMilliseconds: Int?
    public private(set) var commentCount = 0
    /// A line or an event passed `maxEventBytes`: the stream is not one this client reads
    /// (memory stays bounded; what arrives after is ignored).
    public private(set) var overflowed = false
    public let maxEventBytes: Int

    private var line: [UInt8] = []
    private var sawCR = false
    private var dataBuffer: [UInt8] = []
    private var hasData = false
    private var eventName: String = ""
    private var pendingID: String?

    public init(maxEventBytes: Int = 1 << 20) { self.maxEventBytes = maxEventBytes }

    /// Feeds bytes; returns the events they completed.
    public mutating func feed<C: Collection>(_ bytes: C) -> [SSEEvent] where C.Element == UInt8 {
        var events: [SSEEvent] = []
        if overflowed { return events }
        for b in bytes {
            if line.count + dataBuffer.count >= maxEventBytes {
                overflowed = true
                line = []
                dataBuffer = []
                return events
            }
            if sawCR {
                sawCR = false
                if b == 0x0A { continue }
            }
            if b == 0x0D {
                sawCR = true
                if let e = endLine() { events.append(e) }
            } else if b == 0x0A {
                if let e = endLine() { events.append(e) }
            } else {
                line.append(b)
            }
        }
        return events
    }

    private mutating func endLine() -> SSEEvent? {
        defer { line.removeAll(keepingCapacity: true) }
        if line.isEmpty { return dispatch() }
        if line[0] == UInt8(ascii: ":") { commentCount += 1; return nil }
        let field: [UInt8]
        var value: ArraySlice<UInt8>
        if let colon = line.firstIndex(of: UInt8(ascii: ":")) {
            field = Array(line[..<colon])
            value = line[(colon + 1)...]
            if value.first == UInt8(ascii: " ") { value = value.dropFirst() }
        } else {
            field = line
            value = []
        }
        switch String(decoding: field, as: UTF8.self) {
        case "event": eventName = String(decoding: value, as: UTF8.self)
        case "data":
            if hasData { dataBuffer.append(0x0A) }
            dataBuffer.append(contentsOf: value)
            hasData = true
        case "id":
            if !value.contains(0) { pendingID = String(decoding: value, as: UTF8.self); lastEventID = pendingID }
        case "retry":
            if !value.isEmpty, value.allSatisfy({ (0x30...0x39).contains($0) }) {
                retryMilliseconds = Int(String(decoding: value, as: UTF8.self))
            }
        default: break
        }
        return nil
    }

    private mutating func dispatch() -> SSEEvent? {
        defer {
            dataBuffer.removeAll(keepingCapacity: true)
            hasData = false
            eventName = ""
            pendingID = nil
        }
        guard hasData else { return nil }
        return SSEEvent(id: lastEventID, event: eventName.isEmpty ? "message" : eventName,
                        data: String(decoding: dataBuffer, as: UTF8.self))
    }
}
