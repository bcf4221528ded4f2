#if canImport(Glibc)
import Glibc
#endif

/// Starting other programs with posix_spawn (never fork of a Swift process). One spawn
/// primitive for the server, the CLI, the benchmark and the tests.
public enum Subprocess {
    /// Where a child's standard descriptor comes from.
    public enum Stdio: Sendable {
        case inherit
        case null
        case fd(Int32)
    }

    public struct Options: Sendable {
        /// The whole environment of the child; nil: this process's, passed on as it is.
        public var environment: [String: String]?
        public var stdin: Stdio = .inherit
        public var stdout: Stdio = .inherit
        public var stderr: Stdio = .inherit
        /// Descriptors the child must not keep (the other ends of its pipes).
        public var closeInChild: [Int32] = []
        /// The child leads a new process group (signal it and its descendants together).
        public var newProcessGroup = false
        /// Signals whose handling is reset to the default in the child (we ignore SIGPIPE).
        public var defaultSignals: [Int32] = [SIGPIPE]
        /// Start the child with no signal blocked, whatever this thread blocks now.
        public var clearSignalMask = false

        public init(environment: [String: String]? = nil) { self.environment = environment }
    }

    /// Starts `argv` (argv[0] looked up in PATH unless it has a slash); returns the pid, or
    /// errno of the failed spawn.
    public static func spawn(_ argv: [String], _ options: Options = Options()) -> Result<pid_t, SystemError> {
        precondition(!argv.isEmpty, "spawn needs a program")
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        for (target, stdio) in [(Int32(0), options.stdin), (1, options.stdout), (2, options.stderr)] {
            switch stdio {
            case .inherit: break
            case .null: posix_spawn_file_actions_addopen(&actions, target, "/dev/null", target == 0 ? O_RDONLY : O_WRONLY, 0)
            case .fd(let fd): posix_spawn_file_actions_adddup2(&actions, fd, target)
            }
        }
        for fd in options.closeInChild { posix_spawn_file_actions_addclose(&actions, fd) }

        var attr = posix_spawnattr_t()
        posix_spawnattr_init(&attr)
        defer { posix_spawnattr_destroy(&attr) }
        var flags = Int32(POSIX_SPAWN_SETSIGDEF)
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for sig in options.defaultSignals { sigaddset(&defaults, sig) }
        posix_spawnattr_setsigdefault(&attr, &defaults)
        if options.clearSignalMask {
            var empty = sigset_t()
            sigemptyset(&empty)
            posix_spawnattr_setsigmask(&attr, &empty)
            flags |= Int32(POSIX_SPAWN_SETSIGMASK)
        }
        if options.newProcessGroup {
            posix_spawnattr_setpgroup(&attr, 0)
            flags |= Int32(POSIX_SPAWN_SETPGROUP)
        }
        posix_spawnattr_setflags(&attr, Int16(flags))

        let cArgs: [UnsafeMutablePointer<CChar>?] = argv.map { strdup($0) } + [nil]
        defer { for p in cArgs { free(p) } }
        var pid: pid_t = 0
        func launch(_ envp: UnsafePointer<UnsafeMutablePointer<CChar>?>) -> Int32 {
            argv[0].contains("/")
                ? posix_spawn(&pid, argv[0], &actions, &attr, cArgs, envp)
                : posix_spawnp(&pid, argv[0], &actions, &attr, cArgs, envp)
        }
        let r: Int32
        if let env = options.environment {
            let cEnv: [UnsafeMutablePointer<CChar>?] = env.map { strdup("\($0.key)=\($0.value)") } + [nil]
            defer { for p in cEnv { free(p) } }
            r = cEnv.withUnsafeBufferPointer { launch($0.baseAddress!) }
        } else {
            // Our environment exactly as it is (order and all), as a shell would pass it on.
            r = launch(environ)
        }
        guard r == 0 else { return .failure(SystemError("cannot start \(argv[0])", errno: r)) }
        return .success(pid)
    }

    public struct Output: Sendable {
        public var status: Int32
        public var output: String
    }

    /// Runs `argv` to completion, capturing stdout and stderr together.
    public static func run(_ argv: [String], environment: [String: String]? = nil) -> Output {
        var pipeFDs: [Int32] = [0, 0]
        guard pipe(&pipeFDs) == 0 else { return Output(status: -1, output: "pipe failed") }
        // Close-on-exec, so grandchildren (a daemon started by pg_ctl) do not hold the pipe open.
        for fd in pipeFDs { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        var options = Options(environment: environment)
        options.stdin = .null
        options.stdout = .fd(pipeFDs[1])
        options.stderr = .fd(pipeFDs[1])
        options.closeInChild = [pipeFDs[0]]
        let spawned = spawn(argv, options)
        close(pipeFDs[1])
        guard case .success(let pid) = spawned else {
            close(pipeFDs[0])
            if case .failure(let e) = spawned { return Output(status: -1, output: e.description) }
            return Output(status: -1, output: "spawn failed")
        }
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
        try? spawn(argv, Options(environment: environment)).get()
    }

    /// Waits for `pid`; returns its exit status, or 128+signal.
    public static func wait(_ pid: pid_t) -> Int32 {
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 { if errno != EINTR { return -1 } }
        return exitCode(status)
    }

    /// Waits up to `seconds` for `pid` to exit; its exit code, or nil if it still runs.
    public static func wait(_ pid: pid_t, seconds: Double) -> Int32? {
        let deadline = Clock.monotonic() + seconds
        repeat {
            var status: Int32 = 0
            let r = waitpid(pid, &status, WNOHANG)
            if r == pid { return exitCode(status) }
            if r < 0 && errno == ECHILD { return -1 }
            usleep(10_000)
        } while Clock.monotonic() < deadline
        return nil
    }

    /// An exit status as a shell shows it: the code, or 128+signal (WIFEXITED and WTERMSIG are
    /// macros Swift does not import).
    public static func exitCode(_ status: Int32) -> Int32 {
        if status & 0x7f == 0 { return (status >> 8) & 0xff }
        return 128 + (status & 0x7f)
    }

    /// The signal that ended a child, or nil when it exited.
    public static func terminatingSignal(_ status: Int32) -> Int32? {
        status & 0x7f == 0 ? nil : status & 0x7f
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

    public static func environment(_ name: String) -> String? {
        getenv(name).map { String(cString: $0) }
    }

    /// The running executable's absolute path.
    public static func executablePath() -> String {
        var buf = [CChar](repeating: 0, count: 4096)
        let n = readlink("/proc/self/exe", &buf, buf.count - 1)
        guard n > 0 else { return CommandLine.arguments[0] }
        return String(decoding: buf[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
