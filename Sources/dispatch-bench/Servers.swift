import DispatchCore
import DispatchSystem
import DispatchBenchKit
#if canImport(Glibc)
import Glibc
#endif

/// One server under test, as the scenarios see it: where to connect, how to name streams,
/// how to publish, and which processes to weigh.
final class Target {
    enum Kind: String { case dispatch, nchan }
    let kind: Kind
    let port: UInt16
    let key: String
    /// Root process whose tree is weighed (nil: an external server, memory not measured).
    var rootPid: pid_t?
    var logPath = ""
    /// Starts the server process again (same port, key and data); nil for an external server.
    var starter: (() throws -> pid_t)?
    /// Dispatch's embedded PostgreSQL cluster, stopped after dispatchd if it is still up.
    var postgresCluster: String?
    /// Dispatch's data dir (its embedded cluster's socket and pgpass live there).
    var dataDir = ""

    init(kind: Kind, port: UInt16, key: String, rootPid: pid_t?) {
        self.kind = kind
        self.port = port
        self.key = key
        self.rootPid = rootPid
    }

    var name: String { kind.rawValue }

    /// The seq a fresh activity/channel has when subscribers arrive (Dispatch: its start, 1).
    var seqAtSubscribe: Int64 { kind == .dispatch ? 1 : 0 }
    /// Dispatch sends the snapshot at once; nchan sends nothing until a message arrives.
    var readyOnFirstEvent: Bool { kind == .dispatch }

    func streamPath(_ activity: String) -> String {
        switch kind {
        case .dispatch: return "/v1/activities/\(activity)/status?access_token=\(key)"
        case .nchan: return "/sub/\(activity)"
        }
    }

    func finishedStreamPath(_ activity: String) -> String {
        switch kind {
        case .dispatch: return "/v1/activities/\(activity)/status?access_token=\(key)"
        case .nchan: return "/last/\(activity)"
        }
    }

    /// Requests that make `activities` exist before subscribers arrive (nchan needs none).
    func createRequests(_ activities: [String]) -> [(String, String, String)] {
        guard kind == .dispatch else { return [] }
        return activities.map { ("POST", "/v1/activities/start", "{\"activityId\":\"\($0)\",\"taskName\":\"bench\",\"state\":\"processing\"}") }
    }

    /// Requests that leave each activity finished with one retrievable last message.
    func finishRequests(_ activities: [String]) -> [(String, String, String)] {
        switch kind {
        case .dispatch:
            return activities.map { ("POST", "/v1/activities/\($0)/end", "{\"progress\":1,\"status\":\"done\"}") }
        case .nchan:
            return activities.map { ("POST", "/pub/\($0)", Worker.nchanMessage(id: $0, seq: 1, t: 1)) }
        }
    }

    /// Publishes one event carrying the current time; returns that time (ns, CLOCK_REALTIME).
    func publishNow(_ activity: String, seq: Int64) throws -> Int64 {
        var t: Int64 = 0
        let r: BlockingHTTP.Response
        switch kind {
        case .dispatch:
            r = try BlockingHTTP.request(port: port, method: "POST", path: "/v1/activities/\(activity)/update", auth: key) {
                t = Clock.wallNanoseconds()
                return "{\"progress\":0.5,\"status\":\"t=\(t)\"}"
            }
        case .nchan:
            r = try BlockingHTTP.request(port: port, method: "POST", path: "/pub/\(activity)") {
                t = Clock.wallNanoseconds()
                return Worker.nchanMessage(id: activity, seq: seq, t: t)
            }
        }
        guard (200...299).contains(r.status) else { throw BenchError("\(name) publish answered \(r.status)") }
        if kind == .dispatch, let e = r.event, e.seq != seq {
            throw BenchError("dispatch answered seq \(e.seq), expected \(seq)")
        }
        return t
    }

    /// Resident memory of the server's processes: for Dispatch every process of dispatchd's
    /// tree except PostgreSQL; for nginx the master and its workers.
    func memory() -> (rss: Int, pss: Int, processes: Int)? {
        guard let root = rootPid else { return nil }
        var rss = 0, pss = 0, n = 0
        for pid in Proc.tree(root) {
            let comm = Proc.comm(pid)
            if comm.hasPrefix("postgres") || comm.hasPrefix("pg_ctl") || comm == "initdb" { continue }
            let m = Proc.memory(pid)
            rss += m.rss
            pss += m.pss
            n += 1
        }
        return (rss, pss, n)
    }

    /// CPU seconds (user + system, `/proc/<pid>/stat`) the server's processes have used so far:
    /// `server` is dispatchd's tree without PostgreSQL, or nginx's master and workers;
    /// `postgres` is Dispatch's embedded PostgreSQL (0 for nginx). A process that exits inside
    /// a window takes its share with it (none does while a scenario runs).
    func cpu() -> (server: Double, postgres: Double)? {
        guard let root = rootPid else { return nil }
        var server = 0.0, postgres = 0.0
        for pid in Proc.tree(root) {
            let comm = Proc.comm(pid)
            if comm.hasPrefix("postgres") || comm.hasPrefix("pg_ctl") || comm == "initdb" { continue }
            server += Proc.cpuSeconds(pid)
        }
        // The embedded cluster runs detached from dispatchd (pg_ctl starts it in the
        // background): its postmaster's tree, from postmaster.pid.
        if let cluster = postgresCluster, let text = Files.read(cluster + "/postmaster.pid"),
           let first = text.split(separator: "\n").first, let pid = pid_t(first) {
            for p in Proc.tree(pid) { postgres += Proc.cpuSeconds(p) }
        }
        return (server, postgres)
    }

    /// A fresh process, so memory freed by earlier scenarios (kept by malloc and nginx's
    /// pools) does not hide what new streams cost. Stored data (activities) survives.
    func restart() throws {
        guard let starter else { return }
        stop()
        rootPid = try starter()
    }

    func stop() {
        guard let pid = rootPid else { return }
        // nginx: SIGTERM is its fast shutdown; dispatchd: SIGTERM drains and stops PostgreSQL.
        let tree = Proc.tree(pid).filter { !Proc.comm($0).hasPrefix("postgres") }
        Proc.stop(pid, signal: SIGTERM, grace: 20)
        // The embedded PostgreSQL's watchdog (a shell dispatchd starts) outlives it by design:
        // it stops the cluster once dispatchd is gone. Give it that time, then kill what is left
        // (workers that outlived their supervisor).
        let deadline = Clock.monotonic() + 15
        while tree.contains(where: { $0 != pid && Proc.running($0) }) && Clock.monotonic() < deadline { Control.sleep(0.1) }
        for p in tree where p != pid && Proc.running(p) {
            log("bench: \(name) process \(p) still running after its parent stopped; killing it")
            kill(p, SIGKILL)
        }
        startedGroups.removeAll { $0 == pid }
        rootPid = nil
        stopLeftoverPostgres()
    }

    /// dispatchd should stop its embedded PostgreSQL itself; if it was killed (or did not),
    /// the cluster would outlive the run and keep its temporary directory busy.
    func stopLeftoverPostgres() {
        guard let cluster = postgresCluster, access("\(cluster)/postmaster.pid", F_OK) == 0,
              let runuser = Proc.which("runuser") else { return }
        log("bench: PostgreSQL at \(cluster) still running after dispatchd stopped; stopping it")
        _ = Proc.run(runuser, ["-u", "postgres", "--", "/usr/lib/postgresql/15/bin/pg_ctl", "-D", cluster, "stop", "-m", "fast", "-w"])
    }
}

enum Servers {
    static let addresses = (1...8).map { "127.0.0.\($0)" }

    /// A TCP port free on every loopback address we use.
    static func freePort(startingAt start: UInt16) -> UInt16 {
        var p = start
        while p < start + 2000 {
            if addresses.allSatisfy({ canBind($0, p) }) { return p }
            p += 1
        }
        return start
    }

    static func canBind(_ addr: String, _ port: UInt16) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { Glibc.close(fd) }
        var sa = sockaddr_in()
        sa.sin_family = sa_family_t(AF_INET)
        sa.sin_port = port.bigEndian
        sa.sin_addr.s_addr = inet_addr(addr)
        return withUnsafePointer(to: &sa) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        } == 0
    }

    static func randomKey() -> String {
        let chars = Array("abcdefghijklmnopqrstuvwxyz0123456789")
        return "bench-" + String((0..<32).map { _ in chars[Int.random(in: 0..<chars.count)] })
    }

    static func startDispatch(binary: String, dir: String, workers: Int, port: UInt16, env: [String: String] = [:],
                              key: String? = nil) throws -> Target {
        guard access(binary, X_OK) == 0 else { throw BenchError("dispatchd not found at \(binary) (build it, or pass --dispatchd)") }
        let key = key ?? randomKey()
        let data = "\(dir)/dispatch-data"
        try? Files.makeDirectory(data)
        let logPath = "\(dir)/dispatchd.log"
        let listen = addresses.map { "\($0):\(port)" }.joined(separator: ",")
        let start = { () throws -> pid_t in
            let logFd = open(logPath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
            let pid = try Proc.spawn(binary, [], env: [
                "DISPATCH_LISTEN": listen,
                "DISPATCH_BOOTSTRAP_KEY": key,
                "DISPATCH_WORKERS": String(workers),
                "DISPATCH_DATA_DIR": data,
                // As nginx runs with access_log off and error_log at warn: no line per request.
                "DISPATCH_LOG_LEVEL": "warning",
            ].merging(env) { $1 }, stdin: nil, stdout: logFd, stderr: logFd, newGroup: true)
            Glibc.close(logFd)
            let ok = BlockingHTTP.waitReady(port: port, path: "/readyz", seconds: 60) { Proc.alive(pid) }
            if !ok {
                Proc.stop(pid)
                throw BenchError("dispatchd did not become ready; see \(logPath):\n\(tail(logPath))")
            }
            return pid
        }
        let target = Target(kind: .dispatch, port: port, key: key, rootPid: try start())
        target.logPath = logPath
        target.starter = start
        if env["DATABASE_URL"] == nil {
            target.postgresCluster = "\(data)/pg"
            prepareEmergencyPgStop(cluster: "\(data)/pg")
        }
        target.dataDir = data
        return target
    }

    static let nchanModuleCandidates = [
        "/usr/lib/nginx/modules/ngx_nchan_module.so",
        "/usr/share/nginx/modules/ngx_nchan_module.so",
    ]

    /// Installs nginx and nchan from Debian when either is missing.
    static func ensureNginx() throws -> (nginx: String, module: String) {
        func find() -> (String, String)? {
            guard let n = Proc.which("nginx"),
                  let m = nchanModuleCandidates.first(where: { access($0, R_OK) == 0 }) else { return nil }
            return (n, m)
        }
        if let f = find() { return f }
        log("bench: installing nginx and libnginx-mod-nchan (apt-get)...")
        guard let apt = Proc.which("apt-get") else { throw BenchError("nginx/nchan missing and apt-get not found") }
        // policy-rc.d on this machine keeps the packaged service from starting; we run our own.
        _ = Proc.run(apt, ["install", "-y", "-q", "nginx", "libnginx-mod-nchan"])
        if let f = find() { return f }
        throw BenchError("nginx with the nchan module is not available after apt-get install")
    }

    static func startNginx(template: String, dir: String, workers: Int, port: UInt16) throws -> Target {
        let (nginx, module) = try ensureNginx()
        let ndir = "\(dir)/nginx"
        for sub in ["tmp/body", "tmp/proxy", "tmp/fastcgi", "tmp/uwsgi", "tmp/scgi", "logs"] { try? Files.makeDirectory("\(ndir)/\(sub)") }
        guard var conf = Files.read(template), !conf.isEmpty else { throw BenchError("cannot read \(template)") }
        let listen = addresses.map { "        listen \($0):\(port) reuseport backlog=4096;" }.joined(separator: "\n")
        conf = conf.replacing("{{NCHAN_MODULE}}", with: module)
            .replacing("{{WORKERS}}", with: String(workers))
            .replacing("{{DIR}}", with: ndir)
            .replacing("{{BUFFER_LENGTH}}", with: "16")
            .replacing("{{LISTEN}}", with: listen)
        try Files.write("\(ndir)/nginx.conf", conf)
        let logPath = "\(ndir)/stderr.log"
        let start = { () throws -> pid_t in
            let logFd = open(logPath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
            let pid = try Proc.spawn(nginx, ["-p", ndir, "-c", "\(ndir)/nginx.conf", "-e", "\(ndir)/error.log"],
                                     stdout: logFd, stderr: logFd)
            Glibc.close(logFd)
            let ok = BlockingHTTP.waitReady(port: port, path: "/readyz", seconds: 20) { Proc.alive(pid) }
            if !ok {
                Proc.stop(pid)
                throw BenchError("nginx did not become ready:\n\(tail(logPath))\n\(tail("\(ndir)/error.log"))")
            }
            return pid
        }
        let target = Target(kind: .nchan, port: port, key: "", rootPid: try start())
        target.logPath = "\(ndir)/error.log"
        target.starter = start
        return target
    }

    static func tail(_ path: String, lines: Int = 20) -> String {
        let text = Files.read(path) ?? ""
        return text.split(separator: "\n", omittingEmptySubsequences: false).suffix(lines).joined(separator: "\n")
    }
}
