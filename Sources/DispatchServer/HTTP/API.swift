import DispatchCore
import DispatchIO
import DispatchSystem

/// The HTTP front of one worker: maps each request to its `Route` (a pure function), checks
/// credentials, and hands it to the handler for that route (`API+*.swift`). Every answer goes
/// through `reply` or `fail`, so every error is the contract's JSON with its one status.
final class API {
    let config: ServerConfig
    let log: Logger
    let metrics: Metrics
    let db: Database
    let activities: ActivityRepository
    let publisher: Publisher
    let streams: StreamService
    let feeds: FeedService
    let auth: Auth
    /// Readiness of the whole server (every worker): its sessions and writes, and which worker
    /// is not ready.
    var readiness: () -> (Readiness, worker: Int?) = { (.databaseUnavailable, nil) }
    /// The whole server's metrics, Prometheus text.
    var serverMetrics: () -> String = { "" }
    var isShuttingDown = false
    /// A key was revoked here: end what it holds open (its streams).
    var onKeyRevoked: (Int64) -> Void = { _ in }
    /// The devices API (§5.1); nil when the server has no token key.
    var devices: DevicesContext?
    var rng = SystemRandomNumberGenerator()

    init(config: ServerConfig, log: Logger, metrics: Metrics, db: Database, publisher: Publisher, streams: StreamService, feeds: FeedService, auth: Auth) {
        self.config = config
        self.log = log
        self.metrics = metrics
        self.db = db
        activities = publisher.activities
        self.publisher = publisher
        self.streams = streams
        self.feeds = feeds
        self.auth = auth
    }

    func handle(_ req: HTTPRequest) {
        guard let path = req.path else {
            return fail(req, DispatchError(.invalidField, "the path is not valid UTF-8"))
        }
        // Disagreeing Content-Length headers mean the request's framing is ambiguous (request
        // smuggling through a proxy): refuse it. HTTPFraming refuses them before a request
        // gets here; this stays as the route layer's own guard.
        if req.method != .get && req.method != .head && Set(req.headerValues("Content-Length")).count > 1 {
            return fail(req, DispatchError(.invalidField, "conflicting Content-Length headers"), headers: [("Connection", "close")])
        }
        switch Route.match(method: req.method, path: path) {
        case .notFound:
            fail(req, DispatchError(.notFound, "no such endpoint: \(path)"))
        case .methodNotAllowed(let allow):
            let names = allow.map(\.rawValue).joined(separator: ", ")
            fail(req, DispatchError(.methodNotAllowed, "use \(names) for this endpoint"), headers: [("Allow", names)])
        case .preflight(let route):
            preflight(req, route)
        case .invalidActivityID:
            fail(req, DispatchError(.invalidField, "activity id must be 1-128 characters of A-Z a-z 0-9 . _ : -"))
        case .route(let route):
            req.route = route.pattern
            dispatch(req, route)
        }
    }

    private func dispatch(_ req: HTTPRequest, _ route: Route) {
        switch route {
        case .healthz: reply(req, 200, Array(#"{"status":"ok"}"#.utf8))
        case .readyz: self.readiness(req)
        case .metrics: metricsPage(req)
        case .startActivity: publish(req, .start)
        case .update(let id): publish(req, .update(id))
        case .end(let id): publish(req, .end(id))
        case .changes: publishChanges(req)
        case .listActivities: listActivities(req)
        case .activity(let id): getActivity(req, id)
        case .events(let id): history(req, id)
        case .status(let id): statusStream(req, id)
        case .cancel(let id): cancel(req, id)
        case .touch(let id): touch(req, id)
        case .keys where req.method == .post: createKey(req)
        case .keys: listKeys(req)
        case .key(let name): revokeKey(req, name: name)
        case .feed: feed(req)
        case .registerTokens: registerTokens(req)
        case .forgetDevice(let token): forgetDevice(req, token)
        case .session: session(req)
        case .liveActivity(let id): liveActivity(req, id)
        case .page(let name): page(req, name)
        case .openAPI: openAPI(req)
        }
    }

    // MARK: - Answers

    func reply(_ req: HTTPRequest, _ status: Int, _ body: [UInt8], contentType: String = "application/json", headers: [(String, String)] = []) {
        metrics.answered(route: req.route, status: status, seconds: Clock.monotonic() - req.received)
        var h = headers + corsHeaders(req)
        if status != 204 { h.append(("Content-Type", contentType)) }
        req.respond(status: status, headers: h, body: body)
        logRequest(req, status: status, bytes: body.count)
    }

    /// One line per answer at info: the route's pattern (never the raw path with its ids),
    /// never a secret or an access_token.
    func logRequest(_ req: HTTPRequest, status: Int, bytes: Int) {
        guard log.enabled(.info) else { return }
        log.info("http.request", [("method", req.method?.rawValue ?? "OTHER"), ("route", req.route ?? "unmatched"),
                                  ("status", status), ("duration_ms", Int(((Clock.monotonic() - req.received) * 1000).rounded())),
                                  ("bytes", bytes), ("key", req.keyName ?? "-")])
    }

    func fail(_ req: HTTPRequest, _ error: DispatchError, headers: [(String, String)] = []) {
        var h = headers
        // A body over the route's limit ends the connection, as the HTTP layer's own 413 does
        // for one over its limit: the client is not worth reading further.
        if error.code == .bodyTooLarge, !h.contains(where: { $0.0 == "Connection" }) { h.append(("Connection", "close")) }
        if let s = error.retryAfterSeconds { h.append(("Retry-After", String(s))) }
        if error.code == .unauthorized { h.append(("WWW-Authenticate", "Bearer")) }
        reply(req, error.httpStatus, error.jsonBody(), headers: h)
    }

    /// Runs `body` with the request's key when it has `scope`; answers 401/403/503 otherwise.
    /// The key of the request's bearer secret when this worker holds it fresh and it allows
    /// `scope`; nil means `authenticated` decides (a cookie, a miss, a refusal).
    func cachedBearerKey(_ req: HTTPRequest, _ scope: Scope, allowQuery: Bool = false) -> APIKey? {
        guard let bearer = Auth.secret(from: req, allowQuery: allowQuery), let key = auth.cachedKey(bearer, allowing: scope) else { return nil }
        req.keyName = key.name
        return key
    }

    func authenticated(_ req: HTTPRequest, _ scope: Scope, allowQuery: Bool = false, _ body: @escaping (APIKey) -> Void) {
        authenticated(req, anyOf: [scope], allowQuery: allowQuery, body)
    }

    /// The same for a key with any of `scopes`. A bearer key (header, or `access_token` where
    /// allowed) wins; without one, the browser session cookie stands for its key (§7), and a
    /// change made through it needs this server's own `Origin`.
    func authenticated(_ req: HTTPRequest, anyOf scopes: [Scope], allowQuery: Bool = false, _ body: @escaping (APIKey) -> Void) {
        let finish: (Result<APIKey, DispatchError>) -> Void = { [weak self] result in
            switch result {
            case .success(let key):
                req.keyName = key.name
                body(key)
            case .failure(let e): self?.fail(req, e)
            }
        }
        let bearer = Auth.secret(from: req, allowQuery: allowQuery)
        guard bearer == nil, req.header("Authorization") == nil else {
            return auth.authenticate(bearer, needsAnyOf: scopes, completion: finish)
        }
        let cookie: String
        switch sessionCookie(req) {
        case .none: return auth.authenticate(bearer, needsAnyOf: scopes, completion: finish)
        case .duplicate: return fail(req, BrowserSession.duplicateCookie)
        case .one(let secret): cookie = secret
        }
        guard BrowserSession.mayUseCookie(method: req.method, origin: req.header("Origin"), host: req.header("Host"), https: cameOverHTTPS(req)) else {
            return fail(req, API.foreignOrigin)
        }
        sessionKey(cookie) { result in
            switch result {
            case .failure(let e): finish(.failure(e))
            case .success(nil):
                finish(.failure(DispatchError(.unauthorized, "the session has ended (signed out, unused for 12 hours, or its key revoked): sign in again")))
            case .success(let key?):
                guard scopes.contains(where: key.allows) else {
                    let names = scopes.map(\.rawValue)
                    let wanted = names.count == 1 ? names[0] : names.dropLast().joined(separator: ", ") + " or " + names.last!
                    return finish(.failure(DispatchError(.forbidden, "this key lacks the \(wanted) scope")))
                }
                finish(.success(key))
            }
        }
    }

    /// A JSON body must say so: `application/json`, parameters (`; charset=utf-8`) allowed.
    static func requireJSON(_ req: HTTPRequest) -> DispatchError? {
        guard Validation.isJSONContentType(req.header("Content-Type")?.utf8) else {
            return DispatchError(.unsupportedMediaType, "send the body as Content-Type: application/json")
        }
        return nil
    }

    // MARK: - Health

    private func readiness(_ req: HTTPRequest) {
        let (state, worker) = readiness()
        let which = worker.map { #","worker":\#($0)"# } ?? ""
        switch state {
        case .ready: reply(req, 200, Array(#"{"status":"ready"}"#.utf8))
        case .databaseUnavailable: reply(req, 503, Array(#"{"status":"unavailable","reason":"database"\#(which)}"#.utf8))
        case .writesRefused:
            reply(req, 503, Array(#"{"status":"unavailable","reason":"writes_refused","detail":"the database refuses writes; reads and streams still work"\#(which)}"#.utf8))
        case .carrierUnavailable:
            reply(req, 503, Array(#"{"status":"unavailable","reason":"carrier","detail":"changes from other servers arrive late (read from the database every second)"\#(which)}"#.utf8))
        }
    }

    private func metricsPage(_ req: HTTPRequest) {
        reply(req, 200, Array(serverMetrics().utf8), contentType: "text/plain; version=0.0.4")
    }
}
