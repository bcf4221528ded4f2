import DispatchCore

/// The `dispatch` CLI's exit codes. They are part of the CLI's public interface
/// (scripts branch on them) and are the same for every command; docs/cli.md lists them.
public enum CLIExitCode: Int32, Sendable, CaseIterable {
    case success = 0
    /// `watch`: the job ended in `error` or `cancelled`.
    case jobFailed = 1
    case usage = 2
    case notFound = 3
    /// 401 or 403: no key, a bad key, or a key without the needed scope or ownership.
    case auth = 4
    /// 409: the activity is already terminal (or a different start reused its id).
    case conflict = 5
    /// The server could not be reached, or kept failing (5xx, 429) until `--retry-for` ran out.
    case unavailable = 6
    /// The server refused the input (400, 413, 415, a 429 that is a limit, other 4xx).
    case rejected = 7
    /// `progress`: no answer within its `--deadline` (the server is down or failing); the
    /// update is dropped so the script it reports on goes on.
    case deadline = 8
    /// `batch`: every change was answered, and at least one was refused (its result line says why).
    case someRefused = 9
}

/// What the CLI does with one HTTP answer.
public enum CLIHTTPDisposition: Equatable, Sendable {
    case success
    /// Worth repeating (same idempotency key) while the retry budget lasts; if it runs out,
    /// the command exits with `unavailable`.
    case retry
    case fail(CLIExitCode)

    /// The one place where HTTP answers map to CLI outcomes. A 4xx is an answer, never retried,
    /// except the two whose code says "again, later": a 409 `concurrent_changes` (others kept
    /// changing the activity first) and a 429 `rate_limited` (with Retry-After). A 429 that is
    /// a limit (`too_many_live_activities`, ...) would answer the same however long one waits.
    public static func of(status: Int, body: [UInt8] = []) -> CLIHTTPDisposition {
        switch status {
        case 200...299: return .success
        case 401, 403: return .fail(.auth)
        case 404: return .fail(.notFound)
        case 409 where CLIServerError.code(in: body) == "concurrent_changes": return .retry
        case 409: return .fail(.conflict)
        case 408: return .retry
        // A 429 without our error body comes from a proxy's rate limit: pacing too.
        case 429 where [nil, "rate_limited"].contains(CLIServerError.code(in: body)): return .retry
        case 400...499: return .fail(.rejected)
        case 500...599: return .retry
        default: return .fail(.unavailable)  // 1xx/3xx: not something this API answers
        }
    }
}

/// The `error` object of a server answer, `{"error": {"code": "...", "message": "..."}}`.
public struct CLIServerError: Equatable, Sendable {
    public var code: String?
    public var message: String?

    public init(code: String?, message: String?) {
        self.code = code
        self.message = message
    }

    /// Reads the error object out of an answer body; nil when the body is not that shape.
    public static func parse(_ body: [UInt8]) -> CLIServerError? {
        guard let value = try? JSONParser.parse(body), case .object(let inner)? = value["error"] else { return nil }
        let obj = JSONValue.object(inner)
        var code: String?
        var message: String?
        if case .string(let c)? = obj["code"] { code = c }
        if case .string(let m)? = obj["message"] { message = m }
        if code == nil && message == nil { return nil }
        return CLIServerError(code: code, message: message)
    }

    /// The error code of an answer body, if it has one.
    public static func code(in body: [UInt8]) -> String? {
        body.isEmpty ? nil : parse(body)?.code
    }

    /// One readable line: `activity not found (not_found, HTTP 404)`. Control characters from the
    /// server are replaced, so a hostile message cannot rewrite the user's terminal.
    public static func describe(status: Int, body: [UInt8]) -> String {
        let parsed = parse(body)
        let fallback = defaultReason(status: status)
        let message = CLIText.oneLine(parsed?.message ?? fallback)
        if let code = parsed?.code {
            return "\(message) (\(CLIText.oneLine(code)), HTTP \(status))"
        }
        return "\(message) (HTTP \(status))"
    }

    static func defaultReason(status: Int) -> String {
        switch status {
        case 400: return "bad request"
        case 401: return "missing or invalid credentials"
        case 403: return "forbidden"
        case 404: return "not found"
        case 409: return "conflict"
        case 413: return "request body too large"
        case 415: return "unsupported media type"
        case 429: return "too many requests"
        case 500: return "internal server error"
        case 502: return "bad gateway"
        case 503: return "service unavailable"
        case 504: return "gateway timeout"
        default: return "unexpected answer"
        }
    }
}

/// Small text helpers for what the CLI prints.
public enum CLIText {
    /// Replaces control characters (including newlines and ESC) by spaces.
    public static func oneLine(_ s: String) -> String {
        var out = String.UnicodeScalarView()
        for u in s.unicodeScalars {
            if u.value < 0x20 || u.value == 0x7F || (0x80...0x9F).contains(u.value) {
                out.append(" ")
            } else {
                out.append(u)
            }
        }
        return String(out)
    }
}

/// What the CLI tells the user besides results and errors, as text decided here.
public enum CLIFeedback {
    /// Where `make run` / `dispatchd` keeps the development key, relative to its directory.
    public static let devKeyPath = ".dispatch/dev-key"

    /// No key anywhere: which variable or flag to set, and where a local development server
    /// keeps its key (`devKeyHere`: that file exists in the current directory).
    public static func missingToken(devKeyHere: Bool) -> String {
        var text = "no API key: set DISPATCH_TOKEN (or pass --token-file PATH, or --token KEY). For a local development "
            + "server the key is in ./\(devKeyPath) in the directory dispatchd runs from"
        if devKeyHere { text += "; there is one here: export DISPATCH_TOKEN=$(cat \(devKeyPath))" }
        return text
    }

    /// Notes on stderr (`retrying…`, run's activity id) are shown unless `--quiet` is given
    /// and nobody is looking (stderr is not a terminal: cron mail, CI logs).
    public static func showNotes(quiet: Bool, stderrIsTerminal: Bool) -> Bool {
        !quiet || stderrIsTerminal
    }

    /// The line after the first failure of a request that will be retried, so a server that is
    /// down is not 30 s of silence.
    public static func retrying(_ failure: String, budget: Double) -> String {
        "\(failure); retrying for up to \(CLIProgress.duration(budget.rounded(.up)))…"
    }
}
