import DispatchCore
import DispatchIO
import DispatchSystem
import Glibc

/// Starts `workers` copies of this executable sharing the port, restarts any that crash, and
/// forwards SIGTERM/SIGINT to all of them, waiting for each to finish.
final class Supervisor {
    let config: ServerConfig
    let conninfo: String
    let log: Logger
    let loop = EventLoop()
    private var children: [pid_t: Int] = [:]
    private var stopping = false
    private var restarts: [Int: [Double]] = [:]
    private var watchers: [Timer] = []
    /// A worker kept dying at start: the server stopped, and exits non-zero.
    private var gaveUp = false

    init(config: ServerConfig, conninfo: String, log: Logger) {
        self.config = config
        self.conninfo = conninfo
        self.log = log
    }

    /// Where the workers share their states (metrics, readiness): see WorkerState.
    private let stateDir = WorkerState.makeDirectory()
    private var announcedReady = false

    func run() -> Int32 {
        signal(SIGPIPE, SIG_IGN)
        for i in 0..<config.workers { spawn(i) }
        // systemd (Type=notify) hears READY=1 once every worker is ready.
        watchers.append(loop.timer(after: 0.25, repeating: true) { [unowned self] in self.announceReadiness() })
        watchers.append(loop.onSignal(SIGCHLD) { [unowned self] in self.reap() })
        watchers.append(loop.onSignal(SIGTERM) { [unowned self] in self.stop(SIGTERM) })
        watchers.append(loop.onSignal(SIGINT) { [unowned self] in self.stop(SIGTERM) })
        // A state dump of every worker's feeds (`kill -USR1` the server).
        watchers.append(loop.onSignal(SIGUSR1) { [unowned self] in for pid in self.children.keys { kill(pid, SIGUSR1) } })
        watchers.append(loop.onSignal(SIGHUP) { [log] in log.info("signal.hangup_ignored", [("why", "no reload: restart to apply new settings")]) })
        log.info("supervisor.started", [("workers", config.workers)])
        loop.run()
        log.info("supervisor.stopped", [("gave_up", gaveUp)])
        if let stateDir { _ = Subprocess.run(["rm", "-rf", stateDir]) }
        return gaveUp ? 1 : 0
    }

    private func announceReadiness() {
        guard !announcedReady, !stopping, let stateDir else { return }
        let states = WorkerState.read(stateDir, count: config.workers, now: Clock.nowMilliseconds(), freshness: 3)
        guard states.count == config.workers, states.values.allSatisfy({ $0.readiness == .ready }) else { return }
        announcedReady = true
        SystemdNotify.send("READY=1\nSTATUS=serving with \(config.workers) workers")
        log.info("supervisor.ready", [("workers", config.workers)])
    }

    private func spawn(_ index: Int) {
        var env = Subprocess.currentEnvironment()
        env["DISPATCH_WORKER_INDEX"] = String(index)
        env["DISPATCH_WORKER_CONNINFO"] = conninfo
        env["DISPATCH_WORKER_STATE_DIR"] = stateDir
        env["DISPATCH_WORKER_LISTEN"] = config.listen.map { "\($0.host.contains(":") ? "[\($0.host)]" : $0.host):\($0.port)" }.joined(separator: ",")
        guard let pid = Subprocess.start([Subprocess.executablePath()] + Array(CommandLine.arguments.dropFirst()), environment: env) else {
            log.error("supervisor.spawn_failed", [("worker", index)])
            return
        }
        children[pid] = index
        log.info("supervisor.worker_started", [("worker", index), ("pid", pid)])
    }

    private func reap() {
        var status: Int32 = 0
        while true {
            let pid = waitpid(-1, &status, WNOHANG)
            guard pid > 0 else { break }
            guard let index = children.removeValue(forKey: pid) else { continue }
            let code = Subprocess.exitCode(status)
            if stopping {
                log.info("supervisor.worker_exited", [("worker", index), ("status", code)])
                continue
            }
            log.error("supervisor.worker_crashed", [("worker", index), ("pid", pid), ("status", code)])
            // A worker that keeps dying right away (port taken, bad config) stops the server.
            let now = Clock.monotonic()
            var recent = (restarts[index] ?? []).filter { now - $0 < 10 }
            recent.append(now)
            restarts[index] = recent
            if recent.count > 5 || code == 2 {
                log.error("supervisor.giving_up", [("worker", index)])
                gaveUp = true
                stop(SIGTERM)
                continue
            }
            loop.timer(after: 0.2 * Double(recent.count)) { [unowned self] in if !self.stopping { self.spawn(index) } }
        }
        if stopping && children.isEmpty { loop.stop() }
    }

    private func stop(_ sig: Int32) {
        if !stopping {
            stopping = true
            SystemdNotify.send("STOPPING=1")
            log.info("supervisor.stopping", [("workers", children.count)])
            for pid in children.keys { kill(pid, sig) }
            // Workers stop within their shutdown timeout; what is left after that is killed.
            loop.timer(after: config.shutdownTimeoutSeconds + 2) { [unowned self] in
                for pid in self.children.keys { kill(pid, SIGKILL) }
            }
        }
        if children.isEmpty { loop.stop() }
    }
}
