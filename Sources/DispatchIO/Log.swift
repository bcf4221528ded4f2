import DispatchCore
import DispatchSystem
import Glibc

/// Structured log lines, one per event, to fd 2 (stderr as a C global is not concurrency-safe in
/// Swift 6): logfmt (`ts=... level=info msg=stream.open activity=x`) or one JSON object per line.
/// Messages are constants with dotted names; what varies goes in fields.
public final class Logger: @unchecked Sendable {
    public enum Level: Int, Comparable, Sendable {
        case debug, info, warning, error
        public static func < (a: Level, b: Level) -> Bool { a.rawValue < b.rawValue }
        public init?(name: String) {
            switch name.lowercased() {
            case "debug": self = .debug
            case "info": self = .info
            case "warning", "warn": self = .warning
            case "error": self = .error
            default: return nil
            }
        }
        var name: String {
            switch self {
            case .debug: return "debug"
            case .info: return "info"
            case .warning: return "warning"
            case .error: return "error"
            }
        }
    }

    public enum Format: String, Sendable {
        case logfmt, json
    }

    public var level: Level
    public var format: Format
    public var staticFields: [(String, String)]
    /// The message of the access line (`http.request`), limited by `accessRule`.
    public static let accessMessage = "http.request"
    /// Access lines per window (`DISPATCH_ACCESS_LOG`); nil: every one.
    public var accessRule: LogThrottle.Rule?
    /// Warnings and errors of one message per window: a flood repeats one warning, and its
    /// lines must not cost more than the flood (the count of those left out is written).
    public var warningRule: LogThrottle.Rule? = Logger.defaultWarningRule
    public static let defaultWarningRule = LogThrottle.Rule(lines: 20, window: 10)
    private var throttle = LogThrottle()
    private let lock: UnsafeMutablePointer<pthread_mutex_t>

    public init(level: Level = .info, format: Format = .logfmt, fields: [(String, String)] = []) {
        self.level = level
        self.format = format
        self.staticFields = fields
        lock = .allocate(capacity: 1)
        pthread_mutex_init(lock, nil)
    }

    deinit {
        pthread_mutex_destroy(lock)
        lock.deallocate()
    }

    public func debug(_ msg: String, _ fields: [(String, Any)] = []) { log(.debug, msg, fields) }
    public func info(_ msg: String, _ fields: [(String, Any)] = []) { log(.info, msg, fields) }
    public func warning(_ msg: String, _ fields: [(String, Any)] = []) { log(.warning, msg, fields) }
    public func error(_ msg: String, _ fields: [(String, Any)] = []) { log(.error, msg, fields) }

    public func enabled(_ level: Level) -> Bool { level >= self.level }

    public func log(_ level: Level, _ msg: String, _ fields: [(String, Any)]) {
        guard level >= self.level else { return }
        if let rule = msg == Logger.accessMessage ? accessRule : (level >= .warning ? warningRule : nil) {
            pthread_mutex_lock(lock)
            let decision = throttle.admit(msg, rule: rule, now: Clock.monotonic())
            pthread_mutex_unlock(lock)
            switch decision {
            case .suppress: return
            case .write(let before) where before > 0:
                emit(level, "log.suppressed", [("message", msg), ("count", before), ("window_s", rule.window)])
            case .write: break
            }
        }
        emit(level, msg, fields)
    }

    private func emit(_ level: Level, _ msg: String, _ fields: [(String, Any)]) {
        let ts = Timestamp.format(milliseconds: Clock.nowMilliseconds())
        var line: String
        switch format {
        case .logfmt:
            line = "ts=" + ts + " level=" + level.name + " msg=" + Logger.quote(msg)
            for (k, v) in staticFields { line += " " + k + "=" + Logger.quote(v) }
            for (k, v) in fields { line += " " + k + "=" + Logger.quote("\(v)") }
        case .json:
            var w = JSONWriter(capacity: 256)
            w.beginObject()
            w.field("ts", ts); w.field("level", level.name); w.field("msg", msg)
            for (k, v) in staticFields { w.field(k, v) }
            for (k, v) in fields {
                switch v {
                case let n as Int: w.field(k, Int64(n))
                case let n as Int64: w.field(k, n)
                case let d as Double: w.field(k, d)
                case let b as Bool: w.field(k, b)
                default: w.field(k, "\(v)")
                }
            }
            w.endObject()
            line = w.string
        }
        line += "\n"
        _ = line.withCString { write(2, $0, strlen($0)) }
    }

    static func quote(_ s: String) -> String {
        if !s.isEmpty, s.utf8.allSatisfy({ $0 > 0x20 && $0 != 0x22 && $0 != 0x3D && $0 < 0x7F }) { return s }
        var out = "\""
        for c in s.unicodeScalars {
            switch c {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            default: out.unicodeScalars.append(c.value < 0x20 ? "?" : c)
            }
        }
        return out + "\""
    }
}
