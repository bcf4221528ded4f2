/// Every error a client can see: a stable machine-readable code mapped to one HTTP status here.
public struct DispatchError: Error, Equatable, Sendable {
    public enum Code: String, Sendable, CaseIterable {
        case invalidJSON = "invalid_json"
        case invalidField = "invalid_field"
        case unknownField = "unknown_field"
        case missingField = "missing_field"
        case invalidQuery = "invalid_query"
        case notFound = "not_found"
        case alreadyFinished = "already_finished"
        case conflict = "conflict"
        case invalidTransition = "invalid_transition"
        /// Others kept changing the activity first: transient, retry (with Retry-After).
        case concurrentChanges = "concurrent_changes"
        case bodyTooLarge = "body_too_large"
        case unsupportedMediaType = "unsupported_media_type"
        case unauthorized = "unauthorized"
        case forbidden = "forbidden"
        case methodNotAllowed = "method_not_allowed"
        case rateLimited = "rate_limited"
        case tooManyStreams = "too_many_streams"
        /// The key holds `DISPATCH_MAX_LIVE_PER_KEY` live activities (contract §6).
        case tooManyLiveActivities = "too_many_live_activities"
        /// The key finished `DISPATCH_MAX_FINISHED_PER_KEY` activities in the last 24 hours
        /// (issue 36: one key's churn must not grow every feed's initial set).
        case tooManyFinishedActivities = "too_many_finished_activities"
        /// The key registered `DISPATCH_MAX_DEVICES_PER_KEY` devices (contract §6).
        case tooManyDevices = "too_many_devices"
        /// The key holds `DISPATCH_MAX_SESSIONS_PER_KEY` browser sessions (contract §7).
        case tooManySessions = "too_many_sessions"
        case databaseUnavailable = "database_unavailable"
        case internalError = "internal"
    }

    public let code: Code
    public let message: String
    /// For 409 answers: the stored snapshot the request conflicted with.
    public var snapshot: Activity?
    /// For 429 answers: seconds until a retry can succeed.
    public var retryAfterSeconds: Int?

    public init(_ code: Code, _ message: String, snapshot: Activity? = nil) {
        self.code = code
        self.message = message
        self.snapshot = snapshot
    }

    public var httpStatus: Int {
        switch code {
        case .invalidJSON, .invalidField, .unknownField, .missingField, .invalidQuery: return 400
        case .unauthorized: return 401
        case .forbidden: return 403
        case .notFound: return 404
        case .methodNotAllowed: return 405
        case .alreadyFinished, .conflict, .invalidTransition, .concurrentChanges: return 409
        case .bodyTooLarge: return 413
        case .unsupportedMediaType: return 415
        case .rateLimited, .tooManyStreams, .tooManyLiveActivities, .tooManyFinishedActivities, .tooManyDevices, .tooManySessions: return 429
        case .internalError: return 500
        case .databaseUnavailable: return 503
        }
    }

    /// `{"error":{"code":"...","message":"..."}}`, plus the stored snapshot on a conflict.
    public func jsonBody() -> [UInt8] {
        var w = JSONWriter()
        w.beginObject()
        w.key("error")
        w.beginObject()
        w.field("code", code.rawValue)
        w.field("message", message)
        w.endObject()
        if let snapshot {
            w.key("activity")
            w.raw(snapshot.json())
        }
        w.endObject()
        return w.bytes
    }
}
