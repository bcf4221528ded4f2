import DispatchCore
import DispatchIO
import Glibc

/// One server process: an event loop with its HTTP server, its database connections, its
/// LISTEN session and its streams. Several workers share the port (SO_REUSEPORT).
public final class Worker {
    let config: ServerConfig
    let conninfo: String
    let log: Logger
    let loop = EventLoop()
    let http: HTTPServer
    let store: Store
    let listener: PGConnection
    let streams: StreamService
    let auth: Auth
    let metrics: Metrics
    let index: Int
    private var signals: [Timer] = []
    private var rng = SystemRandomNumberGenerator()
    private var shuttingDown = false
    private var listenEstablished = false
    private var pruneTimer: Timer?
    private var orphanTimer: Timer?
    /// The supervisor that started this worker; if it dies (even by SIGKILL), so does the worker.
    var supervisor: pid_t?

    public init(config: ServerConfig, conninfo: String, index: Int, log: Logger) {
        self.config = config
        self.conninfo = conninfo
        self.index = index
        self.log = log
        metrics = Metrics(worker: index)
        var limits = HTTPLimits()
        limits.streamWriteTimeoutSeconds = max(60, config.heartbeatSeconds * 4)
        http = HTTPServer(loop: loop, limits: limits)
        store = Store(loop: loop, conninfo: conninfo, log: log, metrics: metrics, now: Clock.nowMilliseconds)
        listener = PGConnection(loop: loop, conninfo: conninfo, name: "listener", log: log)
        streams = StreamService(loop: loop, store: store, metrics: metrics, log: log, heartbeatSeconds: config.heartbeatSeconds,
                                maxBacklog: config.streamBacklogBytes, writeTimeout: limits.streamWriteTimeoutSeconds)
        auth = Auth(store: store, publishRate: config.publishRatePerSecond)
    }

    /// Binds, connects, and runs the loop until SIGTERM/SIGINT.
    public func run() throws {
        signal(SIGPIPE, SIG_IGN)
        for a in config.listen {
            try http.listen(host: a.host, port: a.port, reusePort: true)
        }
        http.handler = { [unowned self] req in self.route(req) }
        store.onCommitted = { [unowned self] event, json in
            self.streams.committed(activityID: event.snapshot.activityId, seq: event.seq, name: event.name,
                                   json: String(decoding: json, as: UTF8.self))
        }
        listener.onReady = { [unowned self] in
            self.listener.execute([PGQuery("LISTEN \(Store.notifyChannel)"), PGQuery("LISTEN \(Auth.keysChannel)")]) { result in
                guard case .success = result else { return }
                let restored = self.listenEstablished
                self.listenEstablished = true
                self.metrics.dbConnected = true
                self.auth.invalidateAll()
                // NOTIFYs sent while the session was down are lost: catch up from history.
                if restored { self.streams.listenRestored() }
                self.log.info("listen.ready", [("resync", restored)])
            }
        }
        listener.onLost = { [unowned self] reason in
            self.metrics.dbConnected = false
            self.metrics.dbReconnects += 1
            self.log.warning("listen.lost", [("error", reason)])
        }
        listener.onNotify = { [unowned self] channel, payload in
            self.metrics.notifyReceived += 1
            if channel == Auth.keysChannel { self.auth.invalidateAll(); return }
            self.streams.notified(payload)
        }
        store.start()
        listener.start()
        if index == 0 {
            // One worker prunes; concurrent servers doing the same is harmless.
            let retention = config.retentionDays * 86_400
            pruneTimer = loop.timer(after: min(600, retention / 4), repeating: true) { [unowned self] in self.prune() }
        }
        if let supervisor {
            orphanTimer = loop.timer(after: 1, repeating: true) { [unowned self] in
                if getppid() != supervisor {
                    self.log.warning("worker.orphaned", [("supervisor", supervisor)])
                    self.shutdown()
                }
            }
        }
        signals.append(loop.onSignal(SIGTERM) { [unowned self] in self.shutdown() })
        signals.append(loop.onSignal(SIGINT) { [unowned self] in self.shutdown() })
        let addresses = config.listen.map { "\($0.host):\(http.boundPort() ?? $0.port)" }.joined(separator: ",")
        log.info("worker.listening", [("listen", addresses), ("heartbeat_s", config.heartbeatSeconds)])
        loop.run()
        log.info("worker.stopped")
    }

    /// Stops accepting, ends every stream, lets pending answers flush, then leaves the loop.
    func shutdown() {
        guard !shuttingDown else { return }
        shuttingDown = true
        log.info("worker.shutdown", [("streams", streams.openStreams)])
        http.stopListening()
        streams.shutdown()
        loop.timer(after: 0.3) { [unowned self] in
            self.store.close()
            self.listener.close()
            self.loop.stop()
        }
    }

    private func prune() {
        guard store.isReady else { return }
        let cutoff = Clock.nowMilliseconds() - Int64(config.retentionDays * 86_400_000)
        store.prune(endedBefore: cutoff) { [log] n in
            if n > 0 { log.info("retention.pruned", [("activities", n)]) }
        }
    }

    var isReady: Bool { store.isReady && listener.isReady && listenEstablished }

    // MARK: - Routing

    func route(_ req: HTTPRequest) {
        guard let path = req.path else {
            return fail(req, DispatchError(.invalidField, "the path is not valid UTF-8"))
        }
        let parts = path.split(separator: "/", omittingEmptySubsequences: false).dropFirst().map(String.init)
        let method = req.method
        switch (method, parts.first ?? "") {
        case (.get, "healthz") where parts.count == 1:
            return reply(req, 200, Array(#"{"status":"ok"}"#.utf8))
        case (.get, "readyz") where parts.count == 1:
            let ready = isReady
            return reply(req, ready ? 200 : 503, Array((ready ? #"{"status":"ready"}"# : #"{"status":"unavailable","reason":"database"}"#).utf8))
        case (.get, "metrics") where parts.count == 1:
            let text = metrics.render(process: Worker.processFigures())
            return reply(req, 200, Array(text.utf8), contentType: "text/plain; version=0.0.4")
        case (_, "v1"):
            return routeV1(req, method: method, parts: Array(parts.dropFirst()))
        default:
            return fail(req, DispatchError(.notFound, "no such endpoint: \(path)"))
        }
    }

    private func routeV1(_ req: HTTPRequest, method: HTTPRequest.Method, parts: [String]) {
        func allow(_ m: HTTPRequest.Method, _ body: () -> Void) {
            if method == m || (m == .get && method == .head) { body() } else {
                fail(req, DispatchError(.methodNotAllowed, "use \(m.rawValue) for this endpoint"), headers: [("Allow", m.rawValue)])
            }
        }
        switch parts.count {
        case 1 where parts[0] == "activities":
            allow(.get) { listActivities(req) }
        case 2 where parts[0] == "activities" && parts[1] == "start":
            allow(.post) { publish(req, id: nil, kind: "start") }
        case 2 where parts[0] == "activities":
            allow(.get) { withID(req, parts[1]) { getActivity(req, $0) } }
        case 3 where parts[0] == "activities":
            switch parts[2] {
            case "update", "end": allow(.post) { withID(req, parts[1]) { publish(req, id: $0, kind: parts[2]) } }
            case "events": allow(.get) { withID(req, parts[1]) { history(req, $0) } }
            case "status": allow(.get) { withID(req, parts[1]) { status(req, $0) } }
            default: fail(req, DispatchError(.notFound, "no such endpoint"))
            }
        case 1 where parts[0] == "keys":
            switch method {
            case .get: adminKeys(req) { self.listKeys(req) }
            case .post: adminKeys(req) { self.createKey(req) }
            default: fail(req, DispatchError(.methodNotAllowed, "use GET or POST"), headers: [("Allow", "GET, POST")])
            }
        case 2 where parts[0] == "keys":
            allow(.delete) { adminKeys(req) { self.revokeKey(req, name: parts[1]) } }
        default:
            fail(req, DispatchError(.notFound, "no such endpoint"))
        }
    }

    private func withID(_ req: HTTPRequest, _ raw: String, _ body: (String) -> Void) {
        guard Validation.isValidActivityID(raw) else {
            return fail(req, DispatchError(.invalidField, "activity id must be 1-128 characters of A-Z a-z 0-9 . _ : -"))
        }
        body(raw)
    }

    // MARK: - Answers

    func reply(_ req: HTTPRequest, _ status: Int, _ body: [UInt8], contentType: String = "application/json", headers: [(String, String)] = []) {
        metrics.httpRequests[status, default: 0] += 1
        var h = headers
        h.append(("Content-Type", contentType))
        req.respond(status: status, headers: h, body: body)
    }

    func fail(_ req: HTTPRequest, _ error: DispatchError, headers: [(String, String)] = []) {
        var h = headers
        if let s = error.retryAfterSeconds { h.append(("Retry-After", String(s))) }
        if error.code == .unauthorized { h.append(("WWW-Authenticate", "Bearer")) }
        reply(req, error.httpStatus, error.jsonBody(now: 0), headers: h)
    }

    private func authenticated(_ req: HTTPRequest, _ scope: Scope, allowQuery: Bool = false, _ body: @escaping (APIKey) -> Void) {
        auth.authenticate(Auth.secret(from: req, allowQuery: allowQuery), needs: scope) { [unowned self] result in
            switch result {
            case .success(let key): body(key)
            case .failure(let e): self.fail(req, e)
            }
        }
    }

    private func adminKeys(_ req: HTTPRequest, _ body: @escaping () -> Void) {
        authenticated(req, .admin) { _ in body() }
    }

    /// A JSON body must say so: `application/json`, parameters (`; charset=utf-8`) allowed.
    static func requireJSON(_ req: HTTPRequest) -> DispatchError? {
        let value = (req.header("Content-Type") ?? "").split(separator: ";", maxSplits: 1, omittingEmptySubsequences: false)[0]
        let type = value.drop { $0 == " " || $0 == "\t" }.reversed().drop { $0 == " " || $0 == "\t" }.reversed()
        guard String(type).lowercased() == "application/json" else {
            return DispatchError(.unsupportedMediaType, "send the body as Content-Type: application/json")
        }
        return nil
    }

    // MARK: - Publishing

    private func publish(_ req: HTTPRequest, id: String?, kind: String) {
        authenticated(req, .publish) { [unowned self] key in
            if let e = self.auth.checkRate(key) { return self.fail(req, e) }
            if let e = Worker.requireJSON(req) { return self.fail(req, e) }
            let idempotencyKey = req.header("Idempotency-Key")
            if let k = idempotencyKey, !(1...128).contains(k.utf8.count) || !k.utf8.allSatisfy({ (0x21...0x7E).contains($0) }) {
                return self.fail(req, DispatchError(.invalidField, "Idempotency-Key must be 1-128 printable characters"))
            }
            let body = req.body()
            let opKind: PublishOp.Kind
            var activityID = id ?? ""
            do throws(DispatchError) {
                switch kind {
                case "start":
                    var cmd = try Validation.start(body)
                    if let bound = key.machine, !key.scopes.contains(.admin) {
                        if let m = cmd.machine, m != bound {
                            throw DispatchError(.forbidden, "this key may only publish for machine \(bound)")
                        }
                        cmd.machine = bound
                    }
                    activityID = cmd.activityId ?? RandomID.uuid(using: &self.rng)
                    opKind = .start(cmd)
                case "update": opKind = .update(try Validation.update(body))
                default: opKind = .end(try Validation.end(body))
                }
            } catch {
                return self.fail(req, error)
            }
            let isAdmin = key.scopes.contains(.admin)
            let op = PublishOp(activityID: activityID, kind: opKind, idempotencyKey: idempotencyKey, ownerKeyID: key.id,
                               authorize: { stored in
                                   if isAdmin || stored.ownerKeyID == key.id { return nil }
                                   return DispatchError(.forbidden, "this key did not start activity \(stored.activity.activityId)")
                               },
                               completion: { [unowned self] outcome in
                                   switch outcome {
                                   case .committed(let json, let created): self.reply(req, created ? 201 : 200, json)
                                   case .ok(let a): self.reply(req, 200, a.json())
                                   case .replay(let json): self.reply(req, 200, Array(json.utf8))
                                   case .failed(let e): self.fail(req, e)
                                   }
                               })
            self.store.submit(op)
        }
    }

    // MARK: - Reading

    private func getActivity(_ req: HTTPRequest, _ id: String) {
        authenticated(req, .read) { [unowned self] _ in
            self.store.readActivity(id) { result in
                switch result {
                case .failure(let e): self.fail(req, e)
                case .success(nil): self.fail(req, DispatchError(.notFound, "no activity \(id)"))
                case .success(let s?): self.reply(req, 200, s.activity.json())
                }
            }
        }
    }

    private func listActivities(_ req: HTTPRequest) {
        authenticated(req, .read) { [unowned self] _ in
            let q = req.query
            var lq = Store.ListQuery(limit: 50)
            do throws(DispatchError) {
                for k in q.keys where !["state", "machine", "limit", "cursor"].contains(k) {
                    throw DispatchError(.invalidQuery, "unknown query parameter \(k)")
                }
                switch q["state"] {
                case nil: break
                case "active": lq.finished = false
                case "finished": lq.finished = true
                default: throw DispatchError(.invalidQuery, "state must be active or finished")
                }
                if let m = q["machine"] {
                    guard (1...64).contains(m.utf8.count) else { throw DispatchError(.invalidQuery, "machine must be 1-64 characters") }
                    lq.machine = m
                }
                lq.limit = try Validation.integer(q["limit"], name: "limit", range: 1...500, default: 50)
                if let c = q["cursor"] {
                    guard let cursor = ListCursor.decode(c) else { throw DispatchError(.invalidQuery, "cursor is not valid") }
                    lq.cursor = (cursor.createdAt, cursor.activityId)
                }
            } catch {
                return self.fail(req, error)
            }
            self.store.list(lq) { result in
                switch result {
                case .failure(let e): self.fail(req, e)
                case .success(let items):
                    var w = JSONWriter(capacity: 512 * items.count + 64)
                    w.beginObject()
                    w.key("activities")
                    w.beginArray()
                    for a in items { w.raw(a.json()) }
                    w.endArray()
                    let next = items.count == Int(lq.limit) ? items.last.map { ListCursor(createdAt: $0.createdAt, activityId: $0.activityId).encode() } : nil
                    w.field("nextCursor", next)
                    w.endObject()
                    self.reply(req, 200, w.bytes)
                }
            }
        }
    }

    private func history(_ req: HTTPRequest, _ id: String) {
        authenticated(req, .read) { [unowned self] _ in
            let after: Int64, limit: Int64
            do throws(DispatchError) {
                after = try Validation.integer(req.query["after"], name: "after", range: 0...Int64.max, default: 0)
                limit = try Validation.integer(req.query["limit"], name: "limit", range: 1...1000, default: 100)
            } catch {
                return self.fail(req, error)
            }
            self.store.readHistory(id, after: after, limit: limit) { result in
                switch result {
                case .failure(let e): self.fail(req, e)
                case .success(let events):
                    let write = { (events: [StoredEvent]) in
                        var w = JSONWriter(capacity: 512 * events.count + 32)
                        w.beginObject()
                        w.key("events")
                        w.beginArray()
                        for e in events {
                            w.beginObject()
                            w.field("seq", e.seq)
                            w.field("event", e.name)
                            w.key("data"); w.raw(Array(e.data.utf8))
                            w.field("createdAt", Timestamp.format(milliseconds: e.createdMs))
                            w.endObject()
                        }
                        w.endArray()
                        w.endObject()
                        self.reply(req, 200, w.bytes)
                    }
                    if !events.isEmpty { return write(events) }
                    // An empty page: tell an unknown activity apart from one with nothing new.
                    self.store.readActivity(id) { r in
                        switch r {
                        case .success(nil): self.fail(req, DispatchError(.notFound, "no activity \(id)"))
                        case .failure(let e): self.fail(req, e)
                        case .success: write([])
                        }
                    }
                }
            }
        }
    }

    private func status(_ req: HTTPRequest, _ id: String) {
        authenticated(req, .read, allowQuery: true) { [unowned self] key in
            guard !self.shuttingDown else {
                return self.fail(req, DispatchError(.databaseUnavailable, "the server is shutting down"))
            }
            if self.streams.streams(forKey: key.id) >= self.config.maxStreamsPerKey {
                return self.fail(req, DispatchError(.tooManyStreams, "this key already holds \(self.config.maxStreamsPerKey) streams"))
            }
            // HEAD gets the stream's headers only: a stream writes to the socket itself, so it
            // would send a body after a HEAD answer and hold a stream slot.
            if req.method == .head {
                return self.reply(req, 200, [], contentType: "text/event-stream", headers: [("Cache-Control", "no-cache")])
            }
            let lastEventID = Validation.lastEventID(req.header("Last-Event-ID") ?? req.query["lastEventId"])
            self.streams.open(req, activityID: id, lastEventID: lastEventID, keyID: key.id)
        }
    }

    // MARK: - Keys

    private func listKeys(_ req: HTTPRequest) {
        store.reader.execute([PGQuery("""
            SELECT name, array_to_string(scopes, ','), machine, created_at, last_used_at, revoked_at FROM api_keys ORDER BY id
            """)]) { [unowned self] result in
            guard case .success(let rs) = result, rs[0].ok else {
                return self.fail(req, DispatchError(.databaseUnavailable, "the database is unavailable"))
            }
            var w = JSONWriter()
            w.beginObject(); w.key("keys"); w.beginArray()
            for r in rs[0].rows {
                w.beginObject()
                w.field("name", r[0]); w.key("scopes"); w.beginArray()
                for s in (r[1] ?? "").split(separator: ",") { w.string(String(s)) }
                w.endArray()
                w.field("machine", r[2]); w.field("createdAt", r[3]); w.field("lastUsedAt", r[4]); w.field("revokedAt", r[5])
                w.endObject()
            }
            w.endArray(); w.endObject()
            self.reply(req, 200, w.bytes)
        }
    }

    private func createKey(_ req: HTTPRequest) {
        if let e = Worker.requireJSON(req) { return fail(req, e) }
        let spec: KeySpec
        do { spec = try KeySpec.parse(req.body()) } catch { return fail(req, error) }
        let secret = RandomID.secret(using: &rng)
        store.reader.execute([PGQuery("INSERT INTO api_keys (name, secret_hash, scopes, machine) VALUES ($1, $2, string_to_array($3, ','), $4) ON CONFLICT (name) DO NOTHING RETURNING id",
                                      [spec.name, SHA256.hex(Array(secret.utf8)), spec.scopes.map(\.rawValue).sorted().joined(separator: ","), spec.machine])]) { [unowned self] result in
            guard case .success(let rs) = result, rs[0].ok else {
                return self.fail(req, DispatchError(.databaseUnavailable, "the database is unavailable"))
            }
            guard !rs[0].rows.isEmpty else { return self.fail(req, DispatchError(.conflict, "a key named \(spec.name) exists")) }
            var w = JSONWriter()
            w.beginObject(); w.field("name", spec.name); w.field("secret", secret); w.key("scopes"); w.beginArray()
            for s in spec.scopes.map(\.rawValue).sorted() { w.string(s) }
            w.endArray(); w.field("machine", spec.machine); w.endObject()
            self.reply(req, 201, w.bytes)
        }
    }

    private func revokeKey(_ req: HTTPRequest, name: String) {
        store.reader.execute([PGQuery("UPDATE api_keys SET revoked_at = now() WHERE name = $1 AND revoked_at IS NULL RETURNING id", [name]),
                              PGQuery("SELECT pg_notify('\(Auth.keysChannel)', $1)", [name])]) { [unowned self] result in
            guard case .success(let rs) = result, rs[0].ok else {
                return self.fail(req, DispatchError(.databaseUnavailable, "the database is unavailable"))
            }
            guard !rs[0].rows.isEmpty else { return self.fail(req, DispatchError(.notFound, "no active key named \(name)")) }
            self.reply(req, 200, Array(#"{"revoked":true}"#.utf8))
        }
    }

    static func processFigures() -> ProcessFigures {
        var rss = 0
        if let f = fopen("/proc/self/statm", "r") {
            var size = 0, resident = 0
            withUnsafeMutablePointer(to: &size) { s in withUnsafeMutablePointer(to: &resident) { r in
                _ = withVaList([s, r]) { vfscanf(f, "%ld %ld", $0) }
            } }
            fclose(f)
            rss = resident * Int(sysconf(Int32(_SC_PAGESIZE)))
        }
        var fds = 0
        if let d = opendir("/proc/self/fd") {
            while readdir(d) != nil { fds += 1 }
            closedir(d)
            fds -= 3
        }
        var usage = rusage()
        getrusage(RUSAGE_SELF.rawValue, &usage)
        let cpu = Double(usage.ru_utime.tv_sec) + Double(usage.ru_utime.tv_usec) / 1e6 + Double(usage.ru_stime.tv_sec) + Double(usage.ru_stime.tv_usec) / 1e6
        return ProcessFigures(residentBytes: rss, openFDs: max(0, fds), cpuSeconds: cpu)
    }
}
