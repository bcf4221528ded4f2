import DispatchCore
import DispatchIO

/// An API key as authentication sees it (never its secret).
struct APIKey {
    let id: Int64
    let name: String
    let scopes: Set<Scope>
    let machine: String?
    /// When a browser session's cookie authenticated the request: the SHA-256 of its secret,
    /// so that the streams it opens end with it.
    var sessionHash: String?

    func allows(_ needed: Scope) -> Bool {
        if scopes.contains(.admin) { return true }
        if needed == .read && scopes.contains(.publish) { return true }
        return scopes.contains(needed)
    }

    var isAdmin: Bool { scopes.contains(.admin) }

    init(id: Int64, name: String, scopes: Set<Scope>, machine: String?) {
        self.id = id
        self.name = name
        self.scopes = scopes
        self.machine = machine
    }

    init?(row r: PGRow) {
        guard let id = r.int64("id"), let name = r["name"] else { return nil }
        self.init(id: id, name: name, scopes: Scope.parseList(r["scopes"] ?? "") ?? [], machine: r["machine"])
    }
}

/// All SQL on `api_keys`, as statements both the event loop's connections and the blocking
/// admin commands run. Only the SHA-256 of a secret is ever stored or compared.
enum KeySQL {
    static func find(secretHash: String) -> PGQuery {
        PGQuery("""
            SELECT id, name, array_to_string(scopes, ',') AS scopes, machine FROM api_keys
            WHERE secret_hash = $1 AND revoked_at IS NULL
            """, [secretHash], name: "auth_key")
    }

    /// Marks keys used; best effort, batched, never on a request's path.
    static func touch(ids: [Int64]) -> PGQuery {
        PGQuery("UPDATE api_keys SET last_used_at = now() WHERE id = ANY($1::bigint[])",
                ["{" + ids.map(String.init).joined(separator: ",") + "}"], name: "touch_keys")
    }

    static let list = PGQuery("""
        SELECT name, array_to_string(scopes, ',') AS scopes, machine,
               (extract(epoch FROM created_at) * 1000)::bigint AS created_ms,
               (extract(epoch FROM last_used_at) * 1000)::bigint AS last_used_ms,
               (extract(epoch FROM revoked_at) * 1000)::bigint AS revoked_ms
        FROM api_keys ORDER BY id
        """)

    /// Creates a key; no row comes back when the name is taken.
    static func create(_ spec: KeySpec, secretHash: String) -> PGQuery {
        PGQuery("""
            INSERT INTO api_keys (name, secret_hash, scopes, machine) VALUES ($1, $2, string_to_array($3, ','), $4)
            ON CONFLICT (name) DO NOTHING RETURNING id
            """, [spec.name, secretHash, spec.scopes.map(\.rawValue).sorted().joined(separator: ","), spec.machine])
    }

    /// Revokes a key and tells every server process in the same transaction; no row comes back
    /// when there is no active key of that name.
    static func revoke(name: String) -> PGQuery {
        PGQuery("""
            WITH r AS (UPDATE api_keys SET revoked_at = now() WHERE name = $1 AND revoked_at IS NULL RETURNING id)
            SELECT id, pg_notify('\(Channel.keys)', id::text) FROM r
            """, [name])
    }

    /// Which of these keys are revoked (or gone): after a LISTEN session was lost, the
    /// revocations it missed.
    static func revoked(among ids: [Int64]) -> PGQuery {
        PGQuery("""
            SELECT k.id FROM unnest($1::bigint[]) AS k(id)
            WHERE NOT EXISTS (SELECT 1 FROM api_keys a WHERE a.id = k.id AND a.revoked_at IS NULL)
            """, ["{" + ids.map(String.init).joined(separator: ",") + "}"])
    }

    /// The bootstrap or development admin key with exactly this secret. A revoked one stays
    /// revoked unless its secret changed: restarting must not undo a revocation.
    static func ensureAdmin(name: String, secretHash: String) -> PGQuery {
        PGQuery("""
            INSERT INTO api_keys AS k (name, secret_hash, scopes) VALUES ($1, $2, '{admin}')
            ON CONFLICT (name) DO UPDATE SET secret_hash = EXCLUDED.secret_hash, scopes = '{admin}',
                revoked_at = CASE WHEN k.secret_hash = EXCLUDED.secret_hash THEN k.revoked_at END
            """, [name, secretHash])
    }
}

/// One row of the key list, as `/v1/keys` and `dispatchd keys list` show it.
struct KeyListing {
    let name: String
    let scopes: [String]
    let machine: String?
    let createdMs: Int64?
    let lastUsedMs: Int64?
    let revokedMs: Int64?

    init(row r: PGRow) {
        name = r["name"] ?? ""
        scopes = (r["scopes"] ?? "").split(separator: ",").map(String.init)
        machine = r["machine"]
        createdMs = r.int64("created_ms")
        lastUsedMs = r.int64("last_used_ms")
        revokedMs = r.int64("revoked_ms")
    }

    func write(to w: inout JSONWriter) {
        w.beginObject()
        w.field("name", name)
        w.key("scopes"); w.beginArray(); for s in scopes { w.string(s) }; w.endArray()
        w.field("machine", machine)
        w.field("createdAt", createdMs.map { Timestamp.format(milliseconds: $0) })
        w.field("lastUsedAt", lastUsedMs.map { Timestamp.format(milliseconds: $0) })
        w.field("revokedAt", revokedMs.map { Timestamp.format(milliseconds: $0) })
        w.endObject()
    }
}
