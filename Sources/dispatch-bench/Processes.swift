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
    /// Starts `path` with `args`, with our environment plus `env`; stdin/stdout/stderr are
    /// dup'ed from the given fds when set. Remembered in `startedPids` (and `startedGroups`).
    static func spawn(_ path: String, _ args: [String], env: [String: String]? = nil,
                      stdin: Int32? = nil, stdout: Int32? = nil, stderr: Int32? = nil,
                      closeInChild: [Int32] = [], newGroup: Bool = false) throws -> pid_t {
        var options = Subprocess.Options()
        if let env { options.environment = Subprocess.currentEnvironment().merging(env) { $1 } }
        options.stdin = stdin.map { .fd($0) } ?? .inherit
        options.stdout = stdout.map { .fd($0) } ?? .inherit
        options.stderr = stderr.map { .fd($0) } ?? .inherit
        options.closeInChild = closeInChild
        options.newProcessGroup = newGroup
        // Children inherit our signal dispositions, SIGPIPE ignored included, as they always
        // have here (the servers and workers ignore it themselves anyway).
        options.defaultSignals = []
        let pid: pid_t
        switch Subprocess.spawn([path] + args, options) {
        case .success(let p): pid = p
        case .failure(let error): throw BenchError(error.description)
        }
        startedPids.append(pid)
        if newGroup { startedGroups.append(pid) }
        return pid
    }

    /// Waits up to `seconds` for `pid` to exit; true if it did (and was reaped).
    static func wait(_ pid: pid_t, seconds: Double) -> Bool {
        Subprocess.wait(pid, seconds: seconds) != nil
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
            guard let pid = pid_t(entry), let stat = Files.read("/proc/\(pid)/stat") else { continue }
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
        (Files.read("/proc/\(pid)/comm") ?? "").trimmingCharacters(in: "\n")
    }

    /// Whether the process exists and has not exited (a zombie waiting to be reaped has).
    static func running(_ pid: pid_t) -> Bool {
        guard let stat = Files.read("/proc/\(pid)/stat"), let close = stat.lastIndex(of: ")") else { return false }
        return stat[stat.index(after: close)...].split(separator: " ").first != "Z"
    }

    /// User + system CPU seconds of one process so far (fields 14 and 15 of /proc/<pid>/stat).
    static func cpuSeconds(_ pid: pid_t) -> Double {
        guard let stat = Files.read("/proc/\(pid)/stat"), let close = stat.lastIndex(of: ")") else { return 0 }
        let f = stat[stat.index(after: close)...].split(separator: " ")
        guard f.count > 13, let u = Double(f[11]), let s = Double(f[12]) else { return 0 }
        return (u + s) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    /// Resident memory in bytes and proportional share (Pss) of one process.
    static func memory(_ pid: pid_t) -> (rss: Int, pss: Int) {
        let rss = ProcessFigures.residentBytes(of: pid) ?? 0
        let pss = Files.read("/proc/\(pid)/smaps_rollup").map { kbField($0, "Pss:") } ?? 0
        return (rss, pss)
    }

    /// A "Name:   123 kB" field of a /proc file, in bytes.
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

    /// Runs a command to completion and returns its exit status (output goes to `logFd` or ours).
    static func run(_ path: String, _ args: [String], logFd: Int32? = nil) -> Int32 {
        guard let pid = try? spawn(path, args, stdout: logFd, stderr: logFd) else { return -1 }
        let status = Subprocess.wait(pid)
        startedPids.removeAll { $0 == pid }
        return status
    }

    static func which(_ name: String) -> String? {
        for dir in ["/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/sbin", "/usr/local/bin"] {
            let p = "\(dir)/\(name)"
            if access(p, X_OK) == 0 { return p }
        }
        return nil
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
