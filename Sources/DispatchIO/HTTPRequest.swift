import DispatchCore
import DispatchSystem
import Glibc

/// One HTTP request, complete (head and body), as the connection read it. It keeps one copy of
/// its head's bytes; the path, the query and headers are read from it when asked.
public final class HTTPRequest {
    let connection: HTTPConnection
    /// The request line and headers, as received.
    private let head: [UInt8]
    private let targetStart: Int32
    private let targetLength: Int32
    let minor: Int
    var bodyBytes: [UInt8] = []
    /// Which of its connection's requests this is (an answer must match it).
    var serial: UInt32 = 0
    /// The request's method; nil for one the API does not speak.
    public let method: HTTPMethod?
    /// When it arrived whole (monotonic seconds), for the request log.
    public let received: Double
    /// What the request log shows of it once known: the route's pattern and the key's name.
    public var route: String?
    public var keyName: String?

    init(connection: HTTPConnection, head: UnsafeRawBufferPointer, method: String, target: Int, targetLength: Int,
         minor: Int, received: Double) {
        self.connection = connection
        self.head = Array(head)
        targetStart = Int32(target)
        self.targetLength = Int32(targetLength)
        self.minor = minor
        self.received = received
        self.method = HTTPMethod(rawValue: method)
    }

    /// The request target's path part, still percent-encoded (an absolute-form target loses
    /// its scheme and authority).
    private var rawPath: ArraySlice<UInt8> {
        var t = head[Int(targetStart)..<Int(targetStart + targetLength)]
        if let q = t.firstIndex(of: UInt8(ascii: "?")) { t = t[..<q] }
        if let h = t.firstIndex(of: UInt8(ascii: "#")) { t = t[..<h] }
        if t.first != UInt8(ascii: "/"), let scheme = HTTPRequest.find(Array("://".utf8), in: t) {
            let afterAuthority = t[(scheme + 3)...]
            t = afterAuthority.firstIndex(of: UInt8(ascii: "/")).map { afterAuthority[$0...] } ?? ArraySlice(Array("/".utf8))
        }
        return t.isEmpty ? ArraySlice(Array("/".utf8)) : t
    }

    private var rawQuery: ArraySlice<UInt8>? {
        let t = head[Int(targetStart)..<Int(targetStart + targetLength)]
        guard let q = t.firstIndex(of: UInt8(ascii: "?")) else { return nil }
        let rest = t[(q + 1)...]
        return rest.firstIndex(of: UInt8(ascii: "#")).map { rest[..<$0] } ?? rest
    }

    /// The path, percent-decoded, or nil if it decodes to something with NUL or invalid UTF-8.
    public lazy var path: String? = {
        let decoded = HTTPRequest.percentDecode(rawPath, plusIsSpace: false)
        guard !decoded.contains(0) else { return nil }
        return String(validating: decoded, as: UTF8.self)
    }()

    /// Query parameters, decoded (`+` is a space); the first value wins for repeated names,
    /// and a parameter without `=` is ignored.
    public lazy var query: [String: String] = HTTPRequest.queryDictionary(rawQuery)

    /// One query parameter, read from the bytes without building `query` (a status stream's
    /// connect reads two): the value `query[name]` would give.
    public func queryParameter(_ name: String) -> String? { HTTPRequest.queryParameter(name, in: rawQuery) }

    static func queryDictionary(_ raw: ArraySlice<UInt8>?) -> [String: String] {
        guard let q = raw, !q.isEmpty else { return [:] }
        var out: [String: String] = [:]
        for part in q.split(separator: UInt8(ascii: "&")) {
            guard let eq = part.firstIndex(of: UInt8(ascii: "=")) else { continue }
            let k = String(decoding: HTTPRequest.percentDecode(part[..<eq], plusIsSpace: true), as: UTF8.self)
            let v = String(decoding: HTTPRequest.percentDecode(part[(eq + 1)...], plusIsSpace: true), as: UTF8.self)
            guard !k.isEmpty else { continue }
            if out[k] == nil { out[k] = v }
        }
        return out
    }

    /// The first `name=value` whose decoded name equals `name` as Swift compares strings
    /// (canonical equivalence, as the dictionary's keys): bytes first, a string only when
    /// either side is not ASCII.
    static func queryParameter(_ name: String, in raw: ArraySlice<UInt8>?) -> String? {
        guard let q = raw, !q.isEmpty else { return nil }
        let wanted = name.utf8
        let wantedIsASCII = wanted.allSatisfy { $0 < 0x80 }
        func matches(_ rawKey: ArraySlice<UInt8>) -> Bool {
            let needsDecoding = rawKey.contains { $0 == UInt8(ascii: "%") || $0 == UInt8(ascii: "+") }
            if !needsDecoding {
                if rawKey.elementsEqual(wanted) { return true }
                if wantedIsASCII && rawKey.allSatisfy({ $0 < 0x80 }) { return false }
                return String(decoding: rawKey, as: UTF8.self) == name
            }
            let key = HTTPRequest.percentDecode(rawKey, plusIsSpace: true)
            if key.elementsEqual(wanted) { return true }
            if wantedIsASCII && key.allSatisfy({ $0 < 0x80 }) { return false }
            return String(decoding: key, as: UTF8.self) == name
        }
        var start = q.startIndex
        while start < q.endIndex {
            var end = start
            var eq: Int?
            while end < q.endIndex && q[end] != UInt8(ascii: "&") {
                if eq == nil && q[end] == UInt8(ascii: "=") { eq = end }
                end += 1
            }
            if let eq, eq > start, matches(q[start..<eq]) {
                return String(decoding: HTTPRequest.percentDecode(q[(eq + 1)..<end], plusIsSpace: true), as: UTF8.self)
            }
            start = end + 1
        }
        return nil
    }

    /// The address of the connection's other end (a proxy, when there is one), as text.
    public var peerAddress: String? { connection.isOpen ? HTTPServer.peerAddress(connection.fd) : nil }

    /// The first value of a header (names compared case-insensitively), trimmed.
    public func header(_ name: String) -> String? {
        var found: String?
        eachHeader(named: name) { found = $0; return false }
        return found
    }

    /// Every value of a header the request carries, in order.
    public func headerValues(_ name: String) -> [String] {
        var out: [String] = []
        eachHeader(named: name) { out.append($0); return true }
        return out
    }

    /// Walks the head's header lines (the parser accepted them: `name: value`, no folding).
    private func eachHeader(named name: String, _ body: (String) -> Bool) {
        let wanted = Array(name.utf8)
        head.withUnsafeBufferPointer { h in
            var i = 0
            // Skip the request line.
            while i < h.count && h[i] != 0x0A { i += 1 }
            i += 1
            while i < h.count {
                var end = i
                while end < h.count && h[end] != 0x0A { end += 1 }
                var lineEnd = end
                if lineEnd > i && h[lineEnd - 1] == 0x0D { lineEnd -= 1 }
                if lineEnd == i { return }  // the blank line ending the head
                if lineEnd - i > wanted.count, h[i + wanted.count] == UInt8(ascii: ":"), HTTPRequest.equalsIgnoringCase(h, i, wanted) {
                    var s = i + wanted.count + 1, e = lineEnd
                    while s < e && (h[s] == 0x20 || h[s] == 0x09) { s += 1 }
                    while e > s && (h[e - 1] == 0x20 || h[e - 1] == 0x09) { e -= 1 }
                    if !body(String(decoding: UnsafeBufferPointer(rebasing: h[s..<e]), as: UTF8.self)) { return }
                }
                i = end + 1
            }
        }
    }

    private static func equalsIgnoringCase(_ h: UnsafeBufferPointer<UInt8>, _ at: Int, _ name: [UInt8]) -> Bool {
        for (j, c) in name.enumerated() {
            let a = h[at + j], b = c
            let la = a >= 0x41 && a <= 0x5A ? a | 0x20 : a
            let lb = b >= 0x41 && b <= 0x5A ? b | 0x20 : b
            if la != lb { return false }
        }
        return true
    }

    public func body() -> [UInt8] { bodyBytes }

    /// Answers it: status line, headers and body written as one array (the body is left out
    /// for HEAD; `Content-Length` is always the body's). A second answer is ignored.
    public func respond(status: Int, headers: [(String, String)] = [], body: [UInt8]) {
        connection.answer(self, status: status, headers: headers, body: body)
    }

    /// A `200` stream answered whole: `headers`, then `payloads`, then its end, framed as a
    /// stream that ends at once would be (chunks on HTTP/1.1, the close on HTTP/1.0).
    public func respondStream(headers: [(String, String)], payloads: [StreamPayload]) {
        connection.answerStream(self, headers: headers, payloads: payloads)
    }

    public static func reason(_ status: Int) -> String {
        switch status {
        case 100: return "Continue"
        case 200: return "OK"
        case 201: return "Created"
        case 202: return "Accepted"
        case 204: return "No Content"
        case 304: return "Not Modified"
        case 400: return "Bad Request"
        case 401: return "Unauthorized"
        case 403: return "Forbidden"
        case 404: return "Not Found"
        case 405: return "Method Not Allowed"
        case 409: return "Conflict"
        case 413: return "Payload Too Large"
        case 414: return "URI Too Long"
        case 415: return "Unsupported Media Type"
        case 417: return "Expectation Failed"
        case 429: return "Too Many Requests"
        case 431: return "Request Header Fields Too Large"
        case 500: return "Internal Server Error"
        case 501: return "Not Implemented"
        case 503: return "Service Unavailable"
        default: return "Status"
        }
    }

    static func percentDecode(_ s: ArraySlice<UInt8>, plusIsSpace: Bool) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(s.count)
        var i = s.startIndex
        func hex(_ c: UInt8) -> UInt8? {
            switch c {
            case 0x30...0x39: return c - 0x30
            case 0x41...0x46: return c - 0x41 + 10
            case 0x61...0x66: return c - 0x61 + 10
            default: return nil
            }
        }
        while i < s.endIndex {
            let c = s[i]
            if c == UInt8(ascii: "%"), i + 2 < s.endIndex, let h = hex(s[i + 1]), let l = hex(s[i + 2]) {
                out.append(h << 4 | l)
                i += 3
                continue
            }
            out.append(plusIsSpace && c == UInt8(ascii: "+") ? 0x20 : c)
            i += 1
        }
        return out
    }

    static func find(_ needle: [UInt8], in hay: ArraySlice<UInt8>) -> Int? {
        guard hay.count >= needle.count else { return nil }
        var i = hay.startIndex
        while i + needle.count <= hay.endIndex {
            if hay[i..<(i + needle.count)].elementsEqual(needle) { return i }
            i += 1
        }
        return nil
    }
}
