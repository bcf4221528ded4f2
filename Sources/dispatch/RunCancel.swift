#if canImport(Glibc)
import Glibc
#endif
import DispatchCore
import DispatchSystem
import DispatchCLIKit
import DispatchBlockingHTTP

/// The command `run` started, shared between the main thread (which spawns and reaps it) and
/// the cancel watcher (which may signal it).
///
/// Where the command runs decides how it is signalled. Normally it leads a process group of its
/// own, so a cancel reaches everything it started (`sh -c` and its children, a build and its
/// compilers). When `run` sits in the foreground of a terminal, the command stays in `run`'s
/// process group instead, so it keeps the terminal (it can read input; Ctrl-C and Ctrl-Z work
/// as without the wrapper); a cancel then signals the command and its descendants.
final class RunChild: @unchecked Sendable {
    private var mutex = pthread_mutex_t()
    private var pid: pid_t = 0
    /// The command's process group while it leads one; kept after it is reaped, for leftovers.
    private var group: pid_t = 0
    private(set) var ownGroup = true

    init() { pthread_mutex_init(&mutex, nil) }
    deinit { pthread_mutex_destroy(&mutex) }

    /// Whether the command should lead its own process group: not when `run` is in the
    /// foreground of its controlling terminal (the command would lose the terminal).
    static func shouldLeadGroup() -> Bool {
        let fd = open("/dev/tty", O_RDWR | O_NOCTTY | O_CLOEXEC)
        guard fd >= 0 else { return true }  // no controlling terminal
        defer { close(fd) }
        return tcgetpgrp(fd) != getpgrp()
    }

    func started(_ p: pid_t, ownGroup: Bool) {
        pthread_mutex_lock(&mutex)
        pid = p
        group = ownGroup ? p : 0
        self.ownGroup = ownGroup
        pthread_mutex_unlock(&mutex)
    }

    func ended() {
        pthread_mutex_lock(&mutex)
        pid = 0
        pthread_mutex_unlock(&mutex)
    }

    var running: Bool {
        pthread_mutex_lock(&mutex)
        defer { pthread_mutex_unlock(&mutex) }
        return pid > 0
    }

    /// `sig` to the command's process group, or to the command and its descendants.
    func signal(_ sig: Int32) {
        pthread_mutex_lock(&mutex)
        defer { pthread_mutex_unlock(&mutex) }
        guard pid > 0 else { return }
        if ownGroup {
            kill(-pid, sig)
        } else {
            // Children first, so none is reparented out of reach while we go.
            for p in ProcessTree.descendants(of: pid).reversed() { kill(p, sig) }
            kill(pid, sig)
        }
    }

    /// After a cancel: what is left of the command's process group (a grandchild that ignored
    /// SIGTERM) gets SIGKILL once `deadline` (monotonic seconds) passes.
    func killLeftovers(deadline: Double) {
        guard group > 0 else { return }
        while kill(-group, 0) == 0 && Clock.monotonic() < deadline { Clock.sleep(seconds: 0.05) }
        if kill(-group, 0) == 0 { kill(-group, SIGKILL) }
    }
}

/// Processes below one, from /proc (Linux): each process's parent is field 4 of its `stat`.
enum ProcessTree {
    static func descendants(of root: pid_t) -> [pid_t] {
        guard let dir = opendir("/proc") else { return [] }
        defer { closedir(dir) }
        var parents: [pid_t: pid_t] = [:]
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
            }
            guard let p = pid_t(name), let stat = Files.read("/proc/\(name)/stat"), let ppid = parentPID(stat) else { continue }
            parents[p] = ppid
        }
        var out: [pid_t] = []
        var frontier: Set<pid_t> = [root]
        while !frontier.isEmpty {
            let next = parents.filter { frontier.contains($0.value) }.map(\.key)
            out += next
            frontier = Set(next)
        }
        return out
    }

    /// `pid (comm) state ppid ...`: comm may hold spaces and parentheses, so read after the last `)`.
    static func parentPID(_ stat: String) -> pid_t? {
        guard let close = stat.lastIndex(of: ")") else { return nil }
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        guard fields.count >= 2 else { return nil }
        return pid_t(fields[1])
    }
}

/// While the command runs: follows the activity's status stream and acts on a cancel request
/// (`CLIRunCancel` decides), from its own thread, so nothing the publisher waits for can delay
/// a SIGKILL that is due. It starts following once the activity exists (`ready`: the publisher
/// has had the start accepted). `stop` joins the thread and hands back what the cancel side did.
final class RunWatcher: @unchecked Sendable {
    private let client: Client
    private let activityID: String
    private let child: RunChild
    private let ready: () -> Bool
    private var control: CLIRunCancel
    private var stopping = false
    private var mutex = pthread_mutex_t()
    private var followThread = pthread_t()

    init(client: Client, activityID: String, child: RunChild, killAfter: Double, ready: @escaping () -> Bool) {
        var c = client
        c.attemptTimeout = 5
        self.client = c
        self.activityID = activityID
        self.child = child
        self.ready = ready
        control = CLIRunCancel(killAfter: killAfter)
        pthread_mutex_init(&mutex, nil)
    }

    deinit { pthread_mutex_destroy(&mutex) }

    func start() {
        followThread = spawnThread { [self] in follow() }
    }

    /// Ends the thread (within about a second).
    func stop() -> CLIRunCancel {
        pthread_mutex_lock(&mutex)
        stopping = true
        pthread_mutex_unlock(&mutex)
        pthread_join(followThread, nil)
        return control
    }

    private var isStopping: Bool {
        pthread_mutex_lock(&mutex)
        defer { pthread_mutex_unlock(&mutex) }
        return stopping
    }

    // MARK: - Following the status stream

    /// Lets the cancel state machine act on the clock (SIGTERM for a request that came before
    /// the command started, SIGKILL after the grace period).
    private func tick() {
        perform(control.tick(childRunning: child.running, now: Clock.monotonic()))
    }

    private func perform(_ actions: [CLIRunCancel.Action]) {
        for action in actions {
            switch action {
            case .terminate:
                Output.err("dispatch run: cancel requested\(control.reason.map { " (\(CLIText.oneLine($0)))" } ?? ""); sending SIGTERM to the command")
                child.signal(SIGTERM)
            case .kill:
                Output.err("dispatch run: the command is still running \(CLIProgress.duration(control.killAfter)) after SIGTERM; sending SIGKILL")
                child.signal(SIGKILL)
            }
        }
    }

    /// Sleeps up to `seconds`, ticking, until stopped.
    private func pause(_ seconds: Double) {
        let until = Clock.monotonic() + seconds
        while !isStopping && Clock.monotonic() < until {
            tick()
            Clock.sleep(seconds: min(0.2, max(0, until - Clock.monotonic())))
        }
    }

    private func follow() {
        var state = CLIWatchState(activityID: activityID)
        var following = true
        var failures = 0
        while !isStopping {
            tick()
            guard following, ready() else { pause(0.2); continue }
            switch followOnce(&state) {
            case .over:
                following = false
            case .dropped(let streamed):
                failures = streamed ? 1 : failures + 1
                // The server's retry: delay after a dropped stream, growing while it stays
                // unreachable, up to 16 times that and never above 30 s.
                let advised = Double(state.retryMilliseconds) / 1000
                pause(Backoff(initial: advised, maximum: min(30, advised * 16)).step(afterAttempt: failures))
            }
        }
    }

    private enum FollowEnd {
        /// The activity is over (or gone, or the key may not read it): nothing more will come.
        case over
        case dropped(streamed: Bool)
    }

    private func followOnce(_ state: inout CLIWatchState) -> FollowEnd {
        var headers = client.headers(idempotencyKey: nil, accept: "text/event-stream")
        if let last = state.lastEventID { headers.append(("Last-Event-ID", last)) }
        let request = CLIHTTP.encodeRequest(method: "GET", path: Client.activityPath(activityID, "/status"),
                                            endpoint: client.global.endpoint, headers: headers, body: nil)
        let conn: HTTP1Connection
        do {
            conn = try HTTP1Connection.connect(to: client.global.endpoint, caFile: client.global.caFile, timeout: 5)
            try conn.send(request, deadline: Clock.monotonic() + 5)
        } catch {
            return .dropped(streamed: false)
        }
        var sse = SSEParser()
        var reading = false
        var streamed = false
        var lastBytes = Clock.monotonic()
        while !isStopping {
            tick()
            let events: [HTTPResponseEvent]?
            do {
                events = try conn.readEvents(until: Clock.monotonic() + 0.25)
            } catch {
                return .dropped(streamed: streamed)
            }
            guard let events else {
                // The server sends a heartbeat every 15 s: a silent stream is a dead one.
                if Clock.monotonic() - lastBytes > 90 { return .dropped(streamed: streamed) }
                continue
            }
            lastBytes = Clock.monotonic()
            for event in events {
                switch event {
                case .head(let head):
                    switch state.answered(status: head.status) {
                    case .readStream: reading = true
                    case .fetchSnapshot, .finish: return .over  // 204 (already over), 401/403/404
                    case .retryConnect, .display, .reconnect, .awaitActivity: return .dropped(streamed: false)
                    }
                case .body(let bytes):
                    guard reading else { continue }
                    streamed = true
                    for sseEvent in sse.feed(bytes) {
                        for action in state.received(sseEvent) {
                            switch action {
                            case .display(_, let view) where view.cancelRequested:
                                perform(control.cancelRequested(reason: view.cancelReason, childRunning: child.running, now: Clock.monotonic()))
                            case .finish:
                                return .over
                            case .awaitActivity:
                                return .dropped(streamed: streamed)
                            case .display, .readStream, .reconnect, .retryConnect, .fetchSnapshot:
                                break
                            }
                        }
                    }
                    if let r = sse.retryMilliseconds { state.retryAdvised(milliseconds: r) }
                case .end:
                    return .dropped(streamed: streamed)
                }
            }
        }
        return .over
    }
}

/// Starts a thread that runs `body` with every signal blocked: signals are the main thread's
/// business (its handler forwards them to the command).
func spawnThread(_ body: @escaping () -> Void) -> pthread_t {
    final class Box { let body: () -> Void; init(_ b: @escaping () -> Void) { body = b } }
    var thread = pthread_t()
    var all = sigset_t(), old = sigset_t()
    sigfillset(&all)
    pthread_sigmask(SIG_SETMASK, &all, &old)
    pthread_create(&thread, nil, { arg in
        Unmanaged<Box>.fromOpaque(arg!).takeRetainedValue().body()
        return nil
    }, Unmanaged.passRetained(Box(body)).toOpaque())
    pthread_sigmask(SIG_SETMASK, &old, nil)
    return thread
}
