import DispatchCore
import DispatchCrypto
import DispatchIO

/// `/v1/keys`: admin only.
extension API {
    func listKeys(_ req: HTTPRequest) {
        authenticated(req, .admin) { [unowned self] _ in
            self.db.read(KeySQL.list) { result in
                switch result {
                case .failure(let e): self.fail(req, e)
                case .success(let r):
                    var w = JSONWriter()
                    w.beginObject(); w.key("keys"); w.beginArray()
                    for row in r.rows { KeyListing(row: row).write(to: &w) }
                    w.endArray(); w.endObject()
                    self.reply(req, 200, w.bytes)
                }
            }
        }
    }

    func createKey(_ req: HTTPRequest) {
        authenticated(req, .admin) { [unowned self] _ in
            if let e = API.requireJSON(req) { return self.fail(req, e) }
            let spec: KeySpec
            do throws(DispatchError) { spec = try KeySpec.parse(req.body()) } catch { return self.fail(req, error) }
            let secret = RandomID.secret(using: &self.rng)
            self.db.read(KeySQL.create(spec, secretHash: SHA256.hex(Array(secret.utf8)))) { result in
                switch result {
                case .failure(let e): self.fail(req, e)
                case .success(let r) where r.rows.isEmpty: self.fail(req, DispatchError(.conflict, "a key named \(spec.name) exists"))
                case .success:
                    self.log.info("keys.created", [("name", spec.name), ("scopes", spec.scopes.map(\.rawValue).sorted().joined(separator: ","))])
                    var w = JSONWriter()
                    w.beginObject(); w.field("name", spec.name); w.field("secret", secret); w.key("scopes"); w.beginArray()
                    for s in spec.scopes.map(\.rawValue).sorted() { w.string(s) }
                    w.endArray(); w.field("machine", spec.machine); w.endObject()
                    self.reply(req, 201, w.bytes)
                }
            }
        }
    }

    func revokeKey(_ req: HTTPRequest, name: String) {
        authenticated(req, .admin) { [unowned self] _ in
            self.db.read(KeySQL.revoke(name: name)) { result in
                switch result {
                case .failure(let e): self.fail(req, e)
                case .success(let r) where r.rows.isEmpty: self.fail(req, DispatchError(.notFound, "no active key named \(name)"))
                case .success(let r):
                    // This worker stops accepting the key and ends its streams before it answers;
                    // the others hear the NOTIFY sent in the same transaction.
                    self.auth.invalidateAll()
                    if let id = r.first?.int64("id") { self.onKeyRevoked(id) }
                    self.log.info("keys.revoked", [("name", name)])
                    self.reply(req, 200, Array(#"{"revoked":true}"#.utf8))
                }
            }
        }
    }
}
