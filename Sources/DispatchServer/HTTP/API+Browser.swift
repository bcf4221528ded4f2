import DispatchCore
import DispatchIO
import DispatchSystem
import DispatchWeb

/// The feed, CORS, the Activities view and the API description (contract §8, §9).
extension API {
    // MARK: - CORS

    /// CORS headers for an answer to `req`: only on `/v1`, only for configured origins.
    func corsHeaders(_ req: HTTPRequest) -> [(String, String)] {
        guard config.cors.isEnabled, let path = req.path, path.hasPrefix("/v1/") || path == "/v1" else { return [] }
        return config.cors.headers(origin: req.header("Origin"))
    }

    /// `OPTIONS` on an existing path: 204 with `Allow`; a preflight from an allowed origin also
    /// gets the methods, the request headers it may send and a max-age. Another origin gets
    /// the 204 without CORS headers, so its browser refuses the call (and learns nothing).
    func preflight(_ req: HTTPRequest, _ route: Route) {
        var methods = route.methods.map(\.rawValue)
        if route.methods.contains(.get) { methods.append("HEAD") }
        methods.append("OPTIONS")
        var headers = [("Allow", methods.joined(separator: ", "))]
        if let path = req.path, path.hasPrefix("/v1/") {
            headers += config.cors.preflightHeaders(origin: req.header("Origin"), methods: route.methods)
        }
        metrics.answered(route: route.pattern, status: 204, seconds: Clock.monotonic() - req.received)
        req.respond(status: 204, headers: headers, body: [])
        logRequest(req, status: 204, bytes: 0)
    }

    /// Streams of one key on this worker: status streams and feeds share the limit.
    func streamsHeld(by key: Int64) -> Int {
        streams.streams(forKey: key) + feeds.streams(forKey: key)
    }

    // MARK: - The feed

    func feed(_ req: HTTPRequest) {
        authenticated(req, .read, allowQuery: true) { [unowned self] key in
            guard !self.isShuttingDown else {
                return self.fail(req, DispatchError(.databaseUnavailable, "the server is shutting down"))
            }
            var filter = FeedFilter()
            do throws(DispatchError) {
                let q = req.query
                for k in q.keys where !["state", "machine", "access_token", "lastEventId"].contains(k) {
                    throw DispatchError(.invalidQuery, "unknown query parameter \(k)")
                }
                switch q["state"] {
                case nil: break
                case "active": filter.state = .active
                case "finished": filter.state = .finished
                default: throw DispatchError(.invalidQuery, "state must be active or finished")
                }
                if let m = q["machine"] {
                    guard (1...64).contains(m.utf8.count) else { throw DispatchError(.invalidQuery, "machine must be 1-64 characters") }
                    filter.machine = m
                }
            } catch {
                return self.fail(req, error)
            }
            if self.streamsHeld(by: key.id) >= self.config.maxStreamsPerKey {
                return self.fail(req, DispatchError(.tooManyStreams, "this key already holds \(self.config.maxStreamsPerKey) streams"))
            }
            if req.method == .head {
                return self.reply(req, 200, [], contentType: "text/event-stream", headers: [("Cache-Control", "no-cache")])
            }
            // A Last-Event-ID that is not a position we could have issued is answered with
            // `reset` and the initial set, never an error: an EventSource would retry it for ever.
            let raw = req.header("Last-Event-ID") ?? req.query["lastEventId"]
            let text = raw.map { String($0.drop { $0 == " " }) }
            let lastEventID = Validation.lastEventID(text)
            let invalid = text.map { !$0.isEmpty && lastEventID == nil } ?? false
            self.feeds.open(req, filter: filter, lastEventID: lastEventID, invalidLastEventID: invalid, keyID: key.id, sessionHash: key.sessionHash,
                            extraHeaders: self.corsHeaders(req))
        }
    }

    // MARK: - The Activities view and openapi.json

    /// The page's policy: everything from this server, nothing inline, no framing.
    static let contentSecurityPolicy =
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        + "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

    func page(_ req: HTTPRequest, _ name: String) {
        serve(req, name)
    }

    func openAPI(_ req: HTTPRequest) {
        serve(req, "openapi.json")
    }

    /// A compiled-in file with its type, an ETag (304 on a match) and a short cache life:
    /// a new server version is picked up within a minute, and revalidation is cheap.
    private func serve(_ req: HTTPRequest, _ name: String) {
        guard let file = Web.files[name] else { return fail(req, DispatchError(.notFound, "no such file: \(name)")) }
        var headers: [(String, String)] = [
            ("ETag", file.etag), ("Cache-Control", "public, max-age=60"), ("X-Content-Type-Options", "nosniff"),
        ]
        if name.hasSuffix(".html") {
            headers += [("Content-Security-Policy", API.contentSecurityPolicy), ("Referrer-Policy", "no-referrer"),
                        ("X-Frame-Options", "DENY")]
        }
        // Public, credential-free files other origins may load: a page elsewhere imports
        // dispatch.js as a module (module scripts are fetched with CORS).
        if name == "openapi.json" || name == "dispatch.js" { headers.append(("Access-Control-Allow-Origin", "*")) }
        if let inm = req.header("If-None-Match"), inm.split(separator: ",").contains(where: { $0.drop { $0 == " " } == file.etag }) {
            metrics.answered(route: req.route, status: 304, seconds: Clock.monotonic() - req.received)
            return req.respond(status: 304, headers: headers, body: [])
        }
        reply(req, 200, req.method == .head ? [] : file.body, contentType: file.contentType, headers: headers)
    }
}
