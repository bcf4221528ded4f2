import DispatchCore

/// The CLI's minimal HTTP/1.1 client, minus the sockets: URL parsing, request encoding and an
/// incremental response parser (Content-Length, chunked, or read-until-close bodies).

/// Where the server is: `http://host[:port][/base/path]`. TLS is not spoken by the CLI.
public struct CLIEndpoint: Equatable, Sendable {
    public var host: String
    public var port: Int
    /// Prefix for every request path, without a trailing slash ("" or "/dispatch").
    public var basePath: String

    public init(host: String, port: Int, basePath: String = "") {
        self.host = host
        self.port = port
        self.basePath = basePath
    }

    public struct ParseError: Error, Equatable, Sendable {
        public var message: String
    }

    public static func parse(_ text: String) throws(ParseError) -> CLIEndpoint {
        var rest = Substring(text)
        if rest.lowercased().hasPrefix("https://") {
            throw ParseError(message: "https is not supported; use http:// (put a TLS proxy on the machine if the server is remote)")
        }
        guard rest.lowercased().hasPrefix("http://") else { throw ParseError(message: "must start with http://") }
        rest = rest.dropFirst(7)
        let authority: Substring
        if let slash = rest.firstIndex(of: "/") {
            authority = rest[..<slash]
            rest = rest[slash...]
        } else {
            authority = rest
            rest = ""
        }
        guard !authority.contains("@") else { throw ParseError(message: "credentials in the URL are not supported; use --token") }
        var host: Substring
        var portText: Substring?
        if authority.first == "[" {
            guard let close = authority.firstIndex(of: "]") else { throw ParseError(message: "unterminated IPv6 address") }
            host = authority[authority.index(after: authority.startIndex)..<close]
            let after = authority[authority.index(after: close)...]
            if !after.isEmpty {
                guard after.first == ":" else { throw ParseError(message: "unexpected text after the IPv6 address") }
                portText = after.dropFirst()
            }
        } else if let colon = authority.lastIndex(of: ":") {
            host = authority[..<colon]
            portText = authority[authority.index(after: colon)...]
        } else {
            host = authority
        }
        guard !host.isEmpty else { throw ParseError(message: "missing host") }
        var port = 80
        if let portText {
            guard !portText.isEmpty, portText.count <= 5, portText.allSatisfy({ $0.isASCII && $0.isNumber }),
                  let p = Int(portText), (1...65535).contains(p) else {
                throw ParseError(message: "bad port '\(portText)'")
            }
            port = p
        }
        if rest.contains("?") || rest.contains("#") { throw ParseError(message: "a query or fragment is not allowed") }
        while rest.hasSuffix("/") { rest = rest.dropLast() }
        return CLIEndpoint(host: String(host), port: port, basePath: String(rest))
    }

    /// The `Host` header value.
    public var hostHeader: String {
        let h = host.contains(":") ? "[\(host)]" : host
        return port == 80 ? h : "\(h):\(port)"
    }

    public var display: String { "http://\(hostHeader)\(basePath)" }
}

public enum CLIHTTP {
    /// Percent-encodes a path segment (an activity id): everything but RFC 3986 unreserved characters.
    public static func encodeSegment(_ s: String) -> String {
        var out = ""
        let hex = Array("0123456789ABCDEF")
        for b in s.utf8 {
            switch b {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
                 UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."),
                 UInt8(ascii: "_"), UInt8(ascii: "~"), UInt8(ascii: ":"):
                out.unicodeScalars.append(Unicode.Scalar(b))
            default:
                out.append("%")
                out.append(hex[Int(b >> 4)])
                out.append(hex[Int(b & 0xF)])
            }
        }
        return out
    }

    /// Encodes a request. Header values are stripped of CR and LF so a flag value cannot inject headers.
    public static func encodeRequest(method: String, path: String, endpoint: CLIEndpoint,
                                     headers: [(String, String)], body: [UInt8]?) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(256 + (body?.count ?? 0))
        func line(_ s: String) { out.append(contentsOf: s.utf8); out.append(0x0D); out.append(0x0A) }
        func clean(_ s: String) -> String { String(s.unicodeScalars.filter { $0 != "\r" && $0 != "\n" }) }
        line("\(method) \(endpoint.basePath)\(path) HTTP/1.1")
        line("Host: \(endpoint.hostHeader)")
        for (name, value) in headers { line("\(clean(name)): \(clean(value))") }
        if let body {
            line("Content-Type: application/json")
            line("Content-Length: \(body.count)")
        }
        line("Connection: close")
        out.append(0x0D)
        out.append(0x0A)
        if let body { out.append(contentsOf: body) }
        return out
    }
}

public struct CLIHTTPResponseHead: Equatable, Sendable {
    public var status: Int
    public var reason: String
    /// Names lower-cased, in arrival order.
    public var headers: [(String, String)]

    public static func == (a: CLIHTTPResponseHead, b: CLIHTTPResponseHead) -> Bool {
        a.status == b.status && a.reason == b.reason && a.headers.elementsEqual(b.headers, by: { $0 == $1 })
    }

    public func header(_ name: String) -> String? {
        let lower = name.lowercased()
        return headers.first { $0.0 == lower }?.1
    }
}

public enum CLIHTTPResponseEvent: Equatable, Sendable {
    case head(CLIHTTPResponseHead)
    case body([UInt8])
    case end
}

public struct CLIHTTPParseError: Error, Equatable, Sendable {
    public var message: String
    /// True when the connection ended before the response was complete (worth a retry),
    /// false when what arrived is not HTTP.
    public var truncated: Bool
}

/// Incremental HTTP/1.1 response parser: feed it bytes as they arrive; it returns the head,
/// body pieces (chunked framing removed) and `.end`. `finish()` reports the end of the connection.
public struct CLIHTTPResponseParser: Sendable {
    public static let maxHeadBytes = 64 * 1024

    enum State: Sendable {
        case head
        case fixed(remaining: Int)
        case chunkSize
        case chunkData(remaining: Int)
        case chunkDataEnd
        case trailers
        case untilClose
        case done
    }

    private var state: State = .head
    private var buffer: [UInt8] = []
    private let headRequest: Bool

    public init(isHeadRequest: Bool = false) {
        headRequest = isHeadRequest
    }

    public var isDone: Bool { if case .done = state { return true } else { return false } }

    public mutating func feed<C: Collection>(_ bytes: C) throws(CLIHTTPParseError) -> [CLIHTTPResponseEvent] where C.Element == UInt8 {
        buffer.append(contentsOf: bytes)
        var events: [CLIHTTPResponseEvent] = []
        var progressed = true
        while progressed {
            progressed = try step(&events)
        }
        return events
    }

    /// The peer closed the connection.
    public mutating func finish() throws(CLIHTTPParseError) -> [CLIHTTPResponseEvent] {
        switch state {
        case .done: return []
        case .untilClose:
            state = .done
            return [.end]
        case .head, .fixed, .chunkSize, .chunkData, .chunkDataEnd, .trailers:
            throw CLIHTTPParseError(message: "connection closed before the response was complete", truncated: true)
        }
    }

    private func findCRLF(from start: Int = 0) -> Int? {
        var i = start
        while i + 1 < buffer.count {
            if buffer[i] == 0x0D && buffer[i + 1] == 0x0A { return i }
            i += 1
        }
        return nil
    }

    private func malformed(_ message: String) -> CLIHTTPParseError {
        CLIHTTPParseError(message: message, truncated: false)
    }

    /// Does one unit of work; returns whether it consumed anything.
    private mutating func step(_ events: inout [CLIHTTPResponseEvent]) throws(CLIHTTPParseError) -> Bool {
        switch state {
        case .done:
            buffer.removeAll()
            return false
        case .head:
            guard let end = findHeadEnd() else {
                if buffer.count > Self.maxHeadBytes { throw malformed("response head too large") }
                return false
            }
            let headBytes = Array(buffer[..<end])
            buffer.removeFirst(end + 4)
            let head = try parseHead(headBytes)
            if (100...199).contains(head.status) { return true }  // interim answer; the real one follows
            events.append(.head(head))
            let te = head.header("transfer-encoding")?.lowercased()
            if headRequest || head.status == 204 || head.status == 304 {
                state = .done
                events.append(.end)
            } else if let te, te.split(separator: ",").last.map({ String($0).cliTrimmed() }) == "chunked" {
                state = .chunkSize
            } else if let cl = head.header("content-length") {
                guard let n = Int(cl.cliTrimmed()), n >= 0 else { throw malformed("bad Content-Length") }
                if n == 0 {
                    state = .done
                    events.append(.end)
                } else {
                    state = .fixed(remaining: n)
                }
            } else {
                state = .untilClose
            }
            return true
        case .fixed(let remaining):
            guard !buffer.isEmpty else { return false }
            let n = min(remaining, buffer.count)
            events.append(.body(Array(buffer[..<n])))
            buffer.removeFirst(n)
            if n == remaining {
                state = .done
                events.append(.end)
            } else {
                state = .fixed(remaining: remaining - n)
            }
            return true
        case .untilClose:
            guard !buffer.isEmpty else { return false }
            events.append(.body(buffer))
            buffer.removeAll(keepingCapacity: true)
            return true
        case .chunkSize:
            guard let crlf = findCRLF() else {
                if buffer.count > 1024 { throw malformed("chunk size line too long") }
                return false
            }
            var sizeText = buffer[..<crlf]
            if let semi = sizeText.firstIndex(of: UInt8(ascii: ";")) { sizeText = sizeText[..<semi] }
            while sizeText.last == 0x20 || sizeText.last == 0x09 { sizeText = sizeText.dropLast() }
            guard !sizeText.isEmpty, sizeText.count <= 15,
                  let size = Int(String(decoding: sizeText, as: UTF8.self), radix: 16), size >= 0 else {
                throw malformed("bad chunk size")
            }
            buffer.removeFirst(crlf + 2)
            state = size == 0 ? .trailers : .chunkData(remaining: size)
            return true
        case .chunkData(let remaining):
            guard !buffer.isEmpty else { return false }
            let n = min(remaining, buffer.count)
            events.append(.body(Array(buffer[..<n])))
            buffer.removeFirst(n)
            state = n == remaining ? .chunkDataEnd : .chunkData(remaining: remaining - n)
            return true
        case .chunkDataEnd:
            guard buffer.count >= 2 else { return false }
            guard buffer[0] == 0x0D, buffer[1] == 0x0A else { throw malformed("missing CRLF after chunk") }
            buffer.removeFirst(2)
            state = .chunkSize
            return true
        case .trailers:
            guard let crlf = findCRLF() else {
                if buffer.count > Self.maxHeadBytes { throw malformed("trailers too large") }
                return false
            }
            buffer.removeFirst(crlf + 2)
            if crlf == 0 {
                state = .done
                events.append(.end)
            }
            return true
        }
    }

    private func findHeadEnd() -> Int? {
        var i = 0
        while i + 3 < buffer.count {
            if buffer[i] == 0x0D && buffer[i + 1] == 0x0A && buffer[i + 2] == 0x0D && buffer[i + 3] == 0x0A { return i }
            i += 1
        }
        return nil
    }

    private func parseHead(_ bytes: [UInt8]) throws(CLIHTTPParseError) -> CLIHTTPResponseHead {
        let lines = bytes.split(separator: 0x0A, omittingEmptySubsequences: false).map { line -> ArraySlice<UInt8> in
            line.last == 0x0D ? line.dropLast() : line
        }
        guard let statusLine = lines.first else { throw malformed("empty response") }
        let parts = statusLine.split(separator: 0x20, maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count >= 2, parts[0].starts(with: Array("HTTP/1.".utf8)), parts[1].count == 3,
              let status = Int(String(decoding: parts[1], as: UTF8.self)), (100...599).contains(status) else {
            throw malformed("not an HTTP response")
        }
        let reason = parts.count > 2 ? String(decoding: parts[2], as: UTF8.self) : ""
        var headers: [(String, String)] = []
        for line in lines.dropFirst() where !line.isEmpty {
            guard let colon = line.firstIndex(of: UInt8(ascii: ":")) else { throw malformed("bad header line") }
            let name = String(decoding: line[..<colon], as: UTF8.self).lowercased()
            let value = String(decoding: line[(colon + 1)...], as: UTF8.self).cliTrimmed()
            headers.append((name, value))
        }
        return CLIHTTPResponseHead(status: status, reason: reason, headers: headers)
    }
}
