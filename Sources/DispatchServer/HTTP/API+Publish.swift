import DispatchCore
import DispatchIO

/// The three publishing calls of contract §2.
enum PublishCall {
    case start
    case update(String)
    case end(String)
}

extension API {
    func publish(_ req: HTTPRequest, _ call: PublishCall) {
        authenticated(req, .publish) { [unowned self] key in
            if let e = self.auth.checkRate(key) { return self.fail(req, e) }
            if let e = API.requireJSON(req) { return self.fail(req, e) }
            let idempotencyKey = req.header("Idempotency-Key")
            if let k = idempotencyKey, !(1...128).contains(k.utf8.count) || !k.utf8.allSatisfy({ (0x21...0x7E).contains($0) }) {
                return self.fail(req, DispatchError(.invalidField, "Idempotency-Key must be 1-128 printable characters"))
            }
            let body = req.body()
            let kind: PublishOp.Kind
            let activityID: String
            do throws(DispatchError) {
                switch call {
                case .start:
                    var cmd = try Validation.start(body)
                    if let bound = key.machine, !key.isAdmin {
                        if let m = cmd.machine, m != bound {
                            throw DispatchError(.forbidden, "this key may only publish for machine \(bound)")
                        }
                        cmd.machine = bound
                    }
                    activityID = cmd.activityId ?? RandomID.uuid(using: &self.rng)
                    kind = .start(cmd)
                case .update(let id):
                    activityID = id
                    kind = .update(try Validation.update(body))
                case .end(let id):
                    activityID = id
                    kind = .end(try Validation.end(body))
                }
            } catch {
                return self.fail(req, error)
            }
            let op = PublishOp(activityID: activityID, kind: kind, idempotencyKey: idempotencyKey, ownerKeyID: key.id,
                               access: key.isAdmin ? .anyActivity : .startedBy(keyID: key.id))
            self.publisher.submit(op) { [unowned self] outcome in
                switch outcome {
                case .committed(let json, let created): self.reply(req, created ? 201 : 200, json)
                case .ok(let a): self.reply(req, 200, a.json())
                case .replay(let json): self.reply(req, 200, Array(json.utf8))
                case .failed(let e): self.fail(req, e)
                }
            }
        }
    }
}
