/// How many lines of one kind a log writes per window (issue 36: a flood of refused requests
/// wrote one access line each, 118 MB in 20 s). A fixed window per kind: the first `lines`
/// of a window are written, the rest counted; the first line of the next window of that kind
/// says how many were left out (`log.suppressed`). Time is passed in.
public struct LogThrottle: Sendable {
    public struct Rule: Equatable, Sendable {
        /// Lines written per window; 0 writes none.
        public var lines: Int
        public var window: Double
        public init(lines: Int, window: Double) {
            self.lines = lines
            self.window = window
        }
    }

    public enum Decision: Equatable, Sendable {
        /// Write the line; first say that `suppressedBefore` lines of its kind were left out.
        case write(suppressedBefore: Int)
        case suppress
    }

    private struct Window: Sendable {
        var start: Double
        var written: Int
        var suppressed: Int
    }

    private var windows: [String: Window] = [:]

    public init() {}

    public mutating func admit(_ kind: String, rule: Rule, now: Double) -> Decision {
        guard var w = windows[kind], now - w.start < rule.window else {
            let before = windows[kind]?.suppressed ?? 0
            let writes = rule.lines > 0
            windows[kind] = Window(start: now, written: writes ? 1 : 0, suppressed: writes ? 0 : before + 1)
            // With lines 0 nothing is ever written, so nothing is ever reported either.
            return writes ? .write(suppressedBefore: before) : .suppress
        }
        defer { windows[kind] = w }
        if w.written < rule.lines {
            w.written += 1
            return .write(suppressedBefore: 0)
        }
        w.suppressed += 1
        return .suppress
    }
}

/// `DISPATCH_ACCESS_LOG`: one `http.request` line per answer (`all`), none (`off`), or at most
/// N a second per worker (a number; the rest counted in `log.suppressed`).
public enum AccessLogSetting: Equatable, Sendable {
    case all, off
    case perSecond(Int)

    public static let `default` = AccessLogSetting.perSecond(100)

    public static func parse(_ text: String) -> AccessLogSetting? {
        switch text.lowercased() {
        case "all", "on": return .all
        case "off", "none", "0": return .off
        default:
            guard let n = Int(text), n > 0 else { return nil }
            return .perSecond(n)
        }
    }

    /// The throttle rule for access lines; nil: every line.
    public var rule: LogThrottle.Rule? {
        switch self {
        case .all: return nil
        case .off: return LogThrottle.Rule(lines: 0, window: 1)
        case .perSecond(let n): return LogThrottle.Rule(lines: n, window: 1)
        }
    }
}
