import DispatchCore

/// The CLI's minimal HTTP/1.1 client, minus the sockets: URL parsing and request encoding.
/// Answers are read with DispatchCore's `HTTPResponseParser`.

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
