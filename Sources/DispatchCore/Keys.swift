/// A request to create an API key (`POST /v1/keys`, `dispatchd keys create`).
public struct KeySpec: Equatable, Sendable {
    public var name: String
    public var scopes: Set<Scope>
    public var machine: String?

    public init(name: String, scopes: Set<Scope>, machine: String?) throws(DispatchError) {
        guard Validation.isTag(name) else { throw DispatchError(.invalidField, "name must be 1-64 characters of A-Z a-z 0-9 . _ -") }
        guard !scopes.isEmpty else { throw DispatchError(.invalidField, "at least one scope is required") }
        if let m = machine {
            // The same rule as an activity's machine tag: a bound key stamps it on what it starts.
            guard Validation.isTag(m) else { throw DispatchError(.invalidField, "machine must be 1-64 characters of A-Z a-z 0-9 . _ -") }
        }
        self.name = name
        self.scopes = scopes
        self.machine = machine
    }

    public static func parse(_ body: [UInt8]) throws(DispatchError) -> KeySpec {
        let f = try Validation.object(body, allowed: ["name", "scopes", "machine"])
        guard case .string(let name)? = f["name"] else { throw DispatchError(.missingField, "name is required") }
        guard case .array(let items)? = f["scopes"] else { throw DispatchError(.missingField, "scopes is required (publish, read, device, admin)") }
        var scopes: Set<Scope> = []
        for item in items {
            guard case .string(let s) = item, let scope = Scope(rawValue: s) else {
                throw DispatchError(.invalidField, "scopes must be among publish, read, device, admin")
            }
            scopes.insert(scope)
        }
        var machine: String?
        switch f["machine"] {
        case nil, .null?: break
        case .string(let m)?: machine = m
        default: throw DispatchError(.invalidField, "machine must be a string")
        }
        return try KeySpec(name: name, scopes: scopes, machine: machine)
    }
}

/// The opaque `cursor` of a list page: the last item's creation time and id.
public struct ListCursor: Equatable, Sendable {
    public var createdAt: Int64
    public var activityId: String

    public init(createdAt: Int64, activityId: String) {
        self.createdAt = createdAt
        self.activityId = activityId
    }

    public func encode() -> String { "\(createdAt)_\(activityId)" }

    public static func decode(_ s: String) -> ListCursor? {
        guard let sep = s.firstIndex(of: "_"), let t = Int64(s[..<sep]) else { return nil }
        let id = String(s[s.index(after: sep)...])
        guard Validation.isValidActivityID(id) else { return nil }
        return ListCursor(createdAt: t, activityId: id)
    }
}
