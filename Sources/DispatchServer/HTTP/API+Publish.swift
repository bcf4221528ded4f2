import DispatchCore
import DispatchIO

/// The three publishing calls of contract §2 (and §2.1's many changes in one request, below).
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
            if let k = idempotencyKey, !ChangeBatch.isValidIdempotencyKey(k) { return self.fail(req, ChangeBatch.invalidIdempotencyKey) }
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

    /// `POST /v1/changes` (§2.1): each change checked as its single call, the accepted ones
    /// submitted in request order, one answer once every one is answered. The request takes one
    /// token of the key's publish rate, as one call.
    func publishChanges(_ req: HTTPRequest) {
        authenticated(req, .publish) { [unowned self] key in
            if let e = self.auth.checkRate(key) { return self.fail(req, e) }
            if let e = API.requireJSON(req) { return self.fail(req, e) }
            let parsed: [Result<ChangeBatch.Change, DispatchError>]
            do throws(DispatchError) {
                parsed = try ChangeBatch.parse(req.body(), boundMachine: key.isAdmin ? nil : key.machine,
                                               newID: { RandomID.uuid(using: &self.rng) })
            } catch {
                return self.fail(req, error)
            }
            let access: PublishAccess = key.isAdmin ? .anyActivity : .startedBy(keyID: key.id)
            var ops: [PublishOp] = []
            ops.reserveCapacity(parsed.count)
            for case .success(let c) in parsed {
                ops.append(PublishOp(activityID: c.activityID, kind: c.kind, idempotencyKey: c.idempotencyKey, ownerKeyID: key.id, access: access))
            }
            self.publisher.submitAll(ops) { [unowned self] outcomes in
                var next = outcomes.makeIterator()
                let results = parsed.map { entry -> Result<PublishOp.Outcome, DispatchError> in
                    switch entry {
                    case .success: return .success(next.next()!)
                    case .failure(let e): return .failure(e)
                    }
                }
                self.reply(req, 200, ChangeBatch.answer(results))
            }
        }
    }
}
