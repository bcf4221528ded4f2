/// An HTTP/2 request's header block, built from a URL, a method and header pairs: pure, so
/// the APNs client's shell (`H2Client`) only hands the result to nghttp2.
///
/// Only `https` URLs (HTTP/2 over TLS, ALPN h2). Pseudo-headers come first (RFC 9113 §8.3);
/// names are lower-cased; connection-specific headers (which HTTP/2 forbids) and `host` (the
/// URL's authority is `:authority`) are refused rather than silently dropped, as are values
/// with CR, LF or NUL and names that are not tokens.
public struct HTTP2RequestHead: Equatable, Sendable {
    /// The host as connected to and verified (no brackets around an IPv6 literal).
    public let host: String
    public let port: Int
    /// Connections are shared per authority (`host:port`).
    public let authority: String
    public let path: String
    /// Pseudo-headers first, then the request's headers, then `content-length` for a body.
    public let fields: [Field]

    public struct Field: Equatable, Sendable {
        public let name: String
        public let value: String
        public init(_ name: String, _ value: String) { self.name = name; self.value = value }
    }

    /// Why a request cannot be sent (never sent: `HTTPClientFailure.Kind.invalidRequest`).
    public struct Invalid: Error, Equatable, Sendable {
        public let reason: String
        public init(_ reason: String) { self.reason = reason }
    }

    static let forbidden: Set<String> = ["connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "host", "te"]

    /// The head of `method url`, or why it cannot be sent.
    public static func make(method: String, url: String, headers: [(String, String)], bodyLength: Int) -> Result<HTTP2RequestHead, Invalid> {
        guard isToken(method) else { return .failure(Invalid("bad method")) }
        guard url.hasPrefix("https://") else { return .failure(Invalid("not an https URL (HTTP/2 over TLS only): \(url)")) }
        let rest = url.dropFirst("https://".count)
        let slash = rest.firstIndex(where: { $0 == "/" || $0 == "?" }) ?? rest.endIndex
        let authorityPart = rest[..<slash]
        var path = String(rest[slash...])
        if path.isEmpty { path = "/" } else if path.hasPrefix("?") { path = "/" + path }
        if let hash = path.firstIndex(of: "#") { path = String(path[..<hash]) }
        guard !authorityPart.isEmpty, !authorityPart.contains("@") else { return .failure(Invalid("bad host in \(url)")) }
        guard !path.utf8.contains(where: { $0 <= 0x20 || $0 == 0x7F }) else { return .failure(Invalid("bad path in \(url)")) }
        var host: Substring
        var portText: Substring?
        if authorityPart.hasPrefix("[") {
            guard let close = authorityPart.firstIndex(of: "]") else { return .failure(Invalid("bad IPv6 host in \(url)")) }
            host = authorityPart[authorityPart.index(after: authorityPart.startIndex)..<close]
            let after = authorityPart[authorityPart.index(after: close)...]
            if !after.isEmpty {
                guard after.hasPrefix(":") else { return .failure(Invalid("bad host in \(url)")) }
                portText = after.dropFirst()
            }
        } else if let colon = authorityPart.firstIndex(of: ":") {
            host = authorityPart[..<colon]
            portText = authorityPart[authorityPart.index(after: colon)...]
        } else {
            host = authorityPart
        }
        var port = 443
        if let portText {
            guard let p = Int(portText), (1...65535).contains(p) else { return .failure(Invalid("bad port in \(url)")) }
            port = p
        }
        guard !host.isEmpty, host.utf8.allSatisfy({ c in
            (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A) || c == 0x2D || c == 0x2E || c == 0x3A || c == 0x5F
        }) else { return .failure(Invalid("bad host in \(url)")) }
        let authority = String(authorityPart).lowercased()
        var fields = [Field(":method", method), Field(":scheme", "https"), Field(":authority", authority), Field(":path", path)]
        var hasLength = false
        for (name, value) in headers {
            let lower = name.lowercased()
            guard isToken(name) else { return .failure(Invalid("bad header name \(name)")) }
            guard !forbidden.contains(lower) else { return .failure(Invalid("header \(name) is not allowed in HTTP/2")) }
            guard !value.utf8.contains(where: { $0 == 0x0D || $0 == 0x0A || $0 == 0 }) else { return .failure(Invalid("header \(name) contains CR, LF or NUL")) }
            if lower == "content-length" {
                guard Int(value) == bodyLength else { return .failure(Invalid("content-length \(value) is not the body's \(bodyLength) bytes")) }
                hasLength = true
            }
            fields.append(Field(lower, value))
        }
        if !hasLength && (bodyLength > 0 || !["GET", "HEAD", "DELETE", "OPTIONS"].contains(method)) {
            fields.append(Field("content-length", String(bodyLength)))
        }
        return .success(HTTP2RequestHead(host: String(host).lowercased(), port: port, authority: authority, path: path, fields: fields))
    }

    static func isToken(_ s: String) -> Bool {
        !s.isEmpty && s.utf8.allSatisfy { c in
            (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A) || "!#$%&'*+-.^_`|~".utf8.contains(c)
        }
    }
}
