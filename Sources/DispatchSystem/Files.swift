#if canImport(Glibc)
import Glibc
#endif

/// Whole-file reads and writes for configuration, keys and migrations (never on a hot path).
public enum Files {
    public static func readBytes(_ path: String) -> [UInt8]? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        return readAll(fd)
    }

    /// Standard input up to its end (the CLI's `-` for a file); nil on a read error.
    public static func readStandardInput() -> [UInt8]? { readAll(0) }

    /// Everything `fd` gives up to its end; nil on a read error.
    public static func readAll(_ fd: Int32) -> [UInt8]? {
        var bytes: [UInt8] = []
        var buf = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = Glibc.read(fd, &buf, buf.count)
            if n > 0 { bytes.append(contentsOf: buf[0..<n]); continue }
            if n < 0 && errno == EINTR { continue }
            if n < 0 { return nil }
            return bytes
        }
    }

    public static func read(_ path: String) -> String? {
        readBytes(path).map { String(decoding: $0, as: UTF8.self) }
    }

    /// Writes `contents` to a temporary file beside `path` and renames it into place, so a
    /// reader never sees half a file; the file gets `mode` (secrets: 0o600).
    public static func write(_ path: String, _ contents: [UInt8], mode: mode_t = 0o644) throws(SystemError) {
        let temp = path + ".tmp-\(getpid())"
        let fd = open(temp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode)
        guard fd >= 0 else { throw SystemError("cannot write \(temp)", errno: errno) }
        fchmod(fd, mode)
        var offset = 0
        while offset < contents.count {
            let n = contents.withUnsafeBytes { Glibc.write(fd, $0.baseAddress! + offset, $0.count - offset) }
            if n < 0 {
                if errno == EINTR { continue }
                let e = errno
                close(fd)
                unlink(temp)
                throw SystemError("cannot write \(temp)", errno: e)
            }
            offset += n
        }
        fsync(fd)
        close(fd)
        guard rename(temp, path) == 0 else {
            let e = errno
            unlink(temp)
            throw SystemError("cannot rename \(temp) to \(path)", errno: e)
        }
    }

    public static func write(_ path: String, _ text: String, mode: mode_t = 0o644) throws(SystemError) {
        try write(path, Array(text.utf8), mode: mode)
    }

    public static func exists(_ path: String) -> Bool { access(path, F_OK) == 0 }

    /// A secret kept in a file (mode 0600): read it, or create it once with `make()`. For the
    /// embedded default's development key, token key and webhook secret.
    public static func readOrCreateSecret(_ path: String, make: () -> String) throws(SystemError) -> String {
        if let text = read(path)?.trimmingNewlines, !text.isEmpty { return text }
        let secret = make()
        try write(path, secret + "\n", mode: 0o600)
        return secret
    }

    /// Creates `path` and its missing parents with `mode`.
    public static func makeDirectory(_ path: String, mode: mode_t = 0o755) throws(SystemError) {
        var current = path.hasPrefix("/") ? "" : "."
        for part in path.split(separator: "/") {
            current += "/" + part
            if mkdir(current, mode) != 0 && errno != EEXIST {
                throw SystemError("cannot create \(current)", errno: errno)
            }
        }
    }

    /// `path` made absolute against the working directory, with `.` and `..` resolved.
    public static func absolutePath(_ p: String) -> String {
        if p.hasPrefix("/") { return p }
        var buf = [CChar](repeating: 0, count: 4096)
        guard getcwd(&buf, buf.count) != nil else { return p }
        let cwd = String(decoding: buf.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        var parts = cwd.split(separator: "/").map(String.init)
        for piece in p.split(separator: "/") {
            if piece == "." { continue }
            if piece == ".." { _ = parts.popLast(); continue }
            parts.append(String(piece))
        }
        return "/" + parts.joined(separator: "/")
    }
}

/// A failed system call, with errno's text.
public struct SystemError: Error, CustomStringConvertible, Sendable {
    public let message: String
    public let errno: Int32
    public init(_ message: String, errno: Int32 = 0) {
        self.message = message
        self.errno = errno
    }
    public var description: String {
        errno == 0 ? message : "\(message): \(String(cString: strerror(errno)))"
    }
}

extension String {
    /// The path without its last component ("/a/b" -> "/a").
    public var dropLastPathComponent: String {
        guard let slash = lastIndex(of: "/"), slash != startIndex else { return "/" }
        return String(self[..<slash])
    }

    public var trimmingNewlines: String {
        var s = self
        while s.hasSuffix("\n") || s.hasSuffix(" ") || s.hasSuffix("\r") { s.removeLast() }
        return s
    }
}
