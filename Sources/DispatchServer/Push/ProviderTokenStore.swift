import DispatchCore
import DispatchCrypto
import DispatchIO
import DispatchSystem

/// The deployment's one provider token (contract §5.2), shared through
/// `apns_provider_tokens` (Migrations/0011): a sender reads it; one that finds none usable
/// takes a session advisory lock, reads again (another process may have just made it), and
/// only then makes and stores a new one. So N servers × M workers make one JWT per renewal,
/// not N·M. The JWT is sealed like device tokens: the table alone does not let anyone push.
final class ProviderTokenStore {
    struct Token: Equatable {
        let jwt: String
        /// Its `iat`, Unix seconds.
        let issuedAt: Int64
        /// Sending is paused deployment-wide until then (Unix seconds).
        let pausedUntil: Int64?
    }

    enum Failure: Error { case database(String), signing(String) }

    /// The renewal's session lock id (`AdvisoryLock.apnsProviderToken`).
    static let lockKey = AdvisoryLock.apnsProviderToken.rawValue

    private let db: PGConnection
    private let settings: APNsSettings
    private let signer: ES256Signer
    private let vault: TokenVault
    private let policy: ProviderTokenPolicy
    private let log: Logger
    /// Unix seconds (the new token's `iat`).
    private let clock: () -> Double
    /// Callers waiting on the obtain in flight: one at a time per process (the advisory lock is
    /// reentrant within a session, so two renewals on this connection would both make a JWT).
    private var waiting: [(Result<Token, Failure>) -> Void]?

    init(db: PGConnection, settings: APNsSettings, signer: ES256Signer, vault: TokenVault, policy: ProviderTokenPolicy, log: Logger,
         clock: @escaping () -> Double) {
        self.db = db
        self.clock = clock
        self.settings = settings
        self.signer = signer
        self.vault = vault
        self.policy = policy
        self.log = log
    }

    /// The token to send with. `refused`: the JWT APNs just refused (a stored token equal to
    /// it is not usable); `now` in Unix seconds.
    func obtain(refused: String?, now: Int64, completion: @escaping (Result<Token, Failure>) -> Void) {
        if waiting != nil {
            waiting?.append(completion)
            return
        }
        waiting = [completion]
        let finish: (Result<Token, Failure>) -> Void = { [weak self] result in
            guard let self else { return }
            let all = self.waiting ?? []
            self.waiting = nil
            for c in all { c(result) }
        }
        db.execute([read]) { [weak self] result in
            guard let self else { return }
            switch self.decode(result) {
            case .failure(let e): finish(.failure(e))
            case .success(let row?) where self.usable(row, refused: refused, now: now): finish(.success(row))
            case .success: self.renew(refused: refused, completion: finish)
            }
        }
    }

    /// Under the lock: the stored token if someone made a usable one meanwhile, else a new one.
    private func renew(refused: String?, completion: @escaping (Result<Token, Failure>) -> Void) {
        db.execute([PGQuery("SELECT \(AdvisoryLock.apnsProviderToken.sessionLock)", name: "apns_token_lock"), read]) { [weak self] result in
            guard let self else { return }
            let now = Int64(self.clock())
            switch self.decode(result) {
            case .failure(let e):
                self.unlock()
                completion(.failure(e))
            case .success(let row?) where self.usable(row, refused: refused, now: now):
                self.unlock()
                completion(.success(row))
            case .success(let row):
                let jwt: String, sealed: TokenVault.Sealed
                do {
                    jwt = try APNsRequest.providerToken(keyID: self.settings.keyID, teamID: self.settings.teamID, issuedAt: now, signer: self.signer)
                    sealed = try self.vault.sealText(jwt)
                } catch {
                    self.unlock()
                    return completion(.failure(.signing("\(error)")))
                }
                // The store commits at its own sync, before the unlock: in one batch (one
                // implicit transaction) the lock would go first, and a waiting process would
                // read the table before the commit and make a second JWT.
                self.db.execute([self.store(sealed, issuedAt: now)]) { result in
                    guard case .success(let rs) = result, rs.allSatisfy(\.ok) else {
                        return completion(.failure(.database("storing the provider token failed")))
                    }
                    self.log.info("apns.provider_token", [("iat", now), ("previous_age_s", row.map { now - $0.issuedAt } ?? -1),
                                                          ("why", refused == nil ? "due" : "refused")])
                    completion(.success(Token(jwt: jwt, issuedAt: now, pausedUntil: row?.pausedUntil)))
                }
                self.unlock()
            }
        }
    }

    /// Sending paused deployment-wide until `until` (Unix seconds): `TooManyProviderTokenUpdates`.
    func pause(until: Int64) {
        db.execute([PGQuery("""
            UPDATE apns_provider_tokens SET paused_until = GREATEST(coalesce(paused_until, 0), $3::bigint)
            WHERE team_id = $1 AND key_id = $2
            """, [settings.teamID, settings.keyID, String(until)], name: "apns_token_pause")]) { _ in }
    }

    private func usable(_ t: Token, refused: String?, now: Int64) -> Bool {
        t.jwt != refused && !policy.isDue(mintedAt: Double(t.issuedAt), now: Double(now))
    }

    private var read: PGQuery {
        PGQuery("SELECT jwt_mac, jwt_sealed, issued_at, paused_until FROM apns_provider_tokens WHERE team_id = $1 AND key_id = $2",
                [settings.teamID, settings.keyID], name: "apns_token_read")
    }

    private func store(_ sealed: TokenVault.Sealed, issuedAt: Int64) -> PGQuery {
        PGQuery("""
            INSERT INTO apns_provider_tokens AS t (team_id, key_id, jwt_mac, jwt_sealed, issued_at) VALUES ($1, $2, $3::bytea, $4::bytea, $5::bigint)
            ON CONFLICT (team_id, key_id) DO UPDATE SET jwt_mac = EXCLUDED.jwt_mac, jwt_sealed = EXCLUDED.jwt_sealed,
              issued_at = EXCLUDED.issued_at
            """, [settings.teamID, settings.keyID, Bytea.literal(sealed.mac), Bytea.literal(sealed.sealed), String(issuedAt)],
            name: "apns_token_store")
    }

    private var unlockQuery: PGQuery {
        PGQuery("SELECT \(AdvisoryLock.apnsProviderToken.sessionUnlock)", name: "apns_token_unlock")
    }

    private func unlock() { db.execute([unlockQuery]) { _ in } }

    /// The stored token of a `read` (the last result of the batch), nil when there is none;
    /// one that does not open under this token key counts as none (it is replaced).
    private func decode(_ result: Result<[PGResult], PGError>) -> Result<Token?, Failure> {
        guard case .success(let rs) = result, let r = rs.last, rs.allSatisfy(\.ok) else {
            return .failure(.database("reading the provider token failed"))
        }
        guard let row = r.first, let mac = Bytea.decode(row["jwt_mac"]), let sealed = Bytea.decode(row["jwt_sealed"]),
              let jwt = vault.openText(sealed, mac: mac), let iat = row.int64("issued_at") else { return .success(nil) }
        return .success(Token(jwt: jwt, issuedAt: iat, pausedUntil: row.int64("paused_until")))
    }
}
