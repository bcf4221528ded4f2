#if canImport(Glibc)
import Glibc
#endif
import DispatchCore
import DispatchSystem
import DispatchCLIKit

/// What the signal handlers share with the main thread. Only async-signal-safe work happens
/// in the handler: store the signal number, forward it with kill().
enum RunSignals {
    nonisolated(unsafe) static var child: pid_t = 0
    /// The child leads its own process group (see RunChild): signals go to the whole group.
    nonisolated(unsafe) static var ownGroup = false
    nonisolated(unsafe) static var received: Int32 = 0
    static let forwarded: [Int32] = [SIGINT, SIGTERM, SIGHUP]

    static func install() {
        var action = sigaction()
        action.__sigaction_handler.sa_sigaction = { sig, info, _ in
            RunSignals.received = sig
            let pid = RunSignals.child
            // A terminal's Ctrl-C (si_code SI_KERNEL) already went to the whole foreground
            // process group, child included; forwarding it again would deliver it twice. A child
            // in a group of its own got nothing: it gets everything, and so do its children.
            let code = info.map { $0.pointee.si_code } ?? 0
            if pid > 0, RunSignals.ownGroup { kill(-pid, sig) } else if pid > 0, code != 0x80 /* SI_KERNEL */ { kill(pid, sig) }
        }
        sigemptyset(&action.sa_mask)
        action.sa_flags = SA_SIGINFO | SA_RESTART
        for sig in forwarded { sigaction(sig, &action, nil) }
    }

    static func restoreDefaults() {
        for sig in forwarded { signal(sig, SIG_DFL) }
    }

    static func block(_ how: Int32, old: UnsafeMutablePointer<sigset_t>?) {
        var set = sigset_t()
        sigemptyset(&set)
        for sig in forwarded { sigaddset(&set, sig) }
        sigprocmask(how, &set, old)
    }

    static func name(_ sig: Int32) -> String {
        switch sig {
        case SIGHUP: return "SIGHUP"
        case SIGINT: return "SIGINT"
        case SIGQUIT: return "SIGQUIT"
        case SIGILL: return "SIGILL"
        case SIGABRT: return "SIGABRT"
        case SIGBUS: return "SIGBUS"
        case SIGFPE: return "SIGFPE"
        case SIGKILL: return "SIGKILL"
        case SIGSEGV: return "SIGSEGV"
        case SIGPIPE: return "SIGPIPE"
        case SIGALRM: return "SIGALRM"
        case SIGTERM: return "SIGTERM"
        case SIGUSR1: return "SIGUSR1"
        case SIGUSR2: return "SIGUSR2"
        default: return "signal \(sig)"
        }
    }
}

/// `dispatch run -- CMD...`: run CMD at once, track it as an activity in the background
/// (start, progress read from its output, touches, the end with its outcome: `RunPublisher`),
/// stop it when the activity is cancelled remotely (`RunWatcher`), and exit as CMD did.
/// The server being slow or down never delays the command: the publishing catches up.
struct RunCommand {
    let options: CLIRunOptions
    let client: Client

    func run() -> Int32 {
        RunSignals.install()
        let extractor: ((String) -> Double?)?
        if let pattern = options.progressRegex, let regex = try? CLIProgressExtractor(pattern: pattern) {
            extractor = { regex.progress(in: $0) }
        } else if options.readProgress {
            extractor = CLIProgressShapes.progress(in:)
        } else {
            extractor = nil
        }

        // 1. Name the activity (our own UUID unless --id: the server need not answer first) and
        //    start publishing it in the background. Without a key the command runs untracked.
        let activityID = options.start.activityID ?? System.newActivityID()
        var publisher: RunPublisher?
        if client.global.token == nil {
            Output.fail("run", CLIFeedback.missingToken(devKeyHere: Files.exists(CLIFeedback.devKeyPath)) + "; running the command untracked")
        } else {
            var start = options.start
            start.activityID = activityID
            if start.status == nil { start.status = "Running" }
            // No tag given: this host's name, if it fits; a key bound to another machine refuses
            // it (403), and the publisher starts again without it.
            var guessed = false
            if start.machine == nil, let host = System.hostName().flatMap(CLIRunMachine.fromHostName) {
                start.machine = host
                guessed = true
            }
            publisher = RunPublisher(client: client, start: start, machineGuessed: guessed)
            Notes.show("run", "activity \(activityID) (dispatch watch --id \(activityID))")
        }
        if RunSignals.received != 0 {
            let sig = RunSignals.received
            finish(publisher, CLIEndOptions(activityID: activityID, state: "cancelled", status: "Cancelled (\(RunSignals.name(sig)))",
                                            error: "interrupted by \(RunSignals.name(sig)) before the command started"))
            return exitLikeSignal(sig)
        }

        // 2. Run the command, following the activity's stream for a cancel request once it exists.
        let child = RunChild()
        let watcher = publisher.map { p in
            RunWatcher(client: client, activityID: activityID, child: child, killAfter: options.killAfter, ready: { p.started })
        }
        watcher?.start()
        let statusFromOutput = options.statusFromOutput
        let outcome = ChildProcess.run(options.command, capture: extractor != nil, child: child) { line in
            if let p = extractor?(line) { publisher?.offer(p) }
            if statusFromOutput, let status = CLIRunStatus.fromOutput(line) { publisher?.offer(status: status) }
        }
        RunSignals.restoreDefaults()  // a second Ctrl-C while the end is published stops us at once

        // 3a. Cancelled remotely: the command was sent SIGTERM (and SIGKILL after the grace).
        if let cancel = watcher?.stop(), cancel.cancelledTheCommand {
            if let t = cancel.terminatedAt { child.killLeftovers(deadline: t + cancel.killAfter) }
            finish(publisher, cancel.end)
            return cancel.exitCode
        }

        // 3b. End with the command's outcome.
        let sig = RunSignals.received
        var end = CLIEndOptions(activityID: activityID)
        switch outcome {
        case .spawnFailed(let errno, let exitCode):
            let what = errno == ENOENT ? "command not found: \(options.command[0])" : "cannot run \(options.command[0]): \(System.errorText(errno))"
            Output.fail("run", what)
            end.state = "error"; end.status = "Failed to start"; end.error = what
            finish(publisher, end)
            return exitCode
        case .exited(let code):
            if sig != 0 {
                end.state = "cancelled"; end.status = "Cancelled (\(RunSignals.name(sig)))"
            } else if code == 0 {
                end.state = "completed"; end.status = "Completed"
            } else {
                end.state = "error"; end.status = "Failed (exit status \(code))"; end.error = "exit status \(code)"
            }
            finish(publisher, end)
            return code
        case .signaled(let childSignal):
            if sig != 0 {
                end.state = "cancelled"; end.status = "Cancelled (\(RunSignals.name(sig)))"
            } else {
                end.state = "error"; end.status = "Killed (\(RunSignals.name(childSignal)))"
                end.error = "killed by \(RunSignals.name(childSignal))"
            }
            finish(publisher, end)
            return exitLikeSignal(childSignal)
        }
    }

    /// Publishes the end after whatever is still queued, trying for --retry-for seconds.
    private func finish(_ publisher: RunPublisher?, _ end: CLIEndOptions) {
        guard let publisher else { return }
        if let response = publisher.finish(end, budget: client.global.retryFor), client.global.json {
            client.printBody(response.body)
        }
    }

    /// Dies of the same signal as the command, so a calling shell sees what it would have seen
    /// without `dispatch run` in between (bash stops a script on a child's SIGINT). Signals
    /// that would dump core are reported as 128+N instead.
    private func exitLikeSignal(_ sig: Int32) -> Int32 {
        let coreDumping: [Int32] = [SIGQUIT, SIGILL, SIGTRAP, SIGABRT, SIGBUS, SIGFPE, SIGSEGV, SIGSYS, SIGXCPU, SIGXFSZ]
        if !coreDumping.contains(sig) {
            signal(sig, SIG_DFL)
            var set = sigset_t()
            sigemptyset(&set)
            sigaddset(&set, sig)
            sigprocmask(SIG_UNBLOCK, &set, nil)
            kill(getpid(), sig)
        }
        return 128 + sig
    }
}

/// Spawns a command (looked up in PATH) and waits for it, optionally passing its stdout and
/// stderr through pipes so each line can be inspected.
enum ChildProcess {
    enum Outcome {
        case exited(Int32)
        case signaled(Int32)
        /// errno of the failed spawn, and the shell-style exit code (127 not found, 126 otherwise).
        case spawnFailed(Int32, Int32)
    }

    static func run(_ command: [String], capture: Bool, child: RunChild? = nil, onLine: (String) -> Void) -> Outcome {
        var outPipe: [Int32] = [-1, -1]
        var errPipe: [Int32] = [-1, -1]
        if capture {
            guard pipe(&outPipe) == 0, pipe(&errPipe) == 0 else { return .spawnFailed(errno, 126) }
            for fd in outPipe + errPipe { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        }

        // The child starts with no signal blocked, and with the signals we forward (and SIGPIPE,
        // SIGQUIT) at their defaults, whatever this process does with them.
        // The command gets our environment without our API key: it is not its to use.
        var environment = Subprocess.currentEnvironment()
        environment["DISPATCH_TOKEN"] = nil
        var spawnOptions = Subprocess.Options(environment: environment)
        let ownGroup = RunChild.shouldLeadGroup()
        spawnOptions.newProcessGroup = ownGroup
        spawnOptions.clearSignalMask = true
        spawnOptions.defaultSignals = RunSignals.forwarded + [SIGPIPE, SIGQUIT]
        if capture {
            spawnOptions.stdout = .fd(outPipe[1])
            spawnOptions.stderr = .fd(errPipe[1])
        }

        // Block the forwarded signals until the child's pid is known, so none is lost between
        // the spawn and the handler learning whom to forward to.
        var oldMask = sigset_t()
        RunSignals.block(SIG_BLOCK, old: &oldMask)
        let spawned = Subprocess.spawn(command, spawnOptions)
        if case .success(let pid) = spawned {
            RunSignals.ownGroup = ownGroup
            RunSignals.child = pid
            child?.started(pid, ownGroup: ownGroup)
        }
        sigprocmask(SIG_SETMASK, &oldMask, nil)

        if capture {
            close(outPipe[1])
            close(errPipe[1])
        }
        let pid: pid_t
        switch spawned {
        case .success(let p):
            pid = p
        case .failure(let error):
            if capture { close(outPipe[0]); close(errPipe[0]) }
            return .spawnFailed(error.errno, error.errno == ENOENT ? 127 : 126)
        }

        var status: Int32 = 0
        var reaped = false
        if capture {
            reaped = pump(out: outPipe[0], err: errPipe[0], pid: pid, status: &status, onLine: onLine)
        }
        while !reaped {
            if waitpid(pid, &status, 0) == pid { reaped = true } else if errno != EINTR { break }
        }
        RunSignals.child = 0
        child?.ended()
        // WIFEXITED / WTERMSIG are macros that Swift does not import.
        let termSignal = status & 0x7F
        if termSignal == 0 { return .exited((status >> 8) & 0xFF) }
        return .signaled(termSignal)
    }

    /// Copies the child's output to ours and hands complete lines to `onLine`, until both pipes
    /// close or the child has exited and its pipes are drained (a grandchild that keeps a pipe
    /// open must not keep us waiting). Returns whether the child was reaped.
    private static func pump(out: Int32, err: Int32, pid: pid_t, status: inout Int32, onLine: (String) -> Void) -> Bool {
        var fds = [pollfd(fd: out, events: Int16(POLLIN), revents: 0), pollfd(fd: err, events: Int16(POLLIN), revents: 0)]
        var splitters = [CLILineSplitter(), CLILineSplitter()]
        let targets: [Int32] = [1, 2]
        var open = [true, true]
        var reaped = false
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        while open[0] || open[1] {
            for i in 0..<2 { fds[i].fd = open[i] ? (i == 0 ? out : err) : -1; fds[i].revents = 0 }
            let n = poll(&fds, 2, reaped ? 0 : 200)
            if n < 0 && errno == EINTR { continue }
            if n <= 0 {
                if reaped { break }  // exited and nothing left to read right now
                if waitpid(pid, &status, WNOHANG) == pid { reaped = true }
                continue
            }
            for i in 0..<2 where open[i] && fds[i].revents != 0 {
                let count = buffer.withUnsafeMutableBytes { read(fds[i].fd, $0.baseAddress!, $0.count) }
                if count > 0 {
                    let chunk = buffer[..<count]
                    Output.write(targets[i], Array(chunk))
                    for line in splitters[i].feed(chunk) { onLine(line) }
                } else if count == 0 || (errno != EINTR && errno != EAGAIN) {
                    open[i] = false
                    close(fds[i].fd)
                    if let rest = splitters[i].finish() { onLine(rest) }
                }
            }
        }
        for i in 0..<2 where open[i] {
            close(i == 0 ? out : err)
            if let rest = splitters[i].finish() { onLine(rest) }
        }
        return reaped
    }
}
