import DispatchCore
import DispatchCrypto
import DispatchIO
import DispatchSystem

/// Bearer keys: looked up by the SHA-256 of the secret and cached for a few seconds, so the hot
/// path costs no round trip; a revocation clears every worker's cache through NOTIFY, and the
/// revoking worker's own before it answers. Authentication only reads: `last_used_at` is
/// written later, in batches, and a database that refuses writes does not stop reads.
final class Auth {
    let db: Database
    let ttl: Double
    let log: Logger
    private var cache: [String: (key: APIKey?, fetched: Double)] = [:]
    /// Secrets the database did not know, apart from `cache`: a flood of made-up keys fills
    /// this one (and empties it when full), never pushing good keys out (issue 36).
    private var refused: [String: Double] = [:]
    /// Session hashes found ended (a session never comes back): refused without a round trip.
    private var endedSessions = Set<String>()
    static let maxCached = 10_000
    private var waiters: [String: [(Result<APIKey?, DispatchError>) -> Void]] = [:]
    private var publishes: PerKeyRate
    private var used: Set<Int64> = []
    private var touchTimer: Timer?
    let publishRate: Double
    /// Sign-in attempts per client address and per key (`DISPATCH_SIGNIN_RATE`, per worker).
    private var signInsByClient: PerClientRate?
    private var signInsByKey: PerClientRate?
    /// When the sessions holding streams are next written down as in use.
    var streamSessionsTouchDue: Double = 0

    /// Monotonic seconds (the loop's clock; a test's own).
    private let now: () -> Double

    init(db: Database, loop: LoopScheduling, log: Logger, ttl: Double = 10, publishRate: Double,
         now: @escaping () -> Double = Clock.monotonic) {
        self.db = db
        self.ttl = ttl
        self.log = log
        self.publishRate = publishRate
        self.now = now
        publishes = PerKeyRate(rate: publishRate)
        touchTimer = loop.timer(after: 30, repeating: true) { [weak self] in self?.flushUsed() }
    }

    /// At shutdown, before the database closes: the keys used since the last flush are
    /// written down, and no flush runs after it.
    func stop() {
        flushUsed()
        touchTimer?.cancel()
        touchTimer = nil
    }

    /// Bumped by every invalidation: a lookup that was in flight across one (it may have read
    /// the key just before its revocation committed) answers its request but is not cached.
    private var generation = 0

    func invalidateAll() {
        cache.removeAll()
        refused.removeAll()
        generation += 1
    }

    func isEndedSession(_ hash: String) -> Bool { endedSessions.contains(hash) }

    func sessionEnded(_ hash: String) {
        if endedSessions.count >= Auth.maxCached { endedSessions.removeAll() }
        endedSessions.insert(hash)
    }

    static func secret(from req: HTTPRequest, allowQuery: Bool) -> String? {
        if let h = req.header("Authorization") { return bearerToken(h) }
        if allowQuery { return req.queryParameter("access_token") }
        return nil
    }

    /// What follows `Bearer ` (the scheme in any case) in an Authorization value, or nil.
    static func bearerToken(_ value: String) -> String? {
        let bytes = value.utf8
        guard let space = bytes.firstIndex(of: UInt8(ascii: " ")) else { return nil }
        let scheme = bytes[..<space]
        guard scheme.count == 6, zip(scheme, "bearer".utf8).allSatisfy({ $0 | 0x20 == $1 }) else { return nil }
        let token = value[bytes.index(after: space)...]
        return token.isEmpty ? nil : String(token)
    }

    /// The key of a secret this worker holds fresh, when it allows `scope`: the same answer
    /// `authenticate` would give, with no callback (nil: ask `authenticate`).
    func cachedKey(_ secret: String, allowing scope: Scope) -> APIKey? {
        guard let hit = cache[secret], let key = hit.key, now() - hit.fetched < ttl, key.allows(scope) else { return nil }
        used.insert(key.id)
        return key
    }

    func authenticate(_ secret: String?, needs scope: Scope, completion: @escaping (Result<APIKey, DispatchError>) -> Void) {
        authenticate(secret, needsAnyOf: [scope], completion: completion)
    }

    /// Succeeds when the key allows at least one of `scopes` (remote cancel: device, admin or publish).
    func authenticate(_ secret: String?, needsAnyOf scopes: [Scope], completion: @escaping (Result<APIKey, DispatchError>) -> Void) {
        guard let secret, !secret.isEmpty, secret.utf8.count <= 512 else {
            completion(.failure(DispatchError(.unauthorized, "an API key is required: Authorization: Bearer <key>")))
            return
        }
        let finish: (APIKey?) -> Void = { [weak self] key in
            guard let key else {
                return completion(.failure(DispatchError(.unauthorized, "the API key is not valid")))
            }
            guard scopes.contains(where: key.allows) else {
                let names = scopes.map(\.rawValue)
                let wanted = names.count == 1 ? names[0] : names.dropLast().joined(separator: ", ") + " or " + names.last!
                return completion(.failure(DispatchError(.forbidden, "this key lacks the \(wanted) scope")))
            }
            self?.used.insert(key.id)
            completion(.success(key))
        }
        // Cached by secret (process memory only), so the hot path hashes nothing; the
        // database only ever sees and stores the SHA-256.
        let now = self.now()
        if let hit = cache[secret], now - hit.fetched < ttl {
            return finish(hit.key)
        }
        if let at = refused[secret], now - at < ttl {
            return finish(nil)
        }
        if waiters[secret] != nil {
            waiters[secret]!.append { r in
                switch r {
                case .success(let k): finish(k)
                case .failure(let e): completion(.failure(e))
                }
            }
            return
        }
        waiters[secret] = []
        let startedIn = generation
        db.read(KeySQL.find(secretHash: SHA256.hex(Array(secret.utf8)))) { [weak self] result in
            guard let self else { return }
            let waiting = self.waiters.removeValue(forKey: secret) ?? []
            switch result {
            case .failure:
                // A failed lookup says nothing about the key: 503, not a cached 401.
                completion(.failure(Database.unavailable))
                for w in waiting { w(.failure(Database.unavailable)) }
            case .success(let r):
                let key = r.first.flatMap(APIKey.init(row:))
                if startedIn == self.generation {
                    if key == nil {
                        if self.refused.count >= Auth.maxCached { self.refused.removeAll() }
                        self.refused[secret] = self.now()
                    } else {
                        if self.cache.count >= Auth.maxCached { self.cache.removeAll() }
                        self.cache[secret] = (key, self.now())
                    }
                }
                finish(key)
                for w in waiting { w(.success(key)) }
            }
        }
    }

    /// Writes `last_used_at` for the keys used since the last flush; a failure is only logged.
    func flushUsed() {
        guard !used.isEmpty, db.reader.isReady else { return }
        let ids = Array(used)
        used.removeAll()
        db.reader.execute([KeySQL.touch(ids: ids)]) { [log] result in
            if case .success(let rs) = result, let e = rs[0].errorMessage {
                log.warning("keys.last_used_failed", [("error", e.trimmingNewlines)])
            }
        }
    }

    /// One sign-in attempt from `client`; the seconds to wait when refused. Checked before
    /// anything else, so a flood of attempts costs no database work.
    func takeSignIn(client: String, perMinute: Double) -> Double? {
        guard perMinute > 0 else { return nil }
        if signInsByClient == nil { signInsByClient = PerClientRate(rate: perMinute / 60, burst: perMinute) }
        return signInsByClient!.take(client, now: now())
    }

    /// One sign-in with the key `keyID`, once the key is known good.
    func takeSignIn(keyID: Int64, perMinute: Double) -> Double? {
        guard perMinute > 0 else { return nil }
        if signInsByKey == nil { signInsByKey = PerClientRate(rate: perMinute / 60, burst: perMinute) }
        return signInsByKey!.take(String(keyID), now: now())
    }

    /// Per-key publish rate; admin keys are not limited. Returns a refusal with Retry-After.
    func checkRate(_ key: APIKey) -> DispatchError? {
        guard publishRate > 0, !key.isAdmin else { return nil }
        guard let wait = publishes.take(key.id, now: now()) else { return nil }
        var e = DispatchError(.rateLimited, "publish rate limit of \(publishRate)/s for key \(key.name) exceeded")
        e.retryAfterSeconds = max(1, Int(wait.rounded(.up)))
        return e
    }
}
