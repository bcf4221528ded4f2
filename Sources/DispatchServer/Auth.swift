import DispatchCore
import DispatchIO

struct APIKey {
    let id: Int64
    let name: String
    let scopes: Set<Scope>
    let machine: String?

    func allows(_ needed: Scope) -> Bool {
        if scopes.contains(.admin) { return true }
        if needed == .read && scopes.contains(.publish) { return true }
        return scopes.contains(needed)
    }
}

/// Bearer keys: looked up by the SHA-256 of the secret, cached for a few seconds so the hot path
/// costs no round trip; revocation clears every worker's cache at once through NOTIFY.
final class Auth {
    static let keysChannel = "dispatch_keys"
    let store: Store
    let ttl: Double
    private var cache: [String: (key: APIKey?, fetched: Double)] = [:]
    private var waiters: [String: [(Result<APIKey?, DispatchError>) -> Void]] = [:]
    private var buckets: [Int64: TokenBucket] = [:]
    let publishRate: Double

    init(store: Store, ttl: Double = 10, publishRate: Double) {
        self.store = store
        self.ttl = ttl
        self.publishRate = publishRate
    }

    /// Bumped by every invalidation: a lookup that was in flight across one (it may have read
    /// the key just before its revocation committed) answers its request but is not cached.
    private var generation = 0

    func invalidateAll() {
        cache.removeAll()
        generation += 1
    }

    static func secret(from req: HTTPRequest, allowQuery: Bool) -> String? {
        if let h = req.header("Authorization") {
            let parts = h.split(separator: " ", maxSplits: 1)
            if parts.count == 2, parts[0].lowercased() == "bearer" { return String(parts[1]) }
            return nil
        }
        if allowQuery { return req.query["access_token"] }
        return nil
    }

    func authenticate(_ secret: String?, needs scope: Scope, completion: @escaping (Result<APIKey, DispatchError>) -> Void) {
        guard let secret, !secret.isEmpty, secret.utf8.count <= 512 else {
            completion(.failure(DispatchError(.unauthorized, "an API key is required: Authorization: Bearer <key>")))
            return
        }
        let finish: (APIKey?) -> Void = { key in
            guard let key else {
                completion(.failure(DispatchError(.unauthorized, "the API key is not valid")))
                return
            }
            guard key.allows(scope) else {
                completion(.failure(DispatchError(.forbidden, "this key lacks the \(scope.rawValue) scope")))
                return
            }
            completion(.success(key))
        }
        let now = Clock.monotonic()
        // Cached by secret (process memory only), so the hot path hashes nothing; the
        // database only ever sees and stores the SHA-256.
        if let hit = cache[secret], now - hit.fetched < ttl {
            finish(hit.key)
            return
        }
        if waiters[secret] != nil {
            waiters[secret]!.append { r in if case .success(let k) = r { finish(k) } else if case .failure(let e) = r { completion(.failure(e)) } }
            return
        }
        waiters[secret] = []
        let hash = SHA256.hex(Array(secret.utf8))
        let startedIn = generation
        store.reader.execute([PGQuery("""
            UPDATE api_keys SET last_used_at = now() WHERE secret_hash = $1 AND revoked_at IS NULL
            RETURNING id, name, array_to_string(scopes, ','), machine
            """, [hash], name: "auth_key")]) { [weak self] result in
            guard let self else { return }
            let waiting = self.waiters.removeValue(forKey: secret) ?? []
            switch result {
            case .failure(let e):
                let err = Store.unavailable(e)
                completion(.failure(err))
                for w in waiting { w(.failure(err)) }
            case .success(let rs) where !rs[0].ok:
                // A failed lookup says nothing about the key: 503, not a cached 401.
                let err = DispatchError(.databaseUnavailable, "the database is unavailable, retry shortly")
                completion(.failure(err))
                for w in waiting { w(.failure(err)) }
            case .success(let rs):
                var key: APIKey?
                if let r = rs[0].rows.first, let id = r[0].flatMap({ Int64($0) }), let name = r[1] {
                    key = APIKey(id: id, name: name, scopes: Scope.parseList(r[2] ?? "") ?? [], machine: r[3])
                }
                if self.cache.count > 10_000 { self.cache.removeAll() }
                if startedIn == self.generation { self.cache[secret] = (key, Clock.monotonic()) }
                finish(key)
                for w in waiting { w(.success(key)) }
            }
        }
    }

    /// Per-key publish rate; admin keys are not limited. Returns a refusal with Retry-After.
    func checkRate(_ key: APIKey) -> DispatchError? {
        guard publishRate > 0, !key.scopes.contains(.admin) else { return nil }
        let now = Clock.monotonic()
        var bucket = buckets[key.id] ?? TokenBucket(rate: publishRate, burst: max(1, publishRate * 2), now: now)
        let wait = bucket.take(now: now)
        buckets[key.id] = bucket
        guard let wait else { return nil }
        var e = DispatchError(.rateLimited, "publish rate limit of \(publishRate)/s for key \(key.name) exceeded")
        e.retryAfterSeconds = max(1, Int(wait.rounded(.up)))
        return e
    }
}
