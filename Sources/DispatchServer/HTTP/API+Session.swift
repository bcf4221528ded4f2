import DispatchCore
import DispatchCrypto
import DispatchIO
import DispatchSystem
import PGCore

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
        guard !config.trustedProxies.isEmpty, config.trustedProxies.contains(req.peerAddress) else { return false }
        return BrowserSession.forwardedHTTPS(req.header("X-Forwarded-Proto"))
    }

    /// The session cookie across every `Cookie` header of the request.
    func sessionCookie(_ req: HTTPRequest) -> BrowserSession.CookieRead {
        BrowserSession.read(cookieHeaders: req.headerValues("Cookie"))
    }

    /// Who is signing in, for the per-client limit: the peer, or behind a trusted proxy the
    /// address it appended to `X-Forwarded-For`.
    func signInClient(_ req: HTTPRequest) -> String {
        let peer = req.peerAddress ?? "-"
        guard !config.trustedProxies.isEmpty, config.trustedProxies.contains(peer),
              let forwarded = req.headerValues("X-Forwarded-For").last?.split(separator: ",").last else { return peer }
        let client = forwarded.drop { $0 == " " || $0 == "\t" }.reversed().drop { $0 == " " || $0 == "\t" }.reversed()
        return client.isEmpty ? peer : String(client)
    }

    /// Sign-in (contract §7). Limited before any database work by the client's attempts, then
    /// by the key's attempts, then by the sessions the key holds (`DISPATCH_SIGNIN_RATE`,
    /// `DISPATCH_MAX_SESSIONS_PER_KEY`): `429` with `Retry-After` each.
    private func createSession(_ req: HTTPRequest) {
        let limits = config.limits
        if let wait = auth.takeSignIn(client: signInClient(req), perMinute: limits.signInsPerMinute) {
            return fail(req, KeyRules.tooManySignIns(perMinute: limits.signInsPerMinute, by: "from this address", wait: wait))
        }
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
            if let wait = self.auth.takeSignIn(keyID: key.id, perMinute: limits.signInsPerMinute) {
                return self.fail(req, KeyRules.tooManySignIns(perMinute: limits.signInsPerMinute, by: "with this key", wait: wait))
            }
            let secret = BrowserSession.secretPrefix + RandomID.secret(using: &self.rng).dropFirst(4)
            self.db.read(SessionSQL.create(secretHash: SHA256.hex(Array(secret.utf8)), keyID: key.id, max: limits.maxSessionsPerKey)) { r in
                switch r {
                case .failure(let e): self.fail(req, e)
                case .success(let rows) where rows.rows.isEmpty:
                    self.log.warning("session.refused_too_many", [("key", key.name), ("max", limits.maxSessionsPerKey)])
                    self.fail(req, KeyRules.tooManySessions(max: limits.maxSessionsPerKey))
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
        let secret: String
        switch sessionCookie(req) {
        case .none: return reply(req, 204, [], headers: clear)
        case .duplicate: return fail(req, BrowserSession.duplicateCookie, headers: clear)
        case .one(let s): secret = s
        }
        guard BrowserSession.mayUseCookie(method: req.method, origin: req.header("Origin"), host: req.header("Host"), https: cameOverHTTPS(req)) else {
            return fail(req, API.foreignOrigin)
        }
        let hash = SHA256.hex(Array(secret.utf8))
        db.read(SessionSQL.delete(secretHash: hash)) { [unowned self] r in
            switch r {
            case .failure(let e): self.fail(req, e)
            case .success:
                self.auth.sessionEnded(hash)
                // Its streams here end now; other workers and servers see it at their next
                // re-check (`recheckStreamAuthority`, every second).
                self.streams.closeStreams(ofSession: hash)
                self.feeds.closeStreams(ofSession: hash)
                self.reply(req, 204, [], headers: clear)
            }
        }
    }

    /// Every second: ends the streams whose authority is gone. Those opened through a browser
    /// session whose session was signed out, expired or lost its key, and those of keys
    /// revoked, on every worker and server, whatever NOTIFY did (a lost LISTEN session, a
    /// revocation straight in the database). An open stream counts as use of its session
    /// (written at most once a minute), so a page left open does not sign itself out.
    func recheckStreamAuthority() {
        let sessions = Array(Set(streams.sessionsWithStreams + feeds.sessionsWithStreams))
        let keys = Array(Set(streams.keysWithStreams + feeds.keysWithStreams))
        guard db.reader.isReady else { return }
        if !sessions.isEmpty {
            db.read(SessionSQL.ended(among: sessions)) { [weak self] r in
                guard let self, case .success(let rows) = r else { return }
                for row in rows.rows {
                    guard let hash = row["secret_hash"] else { continue }
                    self.streams.closeStreams(ofSession: hash)
                    self.feeds.closeStreams(ofSession: hash)
                    self.log.info("session.streams_closed", [("reason", row["reason"] ?? "ended")])
                }
            }
            let now = DispatchSystem.Clock.monotonic()
            if now >= auth.streamSessionsTouchDue {
                auth.streamSessionsTouchDue = now + Double(BrowserSession.touchEverySeconds)
                db.reader.execute([SessionSQL.touch(secretHashes: sessions)]) { _ in }
            }
        }
        if !keys.isEmpty {
            db.read(KeySQL.revoked(among: keys)) { [weak self] r in
                guard let self, case .success(let rows) = r, !rows.rows.isEmpty else { return }
                // A revocation NOTIFY did not bring: the key cache must not honour it either.
                self.auth.invalidateAll()
                for row in rows.rows { if let id = row.int64("id") { self.onKeyRevoked(id) } }
            }
        }
    }

    static let foreignOrigin = DispatchError(.forbidden, "a change made with the session cookie must come from this server's own page (Origin)")

    /// The key behind a session cookie, for `authenticated`: nil when the session is unknown,
    /// signed out, idle for 12 hours, or its key revoked.
    func sessionKey(_ secret: String, _ completion: @escaping (Result<APIKey?, DispatchError>) -> Void) {
        // What we never hand out, or found ended before, costs no round trip.
        guard secret.hasPrefix(BrowserSession.secretPrefix) else { return completion(.success(nil)) }
        let hash = SHA256.hex(Array(secret.utf8))
        if auth.isEndedSession(hash) { return completion(.success(nil)) }
        db.read(SessionSQL.find(secretHash: hash)) { [weak self] r in
            switch r {
            case .failure(let e): completion(.failure(e))
            case .success(let rows):
                guard let row = rows.first, var key = APIKey(row: row) else {
                    self?.auth.sessionEnded(hash)
                    return completion(.success(nil))
                }
                key.sessionHash = hash
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
    /// A new session, unless the key holds `max` live ones already (no row comes back then);
    /// sessions idle past the limit are cleared on the way (at most a few). Concurrent
    /// sign-ins of one key may pass the count together: the sign-in rate bounds by how much.
    static func create(secretHash: String, keyID: Int64, max: Int) -> PGQuery {
        PGQuery("""
            WITH expired AS (
              DELETE FROM browser_sessions WHERE secret_hash IN (
                SELECT secret_hash FROM browser_sessions WHERE last_used_at < now() - make_interval(secs => $3::bigint) LIMIT 100))
            INSERT INTO browser_sessions (secret_hash, key_id)
            SELECT $1, $2::bigint
            WHERE (SELECT count(*) FROM browser_sessions WHERE key_id = $2::bigint
                   AND last_used_at > now() - make_interval(secs => $3::bigint)) < $4::bigint
            RETURNING 1
            """, [secretHash, String(keyID), String(BrowserSession.idleSeconds), String(max)], name: "session_create")
    }

    /// Which of these sessions are over: signed out, idle past the limit, or their key revoked.
    static func ended(among hashes: [String]) -> PGQuery {
        PGQuery("""
            SELECT h.secret_hash, CASE WHEN s.secret_hash IS NULL THEN 'signed_out'
                                       WHEN k.revoked_at IS NOT NULL THEN 'key_revoked' ELSE 'expired' END AS reason
            FROM unnest($1::text[]) AS h(secret_hash)
            LEFT JOIN browser_sessions s ON s.secret_hash = h.secret_hash
            LEFT JOIN api_keys k ON k.id = s.key_id
            WHERE s.secret_hash IS NULL OR k.revoked_at IS NOT NULL
               OR s.last_used_at <= now() - make_interval(secs => $2::bigint)
            """, [PGArray.text(hashes), String(BrowserSession.idleSeconds)], name: "session_ended")
    }

    /// Sessions in use by open streams.
    static func touch(secretHashes: [String]) -> PGQuery {
        PGQuery("UPDATE browser_sessions SET last_used_at = now() WHERE secret_hash = ANY($1::text[])",
                [PGArray.text(secretHashes)], name: "session_touch_streams")
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
