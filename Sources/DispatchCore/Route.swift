/// HTTP methods the API speaks.
public enum HTTPMethod: String, Sendable, CaseIterable {
    case get = "GET", post = "POST", head = "HEAD", put = "PUT", delete = "DELETE", options = "OPTIONS", patch = "PATCH"
}

/// Every endpoint of the server, and the one pure function that maps a request line to it.
public enum Route: Equatable, Sendable {
    case healthz
    case readyz
    case metrics
    case startActivity
    case listActivities
    case activity(String)
    case update(String)
    case end(String)
    case events(String)
    case status(String)
    case cancel(String)
    case touch(String)
    /// Many starts, updates and ends in one request (contract §2.1).
    case changes
    case keys
    case key(String)
    /// The feed: every change to every activity the key may read (contract §8).
    case feed
    case registerTokens
    case forgetDevice(String)
    /// A browser session: trade a key for a cookie, ask what it may do, sign out (§7).
    case session
    /// The Live Activity push for an activity's latest change (§5.2).
    case liveActivity(String)
    /// The Activities view and its files (`/`, `/app.js`, ...).
    case page(String)
    case openAPI

    /// The methods an endpoint answers (HEAD goes with GET).
    public var methods: [HTTPMethod] {
        switch self {
        case .healthz, .readyz, .metrics, .listActivities, .activity, .events, .status, .feed, .page, .openAPI, .liveActivity: return [.get]
        case .startActivity, .update, .end, .cancel, .touch, .registerTokens, .changes: return [.post]
        case .keys: return [.get, .post]
        case .key, .forgetDevice: return [.delete]
        case .session: return [.get, .post, .delete]
        }
    }

    /// A stable name for logs and metrics: the pattern, never the ids in the path.
    public var pattern: String {
        switch self {
        case .healthz: return "/healthz"
        case .readyz: return "/readyz"
        case .metrics: return "/metrics"
        case .startActivity: return "/v1/activities/start"
        case .listActivities: return "/v1/activities"
        case .activity: return "/v1/activities/{id}"
        case .update: return "/v1/activities/{id}/update"
        case .end: return "/v1/activities/{id}/end"
        case .events: return "/v1/activities/{id}/events"
        case .status: return "/v1/activities/{id}/status"
        case .cancel: return "/v1/activities/{id}/cancel"
        case .touch: return "/v1/activities/{id}/touch"
        case .changes: return "/v1/changes"
        case .keys: return "/v1/keys"
        case .key: return "/v1/keys/{name}"
        case .feed: return "/v1/stream"
        case .registerTokens: return "/v1/activity-tokens"
        case .forgetDevice: return "/v1/activity-tokens/{deviceToken}"
        case .session: return "/v1/session"
        case .liveActivity: return "/v1/activities/{id}/live-activity"
        case .page: return "/"
        case .openAPI: return "/openapi.json"
        }
    }

    public enum Match: Equatable, Sendable {
        case route(Route)
        /// The path exists but not with this method: answer 405 with `Allow`.
        case methodNotAllowed(allow: [HTTPMethod])
        /// `OPTIONS` on an existing path: a CORS preflight (or a question about methods);
        /// answer 204 with `Allow` (and the CORS headers when the origin is allowed).
        case preflight(Route)
        /// An activity id in the path breaks the id rules: answer 400.
        case invalidActivityID
        case notFound
    }

    /// Maps a decoded path and a method to an endpoint.
    public static func match(method: HTTPMethod?, path: String) -> Match {
        guard let route = route(segments(path)) else { return .notFound }
        let allowed = route.methods
        if method == .options { return .preflight(route) }
        guard let method, allowed.contains(method) || (method == .head && allowed.contains(.get)) else {
            return .methodNotAllowed(allow: allowed)
        }
        if let id = route.activityID, !Validation.isValidActivityID(id) { return .invalidActivityID }
        return .route(route)
    }

    /// The activity id a route names, if any.
    public var activityID: String? {
        switch self {
        case .activity(let id), .update(let id), .end(let id), .events(let id), .status(let id), .cancel(let id), .touch(let id),
             .liveActivity(let id):
            return id
        case .healthz, .readyz, .metrics, .startActivity, .listActivities, .changes, .keys, .key, .feed, .registerTokens, .forgetDevice,
             .page, .openAPI, .session:
            return nil
        }
    }

    /// The files of the Activities view served at the top level (besides `/`).
    public static let pageFiles: Set<String> = ["app.js", "detail.js", "symbols.js", "dispatch.js", "style.css", "favicon.svg"]

    /// The path's segments after its first `/` (Substrings: only an id the route keeps becomes
    /// a String of its own), split on the UTF-8 bytes rather than by Character; nil past five,
    /// which no route has.
    private static func segments(_ path: String) -> ArraySlice<Substring>? {
        let utf8 = path.utf8
        var all: [Substring] = []
        all.reserveCapacity(6)
        var start = utf8.startIndex
        var i = start
        while i != utf8.endIndex {
            if utf8[i] == UInt8(ascii: "/") {
                guard all.count < 5 else { return nil }
                all.append(path[start..<i])
                start = utf8.index(after: i)
            }
            i = utf8.index(after: i)
        }
        all.append(path[start..<utf8.endIndex])
        return all.dropFirst()
    }

    private static func route(_ all: ArraySlice<Substring>?) -> Route? {
        guard let all else { return nil }
        let parts = Parts(all)
        switch parts.count {
        case 1:
            switch parts[0] {
            case "healthz": return .healthz
            case "readyz": return .readyz
            case "metrics": return .metrics
            case "openapi.json": return .openAPI
            case "", "index.html": return .page("index.html")
            case let name where pageFiles.contains(String(name)): return .page(String(name))
            default: return nil
            }
        case 2 where parts[0] == "v1":
            switch parts[1] {
            case "activities": return .listActivities
            case "changes": return .changes
            case "keys": return .keys
            case "stream": return .feed
            case "activity-tokens": return .registerTokens
            case "session": return .session
            default: return nil
            }
        case 3 where parts[0] == "v1" && parts[1] == "activity-tokens":
            return .forgetDevice(String(parts[2]))
        case 3 where parts[0] == "v1" && parts[1] == "activities":
            return parts[2] == "start" ? .startActivity : .activity(String(parts[2]))
        case 3 where parts[0] == "v1" && parts[1] == "keys":
            return .key(String(parts[2]))
        case 4 where parts[0] == "v1" && parts[1] == "activities":
            let id = String(parts[2])
            switch parts[3] {
            case "update": return .update(id)
            case "end": return .end(id)
            case "events": return .events(id)
            case "status": return .status(id)
            case "cancel": return .cancel(id)
            case "touch": return .touch(id)
            case "live-activity": return .liveActivity(id)
            default: return nil
            }
        default:
            return nil
        }
    }

    /// The path's segments after the leading slash, indexed from 0.
    private struct Parts {
        let slice: ArraySlice<Substring>
        init(_ slice: ArraySlice<Substring>) { self.slice = slice }
        var count: Int { slice.count }
        subscript(i: Int) -> Substring { slice[slice.startIndex + i] }
    }
}
