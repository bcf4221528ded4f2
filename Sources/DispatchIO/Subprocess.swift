import Glibc

/// Starting other programs with posix_spawn (no fork of a Swift process).
public enum Subprocess {
    public struct Output {
        public var status: Int32
        public var output: String
    }

    /// Runs `argv` to completion, capturing stdout and stderr together.
    public static func run(_ argv: [String], environment: [String: String]? = nil) -> Output {
        var pipeFDs: [Int32] = [0, 0]
        guard pipe(&pipeFDs) == 0 else { return Output(status: -1, output: "pipe failed") }
        // Close-on-exec, so grandchildren (a daemon started by pg_ctl) do not hold the pipe open.
        for fd in pipeFDs { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, pipeFDs[1], 1)
        posix_spawn_file_actions_adddup2(&actions, pipeFDs[1], 2)
        posix_spawn_file_actions_addclose(&actions, pipeFDs[0])
        defer { posix_spawn_file_actions_destroy(&actions) }
        guard let pid = spawn(argv, environment: environment, actions: &actions) else {
            close(pipeFDs[0]); close(pipeFDs[1])
            return Output(status: -1, output: "cannot start \(argv[0]): \(String(cString: strerror(errno)))")
        }
        close(pipeFDs[1])
        var data: [UInt8] = []
        var buf = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = read(pipeFDs[0], &buf, buf.count)
            if n > 0 { data.append(contentsOf: buf[0..<n]) } else if n < 0 && errno == EINTR { continue } else { break }
        }
        close(pipeFDs[0])
        return Output(status: wait(pid), output: String(decoding: data, as: UTF8.self))
    }

    /// Starts `argv` with the parent's stdio; returns its pid.
    public static func start(_ argv: [String], environment: [String: String]? = nil) -> pid_t? {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        return spawn(argv, environment: environment, actions: &actions)
    }

    static func spawn(_ argv: [String], environment: [String: String]?, actions: inout posix_spawn_file_actions_t) -> pid_t? {
        let env = environment ?? currentEnvironment()
        let envStrings = env.map { "\($0.key)=\($0.value)" }
        var cArgs: [UnsafeMutablePointer<CChar>?] = argv.map { strdup($0) } + [nil]
        var cEnv: [UnsafeMutablePointer<CChar>?] = envStrings.map { strdup($0) } + [nil]
        defer { for p in cArgs { free(p) }; for p in cEnv { free(p) } }
        var attr = posix_spawnattr_t()
        posix_spawnattr_init(&attr)
        defer { posix_spawnattr_destroy(&attr) }
        // Children get default signal handling (we ignore SIGPIPE ourselves).
        var defaults = sigset_t()
        sigemptyset(&defaults)
        sigaddset(&defaults, SIGPIPE)
        posix_spawnattr_setsigdefault(&attr, &defaults)
        posix_spawnattr_setflags(&attr, Int16(POSIX_SPAWN_SETSIGDEF))
        var pid: pid_t = 0
        let path = argv[0]
        let r = path.contains("/")
            ? posix_spawn(&pid, path, &actions, &attr, &cArgs, &cEnv)
            : posix_spawnp(&pid, path, &actions, &attr, &cArgs, &cEnv)
        guard r == 0 else { errno = r; return nil }
        return pid
    }

    /// Waits for `pid`; returns its exit status, or 128+signal.
    public static func wait(_ pid: pid_t) -> Int32 {
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 { if errno != EINTR { return -1 } }
        return exitCode(status)
    }

    public static func exitCode(_ status: Int32) -> Int32 {
        if status & 0x7f == 0 { return (status >> 8) & 0xff }
        return 128 + (status & 0x7f)
    }

    public static func currentEnvironment() -> [String: String] {
        var out: [String: String] = [:]
        var p = environ
        while let entry = p.pointee {
            let s = String(cString: entry)
            if let eq = s.firstIndex(of: "=") { out[String(s[..<eq])] = String(s[s.index(after: eq)...]) }
            p += 1
        }
        return out
    }

    /// The running executable's absolute path.
    public static func executablePath() -> String {
        var buf = [CChar](repeating: 0, count: 4096)
        let n = readlink("/proc/self/exe", &buf, buf.count - 1)
        guard n > 0 else { return CommandLine.arguments[0] }
        return String(decoding: buf[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
