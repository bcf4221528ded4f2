/// Cross-origin access for browsers (contract §9), as a pure policy: which origin may read
/// `/v1` answers, and the headers that say so. Configured by `DISPATCH_CORS_ORIGINS`.
public struct CORSPolicy: Equatable, Sendable {
    /// Exact origins (`scheme://host[:port]`, lower case), or every origin (`*`).
    public let origins: Set<String>
    public let anyOrigin: Bool

    public static let none = CORSPolicy(origins: [], anyOrigin: false)

    public init(origins: Set<String>, anyOrigin: Bool) {
        self.origins = origins
        self.anyOrigin = anyOrigin
    }

    public var isEnabled: Bool { anyOrigin || !origins.isEmpty }

    /// Parses the setting: `*`, or comma-separated origins such as
    /// `https://ops.example,http://localhost:3000`. Returns the problem as text.
    public static func parse(_ text: String) -> Result<CORSPolicy, CORSConfigError> {
        let items = text.split(separator: ",").map { String($0.drop { $0 == " " }.reversed().drop { $0 == " " }.reversed()) }
            .filter { !$0.isEmpty }
        if items.isEmpty { return .success(.none) }
        if items == ["*"] { return .success(CORSPolicy(origins: [], anyOrigin: true)) }
        var set: Set<String> = []
        for item in items {
            let o = item.lowercased()
            guard o != "*" else { return .failure(CORSConfigError("* must stand alone")) }
            guard isOrigin(o) else {
                return .failure(CORSConfigError("\(item) is not an origin (scheme://host[:port], no path)"))
            }
            set.insert(o)
        }
        return .success(CORSPolicy(origins: set, anyOrigin: false))
    }

    /// `http(s)://host[:port]` with nothing after it.
    static func isOrigin(_ o: String) -> Bool {
        let rest: Substring
        if o.hasPrefix("https://") { rest = o.dropFirst(8) } else if o.hasPrefix("http://") { rest = o.dropFirst(7) } else { return false }
        guard !rest.isEmpty, !rest.contains("/"), !rest.contains("?"), !rest.contains("#"), !rest.contains("@") else { return false }
        return rest.unicodeScalars.allSatisfy { $0.isASCII && $0.value > 0x20 && $0.value < 0x7F }
    }

    /// The `Access-Control-Allow-Origin` value for a request's `Origin`, or nil.
    public func allowedOrigin(_ origin: String?) -> String? {
        guard let origin, !origin.isEmpty else { return nil }
        if anyOrigin { return "*" }
        return origins.contains(origin.lowercased()) ? origin : nil
    }

    /// Headers for an answer (streams and errors included) to a request from `origin`.
    /// `Vary: Origin` goes on every answer while a list is configured: caches must not hand
    /// one origin's answer to another.
    public func headers(origin: String?) -> [(String, String)] {
        guard isEnabled else { return [] }
        var h: [(String, String)] = anyOrigin ? [] : [("Vary", "Origin")]
        if let allow = allowedOrigin(origin) {
            h.append(("Access-Control-Allow-Origin", allow))
            h.append(("Access-Control-Expose-Headers", "Retry-After, WWW-Authenticate, Allow"))
        }
        return h
    }

    public static let allowedHeaders = "Authorization, Content-Type, Idempotency-Key, Last-Event-ID"
    public static let maxAgeSeconds = 7200

    /// Headers for a preflight (`OPTIONS`) answer: none unless the origin is allowed, in which
    /// case the browser learns the methods of the path and the request headers it may send.
    public func preflightHeaders(origin: String?, methods: [HTTPMethod]) -> [(String, String)] {
        guard let allow = allowedOrigin(origin) else { return anyOrigin ? [] : (isEnabled ? [("Vary", "Origin")] : []) }
        var names = methods.map(\.rawValue)
        if methods.contains(.get) { names.append("HEAD") }
        names.append("OPTIONS")
        return (anyOrigin ? [] : [("Vary", "Origin")]) + [
            ("Access-Control-Allow-Origin", allow),
            ("Access-Control-Allow-Methods", names.joined(separator: ", ")),
            ("Access-Control-Allow-Headers", CORSPolicy.allowedHeaders),
            ("Access-Control-Max-Age", String(CORSPolicy.maxAgeSeconds)),
        ]
    }
}

public struct CORSConfigError: Error, Equatable, Sendable {
    public let message: String
    public init(_ m: String) { message = m }
}
