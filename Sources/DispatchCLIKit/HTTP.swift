import DispatchCore

/// The CLI's minimal HTTP/1.1 client, minus the sockets: URL parsing, where a key may go, and
/// request encoding. Answers are read with DispatchCore's `HTTPResponseParser`, over a plain
/// socket or, for https, libcurl's TLS connection.

/// Where the server is: `http(s)://host[:port][/base/path]`. Plain `http` goes over a POSIX
/// socket; `https` through libcurl (TLS, proxies), loaded only then.
public struct CLIEndpoint: Equatable, Sendable {
    public enum Scheme: String, Sendable {
        case http, https

        public var defaultPort: Int { self == .https ? 443 : 80 }
    }

    public var scheme: Scheme
    public var host: String
    public var port: Int
    /// Prefix for every request path, without a trailing slash ("" or "/dispatch").
    public var basePath: String

    public init(host: String, port: Int, basePath: String = "", scheme: Scheme = .http) {
        self.scheme = scheme
        self.host = host
        self.port = port
        self.basePath = basePath
    }

    public struct ParseError: Error, Equatable, Sendable {
        public var message: String
    }

    public static func parse(_ text: String) throws(ParseError) -> CLIEndpoint {
        var rest = Substring(text)
        let scheme: Scheme
        if rest.lowercased().hasPrefix("https://") {
            scheme = .https
            rest = rest.dropFirst(8)
        } else if rest.lowercased().hasPrefix("http://") {
            scheme = .http
            rest = rest.dropFirst(7)
        } else {
            throw ParseError(message: "must start with http:// or https://")
        }
        let authority: Substring
        if let slash = rest.firstIndex(of: "/") {
            authority = rest[..<slash]
            rest = rest[slash...]
        } else {
            authority = rest
            rest = ""
        }
        guard !authority.contains("@") else { throw ParseError(message: "credentials in the URL are not supported; use --token-file") }
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
        guard host.unicodeScalars.allSatisfy({ $0.value > 0x20 && $0.value < 0x7F && !"/?#[]\\".unicodeScalars.contains($0) }) else {
            throw ParseError(message: "bad host '\(host)'")
        }
        var port = scheme.defaultPort
        if let portText {
            guard !portText.isEmpty, portText.count <= 5, portText.allSatisfy({ $0.isASCII && $0.isNumber }),
                  let p = Int(portText), (1...65535).contains(p) else {
                throw ParseError(message: "bad port '\(portText)'")
            }
            port = p
        }
        if rest.contains("?") || rest.contains("#") { throw ParseError(message: "a query or fragment is not allowed") }
        while rest.hasSuffix("/") { rest = rest.dropLast() }
        return CLIEndpoint(host: String(host), port: port, basePath: String(rest), scheme: scheme)
    }

    /// The `Host` header value.
    public var hostHeader: String {
        let h = host.contains(":") ? "[\(host)]" : host
        return port == scheme.defaultPort ? h : "\(h):\(port)"
    }

    public var display: String { "\(scheme.rawValue)://\(hostHeader)\(basePath)" }

    /// The URL libcurl connects to (scheme, host and port: the path goes in our own request).
    public var connectURL: String {
        let h = host.contains(":") ? "[\(host)]" : host
        return "\(scheme.rawValue)://\(h):\(port)/"
    }

    /// Whether the host is this machine: `localhost`, 127.0.0.0/8 or ::1 (also as
    /// ::ffff:127.x.y.z). Only these may receive a key over plain HTTP without `--insecure-http`.
    public var isLoopback: Bool {
        if host.lowercased() == "localhost" { return true }
        if let v4 = CLIAddress.ipv4(host) { return v4[0] == 127 }
        if let v6 = CLIAddress.ipv6(host) {
            if v6 == [UInt8](repeating: 0, count: 15) + [1] { return true }
            return v6[0..<10].allSatisfy { $0 == 0 } && v6[10] == 0xFF && v6[11] == 0xFF && v6[12] == 127
        }
        return false
    }
}

/// IP address literals, parsed without the C library (the policy above is pure).
public enum CLIAddress {
    /// `a.b.c.d`, four decimal numbers 0-255.
    public static func ipv4(_ s: String) -> [UInt8]? {
        let parts = s.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 4 else { return nil }
        var out: [UInt8] = []
        for p in parts {
            guard !p.isEmpty, p.count <= 3, p.allSatisfy({ $0.isASCII && $0.isNumber }), let v = Int(p), v <= 255 else { return nil }
            out.append(UInt8(v))
        }
        return out
    }

    /// An IPv6 literal (`::1`, `fe80::1`, `::ffff:127.0.0.1`) as 16 bytes; a zone (`%eth0`) is ignored.
    public static func ipv6(_ text: String) -> [UInt8]? {
        var s = Substring(text)
        if let percent = s.firstIndex(of: "%") { s = s[..<percent] }
        guard s.contains(":") else { return nil }
        func groups(_ part: Substring) -> [UInt8]? {
            if part.isEmpty { return [] }
            var out: [UInt8] = []
            let fields = part.split(separator: ":", omittingEmptySubsequences: false)
            for (i, f) in fields.enumerated() {
                if i == fields.count - 1, f.contains("."), let v4 = ipv4(String(f)) { out += v4; continue }
                guard !f.isEmpty, f.count <= 4, let v = UInt16(f, radix: 16) else { return nil }
                out += [UInt8(v >> 8), UInt8(v & 0xFF)]
            }
            return out
        }
        let gaps = s.ranges(of: "::")
        switch gaps.count {
        case 0:
            guard let all = groups(s), all.count == 16 else { return nil }
            return all
        case 1:
            guard let head = groups(s[..<gaps[0].lowerBound]), let tail = groups(s[gaps[0].upperBound...]),
                  head.count + tail.count <= 14 else { return nil }
            return head + [UInt8](repeating: 0, count: 16 - head.count - tail.count) + tail
        default:
            return nil
        }
    }
}

/// Where the CLI may send its API key.
public enum CLITransportPolicy {
    /// Why a request must not go out, or nil. A key sent over plain HTTP to another machine can
    /// be read (and reused) by anyone on the path; loopback never leaves this machine.
    public static func refusal(endpoint: CLIEndpoint, sendsKey: Bool, insecureHTTP: Bool) -> String? {
        guard sendsKey, endpoint.scheme == .http, !endpoint.isLoopback, !insecureHTTP else { return nil }
        return "refusing to send the API key over plain HTTP to \(endpoint.display): anyone on the network could read it. "
            + "Use https:// (or a TLS proxy), or --insecure-http (DISPATCH_INSECURE_HTTP=1) on a network you trust"
    }
}

public enum CLIHTTP {
    /// Seconds a connection may take to be made (TCP, and TLS for https): a server that is
    /// down or unreachable is said so within this, then retried as `--retry-for` says,
    /// however long the attempt's answer may take (issue 36: `list` waited 30 s in silence).
    public static let connectTimeout = 3.0

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

    /// Encodes a request (a JSON body when there is one). CR and LF are dropped from header
    /// names and values, so a flag value cannot inject headers.
    public static func encodeRequest(method: String, path: String, endpoint: CLIEndpoint,
                                     headers: [(String, String)], body: [UInt8]?) -> [UInt8] {
        HTTPRequestEncoder.encode(method: method, target: endpoint.basePath + path, host: endpoint.hostHeader,
                                  headers: body == nil ? headers : headers + [("Content-Type", "application/json")], body: body)
    }
}
