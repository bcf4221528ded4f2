import DispatchCore
import DispatchIO
import DispatchSystem

/// Remote cancel and keeping an activity fresh (contract §5.3, §5.4).
extension API {
    /// `POST /v1/activities/{id}/cancel`: a `device` or `admin` key may cancel any activity, a
    /// `publish` key only one it started. The request goes through the publish path (one
    /// `cancel_requested` event, its webhook queued in the same transaction); `202` whether it
    /// was new or repeated (a repeat writes nothing), `409` once the activity has finished.
    /// Both carry the snapshot only to a key that may read.
    func cancel(_ req: HTTPRequest, _ id: String) {
        authenticated(req, anyOf: [.device, .admin, .publish]) { [unowned self] key in
            if let e = self.auth.checkRate(key) { return self.fail(req, e) }
            let body = req.body()
            // The body is optional: a bare `curl -X POST .../cancel` asks without a reason.
            if !body.isEmpty, let e = API.requireJSON(req) { return self.fail(req, e) }
            let reason: String?
            do throws(DispatchError) {
                reason = try Validation.cancel(body)
            } catch {
                return self.fail(req, error)
            }
            let anyActivity = key.isAdmin || key.scopes.contains(.device)
            // A key that may not read (a device-only key) learns that its request was taken,
            // never the activity: no snapshot in the 202, nor in the 409 of a finished one (§6).
            let mayRead = key.allows(.read)
            let accepted = KeyRules.cancelAccepted(activityID: id)
            let op = PublishOp(activityID: id, kind: .cancel(reason: reason, deliveryID: RandomID.uuid(using: &self.rng)),
                               ownerKeyID: key.id, access: anyActivity ? .anyActivity : .startedBy(keyID: key.id))
            self.publisher.submit(op) { [unowned self] outcome in
                switch outcome {
                case .committed(let json, _): self.reply(req, 202, mayRead ? json : accepted)
                case .ok(let a): self.reply(req, 202, mayRead ? a.json() : accepted)
                case .replay(let json): self.reply(req, 202, mayRead ? Array(json.utf8) : accepted)
                case .failed(let e): self.fail(req, KeyRules.visible(e, mayRead: mayRead))
                }
            }
        }
    }

    /// `POST /v1/activities/{id}/touch`: the owning publisher (or an admin) says "still alive".
    /// Renews the stale deadline only: no event, no history row; a push only when the phones'
    /// stale-date falls behind (§5.4). `204`; `404` unknown,
    /// `403` not the owner, `409` finished.
    func touch(_ req: HTTPRequest, _ id: String) {
        authenticated(req, .publish) { [unowned self] key in
            if let e = self.auth.checkRate(key) { return self.fail(req, e) }
            self.db.read(StaleSQL.touch(id, now: Clock.nowMilliseconds(), ownerKeyID: key.isAdmin ? nil : key.id)) { [unowned self] result in
                switch result {
                case .failure(let e):
                    self.fail(req, e)
                case .success(let r):
                    guard let row = r.first, let stored = StoredActivity(row: row) else {
                        return self.fail(req, DispatchError(.notFound, "no activity \(id)"))
                    }
                    if row.int("touched") == 1 {
                        // A deadline moved far enough past the phones' stale-date gets them a
                        // new one (contract §5.4; PushFanOutRepository.staleRefresh).
                        guard let devices = self.devices, devices.pushes, stored.staleAfter > 0 else { return self.reply(req, 204, []) }
                        return self.db.reader.execute([PushFanOutRepository.staleRefresh(id)]) { [unowned self] result in
                            if case .success(let rs) = result, (rs.first?.first?.int("refreshed") ?? 0) > 0 { devices.kick() }
                            self.reply(req, 204, [])
                        }
                    }
                    if stored.activity.state.isTerminal {
                        return self.fail(req, DispatchError(.alreadyFinished, "activity \(id) has already finished", snapshot: stored.activity))
                    }
                    self.fail(req, DispatchError(.forbidden, "this key did not start activity \(id)"))
                }
            }
        }
    }
}
