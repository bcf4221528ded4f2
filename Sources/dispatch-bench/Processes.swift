import DispatchCore
import DispatchSystem
import DispatchBenchKit
#if canImport(Glibc)
import Glibc
#endif

/// Everything this run started, so a signal or a deadline can stop it all.
nonisolated(unsafe) var startedPids: [pid_t] = []
/// Process groups of servers started with `newGroup` (their workers die with them).
nonisolated(unsafe) var startedGroups: [pid_t] = []

enum Proc {
    /// Starts `path` with `args`; stdin/stdout/stderr are dup'ed from the given fds when set.
    static func spawn(_ path: String, _ args: [String], env: [String: String]? = nil,
                      stdin: Int32? = nil, stdout: Int32? = nil, stderr: Int32? = nil,
                      closeInChild: [Int32] = [], newGroup: Bool = false) throws -> pid_t {
        var attr = posix_spawnattr_t()
        posix_spawnattr_init(&attr)
        defer { posix_spawnattr_destroy(&attr) }
        if newGroup {
            posix_spawnattr_setflags(&attr, Int16(POSIX_SPAWN_SETPGROUP))
            posix_spawnattr_setpgroup(&attr, 0)
        }
        var fa = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&fa)
        defer { posix_spawn_file_actions_destroy(&fa) }
        if let fd = stdin { posix_spawn_file_actions_adddup2(&fa, fd, 0) }
        if let fd = stdout { posix_spawn_file_actions_adddup2(&fa, fd, 1) }
        if let fd = stderr { posix_spawn_file_actions_adddup2(&fa, fd, 2) }
        for fd in closeInChild { posix_spawn_file_actions_addclose(&fa, fd) }
        let argv: [UnsafeMutablePointer<CChar>?] = ([path] + args).map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        var environment = currentEnvironment()
        if let env { for (k, v) in env { environment[k] = v } }
        let envp: [UnsafeMutablePointer<CChar>?] = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer { envp.forEach { free($0) } }
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, path, &fa, &attr, argv, envp)
        if rc != 0 { throw BenchError("cannot start \(path): \(String(cString: strerror(rc)))") }
        startedPids.append(pid)
        if newGroup { startedGroups.append(pid) }
        return pid
    }

    static func currentEnvironment() -> [String: String] {
        var r: [String: String] = [:]
        var p = environ
        while let e = p.pointee {
            let s = String(cString: e)
            if let eq = s.firstIndex(of: "=") { r[String(s[..<eq])] = String(s[s.index(after: eq)...]) }
            p += 1
        }
        return r
    }

    /// Waits up to `seconds` for `pid` to exit; true if it did (and was reaped).
    static func wait(_ pid: pid_t, seconds: Double) -> Bool {
        let deadline = Clock.monotonicNanoseconds() + Int64(seconds * 1e9)
        while Clock.monotonicNanoseconds() < deadline {
            var status: Int32 = 0
            let r = waitpid(pid, &status, WNOHANG)
            if r == pid || (r < 0 && errno == ECHILD) { return true }
            usleep(20_000)
        }
        return false
    }

    /// Sends `signal`, waits, then SIGKILL: every child is gone when this returns.
    static func stop(_ pid: pid_t, signal: Int32 = SIGTERM, grace: Double = 10) {
        guard pid > 0 else { return }
        kill(pid, signal)
        if !wait(pid, seconds: grace) {
            kill(pid, SIGKILL)
            _ = wait(pid, seconds: 2)
        }
        startedPids.removeAll { $0 == pid }
    }

    static func alive(_ pid: pid_t) -> Bool {
        var status: Int32 = 0
        return waitpid(pid, &status, WNOHANG) == 0
    }

    /// `pid` and all its descendants, from /proc.
    static func tree(_ root: pid_t) -> [pid_t] {
        var parent: [pid_t: pid_t] = [:]
        for entry in listDir("/proc") {
            guard let pid = pid_t(entry), let stat = readFile("/proc/\(pid)/stat") else { continue }
            // "pid (comm) state ppid ...": comm may hold spaces, so split after the last ')'.
            guard let close = stat.lastIndex(of: ")") else { continue }
            let fields = stat[stat.index(after: close)...].split(separator: " ")
            if fields.count > 1, let ppid = pid_t(fields[1]) { parent[pid] = ppid }
        }
        var result = [root]
        var frontier = [root]
        while let p = frontier.popLast() {
            for (child, pp) in parent where pp == p {
                result.append(child)
                frontier.append(child)
            }
        }
        return result
    }

    static func comm(_ pid: pid_t) -> String {
        (readFile("/proc/\(pid)/comm") ?? "").trimmingCharacters(in: "\n")
    }

    /// Resident memory in bytes (VmRSS) and proportional share (Pss) of one process.
    static func memory(_ pid: pid_t) -> (rss: Int, pss: Int) {
        var rss = 0, pss = 0
        if let s = readFile("/proc/\(pid)/status") { rss = kbField(s, "VmRSS:") }
        if let s = readFile("/proc/\(pid)/smaps_rollup") { pss = kbField(s, "Pss:") }
        return (rss, pss)
    }

    static func kbField(_ text: String, _ name: String) -> Int {
        for line in text.split(separator: "\n") where line.hasPrefix(name) {
            let num = line.dropFirst(name.count).split(whereSeparator: { $0 == " " || $0 == "\t" }).first.flatMap { Int($0) } ?? 0
            return num * 1024
        }
        return 0
    }

    static func listDir(_ path: String) -> [String] {
        guard let d = opendir(path) else { return [] }
        defer { closedir(d) }
        var r: [String] = []
        while let e = readdir(d) {
            let name = withUnsafeBytes(of: e.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            if name != "." && name != ".." { r.append(name) }
        }
        return r
    }

    static func readFile(_ path: String) -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { Glibc.close(fd) }
        var out: [UInt8] = []
        var buf = [UInt8](repeating: 0, count: 16384)
        while true {
            let r = buf.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if r <= 0 { break }
            out.append(contentsOf: buf[0..<r])
        }
        return String(decoding: out, as: UTF8.self)
    }

    static func writeFile(_ path: String, _ text: String) throws {
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw BenchError("cannot write \(path): \(String(cString: strerror(errno)))") }
        defer { Glibc.close(fd) }
        let bytes = Array(text.utf8)
        var off = 0
        while off < bytes.count {
            let r = bytes.withUnsafeBytes { write(fd, $0.baseAddress! + off, bytes.count - off) }
            if r <= 0 { throw BenchError("cannot write \(path)") }
            off += r
        }
    }

    static func mkdirs(_ path: String) {
        var p = ""
        for part in path.split(separator: "/") {
            p += "/" + part
            mkdir(p, 0o755)
        }
    }

    /// Runs a command to completion and returns its exit status (output goes to `logFd` or ours).
    static func run(_ path: String, _ args: [String], logFd: Int32? = nil) -> Int32 {
        guard let pid = try? spawn(path, args, stdout: logFd, stderr: logFd) else { return -1 }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        startedPids.removeAll { $0 == pid }
        return (status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f)
    }

    static func which(_ name: String) -> String? {
        for dir in ["/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/sbin", "/usr/local/bin"] {
            let p = "\(dir)/\(name)"
            if access(p, X_OK) == 0 { return p }
        }
        return nil
    }

    static func selfPath() -> String {
        var buf = [CChar](repeating: 0, count: 4096)
        let n = readlink("/proc/self/exe", &buf, 4095)
        return n > 0 ? String(decoding: buf.prefix(n).map { UInt8(bitPattern: $0) }, as: UTF8.self) : CommandLine.arguments[0]
    }
}

struct BenchError: Error, CustomStringConvertible {
    let description: String
    init(_ s: String) { description = s }
}

extension String {
    func trimmingCharacters(in set: String) -> String {
        var s = Substring(self)
        while let f = s.first, set.contains(f) || f == " " { s = s.dropFirst() }
        while let l = s.last, set.contains(l) || l == " " { s = s.dropLast() }
        return String(s)
    }
}

/// Writes to fd 2 (the C `stderr` global is not concurrency-safe in Swift 6).
func log(_ s: String) {
    let line = Array((s + "\n").utf8)
    line.withUnsafeBytes { _ = write(2, $0.baseAddress, $0.count) }
}
