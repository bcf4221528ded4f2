import DispatchCore
import DispatchSystem
import DispatchBenchKit
#if canImport(Glibc)
import Glibc
#endif

/// The nodes scenario's NATS cluster: one `nats-server` per node on loopback, each with a
/// client port, a route port and a monitoring port chosen up front, so a server killed and
/// started again is the same server to its clients and to the other servers.
final class BenchNATS {
    let clients: [UInt16]
    let routes: [UInt16]
    let monitors: [UInt16]
    private var pids: [pid_t?]
    private let binary: String
    private let dir: String

    /// Ports for `size` servers; none is started yet.
    init(size: Int, dir: String) throws {
        guard let b = ["/usr/sbin/nats-server"].first(where: { access($0, X_OK) == 0 }) ?? Proc.which("nats-server") else {
            throw BenchError("nats-server is not installed (scripts/install-deps.sh --tests installs Debian's nats-server)")
        }
        binary = b
        self.dir = dir
        var ports: [UInt16] = []
        var next: UInt16 = 24222
        while ports.count < 3 * size {
            let p = Servers.freePort(startingAt: next)
            ports.append(p)
            next = p + 1
        }
        clients = Array(ports[0..<size])
        routes = Array(ports[size..<2 * size])
        monitors = Array(ports[(2 * size)...])
        pids = Array(repeating: nil, count: size)
    }

    var size: Int { clients.count }
    var running: [Int] { pids.indices.filter { pids[$0] != nil } }

    /// `DISPATCH_NATS_URL` for node i: its own server first, then the others.
    func url(forNode i: Int) -> String {
        let order = [i] + clients.indices.filter { $0 != i }
        return order.map { "nats://127.0.0.1:\(clients[$0])" }.joined(separator: ",")
    }

    /// Starts server i with routes to every other server's route port (those not running
    /// yet are retried by nats-server), and waits until it answers and routes to the others up.
    func start(_ i: Int) throws {
        guard pids[i] == nil else { return }
        let others = routes.indices.filter { $0 != i }.map { "nats://127.0.0.1:\(routes[$0])" }
        var args = ["-a", "127.0.0.1", "-p", String(clients[i]), "-m", String(monitors[i]), "-n", "bench-\(i + 1)",
                    "-l", "\(dir)/nats-\(i + 1).log", "--cluster_name", "bench", "--cluster", "nats://127.0.0.1:\(routes[i])"]
        if !others.isEmpty { args += ["--routes", others.joined(separator: ",")] }
        let pid = try Proc.spawn(binary, args, stdin: nil)
        pids[i] = pid
        let want = running.count - 1
        let deadline = Clock.monotonicNanoseconds() + 20_000_000_000
        while Clock.monotonicNanoseconds() < deadline {
            guard Proc.alive(pid) else { pids[i] = nil; throw BenchError("nats-server \(i + 1) exited: \(Servers.tail("\(dir)/nats-\(i + 1).log"))") }
            if let v = varz(i), (v["routes"].flatMap { if case .number(let n) = $0 { return Int(n) } else { return nil } } ?? 0) >= want { return }
            Control.sleep(0.02)
        }
        throw BenchError("nats-server \(i + 1) was not ready with \(want) routes in 20 s")
    }

    /// SIGKILL, as a crash: clients see their connection drop at once.
    func kill(_ i: Int) {
        guard let pid = pids[i] else { return }
        Proc.stop(pid, signal: SIGKILL, grace: 5)
        pids[i] = nil
    }

    func stopAll() { for i in pids.indices { kill(i) } }

    /// Server i's `/varz` (nil when it does not answer).
    func varz(_ i: Int) -> JSONValue? {
        guard let body = PlainHTTP.request(port: monitors[i], method: "GET", path: "/varz") else { return nil }
        return try? JSONParser.parse(body)
    }

    /// Messages in plus out, summed over the running servers (counted since each started).
    func messages() -> Double {
        running.reduce(0.0) { total, i in
            guard let v = varz(i) else { return total }
            return total + (v.double("in_msgs") ?? 0) + (v.double("out_msgs") ?? 0)
        }
    }

    func pidsRunning() -> [pid_t] { pids.compactMap { $0 } }
}
