import DispatchCore

/// Remote cancel and staying fresh, as the CLI decides them: `cancel`, `touch`,
/// `verify-webhook`, and what `run` does when its activity is cancelled.

public struct CLICancelOptions: Equatable, Sendable {
    public var activityID: String
    public var reason: String?

    public init(activityID: String, reason: String? = nil) {
        self.activityID = activityID
        self.reason = reason
    }
}

public struct CLIVerifyWebhookOptions: Equatable, Sendable {
    public static let defaultMaxAge = 300.0

    public var secret: String
    /// The `Dispatch-Signature` header's value.
    public var signature: String
    /// A file holding the request body exactly as received; `-` for stdin.
    public var bodyPath: String
    /// Seconds a signature stays acceptable (either side of now); 0: no check.
    public var maxAge: Double

    public init(secret: String, signature: String, bodyPath: String, maxAge: Double = defaultMaxAge) {
        self.secret = secret
        self.signature = signature
        self.bodyPath = bodyPath
        self.maxAge = maxAge
    }
}

extension CLIRequestBody {
    /// `POST /v1/activities/{id}/cancel`.
    public static func cancel(_ o: CLICancelOptions) -> [UInt8] {
        var w = JSONWriter()
        w.beginObject()
        if let r = o.reason { w.field("reason", r) }
        w.endObject()
        return w.bytes
    }
}

/// Checks a cancel webhook's `Dispatch-Signature` (docs/webhooks.md): the header parses, its
/// time is within `maxAge` of now, and one of its `v1` values is the HMAC-SHA256 of
/// `"<t>.<body>"` under the secret. The MAC and the constant-time comparison are passed in
/// (they are libcrypto's, in the shell).
public enum CLIWebhookVerifier {
    public enum Failure: Error, Equatable, Sendable {
        case malformedHeader
        case tooOld(seconds: Int64)
        case inTheFuture(seconds: Int64)
        case mismatch

        public var message: String {
            switch self {
            case .malformedHeader: return "the signature is not 't=<unix seconds>,v1=<hex>'"
            case .tooOld(let s): return "the signature is \(s) s old, more than --max-age allows (a replay?)"
            case .inTheFuture(let s): return "the signature is dated \(s) s in the future, more than --max-age allows (clock skew?)"
            case .mismatch: return "the signature does not match this body and secret"
            }
        }
    }

    public static func verify(header: String, body: [UInt8], secret: String, now: Int64, maxAge: Double,
                              mac: (_ key: [UInt8], _ message: [UInt8]) -> [UInt8],
                              equal: (_ a: [UInt8], _ b: [UInt8]) -> Bool) -> Result<Void, Failure> {
        guard let parsed = CancelWebhook.parseSignature(header) else { return .failure(.malformedHeader) }
        if maxAge > 0 {
            // The parser bounds t to 12 digits; saturate anyway rather than trap on a clock.
            let (difference, overflow) = now.subtractingReportingOverflow(parsed.timestamp)
            let age = overflow ? (now < 0 ? Int64.min + 1 : Int64.max) : difference
            if Double(age) > maxAge { return .failure(.tooOld(seconds: age)) }
            if Double(-age) > maxAge { return .failure(.inTheFuture(seconds: -age)) }
        }
        let expected = mac(Array(secret.utf8), Array("\(parsed.timestamp).".utf8) + body)
        let expectedHex = Array(hex(expected).utf8)
        // Every v1 is compared (in constant time) so the time taken says nothing about which matched.
        var matched = false
        for candidate in parsed.signatures where equal(Array(candidate.utf8), expectedHex) { matched = true }
        return matched ? .success(()) : .failure(.mismatch)
    }

    static func hex(_ bytes: [UInt8]) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        for b in bytes { out.append(digits[Int(b >> 4)]); out.append(digits[Int(b & 0xF)]) }
        return String(decoding: out, as: UTF8.self)
    }
}

/// What `dispatch run` does about a remote cancel, as a pure state machine. The shell feeds it
/// what its status stream shows and the clock; it answers with the signals to send: SIGTERM to
/// the command's process group at once, SIGKILL once `killAfter` seconds pass with the command
/// still running. It also says how the activity ends and what `run` exits with.
public struct CLIRunCancel: Equatable, Sendable {
    public enum Action: Equatable, Sendable {
        case terminate
        case kill
    }

    /// `run`'s default `--kill-after`.
    public static let defaultKillAfter = 10.0
    /// `run`'s default `--stale-after`: a run whose machine died ends within this.
    public static let defaultStaleAfter = 600

    public let killAfter: Double
    public private(set) var requested = false
    public private(set) var reason: String?
    /// When SIGTERM went out (nil: not yet, e.g. the request came before the command started).
    public private(set) var terminatedAt: Double?
    public private(set) var killed = false

    public init(killAfter: Double = defaultKillAfter) {
        self.killAfter = killAfter
    }

    /// A snapshot showed `cancelRequested` (the first one counts).
    public mutating func cancelRequested(reason: String?, childRunning: Bool, now: Double) -> [Action] {
        if !requested {
            requested = true
            self.reason = reason
        }
        return tick(childRunning: childRunning, now: now)
    }

    /// Called often (every quarter second or so) while the command runs.
    public mutating func tick(childRunning: Bool, now: Double) -> [Action] {
        guard requested, childRunning else { return [] }
        guard let t = terminatedAt else {
            terminatedAt = now
            return [.terminate]
        }
        if !killed && now - t >= killAfter {
            killed = true
            return [.kill]
        }
        return []
    }

    /// Whether the command's end is the cancel's doing (SIGTERM went out before it ended).
    public var cancelledTheCommand: Bool { terminatedAt != nil }

    /// The end `run` publishes after a remote cancel: `cancelled`, the reason in the status.
    public var end: CLIEndOptions {
        var status = "Cancelled remotely"
        if let r = reason, !r.isEmpty {
            status = "Cancelled: " + CLIText.oneLine(r)
            if status.count > 200 { status = String(status.prefix(199)) + "…" }
        }
        return CLIEndOptions(activityID: "", state: "cancelled", status: status)
    }

    /// `run`'s exit code after a remote cancel, 130-style: 128 + the signal it took to stop the
    /// command (143 SIGTERM, 137 SIGKILL), whatever the command itself exited with.
    public var exitCode: Int32 { killed ? 128 + 9 : 128 + 15 }

    /// Seconds between touches: a third of the stale period, so two can be lost in a row.
    public static func touchInterval(staleAfter: Int) -> Double { max(1, Double(staleAfter) / 3) }
}
