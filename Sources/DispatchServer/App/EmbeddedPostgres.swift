import DispatchCore
import DispatchCrypto
import DispatchIO
import DispatchSystem
import Glibc

/// A private PostgreSQL cluster under the data directory, for when no DATABASE_URL is given.
/// Uses the server binaries on the machine; as root, runs them as the `postgres` user
/// (initdb refuses root). Unix socket only: nothing listens on TCP.
public final class EmbeddedPostgres {
    public let dataDir: String
    public let clusterDir: String
    public let socketDir: String
    private let binDir: String
    private let runAs: [String]
    private let log: Logger
    public private(set) var started = false
    /// False when the cluster was already running (another dispatchd owns it): leave it be.
    public private(set) var ownsServer = false

    public init(dataDir: String, log: Logger) throws {
        self.log = log
        let absolute = Files.absolutePath(dataDir)
        self.dataDir = absolute
        guard let bin = EmbeddedPostgres.findBinDir() else {
            throw PGError("no PostgreSQL server binaries in /usr/lib/postgresql/*/bin (install postgresql) and no DATABASE_URL set")
        }
        binDir = bin
        var root = absolute
        if getuid() == 0 {
            runAs = ["runuser", "-u", "postgres", "--"]
            // The postgres user must be able to reach the cluster; fall back when an ancestor is private.
            if !EmbeddedPostgres.traversable(byOthers: absolute) {
                root = "/var/lib/dispatch/" + String(SHA256.hex(Array(absolute.utf8)).prefix(16))
                log.warning("embedded_postgres.relocated", [("data_dir", absolute), ("cluster", root),
                                                           ("why", "the postgres user cannot reach the data dir")])
            }
        } else {
            runAs = []
        }
        clusterDir = root + "/pg"
        socketDir = root + "/run"
    }

    public var conninfo: String { "host=\(socketDir) port=5432 user=dispatch dbname=dispatch" }
    public func conninfo(database: String) -> String { "host=\(socketDir) port=5432 user=dispatch dbname=\(database)" }

    public func start() throws {
        try Files.makeDirectory(dataDir)
        try Files.makeDirectory(socketDir.dropLastPathComponent)
        try Files.makeDirectory(socketDir)
        if getuid() == 0 {
            _ = Subprocess.run(["chown", "-R", "postgres:postgres", socketDir.dropLastPathComponent])
        }
        if access(clusterDir + "/PG_VERSION", F_OK) != 0 {
            log.info("embedded_postgres.initdb", [("cluster", clusterDir)])
            let r = Subprocess.run(runAs + [binDir + "/initdb", "-D", clusterDir, "-U", "dispatch", "--auth=trust",
                                            "-E", "UTF8", "--locale=C.UTF-8", "--no-instructions"])
            guard r.status == 0 else { throw PGError("initdb failed: \(r.output.trimmingNewlines)") }
        }
        let status = Subprocess.run(runAs + [binDir + "/pg_ctl", "-D", clusterDir, "status"])
        ownsServer = status.status != 0
        if ownsServer {
            // Autovacuum looks at each database every 5 s rather than every minute: the push
            // outbox is a queue whose dead row versions pile up quickly (Migrations/0004).
            let options = "-k \(socketDir) -c listen_addresses='' -c max_connections=200 -c shared_buffers=128MB -c autovacuum_naptime=5s"
            let r = Subprocess.run(runAs + [binDir + "/pg_ctl", "-D", clusterDir, "-o", options, "-l", clusterDir + "/server.log",
                                            "-w", "-t", "60", "start"])
            guard r.status == 0 else {
                throw PGError("cannot start the embedded PostgreSQL: \(r.output.trimmingNewlines) (see \(clusterDir)/server.log)")
            }
        }
        started = true
        log.info("embedded_postgres.started", [("cluster", clusterDir), ("socket", socketDir)])
        try createDatabase("dispatch")
    }

    public func createDatabase(_ name: String) throws {
        let admin = try BlockingPG(conninfo(database: "postgres"))
        let exists = try admin.query("SELECT 1 FROM pg_database WHERE datname = $1", [name])
        if exists.rows.isEmpty { try admin.script("CREATE DATABASE \"\(name)\"") }
    }

    public func stop() {
        guard started, ownsServer else { return }
        started = false
        let r = Subprocess.run(runAs + [binDir + "/pg_ctl", "-D", clusterDir, "-m", "fast", "-w", "stop"])
        log.info("embedded_postgres.stopped", [("status", r.status)])
    }

    static func traversable(byOthers path: String) -> Bool {
        var current = ""
        for part in path.split(separator: "/").dropLast() {
            current += "/" + part
            var st = stat()
            guard stat(current, &st) == 0 else { return true }
            if st.st_mode & 0o001 == 0 { return false }
        }
        return true
    }

    static func findBinDir() -> String? {
        for version in ["17", "16", "15", "14", "13"] {
            let dir = "/usr/lib/postgresql/\(version)/bin"
            if access(dir + "/initdb", X_OK) == 0 { return dir }
        }
        return nil
    }
}
