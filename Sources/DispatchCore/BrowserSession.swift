/// Browser sessions (contract §7), the decisions only: reading the cookie, writing it, and
/// whether a cookie-authenticated request may change anything. The shell (API+Session) does
/// the database work.
public enum BrowserSession {
    public static let cookieName = "dispatch_session"
    /// Every session secret starts so; a cookie that does not is refused without a lookup.
    public static let secretPrefix = "dss_"
    /// A session unused this long is over.
    public static let idleSeconds: Int64 = 12 * 3600
    /// `last_used_at` is written at most this often per session (reads stay reads).
    public static let touchEverySeconds: Int64 = 60

    /// What a request's `Cookie` headers say about the session cookie.
    public enum CookieRead: Equatable, Sendable {
        /// No session cookie (or one whose value is not a session secret).
        case none
        case one(String)
        /// The cookie named twice (in one header or across several): refused with `400`, as
        /// a first-wins or last-wins reading would let a cookie tossed from a sibling
        /// subdomain or over plain HTTP shadow the real one.
        case duplicate
    }

    /// Reads every `Cookie` header of a request (`a=b; dispatch_session=...`).
    public static func read(cookieHeaders: [String]) -> CookieRead {
        var found: String?
        var malformed = false
        var count = 0
        for header in cookieHeaders {
            for part in header.split(separator: ";") {
                let pair = part.drop { $0 == " " || $0 == "\t" }
                guard let eq = pair.firstIndex(of: "=") else { continue }
                guard pair[..<eq] == cookieName[...] else { continue }
                count += 1
                let value = pair[pair.index(after: eq)...].reversed().drop { $0 == " " || $0 == "\t" }.reversed()
                let text = String(value)
                if (1...128).contains(text.utf8.count), text.utf8.allSatisfy({ (0x21...0x7E).contains($0) && $0 != 0x3B && $0 != 0x2C }) {
                    found = found ?? text
                } else {
                    malformed = true
                }
            }
        }
        if count > 1 { return .duplicate }
        guard !malformed, let found else { return .none }
        return .one(found)
    }

    /// The session secret in a `Cookie` header, or nil (none, malformed, or named twice).
    public static func secret(cookieHeader: String?) -> String? {
        guard let cookieHeader, case .one(let s) = read(cookieHeaders: [cookieHeader]) else { return nil }
        return s
    }

    public static let duplicateCookie = DispatchError(.invalidField, "the request carries the \(cookieName) cookie more than once: clear this site's cookies and sign in again")

    /// Whether `X-Forwarded-Proto` (already known to come from a trusted proxy) says HTTPS:
    /// its first value, trimmed of spaces and tabs, compared without case.
    public static func forwardedHTTPS(_ header: String?) -> Bool {
        guard let header, let first = header.split(separator: ",", omittingEmptySubsequences: false).first else { return false }
        let trimmed = first.drop { $0 == " " || $0 == "\t" }.reversed().drop { $0 == " " || $0 == "\t" }.reversed()
        return String(trimmed).lowercased() == "https"
    }

    /// The `Set-Cookie` value that hands `secret` to the browser.
    public static func setCookie(_ secret: String, secure: Bool) -> String {
        "\(cookieName)=\(secret); HttpOnly; SameSite=Strict; Path=/" + (secure ? "; Secure" : "")
    }

    /// The `Set-Cookie` value that makes the browser forget the session.
    public static func clearCookie(secure: Bool) -> String {
        "\(cookieName)=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0" + (secure ? "; Secure" : "")
    }

    /// Whether a request authenticated by the cookie may go on: reads always; anything that
    /// changes state only with an `Origin` naming this server itself (`scheme://host` as the
    /// request's `Host` says). A missing Origin, `null`, or any other origin is refused.
    public static func mayUseCookie(method: HTTPMethod?, origin: String?, host: String?, https: Bool) -> Bool {
        switch method {
        case .get?, .head?, .options?: return true
        case .post?, .put?, .delete?, .patch?, nil:
            guard let origin, let host, !host.isEmpty else { return false }
            return origin.lowercased() == ((https ? "https://" : "http://") + host).lowercased()
        }
    }
}

/// The proxies whose `X-Forwarded-Proto` is believed (`DISPATCH_TRUSTED_PROXIES`): CIDRs of
/// IPv4 or IPv6 addresses, e.g. `127.0.0.1/32,10.0.0.0/8,::1/128`; a bare address is a /32
/// (or /128).
public struct TrustedProxies: Equatable, Sendable {
    struct Block: Equatable, Sendable {
        let address: [UInt8]
        let prefix: Int
    }

    let blocks: [Block]
    public static let none = TrustedProxies(blocks: [])
    public var isEmpty: Bool { blocks.isEmpty }

    public static func parse(_ text: String) -> Result<TrustedProxies, CORSConfigError> {
        var blocks: [Block] = []
        for raw in text.split(separator: ",") {
            let item = String(raw.drop { $0 == " " }.reversed().drop { $0 == " " }.reversed())
            if item.isEmpty { continue }
            let parts = item.split(separator: "/", maxSplits: 1, omittingEmptySubsequences: false)
            guard let address = IPAddress.parse(String(parts[0])) else {
                return .failure(CORSConfigError("\(item) is not an IP address or CIDR"))
            }
            let bits = address.count * 8
            var prefix = bits
            if parts.count == 2 {
                guard let p = Int(parts[1]), (0...bits).contains(p) else {
                    return .failure(CORSConfigError("\(item): the prefix length must be 0-\(bits)"))
                }
                prefix = p
            }
            blocks.append(Block(address: address, prefix: prefix))
        }
        return .success(TrustedProxies(blocks: blocks))
    }

    /// Whether `peer` (an address as text) lies in one of the blocks. An IPv4-mapped IPv6
    /// peer (`::ffff:10.0.0.1`) is compared as IPv4.
    public func contains(_ peer: String?) -> Bool {
        guard let peer, var address = IPAddress.parse(peer) else { return false }
        if address.count == 16, address[0..<10].allSatisfy({ $0 == 0 }), address[10] == 0xFF, address[11] == 0xFF {
            address = Array(address[12...])
        }
        return blocks.contains { b in
            guard b.address.count == address.count else { return false }
            var left = b.prefix
            for i in 0..<address.count where left > 0 {
                let take = min(8, left)
                let mask = UInt8(truncatingIfNeeded: 0xFF << (8 - take))
                if address[i] & mask != b.address[i] & mask { return false }
                left -= take
            }
            return true
        }
    }
}

/// Textual IP addresses to bytes (4 or 16), without the C library.
public enum IPAddress {
    public static func parse(_ text: String) -> [UInt8]? {
        text.contains(":") ? parse6(text) : parse4(text)
    }

    static func parse4(_ text: String) -> [UInt8]? {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 4 else { return nil }
        var out: [UInt8] = []
        for p in parts {
            guard (1...3).contains(p.count), p.allSatisfy(\.isASCII), let n = UInt8(p) else { return nil }
            out.append(n)
        }
        return out
    }

    static func parse6(_ text: String) -> [UInt8]? {
        var text = Substring(text)
        if let percent = text.firstIndex(of: "%") { text = text[..<percent] }  // a zone id
        let halves = splitAtDoubleColon(text)
        guard halves.count <= 2 else { return nil }
        func groups(_ s: Substring) -> [UInt8]? {
            if s.isEmpty { return [] }
            var out: [UInt8] = []
            let items = s.split(separator: ":", omittingEmptySubsequences: false)
            for (i, g) in items.enumerated() {
                if i == items.count - 1, g.contains(".") {
                    guard let v4 = parse4(String(g)) else { return nil }
                    out += v4
                    continue
                }
                guard (1...4).contains(g.count), let n = UInt16(g, radix: 16) else { return nil }
                out += [UInt8(n >> 8), UInt8(n & 0xFF)]
            }
            return out
        }
        guard let head = groups(halves[0]) else { return nil }
        if halves.count == 1 { return head.count == 16 ? head : nil }
        guard let tail = groups(halves[1]), head.count + tail.count <= 14 else { return nil }
        return head + [UInt8](repeating: 0, count: 16 - head.count - tail.count) + tail
    }
}

/// Splits at the first `::` (a second one stays in the tail, and then fails to parse).
private func splitAtDoubleColon(_ s: Substring) -> [Substring] {
    var i = s.startIndex
    while i < s.endIndex {
        let next = s.index(after: i)
        if s[i] == ":", next < s.endIndex, s[next] == ":" {
            let tail = s[s.index(after: next)...]
            return [s[..<i], tail]
        }
        i = next
    }
    return [s]
}
