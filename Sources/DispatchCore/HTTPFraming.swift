/// What the HTTP/1.1 server layer decides about a request from its head, before it reads a
/// byte of the body: how the body is framed, whether the connection stays open, whether the
/// client waits for `100 Continue`, or why the request is refused (and the connection closed).
/// The parser (picohttpparser, in DispatchIO) only splits the head into its parts; every rule
/// about limits and request smuggling is here, pure and tested as tables (`HTTPFramingTests`).
public enum HTTPFraming {
    public struct Limits: Equatable, Sendable {
        /// The request line and headers together.
        public var maxHeadBytes: Int
        /// The request target (path and query).
        public var maxTargetBytes: Int
        /// A body larger than this is refused from its Content-Length, before it is read.
        public var maxBodyBytes: Int
        /// Paths (without the query) whose bodies may be larger, and how large (`POST
        /// /v1/changes` takes 1 MiB of changes).
        public var largeBodies: [String: Int]
        public init(maxHeadBytes: Int = 8 * 1024, maxTargetBytes: Int = 4 * 1024, maxBodyBytes: Int = 64 * 1024,
                    largeBodies: [String: Int] = [:]) {
            self.maxHeadBytes = maxHeadBytes
            self.maxTargetBytes = maxTargetBytes
            self.maxBodyBytes = maxBodyBytes
            self.largeBodies = largeBodies
        }

        /// The limits for one request target, from its bytes as received (no String made per
        /// request): its path's own body limit, if it has one.
        public func forTarget<Bytes: Collection<UInt8>>(bytes target: Bytes) -> Limits {
            guard !largeBodies.isEmpty else { return self }
            // The path is the target up to `?`.
            let path = target.prefix { $0 != UInt8(ascii: "?") }
            for (p, larger) in largeBodies where path.elementsEqual(p.utf8) {
                var l = self
                l.maxBodyBytes = max(maxBodyBytes, larger)
                return l
            }
            return self
        }
    }

    public enum Body: Equatable, Sendable {
        case none
        case length(Int)
        case chunked
    }

    public struct Head: Equatable, Sendable {
        public var body: Body
        public var keepAlive: Bool
        /// Answer `100 Continue` before the body arrives.
        public var expectContinue: Bool
        public init(body: Body, keepAlive: Bool, expectContinue: Bool) {
            self.body = body
            self.keepAlive = keepAlive
            self.expectContinue = expectContinue
        }
    }

    /// A request refused at the HTTP layer: answered with the contract's JSON error, then the
    /// connection is closed (its framing cannot be trusted for a next request).
    public enum Refusal: Error, Equatable, Sendable {
        case malformed(String)
        case headersTooLarge
        case targetTooLong
        case bodyTooLarge
        case expectationFailed
        case notImplemented(String)

        public var status: Int {
            switch self {
            case .malformed: return 400
            case .headersTooLarge: return 431
            case .targetTooLong: return 414
            case .bodyTooLarge: return 413
            case .expectationFailed: return 417
            case .notImplemented: return 501
            }
        }

        public var code: String {
            switch self {
            case .malformed: return "invalid_request"
            case .headersTooLarge: return "headers_too_large"
            case .targetTooLong: return "uri_too_long"
            case .bodyTooLarge: return "body_too_large"
            case .expectationFailed: return "expectation_failed"
            case .notImplemented: return "not_implemented"
            }
        }

        public var message: String {
            switch self {
            case .malformed(let why): return why
            case .headersTooLarge: return "the request line and headers are too large"
            case .targetTooLong: return "the request target is too long"
            case .bodyTooLarge: return "the request body is too large"
            case .expectationFailed: return "only Expect: 100-continue is supported"
            case .notImplemented(let why): return why
            }
        }

        /// `{"error":{"code","message"}}`.
        public var jsonBody: [UInt8] {
            var w = JSONWriter()
            w.beginObject()
            w.key("error")
            w.beginObject()
            w.key("code"); w.string(code)
            w.key("message"); w.string(message)
            w.endObject()
            w.endObject()
            return w.bytes
        }
    }

    /// The head is still incomplete after `buffered` bytes: whether that already breaks a limit.
    /// `firstLineEnded`: a line feed is among them (else the request line alone is too long).
    public static func incompleteHead(buffered: Int, firstLineEnded: Bool, limits: Limits) -> Refusal? {
        guard buffered > limits.maxHeadBytes else { return nil }
        return firstLineEnded ? .headersTooLarge : .targetTooLong
    }

    /// Decides from a complete head. The header arguments are every value of that header, in
    /// order (names compared case-insensitively by the caller).
    public static func decide(minorVersion: Int, headBytes: Int, targetBytes: Int, contentLength: [String], transferEncoding: [String],
                              connection: [String], expect: [String], limits: Limits) -> Result<Head, Refusal> {
        if targetBytes > limits.maxTargetBytes { return .failure(.targetTooLong) }
        if headBytes > limits.maxHeadBytes { return .failure(.headersTooLarge) }
        guard minorVersion == 0 || minorVersion == 1 else { return .failure(.malformed("only HTTP/1.0 and HTTP/1.1 are spoken")) }
        var body = Body.none
        if !transferEncoding.isEmpty {
            // Both framings at once is how a request is smuggled past a proxy that reads the
            // other one: never guess which the sender meant.
            if !contentLength.isEmpty { return .failure(.malformed("both Content-Length and Transfer-Encoding")) }
            if minorVersion == 0 { return .failure(.malformed("Transfer-Encoding in an HTTP/1.0 request")) }
            let codings = tokens(transferEncoding)
            guard codings.last == "chunked" else { return .failure(.malformed("Transfer-Encoding must end with chunked")) }
            guard codings.count == 1 else { return .failure(.notImplemented("only Transfer-Encoding: chunked is supported")) }
            body = .chunked
        } else if !contentLength.isEmpty {
            var length: Int?
            for value in contentLength {
                for part in value.split(separator: ",", omittingEmptySubsequences: false) {
                    let digits = trim(part)
                    guard !digits.isEmpty, digits.utf8.count <= 18, digits.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }), let n = Int(digits) else {
                        return .failure(.malformed("invalid Content-Length"))
                    }
                    if let length, length != n { return .failure(.malformed("conflicting Content-Length headers")) }
                    length = n
                }
            }
            guard let length else { return .failure(.malformed("invalid Content-Length")) }
            if length > limits.maxBodyBytes { return .failure(.bodyTooLarge) }
            body = length == 0 ? .none : .length(length)
        }
        let options = tokens(connection)
        let keepAlive = options.contains("close") ? false : (minorVersion >= 1 || options.contains("keep-alive"))
        var expectContinue = false
        if !expect.isEmpty {
            guard tokens(expect) == ["100-continue"] else { return .failure(.expectationFailed) }
            expectContinue = minorVersion >= 1 && body != .none
        }
        return .success(Head(body: body, keepAlive: keepAlive, expectContinue: expectContinue))
    }

    /// Methods HTTP defines (RFC 9110 and PATCH): every other token is answered `501` at this
    /// layer; these reach the router, which answers `405` for one a route does not take.
    static let definedMethods: Set<String> = ["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"]

    public static func methodRefusal(_ token: String) -> Refusal? {
        definedMethods.contains(token) ? nil : .notImplemented("the method is not supported")
    }

    /// Comma-separated list elements, trimmed and lower-cased, empty ones dropped.
    static func tokens(_ values: [String]) -> [String] {
        var out: [String] = []
        for v in values {
            for part in v.split(separator: ",") {
                let t = trim(part).lowercased()
                if !t.isEmpty { out.append(t) }
            }
        }
        return out
    }

    static func trim(_ s: Substring) -> String {
        var v = s
        while let c = v.first, c == " " || c == "\t" { v.removeFirst() }
        while let c = v.last, c == " " || c == "\t" { v.removeLast() }
        return String(v)
    }
}
