import DispatchSystem
import DispatchCore
import DispatchIO
import DispatchServer
import Glibc

/// Paths of the executables built next to the test bundle.
public enum TestPaths {
    public static var buildDirectory: String {
        let exe = Subprocess.executablePath()
        var dir = exe
        // .../debug/DispatchPackageTests.xctest (a file on Linux)
        while let slash = dir.lastIndex(of: "/") {
            dir = String(dir[..<slash])
            if access(dir + "/dispatchd", X_OK) == 0 { return dir }
            if dir.isEmpty { break }
        }
        return "./.build/debug"
    }

    public static func binary(_ name: String) -> String { buildDirectory + "/" + name }

    public static var repositoryRoot: String {
        var dir = buildDirectory
        for _ in 0..<6 {
            if access(dir + "/Package.swift", R_OK) == 0 { return dir }
            guard let slash = dir.lastIndex(of: "/") else { break }
            dir = String(dir[..<slash])
        }
        return "."
    }
}

nonisolated(unsafe) private var sharedCluster: TestPostgres?

/// One private PostgreSQL cluster per test process; each test server gets a fresh database in
/// it. Stopped when the process exits. Tests may stop and start it (FoundationTests), so no
/// other process shares it: with `DISPATCH_TEST_CLUSTER_TEMPLATE` (scripts/run-tests, which
/// runs many test processes side by side) it is a copy of a cluster initialised once per run,
/// a second's work instead of initdb's ten under load.
public final class TestPostgres: @unchecked Sendable {
    public let embedded: EmbeddedPostgres
    private var counter = 0

    public static func shared() throws -> TestPostgres {
        if let c = sharedCluster { return c }
        let dir = "/tmp/dispatch-tests-\(getpid())"
        if let template = Subprocess.environment("DISPATCH_TEST_CLUSTER_TEMPLATE"), !template.isEmpty {
            try copyTemplate(template, to: dir)
        }
        let pg = try EmbeddedPostgres(dataDir: dir, log: Logger(level: .warning))
        try pg.start()
        let c = TestPostgres(embedded: pg)
        sharedCluster = c
        atexit {
            sharedCluster?.embedded.stop()
            _ = Subprocess.run(["rm", "-rf", "/tmp/dispatch-tests-\(getpid())"])
        }
        return c
    }

    init(embedded: EmbeddedPostgres) { self.embedded = embedded }

    /// Copies the run's template cluster (stopped, initialised) to `dir`, making the template
    /// first if no process of the run has: under an flock, so one process runs initdb and the
    /// others wait for it. A template left half made (its maker killed) is made again.
    private static func copyTemplate(_ template: String, to dir: String) throws {
        let lockPath = template + ".lock"
        let fd = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw TestError("cannot open \(lockPath)") }
        defer { close(fd) }
        guard flock(fd, LOCK_EX) == 0 else { throw TestError("cannot lock \(lockPath)") }
        let made = template + "/template-complete"
        if !Files.exists(made) {
            _ = Subprocess.run(["rm", "-rf", template])
            let pg = try EmbeddedPostgres(dataDir: template, log: Logger(level: .warning))
            try pg.start()
            pg.stop()
            try Files.write(made, "", mode: 0o600)
        }
        _ = flock(fd, LOCK_UN)
        let copied = Subprocess.run(["cp", "-a", template, dir])
        guard copied.status == 0 else { throw TestError("cannot copy the template cluster: \(copied.output)") }
        _ = Subprocess.run(["rm", "-f", dir + "/template-complete", dir + "/dispatchd.lock"])
    }

    /// A new empty database; returns its conninfo.
    public func freshDatabase() throws -> String {
        counter += 1
        let name = "t\(getpid())_\(counter)"
        try embedded.createDatabase(name)
        return embedded.conninfo(database: name)
    }

    /// Runs SQL as the cluster's superuser against `database`'s conninfo.
    /// `timeout`: seconds for the round trip (bulk test data on a busy machine takes longer).
    public func sql(_ conninfo: String, _ query: String, _ params: [String?] = [], timeout: Double = 30) throws -> [[String?]] {
        try BlockingPG(conninfo, timeout: timeout).query(query, params).rows.map(\.values)
    }
}

/// A real `dispatchd` process on a free loopback port, against its own database.
public final class TestServer: @unchecked Sendable {
    public let port: Int
    public let conninfo: String
    public let adminKey = "test-admin-key-0123456789"
    public var environment: [String: String]
    /// Shell commands run before dispatchd starts (e.g. `ulimit -n 256;`).
    public var shell = ""
    public private(set) var pid: pid_t = 0
    /// `launch` also returns when /readyz says only the carrier is unavailable (a test of a
    /// carrier that refuses the server's credentials).
    public var acceptCarrierUnready = false
    public var baseURL: String { "http://127.0.0.1:\(port)" }
    public let logPath: String

    /// Starts a server; `conninfo` shares another server's database (several processes, one truth).
    public static func start(environment: [String: String] = [:], conninfo: String? = nil) throws -> TestServer {
        let cluster = try TestPostgres.shared()
        let db = try conninfo ?? cluster.freshDatabase()
        let s = TestServer(port: try freePort(), conninfo: db, environment: environment)
        try s.launch()
        return s
    }

    public init(port: Int, conninfo: String, environment: [String: String]) {
        self.port = port
        self.conninfo = conninfo
        self.environment = environment
        logPath = "/tmp/dispatchd-test-\(getpid())-\(port).log"
    }

    public func launch() throws {
        var env = Subprocess.currentEnvironment()
        env["DATABASE_URL"] = conninfo
        env["DISPATCH_LISTEN"] = "127.0.0.1:\(port)"
        env["DISPATCH_BOOTSTRAP_KEY"] = adminKey
        env["DISPATCH_WORKERS"] = env["DISPATCH_WORKERS"] ?? "1"
        env["DISPATCH_LOG_LEVEL"] = "info"
        for (k, v) in environment { env[k] = v }
        if env["DISPATCH_NATS_URL"] == nil, let urls = try TestCarrier.sharedURLs() { env["DISPATCH_NATS_URL"] = urls }
        if let urls = env["DISPATCH_NATS_URL"], !urls.isEmpty, env["DISPATCH_NATS_SUBJECT_PREFIX"] == nil {
            // Tests share NATS servers; each database is a deployment of its own.
            env["DISPATCH_NATS_SUBJECT_PREFIX"] = TestCarrier.subjectPrefix(conninfo)
        }
        let cmd = "\(shell) exec \(TestPaths.binary("dispatchd")) >> \(logPath) 2>&1"
        guard let p = Subprocess.start(["/bin/sh", "-c", cmd], environment: env) else {
            throw TestError("cannot start dispatchd")
        }
        pid = p
        let deadline = Clock.monotonic() + 30
        while Clock.monotonic() < deadline {
            if let r = try? HTTPClient(port: port).request("GET", "/readyz"),
               r.status == 200 || (acceptCarrierUnready && r.status == 503 && r.text.contains("carrier")) { return }
            var status: Int32 = 0
            if waitpid(pid, &status, WNOHANG) == pid {
                pid = 0
                throw TestError("dispatchd exited with \(Subprocess.exitCode(status)): \(log())")
            }
            usleep(50_000)
        }
        throw TestError("dispatchd did not become ready: \(log())")
    }

    public func log() -> String {
        guard let f = fopen(logPath, "r") else { return "" }
        defer { fclose(f) }
        var out: [UInt8] = []
        var buf = [UInt8](repeating: 0, count: 65536)
        while true { let n = fread(&buf, 1, buf.count, f); if n <= 0 { break }; out.append(contentsOf: buf[0..<n]) }
        return String(decoding: out.suffix(8000), as: UTF8.self)
    }

    /// SIGTERM and wait (graceful shutdown).
    public func stop() {
        guard pid > 0 else { return }
        Glibc.kill(pid, SIGTERM)
        _ = Subprocess.wait(pid)
        pid = 0
    }

    /// SIGKILL: a crash, nothing flushed.
    public func kill() {
        guard pid > 0 else { return }
        Glibc.kill(pid, SIGKILL)
        _ = Subprocess.wait(pid)
        pid = 0
    }

    public func restart() throws {
        stop()
        try launch()
    }

    public var client: HTTPClient { HTTPClient(port: port, token: adminKey) }

    deinit {
        if pid > 0 { Glibc.kill(pid, SIGKILL); _ = Subprocess.wait(pid) }
    }

    /// A loopback port bound by this process and never listened on, held until `ClosedPort`
    /// goes: connecting is refused, and no other test's server can take it meanwhile (a port
    /// that was merely free once was, and a "closed port" test got that server's 401).
    public final class ClosedPort {
        public let port: Int
        private let fd: Int32
        public init() throws {
            fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var addr = sockaddr_in()
            addr.sin_family = sa_family_t(AF_INET)
            addr.sin_addr.s_addr = inet_addr("127.0.0.1")
            var length = socklen_t(MemoryLayout<sockaddr_in>.size)
            let fd = self.fd
            let ok = withUnsafeMutablePointer(to: &addr) { a in
                a.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0 }
            }
            guard ok else { close(fd); throw SystemError("cannot hold a loopback port", errno: errno) }
            port = Int(UInt16(bigEndian: addr.sin_port))
        }
        deinit { close(fd) }
    }

    public static func freePort() throws -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        addr.sin_port = 0
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        let ok = withUnsafeMutablePointer(to: &addr) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, len) == 0 && getsockname(fd, $0, &len) == 0 }
        }
        guard ok else { throw TestError("no free port") }
        return Int(UInt16(bigEndian: addr.sin_port))
    }
}

/// `DISPATCH_TEST_CARRIER=nats` runs every test server over NATS (a 3-server cluster this test
/// process starts once) instead of LISTEN/NOTIFY: how CI runs the server suite in both modes.
public enum TestCarrier {
    nonisolated(unsafe) private static var cluster: NATSCluster?

    public static var isNATS: Bool { Subprocess.environment("DISPATCH_TEST_CARRIER") == "nats" }

    /// The shared cluster's URLs in NATS mode, else nil.
    public static func sharedURLs() throws -> String? {
        guard isNATS else { return nil }
        if cluster == nil { cluster = try NATSCluster(size: 3) }
        return cluster?.urls.joined(separator: ",")
    }

    /// A subject prefix of one database's own (`t` + a hash of its conninfo).
    public static func subjectPrefix(_ conninfo: String) -> String {
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        for b in conninfo.utf8 { h = (h ^ UInt64(b)) &* 0x100_0000_01b3 }
        return "t" + String(h, radix: 16)
    }
}

public struct TestError: Error, CustomStringConvertible {
    public let description: String
    public init(_ d: String) { description = d }
}
