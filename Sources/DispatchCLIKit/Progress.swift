import DispatchCore

/// What the CLI shows about an activity, and how command output becomes progress. Pure: the
/// caller passes the terminal width, the current time and the spinner frame.

/// The fields of a snapshot the CLI displays.
public struct CLIActivityView: Equatable, Sendable {
    public var activityID: String
    public var taskName: String?
    public var machine: String?
    public var state: String?
    public var progress: Double?
    public var status: String?
    public var seq: Int?
    /// 1, plus one for every move into `retrying`.
    public var attempt: Int?
    public var cancelRequested: Bool
    /// Why, when the request gave a reason.
    public var cancelReason: String?
    public var error: String?
    /// Seconds since the Unix epoch.
    public var createdAt: Double?
    public var updatedAt: Double?
    /// `updatedAt` as the server wrote it (RFC 3339).
    public var updatedAtText: String?
    public var endedAt: Double?

    public init(activityID: String, taskName: String? = nil, machine: String? = nil, state: String? = nil,
                progress: Double? = nil, status: String? = nil, seq: Int? = nil, attempt: Int? = nil, cancelRequested: Bool = false,
                error: String? = nil, createdAt: Double? = nil, endedAt: Double? = nil) {
        self.activityID = activityID
        self.taskName = taskName
        self.machine = machine
        self.state = state
        self.progress = progress
        self.status = status
        self.seq = seq
        self.attempt = attempt
        self.cancelRequested = cancelRequested
        self.error = error
        self.createdAt = createdAt
        self.endedAt = endedAt
    }

    /// Reads a snapshot; nil when it has no `activityId`. Unknown fields are ignored.
    public init?(json: JSONValue) {
        guard case .string(let id)? = json["activityId"] else { return nil }
        func string(_ k: String) -> String? { if case .string(let s)? = json[k] { return s } else { return nil } }
        activityID = id
        taskName = string("taskName")
        machine = string("machine")
        state = string("state")
        if case .number(let p)? = json["progress"], p.isFinite { progress = min(max(p, 0), 1) } else { progress = nil }
        status = string("status")
        if case .number(let s)? = json["seq"], s.isFinite, s >= 0, s < 1e15 { seq = Int(s) } else { seq = nil }
        if case .number(let a)? = json["attempt"], a.isFinite, a >= 1, a < 1e9 { attempt = Int(a) } else { attempt = nil }
        if case .bool(let c)? = json["cancelRequested"] { cancelRequested = c } else { cancelRequested = false }
        cancelReason = string("cancelReason")
        error = string("error")
        createdAt = string("createdAt").flatMap(CLIProgress.parseTimestamp)
        updatedAtText = string("updatedAt")
        updatedAt = updatedAtText.flatMap(CLIProgress.parseTimestamp)
        endedAt = string("endedAt").flatMap(CLIProgress.parseTimestamp)
    }

    public init?(jsonText: String) {
        guard let value = try? JSONParser.parse(jsonText) else { return nil }
        self.init(json: value)
    }

    /// The contract's terminal states (§1), from the server's own state type so the two cannot
    /// drift apart (this set once missed `rejected`, and `watch` then never ended on one).
    public static let terminalStates: Set<String> = Set(ActivityState.terminal.map(\.rawValue))

    public var isTerminal: Bool { state.map { Self.terminalStates.contains($0) } ?? false }

    /// How long the job has run: to its end, or to `now` while it runs. Never negative (clocks differ).
    public func elapsed(now: Double) -> Double? {
        guard let createdAt else { return nil }
        return max(0, (endedAt ?? now) - createdAt)
    }
}

public enum CLIProgress {
    public static let spinner: [Character] = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"]

    /// 0...100 -> 0...1; nil outside the range or not finite.
    public static func fraction(fromPercent percent: Double) -> Double? {
        guard percent.isFinite, (0...100).contains(percent) else { return nil }
        return percent / 100
    }

    /// `68%`, `68.5%`, or `-` when unknown. Rounded to a tenth, so 0.29 shows as 29%, not 28.9999%.
    public static func percentText(_ progress: Double?) -> String {
        guard let p = progress, p.isFinite else { return "-" }
        let tenths = Int((min(max(p, 0), 1) * 1000).rounded())
        return tenths % 10 == 0 ? "\(tenths / 10)%" : "\(tenths / 10).\(tenths % 10)%"
    }

    /// `[██████░░░░]`, `cells` wide inside the brackets; a dotted bar when progress is unknown.
    public static func bar(_ progress: Double?, cells: Int) -> String {
        let n = max(cells, 1)
        guard let p = progress, p.isFinite else { return "[" + String(repeating: "·", count: n) + "]" }
        let filled = Int((min(max(p, 0), 1) * Double(n)).rounded(.down))
        return "[" + String(repeating: "█", count: filled) + String(repeating: "░", count: n - filled) + "]"
    }

    /// `42s`, `3m05s`, `1h02m`.
    public static func duration(_ seconds: Double) -> String {
        let s = seconds.isFinite ? max(0, Int(seconds.rounded(.down))) : 0
        if s < 60 { return "\(s)s" }
        if s < 3600 { return "\(s / 60)m" + pad2(s % 60) + "s" }
        return "\(s / 3600)h" + pad2((s % 3600) / 60) + "m"
    }

    private static func pad2(_ n: Int) -> String { n < 10 ? "0\(n)" : "\(n)" }

    /// Parses the API's RFC 3339 timestamps (`2026-11-29T22:53:26.123Z`, offsets allowed) into
    /// seconds since the Unix epoch.
    public static func parseTimestamp(_ text: String) -> Double? {
        let b = Array(text.utf8)
        func num(_ from: Int, _ len: Int) -> Int? {
            guard from + len <= b.count else { return nil }
            var v = 0
            for i in from..<(from + len) {
                guard (0x30...0x39).contains(b[i]) else { return nil }
                v = v * 10 + Int(b[i] - 0x30)
            }
            return v
        }
        guard b.count >= 20, b[4] == UInt8(ascii: "-"), b[7] == UInt8(ascii: "-"),
              b[10] == UInt8(ascii: "T") || b[10] == UInt8(ascii: "t") || b[10] == UInt8(ascii: " "),
              b[13] == UInt8(ascii: ":"), b[16] == UInt8(ascii: ":"),
              let year = num(0, 4), let month = num(5, 2), let day = num(8, 2),
              let hour = num(11, 2), let minute = num(14, 2), let second = num(17, 2),
              (1...12).contains(month), (1...31).contains(day), hour < 24, minute < 60, second < 61 else { return nil }
        var i = 19
        var fraction = 0.0
        if i < b.count, b[i] == UInt8(ascii: ".") {
            i += 1
            var scale = 0.1
            let start = i
            while i < b.count, (0x30...0x39).contains(b[i]) {
                fraction += Double(b[i] - 0x30) * scale
                scale /= 10
                i += 1
            }
            guard i > start else { return nil }
        }
        guard i < b.count else { return nil }
        var offset = 0
        switch b[i] {
        case UInt8(ascii: "Z"), UInt8(ascii: "z"):
            i += 1
        case UInt8(ascii: "+"), UInt8(ascii: "-"):
            guard let oh = num(i + 1, 2), i + 3 < b.count, b[i + 3] == UInt8(ascii: ":"), let om = num(i + 4, 2) else { return nil }
            offset = (oh * 60 + om) * 60 * (b[i] == UInt8(ascii: "-") ? -1 : 1)
            i += 6
        default:
            return nil
        }
        guard i == b.count else { return nil }
        // Days from civil (H. Hinnant's algorithm), proleptic Gregorian.
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let mp = (month + 9) % 12
        let doy = (153 * mp + 2) / 5 + day - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        let days = era * 146097 + doe - 719468
        let seconds = days * 86400 + hour * 3600 + minute * 60 + second - offset
        return Double(seconds) + fraction
    }

    /// One line per event, for pipes and logs:
    /// `#5 processing 68% [shodan] Downloading at 18.4 MB/s (68%)`.
    public static func plainLine(event: String, view: CLIActivityView) -> String {
        if event == "not_found" { return "not_found \(CLIText.oneLine(view.activityID))" }
        var parts = ["#\(view.seq.map(String.init) ?? "?")", CLIText.oneLine(event), percentText(view.progress)]
        if view.state == "retrying", let a = view.attempt { parts.append("(attempt \(a))") }
        if let m = view.machine, !m.isEmpty { parts.append("[\(CLIText.oneLine(m))]") }
        if let s = view.status, !s.isEmpty { parts.append(CLIText.oneLine(s)) }
        if let e = view.error, !e.isEmpty { parts.append("— error: \(CLIText.oneLine(e))") }
        return parts.joined(separator: " ")
    }

    /// What the live line says about the state: the state's name, `waiting` for idle (alive
    /// but not working), and the attempt when retrying. `short` drops the attempt's words.
    public static func stateLabel(_ view: CLIActivityView, short: Bool = false) -> String {
        switch view.state {
        case "idle"?: return "waiting"
        case "retrying"?:
            guard let a = view.attempt else { return "retrying" }
            return short ? "retry \(a)" : "retrying (attempt \(a))"
        case let s?: return CLIText.oneLine(s)
        case nil: return ""
        }
    }

    /// The live line's first character: a spinner while the job works, a still mark while it
    /// waits (idle), and one mark per final state.
    public static func glyph(_ view: CLIActivityView, frame: Int) -> String {
        switch view.state {
        case "completed"?: return "✔"
        case "error"?: return "✘"
        case "cancelled"?: return "⊘"
        case "rejected"?: return "⊗"
        case "idle"?: return "‖"
        default: return String(spinner[((frame % spinner.count) + spinner.count) % spinner.count])
        }
    }

    /// The live terminal line (without `\r` or escape codes), at most `width` characters:
    /// `⠋ Debian 13 Trixie ISO [██████░░░░] 68% processing  Downloading… · shodan · 1m02s`.
    /// The status shrinks first, then the name, so the bar, the numbers and the state stay
    /// visible; on a narrow terminal the bar and the state's words shrink too.
    public static func liveLine(view: CLIActivityView, width: Int, now: Double, frame: Int) -> String {
        let glyph = glyph(view, frame: frame)
        let width = max(width, 20)
        let name = CLIText.oneLine(view.taskName ?? view.activityID)
        var statusText = CLIText.oneLine(view.status ?? "")
        if let e = view.error, !e.isEmpty { statusText += statusText.isEmpty ? "error: \(CLIText.oneLine(e))" : " — error: \(CLIText.oneLine(e))" }
        if view.cancelRequested && !view.isTerminal { statusText += statusText.isEmpty ? "cancel requested" : " (cancel requested)" }
        var meta: [String] = []
        if let m = view.machine, !m.isEmpty { meta.append(CLIText.oneLine(m)) }
        if let e = view.elapsed(now: now) { meta.append(duration(e)) }
        let fullMeta = meta.isEmpty ? "" : " · " + meta.joined(separator: " · ")
        // From the roomiest layout to the tightest; the first that leaves room for a name wins.
        let layouts: [(cells: Int, short: Bool, meta: Bool)] = [
            (width >= 80 ? 20 : 10, false, true), (width >= 80 ? 20 : 10, false, false),
            (10, true, false), (5, true, false),
        ]
        for layout in layouts {
            let label = stateLabel(view, short: layout.short)
            let tail = " \(bar(view.progress, cells: layout.cells)) \(percentText(view.progress))" + (label.isEmpty ? "" : " \(label)")
            let metaText = layout.meta ? fullMeta : ""
            let available = width - 2 - tail.count - metaText.count
            guard available >= 4 else { continue }
            let shownName = truncate(name, to: available)
            let statusRoom = available - shownName.count - 2
            let shownStatus = statusRoom >= 4 ? truncate(statusText, to: statusRoom) : ""
            let statusPart = shownStatus.isEmpty ? "" : "  " + shownStatus
            return "\(glyph) \(shownName)\(tail)\(statusPart)\(metaText)"
        }
        return truncate("\(glyph) \(name) \(stateLabel(view, short: true))", to: width)
    }

    /// Cuts to `count` characters, ending in `…` when something was cut.
    public static func truncate(_ s: String, to count: Int) -> String {
        guard count > 0 else { return "" }
        guard s.count > count else { return s }
        return String(s.prefix(count - 1)) + "…"
    }
}

/// Turns a command's output into progress: a user's pattern with exactly one capture group
/// that holds a percentage (`([0-9.]+)%`). Lines with no match, or a number outside 0...100,
/// are ignored.
public struct CLIProgressExtractor {
    private let regex: Regex<(Substring, Substring)>

    public init(pattern: String) throws(CLIUsageError) {
        do {
            regex = try Regex(pattern, as: (Substring, Substring).self)
        } catch {
            throw CLIUsageError("--progress-regex must be a valid regular expression with exactly one capture group (got '\(pattern)')",
                                command: "run")
        }
    }

    /// The progress (0...1) of the last match in the line, so `10% ... 20%` reads as 20%.
    public func progress(in line: String) -> Double? {
        var result: Double?
        for match in line.matches(of: regex) {
            var text = String(match.output.1)
            text = String(text.map { $0 == "," ? "." : $0 })
            if let v = CLIArguments.parseNumber(text), let f = CLIProgress.fraction(fromPercent: v) { result = f }
        }
        return result
    }
}

/// Splits a byte stream into lines at LF, CR or CRLF (progress meters redraw with CR). A line
/// longer than `maxLineBytes` is cut there, so a command without newlines cannot grow memory.
public struct CLILineSplitter: Sendable {
    public var maxLineBytes: Int
    private var pending: [UInt8] = []

    public init(maxLineBytes: Int = 16 * 1024) { self.maxLineBytes = maxLineBytes }

    public mutating func feed<C: Collection>(_ bytes: C) -> [String] where C.Element == UInt8 {
        var lines: [String] = []
        for b in bytes {
            if b == 0x0A || b == 0x0D {
                if !pending.isEmpty { lines.append(String(decoding: pending, as: UTF8.self)) }
                pending.removeAll(keepingCapacity: true)
            } else {
                pending.append(b)
                if pending.count >= maxLineBytes {
                    lines.append(String(decoding: pending, as: UTF8.self))
                    pending.removeAll(keepingCapacity: true)
                }
            }
        }
        return lines
    }

    /// The unterminated rest, at the end of the stream.
    public mutating func finish() -> String? {
        defer { pending.removeAll() }
        return pending.isEmpty ? nil : String(decoding: pending, as: UTF8.self)
    }
}

/// The progress shapes `dispatch run` reads from a command's output without being told:
/// a percentage (`68%`, `68.5%`, `68,5%`) or a count (`12/40`, `[3/10]`, `1.2/3.4 MB`).
/// The last one on a line counts, as with `--progress-regex`. Written as a scanner rather than
/// a regular expression: it runs on every line of a chatty command, and costs nothing at start.
///
/// To keep false matches rare: a number glued to letters, digits, dots or slashes on the
/// wrong side is not read (`sha256%`, `10.0.0.1/24`, `2024/05/06`, `v1.2/3`), a percentage
/// must be within 0–100, and a count needs 0 ≤ N ≤ M with M > 0.
public enum CLIProgressShapes {
    public static func progress(in line: String) -> Double? {
        let b = Array(line.utf8)
        var result: Double?
        var i = 0
        while i < b.count {
            guard isDigit(b[i]), i == 0 || !glued(b[i - 1]) else { i += 1; continue }
            guard let (n, afterN) = number(b, i) else { i += 1; continue }
            if afterN < b.count, b[afterN] == UInt8(ascii: "%") {
                if let f = CLIProgress.fraction(fromPercent: n) { result = f }
                i = afterN + 1
                continue
            }
            if afterN < b.count, b[afterN] == UInt8(ascii: "/"), afterN + 1 < b.count, isDigit(b[afterN + 1]),
               let (m, afterM) = number(b, afterN + 1),
               afterM >= b.count || !(isDigit(b[afterM]) || b[afterM] == UInt8(ascii: "/")) {
                if m > 0, n <= m { result = n / m }
                i = afterM
                continue
            }
            i = afterN
        }
        return result
    }

    static func isDigit(_ c: UInt8) -> Bool { (0x30...0x39).contains(c) }

    /// A character that makes a number part of a longer word: `x86`, `1.2.3`, `a/12`.
    static func glued(_ c: UInt8) -> Bool {
        isDigit(c) || (0x41...0x5A).contains(c) || (0x61...0x7A).contains(c) || c == UInt8(ascii: ".") || c == UInt8(ascii: ",")
            || c == UInt8(ascii: "/") || c == UInt8(ascii: "_") || c >= 0x80
    }

    /// Digits, optionally `.` or `,` and more digits, at `start`; nil for a version-like
    /// `1.2.3` or a number too long to be progress. Returns the value and the index after it.
    static func number(_ b: [UInt8], _ start: Int) -> (Double, Int)? {
        var i = start
        var text = ""
        while i < b.count, isDigit(b[i]) { text.unicodeScalars.append(Unicode.Scalar(b[i])); i += 1 }
        if i + 1 < b.count, b[i] == UInt8(ascii: ".") || b[i] == UInt8(ascii: ","), isDigit(b[i + 1]) {
            text.append(".")
            i += 1
            while i < b.count, isDigit(b[i]) { text.unicodeScalars.append(Unicode.Scalar(b[i])); i += 1 }
            if i + 1 < b.count, b[i] == UInt8(ascii: ".") || b[i] == UInt8(ascii: ","), isDigit(b[i + 1]) { return nil }
        }
        guard text.count <= 15, let v = Double(text) else { return nil }
        return (v, i)
    }
}
