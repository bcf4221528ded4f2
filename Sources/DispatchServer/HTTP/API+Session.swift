import DispatchCore
import DispatchCrypto
import DispatchIO

/// Browser sessions (contract §7): `POST /v1/session` trades the key in `Authorization` for an
/// HttpOnly cookie, `GET` says what the caller may do, `DELETE` signs out. The cookie then
/// authenticates requests beside the bearer path (`authenticated` in API.swift): a bearer key
/// always wins, and a cookie-authenticated change needs this server's own `Origin`.
extension API {
    func session(_ req: HTTPRequest) {
        switch req.method {
        case .post?: createSession(req)
        case .delete?: endSession(req)
        case .get?, .head?, .put?, .options?, .patch?, nil: describeSession(req)
        }
    }

    /// Whether the request reached us over HTTPS: only a trusted proxy's `X-Forwarded-Proto`
    /// says so (dispatchd itself speaks plain HTTP).
    func cameOverHTTPS(_ req: HTTPRequest) -> Bool {
        guard !config.trustedProxies.isEmpty, let proto = req.header("X-Forwarded-Proto"),
              config.trustedProxies.contains(req.peerAddress) else { return false }
        return proto.split(separator: ",").first.map { $0.drop { $0 == " " }.lowercased() == "https" } ?? false
    }

    private func createSession(_ req: HTTPRequest) {
        guard req.header("Authorization") != nil else {
            return fail(req, DispatchError(.unauthorized, "send the API key as Authorization: Bearer <key> to start a session"))
        }
        auth.authenticate(Auth.secret(from: req, allowQuery: false), needsAnyOf: Scope.allCases) { [unowned self] result in
            let key: APIKey
            switch result {
            case .success(let k): key = k
            case .failure(let e): return self.fail(req, e)
            }
            req.keyName = key.name
            let secret = "dss_" + RandomID.secret(using: &self.rng).dropFirst(4)
            self.db.read(SessionSQL.create(secretHash: SHA256.hex(Array(secret.utf8)), keyID: key.id)) { r in
                switch r {
                case .failure(let e): self.fail(req, e)
                case .success:
                    self.log.info("session.created", [("key", key.name)])
                    self.reply(req, 204, [], headers: [("Set-Cookie", BrowserSession.setCookie(secret, secure: self.cameOverHTTPS(req))),
                                                       ("Cache-Control", "no-store")])
                }
            }
        }
    }

    private func describeSession(_ req: HTTPRequest) {
        authenticated(req, anyOf: Scope.allCases) { [unowned self] key in
            var w = JSONWriter(capacity: 128)
            w.beginObject()
            w.field("keyName", key.name)
            w.key("scopes"); w.beginArray(); for s in key.scopes.map(\.rawValue).sorted() { w.string(s) }; w.endArray()
            w.field("machine", key.machine)
            w.endObject()
            self.reply(req, 200, w.bytes, headers: [("Cache-Control", "no-store")])
        }
    }

    /// Ends the cookie's session (when there is one) and clears the cookie; `204` either way,
    /// so a page can always sign out. Through the cookie it is a change: it needs our Origin.
    private func endSession(_ req: HTTPRequest) {
        let clear = [("Set-Cookie", BrowserSession.clearCookie(secure: cameOverHTTPS(req))), ("Cache-Control", "no-store")]
        guard let secret = BrowserSession.secret(cookieHeader: req.header("Cookie")) else { return reply(req, 204, [], headers: clear) }
        guard BrowserSession.mayUseCookie(method: req.method, origin: req.header("Origin"), host: req.header("Host"), https: cameOverHTTPS(req)) else {
            return fail(req, API.foreignOrigin)
        }
        db.read(SessionSQL.delete(secretHash: SHA256.hex(Array(secret.utf8)))) { [unowned self] r in
            switch r {
            case .failure(let e): self.fail(req, e)
            case .success: self.reply(req, 204, [], headers: clear)
            }
        }
    }

    static let foreignOrigin = DispatchError(.forbidden, "a change made with the session cookie must come from this server's own page (Origin)")

    /// The key behind a session cookie, for `authenticated`: nil when the session is unknown,
    /// signed out, idle for 12 hours, or its key revoked.
    func sessionKey(_ secret: String, _ completion: @escaping (Result<APIKey?, DispatchError>) -> Void) {
        let hash = SHA256.hex(Array(secret.utf8))
        db.read(SessionSQL.find(secretHash: hash)) { [weak self] r in
            switch r {
            case .failure(let e): completion(.failure(e))
            case .success(let rows):
                guard let row = rows.first, let key = APIKey(row: row) else { return completion(.success(nil)) }
                // Idle time is kept to the minute: a write at most once a minute per session,
                // best effort, never on the request's path.
                if let idle = row.int64("idle_s"), idle >= BrowserSession.touchEverySeconds, let self, self.db.reader.isReady {
                    self.db.reader.execute([SessionSQL.touch(secretHash: hash)]) { _ in }
                }
                completion(.success(key))
            }
        }
    }
}

/// All SQL on `browser_sessions` (Migrations/0012). Only the SHA-256 of a session secret is
/// stored or compared.
enum SessionSQL {
    /// A new session; sessions idle past the limit are cleared on the way (at most a few).
    static func create(secretHash: String, keyID: Int64) -> PGQuery {
        PGQuery("""
            WITH expired AS (
              DELETE FROM browser_sessions WHERE secret_hash IN (
                SELECT secret_hash FROM browser_sessions WHERE last_used_at < now() - make_interval(secs => $3::bigint) LIMIT 100))
            INSERT INTO browser_sessions (secret_hash, key_id) VALUES ($1, $2::bigint)
            """, [secretHash, String(keyID), String(BrowserSession.idleSeconds)], name: "session_create")
    }

    static func find(secretHash: String) -> PGQuery {
        PGQuery("""
            SELECT k.id, k.name, array_to_string(k.scopes, ',') AS scopes, k.machine,
                   extract(epoch FROM now() - s.last_used_at)::bigint AS idle_s
            FROM browser_sessions s JOIN api_keys k ON k.id = s.key_id
            WHERE s.secret_hash = $1 AND k.revoked_at IS NULL AND s.last_used_at > now() - make_interval(secs => $2::bigint)
            """, [secretHash, String(BrowserSession.idleSeconds)], name: "session_find")
    }

    static func touch(secretHash: String) -> PGQuery {
        PGQuery("UPDATE browser_sessions SET last_used_at = now() WHERE secret_hash = $1", [secretHash], name: "session_touch")
    }

    static func delete(secretHash: String) -> PGQuery {
        PGQuery("DELETE FROM browser_sessions WHERE secret_hash = $1", [secretHash], name: "session_delete")
    }
}
