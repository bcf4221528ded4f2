import DispatchCore
import Glibc

/// Structured log lines in logfmt (`ts=... level=info msg=stream.open activity=x`), one per event,
/// written to fd 2 (stderr as a C global is not concurrency-safe in Swift 6).
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

    public var level: Level
    public var staticFields: [(String, String)]

    public init(level: Level = .info, fields: [(String, String)] = []) {
        self.level = level
        self.staticFields = fields
    }

    public func debug(_ msg: String, _ fields: [(String, Any)] = []) { log(.debug, msg, fields) }
    public func info(_ msg: String, _ fields: [(String, Any)] = []) { log(.info, msg, fields) }
    public func warning(_ msg: String, _ fields: [(String, Any)] = []) { log(.warning, msg, fields) }
    public func error(_ msg: String, _ fields: [(String, Any)] = []) { log(.error, msg, fields) }

    public func log(_ level: Level, _ msg: String, _ fields: [(String, Any)]) {
        guard level >= self.level else { return }
        var line = "ts=" + Logger.timestamp() + " level=" + level.name + " msg=" + Logger.quote(msg)
        for (k, v) in staticFields { line += " " + k + "=" + Logger.quote(v) }
        for (k, v) in fields { line += " " + k + "=" + Logger.quote("\(v)") }
        line += "\n"
        _ = line.withCString { write(2, $0, strlen($0)) }
    }

    static func timestamp() -> String {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        let ms = Int64(ts.tv_sec) * 1000 + Int64(ts.tv_nsec) / 1_000_000
        return Timestamp.format(milliseconds: ms)
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
