/// `POST /v1/changes` (contract §2.1), its pure parts: the body's shape, each change checked
/// exactly as its single call checks its body, path and Idempotency-Key header, and the answer.
/// A body that is not this shape is refused as a whole (thrown); a change that fails its own
/// checks is refused alone (its entry is the error the single call would have answered).
public enum ChangeBatch {
    public static let maxChanges = 1000
    /// The whole request's body (a single call keeps `Validation.maxBodyBytes`).
    public static let maxBodyBytes = 1 << 20

    /// One change ready to submit, as its single call would have submitted it.
    public struct Change: Equatable, Sendable {
        public let activityID: String
        public let kind: PublishOp.Kind
        public let idempotencyKey: String?

        public init(activityID: String, kind: PublishOp.Kind, idempotencyKey: String?) {
            self.activityID = activityID
            self.kind = kind
            self.idempotencyKey = idempotencyKey
        }
    }

    /// What an `Idempotency-Key` header (or a change's `idempotencyKey`) must be.
    public static func isValidIdempotencyKey(_ k: String) -> Bool {
        (1...128).contains(k.utf8.count) && k.utf8.allSatisfy { (0x21...0x7E).contains($0) }
    }

    public static let invalidIdempotencyKey = DispatchError(.invalidField, "Idempotency-Key must be 1-128 printable characters")

    /// The body: thrown when it is not `{"changes": [1 to 1,000 items]}` within 1 MiB, else one
    /// entry per change in request order. `boundMachine`: the machine a non-admin key is bound to
    /// (its starts get it; naming another is 403). `newID` draws a start's id when it names none.
    public static func parse(_ body: [UInt8], boundMachine: String?, newID: () -> String) throws(DispatchError) -> [Result<Change, DispatchError>] {
        let members = try Validation.members(body, of: "a JSON object: {\"changes\": [...]}", limit: maxBodyBytes)
        let top = try Validation.fields(members, allowed: ["changes"])
        guard let list = top["changes"] else { throw DispatchError(.missingField, "changes is required: an array of 1 to \(maxChanges) changes") }
        guard case .array(let items) = list else {
            throw DispatchError(.invalidField, "changes must be an array of 1 to \(maxChanges) changes, not \(list.typeName)")
        }
        guard !items.isEmpty else { throw DispatchError(.invalidField, "changes must hold 1 to \(maxChanges) changes, not 0") }
        guard items.count <= maxChanges else {
            throw DispatchError(.bodyTooLarge, "changes holds \(items.count) changes; at most \(maxChanges) per request")
        }
        return items.map { change($0, boundMachine: boundMachine, newID: newID) }
    }

    /// One change: `op`, `activityId` (optional for a start), `idempotencyKey?`, and the fields of that call.
    public static func change(_ value: JSONValue, boundMachine: String?, newID: () -> String) -> Result<Change, DispatchError> {
        do throws(DispatchError) {
            guard case .object(let members) = value else {
                throw DispatchError(.invalidJSON, "each change must be a JSON object, not \(value.typeName)")
            }
            guard let opValue = members.last(where: { $0.0 == "op" })?.1 else {
                throw DispatchError(.missingField, "op is required: start, update or end")
            }
            guard case .string(let op) = opValue, let call = Call(rawValue: op) else {
                throw DispatchError(.invalidField, "op must be start, update or end")
            }
            var fields = try Validation.fields(members, allowed: call.fields.union(["op", "activityId", "idempotencyKey"]))
            fields["op"] = nil
            var idempotencyKey: String?
            switch fields.removeValue(forKey: "idempotencyKey") {
            case nil, .null?: break
            case .string(let k)? where isValidIdempotencyKey(k): idempotencyKey = k
            case _?: throw invalidIdempotencyKey
            }
            switch call {
            case .start:
                var cmd = try Validation.start(fields: fields)
                if let bound = boundMachine {
                    if let m = cmd.machine, m != bound { throw DispatchError(.forbidden, "this key may only publish for machine \(bound)") }
                    cmd.machine = bound
                }
                return .success(Change(activityID: cmd.activityId ?? newID(), kind: .start(cmd), idempotencyKey: idempotencyKey))
            case .update, .end:
                guard let idValue = fields.removeValue(forKey: "activityId"), idValue != .null else {
                    throw DispatchError(.missingField, "activityId is required for \(call.rawValue)")
                }
                guard case .string(let id) = idValue, Validation.isValidActivityID(id) else {
                    throw DispatchError(.invalidField, "activity id must be 1-128 characters of A-Z a-z 0-9 . _ : -")
                }
                let kind: PublishOp.Kind = call == .update ? .update(try Validation.update(fields: fields)) : .end(try Validation.end(fields: fields))
                return .success(Change(activityID: id, kind: kind, idempotencyKey: idempotencyKey))
            }
        } catch {
            return .failure(error)
        }
    }

    enum Call: String {
        case start, update, end

        var fields: Set<String> {
            switch self {
            case .start: return Validation.startFields
            case .update: return Validation.updateFields
            case .end: return Validation.endFields
            }
        }
    }

    /// `{"results": [...]}`: per change `{"status", "snapshot"}`, or `{"status", "error"}` (and the
    /// stored `activity` a 409 carries), the status and body its single call would have answered.
    public static func answer(_ results: [Result<PublishOp.Outcome, DispatchError>]) -> [UInt8] {
        var w = JSONWriter(capacity: 64 + results.count * 512)
        w.beginObject()
        w.key("results")
        w.beginArray()
        for result in results {
            w.beginObject()
            switch result {
            case .success(.committed(let json, let created)):
                w.field("status", Int64(created ? 201 : 200))
                w.key("snapshot")
                w.raw(json)
            case .success(.ok(let activity)):
                w.field("status", Int64(200))
                w.key("snapshot")
                w.raw(activity.json())
            case .success(.replay(let json)):
                w.field("status", Int64(200))
                w.key("snapshot")
                w.raw(Array(json.utf8))
            case .success(.failed(let e)), .failure(let e):
                w.field("status", Int64(e.httpStatus))
                w.key("error")
                w.beginObject()
                w.field("code", e.code.rawValue)
                w.field("message", e.message)
                w.endObject()
                if let snapshot = e.snapshot {
                    w.key("activity")
                    w.raw(snapshot.json())
                }
            }
            w.endObject()
        }
        w.endArray()
        w.endObject()
        return w.bytes
    }
}
