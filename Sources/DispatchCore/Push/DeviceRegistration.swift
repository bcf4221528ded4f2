/// APNs tokens as the devices API receives them (contract §5.1): hex, an even number of
/// digits, 16–256 bytes once decoded. Any case is accepted; lower case is what is stored,
/// looked up and sent, so a token registered in capitals is the same token.
public enum PushToken {
    public static let minBytes = 16
    public static let maxBytes = 256

    /// `text` in lower-case hex, or a 400 naming `field`.
    public static func validate(_ text: String, field: String) throws(DispatchError) -> String {
        guard isValid(text) else {
            throw DispatchError(.invalidField, "\(field) must be a hex string of \(minBytes * 2)-\(maxBytes * 2) digits (an even number)")
        }
        return text.lowercased()
    }

    public static func isValid(_ text: String) -> Bool {
        let u = text.utf8
        guard u.count % 2 == 0, (minBytes * 2...maxBytes * 2).contains(u.count) else { return false }
        return u.allSatisfy { (0x30...0x39).contains($0) || (0x41...0x46).contains($0) || (0x61...0x66).contains($0) }
    }

    /// What listings and logs show of a token: its last four digits. Never more.
    public static func hint(_ hex: String) -> String { "…" + hex.suffix(4) }
}

/// The APNs environment of an app build (contract §5.1): a development build's tokens work
/// only in the sandbox, a TestFlight or App Store build's only in production.
public enum APNsEnvironment: String, Sendable, CaseIterable {
    case production, sandbox

    /// Where a token APNs called bad in this environment is tried once more.
    public var other: APNsEnvironment {
        switch self {
        case .production: return .sandbox
        case .sandbox: return .production
        }
    }
}

/// A `POST /v1/activity-tokens` body, validated: the device, and what changes for it.
public struct DeviceRegistration: Equatable, Sendable {
    public enum Change: Equatable, Sendable {
        /// A token (lower-case hex) that replaces whatever was registered.
        case set(String)
        /// `null`: forget the token and cancel its pending pushes.
        case forget
    }

    public struct ActivityToken: Equatable, Sendable {
        public var activityID: String
        public var change: Change

        public init(activityID: String, change: Change) {
            self.activityID = activityID
            self.change = change
        }
    }

    /// At most this many activity tokens in one call (a phone shows a handful at a time).
    public static let maxActivityTokens = 64

    public var deviceToken: String
    /// nil: the push-to-start token stays as it is.
    public var pushToStart: Change?
    /// In the body's order; an activity named twice is refused (JSON objects' keys are unique).
    public var activityTokens: [ActivityToken]
    /// nil: production for a new device, unchanged for a known one.
    public var environment: APNsEnvironment?

    public init(deviceToken: String, pushToStart: Change? = nil, activityTokens: [ActivityToken] = []) {
        self.deviceToken = deviceToken
        self.pushToStart = pushToStart
        self.activityTokens = activityTokens
    }

    public static func parse(_ body: [UInt8]) throws(DispatchError) -> DeviceRegistration {
        let fields = try Validation.object(body, allowed: ["deviceToken", "pushToStartToken", "activityTokens", "environment"])
        guard case .string(let device)? = fields["deviceToken"] else {
            if fields["deviceToken"] == nil { throw DispatchError(.missingField, "deviceToken is required") }
            throw DispatchError(.invalidField, "deviceToken must be a hex string")
        }
        var registration = DeviceRegistration(deviceToken: try PushToken.validate(device, field: "deviceToken"))
        switch fields["pushToStartToken"] {
        case nil: break
        case .null?: registration.pushToStart = .forget
        case .string(let t)?: registration.pushToStart = .set(try PushToken.validate(t, field: "pushToStartToken"))
        case let other?: throw DispatchError(.invalidField, "pushToStartToken must be a hex string or null, not \(other.typeName)")
        }
        switch fields["environment"] {
        case nil, .null?: break
        case .string(let e)?:
            guard let env = APNsEnvironment(rawValue: e) else {
                throw DispatchError(.invalidField, "environment must be production or sandbox (the app build's APNs environment), not \(e)")
            }
            registration.environment = env
        case let other?: throw DispatchError(.invalidField, "environment must be production or sandbox, not \(other.typeName)")
        }
        switch fields["activityTokens"] {
        case nil, .null?: break
        case .object(let members)?:
            guard members.count <= maxActivityTokens else {
                throw DispatchError(.invalidField, "activityTokens may name at most \(maxActivityTokens) activities")
            }
            for (id, value) in members {
                guard Validation.isValidActivityID(id) else {
                    throw DispatchError(.invalidField, "activityTokens keys must be activity ids (1-128 characters of A-Z a-z 0-9 . _ : -)")
                }
                switch value {
                case .null:
                    registration.activityTokens.append(ActivityToken(activityID: id, change: .forget))
                case .string(let t):
                    let token = try PushToken.validate(t, field: "activityTokens.\(id)")
                    registration.activityTokens.append(ActivityToken(activityID: id, change: .set(token)))
                default:
                    throw DispatchError(.invalidField, "activityTokens.\(id) must be a hex string or null, not \(value.typeName)")
                }
            }
        case let other?:
            throw DispatchError(.invalidField, "activityTokens must be an object of activity id to token, not \(other.typeName)")
        }
        return registration
    }
}
