import DispatchCore
import DispatchSystem
import Glibc

/// Real `nats-server` processes on loopback ports, clustered: `urls[i]` is server i's client
/// URL, fixed for the cluster's life, so a server stopped and started again is the same
/// server to its clients. Each server runs under a small shell that holds a pipe from this
/// process: when this process exits, however it dies, the pipe closes and the shell kills its
/// server, so no test leaves a server behind.
public final class NATSCluster: @unchecked Sendable {
    public let size: Int
    /// Client ports, cluster (route) ports and monitoring ports, by server.
    public let ports: [Int]
    private let routePorts: [Int]
    public let monitorPorts: [Int]
    private var running: [NATSServerProcess?]
    private let tag: String
    /// Arguments every server is started with (e.g. `--user`, `--pass`), also on a restart.
    public var serverArgs: [String]

    public var urls: [String] { ports.map { "nats://127.0.0.1:\($0)" } }

    /// Starts `size` servers and waits until each accepts clients and has its routes to the
    /// others. Ports are found free, so a clash with another process is possible: start
    /// retries with new ports a few times.
    public init(size: Int, serverArgs: [String] = []) throws {
        precondition(size >= 1, "a cluster has at least one server")
        self.size = size
        self.serverArgs = serverArgs
        tag = "\(getpid())-\(Int(Clock.monotonic() * 1000) % 1_000_000)"
        var lastError: Error = TestError("nats-server did not start")
        for _ in 0..<3 {
            let chosen = try Self.freePorts(3 * size)
            let attempt = NATSClusterPorts(clients: Array(chosen[0..<size]), routes: Array(chosen[size..<2 * size]),
                                           monitors: Array(chosen[(2 * size)...]))
            var started: [NATSServerProcess?] = Array(repeating: nil, count: size)
            do {
                for i in 0..<size { started[i] = try NATSCluster.launch(i, attempt, tag: tag, extra: serverArgs) }
                for i in 0..<size { try NATSCluster.waitUntilReady(i, attempt, running: size, server: started[i]!, log: "/tmp/nats-test-\(tag)-\(i).log") }
                ports = attempt.clients
                routePorts = attempt.routes
                monitorPorts = attempt.monitors
                running = started
                return
            } catch {
                lastError = error
                for s in started { s?.stop() }
            }
        }
        throw lastError
    }

    deinit { stopAll() }

    public func isRunning(_ i: Int) -> Bool { running[i] != nil }

    /// Kills server i (SIGKILL: its clients see the connection drop at once).
    public func stop(_ i: Int) {
        running[i]?.stop()
        running[i] = nil
    }

    /// Starts server i again on its ports and waits until it has its routes to the others.
    public func start(_ i: Int) throws {
        guard running[i] == nil else { return }
        let layout = NATSClusterPorts(clients: ports, routes: routePorts, monitors: monitorPorts)
        let server = try NATSCluster.launch(i, layout, tag: tag, extra: serverArgs)
        running[i] = server
        do {
            try NATSCluster.waitUntilReady(i, layout, running: running.compactMap { $0 }.count, server: server, log: logPath(i))
        } catch {
            stop(i)
            throw error
        }
    }

    public func stopAll() {
        for i in 0..<running.count { stop(i) }
    }

    /// Whether server i would pass a message on `subject` to some subscriber: one of its own
    /// clients (`/subsz`), or another server that told it over their route (`/routez`, where
    /// the remote interest is listed by subject: give the subject exactly as subscribed).
    /// Ask before publishing where interest has to travel, rather than sleeping.
    public func hasInterest(_ i: Int, _ subject: String) -> Bool { interest(i, subject) > 0 }

    /// Server i's subscriptions matching `subject`: one per own client's subscription, plus one
    /// per route that carries interest in it (a route stands for all of its server's clients).
    public func interest(_ i: Int, _ subject: String) -> Int {
        let monitor = HTTPClient(port: monitorPorts[i])
        var n = 0
        if let r = try? monitor.get("/subsz?subs=1&test=" + subject), r.status == 200,
           case .array(let local)? = r.json?["subscriptions_list"] {
            n += local.count
        }
        if let r = try? monitor.get("/routez?subs=1"), r.status == 200, case .array(let routes)? = r.json?["routes"] {
            n += routes.filter { route in
                guard case .array(let subjects)? = route["subscriptions_list"] else { return false }
                return subjects.contains(.string(subject))
            }.count
        }
        return n
    }

    /// Server i's routes to other servers now (a stopped server's route goes when i notices).
    public func routes(_ i: Int) -> Int {
        guard let r = try? HTTPClient(port: monitorPorts[i]).get("/routez"), r.status == 200,
              case .number(let n)? = r.json?["num_routes"] else { return 0 }
        return Int(n)
    }

    /// Waits up to `timeout` seconds until `interest` reaches `count` (two clients of server i
    /// on one subject: 2; the first one's subscription alone says nothing of the second's).
    public func waitForInterest(_ i: Int, _ subject: String, count: Int = 1, timeout: Double = 10) -> Bool {
        let deadline = Clock.monotonic() + timeout
        while Clock.monotonic() < deadline {
            if interest(i, subject) >= count { return true }
            usleep(10_000)
        }
        return false
    }

    /// The server's log file (for a failing test's message).
    public func logPath(_ i: Int) -> String { "/tmp/nats-test-\(tag)-\(i).log" }

    /// `/usr/sbin/nats-server` (Debian), or the first in PATH.
    public static func binary() throws -> String {
        if access("/usr/sbin/nats-server", X_OK) == 0 { return "/usr/sbin/nats-server" }
        for dir in (Subprocess.environment("PATH") ?? "").split(separator: ":") {
            let path = String(dir) + "/nats-server"
            if access(path, X_OK) == 0 { return path }
        }
        throw TestError("nats-server is not installed (scripts/install-deps.sh --tests installs Debian's nats-server)")
    }

    private static func launch(_ i: Int, _ layout: NATSClusterPorts, tag: String, extra: [String]) throws -> NATSServerProcess {
        var args = [try binary(), "-a", "127.0.0.1", "-p", String(layout.clients[i]), "-m", String(layout.monitors[i]),
                    "-n", "dispatch-test-\(i)", "-l", "/tmp/nats-test-\(tag)-\(i).log"] + extra
        if layout.clients.count > 1 {
            let others = layout.routes.enumerated().filter { $0.offset != i }.map { "nats://127.0.0.1:\($0.element)" }
            args += ["--cluster_name", "dispatch-test", "--cluster", "nats://127.0.0.1:\(layout.routes[i])",
                     "--routes", others.joined(separator: ",")]
        }
        return try NATSServerProcess(args)
    }

    private static func waitUntilReady(_ i: Int, _ layout: NATSClusterPorts, running: Int, server: NATSServerProcess, log: String) throws {
        let deadline = Clock.monotonic() + 20
        while Clock.monotonic() < deadline {
            guard server.isAlive else {
                throw TestError("nats-server \(i) exited: " + (Files.read(log) ?? ""))
            }
            if let r = try? HTTPClient(port: layout.monitors[i]).get("/routez"), r.status == 200,
               case .number(let routes)? = r.json?["num_routes"], Int(routes) >= running - 1 {
                return
            }
            usleep(20_000)
        }
        throw TestError("nats-server \(i) was not ready in 20 s (client port \(layout.clients[i]))")
    }

    private static func freePorts(_ n: Int) throws -> [Int] {
        var out: [Int] = []
        while out.count < n {
            let p = try TestServer.freePort()
            if !out.contains(p) { out.append(p) }
        }
        return out
    }
}

struct NATSClusterPorts {
    var clients: [Int]
    var routes: [Int]
    var monitors: [Int]
}

/// One nats-server under its watchdog shell (see NATSCluster).
final class NATSServerProcess {
    private var shell: pid_t
    private var pipeFD: Int32

    init(_ argv: [String]) throws {
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { throw TestError("pipe failed") }
        // Our end must not leak into any other child (it would keep this server alive).
        _ = fcntl(fds[1], F_SETFD, FD_CLOEXEC)
        // First the shell drops every descriptor it inherited past stderr (this process's
        // sockets: a server holding a copy would keep a test's connection open after the test
        // closed it). Then the server runs in the background; a second background job waits for
        // the pipe's end (fd 3) and kills it; the shell leaves when the server does, whoever
        // ended it. bash, not sh: dash cannot name descriptors past 9.
        let script = #"exec 3<&0; for f in /proc/$$/fd/*; do n=${f##*/}; [ "$n" -gt 3 ] && eval "exec $n<&-"; done 2>/dev/null; "#
            + #""$@" </dev/null >/dev/null 2>&1 3<&- & s=$!; { read -r _ <&3; kill -9 $s; } & w=$!; exec 3<&-; wait $s; kill $w 2>/dev/null; wait $w"#
        var options = Subprocess.Options()
        options.stdin = .fd(fds[0])
        options.stdout = .null
        options.stderr = .null
        options.closeInChild = [fds[1]]
        let spawned = Subprocess.spawn(["/bin/bash", "-c", script, "nats-server-watch"] + argv, options)
        close(fds[0])
        guard case .success(let pid) = spawned else {
            close(fds[1])
            throw TestError("cannot start nats-server")
        }
        shell = pid
        pipeFD = fds[1]
    }

    deinit { stop() }

    var isAlive: Bool {
        guard shell > 0 else { return false }
        var status: Int32 = 0
        if waitpid(shell, &status, WNOHANG) == shell {
            shell = 0
            close(pipeFD)
            pipeFD = -1
            return false
        }
        return true
    }

    /// Closes the pipe (the watchdog kills the server) and waits for the shell, which waits
    /// for the server: when this returns, the server's ports are free.
    func stop() {
        if pipeFD >= 0 { close(pipeFD); pipeFD = -1 }
        if shell > 0 { _ = Subprocess.wait(shell); shell = 0 }
    }
}

/// A bare NATS client speaking the text protocol over a blocking socket: what an attacker on
/// the private network can do (publish anything, subscribe to everything). For tests only.
public final class RawNATSClient {
    private let fd: Int32
    private var buffer: [UInt8] = []

    public init(port: Int, user: String? = nil, password: String? = nil) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw TestError("socket failed") }
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = in_port_t(UInt16(port).bigEndian)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        var tv = timeval(tv_sec: 5, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        let ok = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
            connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        guard ok == 0 else { close(fd); throw TestError("cannot connect to NATS on \(port)") }
        _ = try line() // INFO
        var hello = #"{"verbose":false,"pedantic":false"#
        if let user, let password { hello += #","user":"\#(user)","pass":"\#(password)""# }
        hello += "}"
        try send("CONNECT \(hello)\r\n")
        try flush()
    }

    deinit { close(fd) }

    public func publish(_ subject: String, _ payload: [UInt8]) throws {
        try send("PUB \(subject) \(payload.count)\r\n")
        try write(payload + Array("\r\n".utf8))
    }

    public func subscribe(_ subject: String, sid: Int = 1) throws {
        try send("SUB \(subject) \(sid)\r\n")
        try flush()
    }

    /// PING, and wait for the PONG: everything sent before was processed by the server.
    public func flush() throws {
        try send("PING\r\n")
        while true {
            let l = try line()
            if l.hasPrefix("PONG") { return }
            if l.hasPrefix("-ERR") { throw TestError("NATS: \(l)") }
        }
    }

    /// Messages received within `seconds`, as (subject, payload).
    public func messages(for seconds: Double) throws -> [(String, [UInt8])] {
        var out: [(String, [UInt8])] = []
        let deadline = Clock.monotonic() + seconds
        while Clock.monotonic() < deadline {
            guard let l = try? line(timeout: deadline - Clock.monotonic()) else { break }
            if l.hasPrefix("PING") { try send("PONG\r\n"); continue }
            guard l.hasPrefix("MSG ") else { continue }
            let parts = l.split(separator: " ")
            guard parts.count >= 4, let n = Int(parts[parts.count - 1]) else { continue }
            let payload = try bytes(n + 2)
            out.append((String(parts[1]), Array(payload.prefix(n))))
        }
        return out
    }

    private func send(_ s: String) throws { try write(Array(s.utf8)) }

    private func write(_ b: [UInt8]) throws {
        var off = 0
        while off < b.count {
            let n = b[off...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            guard n > 0 else { throw TestError("NATS write failed") }
            off += n
        }
    }

    private func fill(timeout: Double) throws {
        var tv = timeval(tv_sec: Int(max(0, timeout)), tv_usec: Int((max(0, timeout) - floor(max(0, timeout))) * 1_000_000))
        if tv.tv_sec == 0 && tv.tv_usec < 1000 { tv.tv_usec = 1000 }
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        var chunk = [UInt8](repeating: 0, count: 65536)
        let n = recv(fd, &chunk, chunk.count, 0)
        guard n > 0 else { throw TestError("NATS read: nothing") }
        buffer += chunk[0..<n]
    }

    private func line(timeout: Double = 5) throws -> String {
        while true {
            if let i = buffer.firstIndex(of: 10) {
                let l = String(decoding: buffer[..<i], as: UTF8.self)
                buffer.removeFirst(i + 1)
                return l.hasSuffix("\r") ? String(l.dropLast()) : l
            }
            try fill(timeout: timeout)
        }
    }

    private func bytes(_ n: Int) throws -> [UInt8] {
        while buffer.count < n { try fill(timeout: 5) }
        let out = Array(buffer.prefix(n))
        buffer.removeFirst(n)
        return out
    }
}
