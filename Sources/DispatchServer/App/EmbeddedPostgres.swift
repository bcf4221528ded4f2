import DispatchCore
import DispatchCrypto
import DispatchIO
import DispatchSystem
import Glibc

/// A private PostgreSQL cluster under the data directory, for when no DATABASE_URL is given.
/// Uses the server binaries on the machine; as root, runs them as the `postgres` user (initdb
/// refuses root). Private to its owner: no TCP, a socket directory only its owner can enter,
/// and scram-sha-256 with a generated password kept in the data dir (mode 0600).
public final class EmbeddedPostgres {
    public let dataDir: String
    public let clusterDir: String
    public let socketDir: String
    private let binDir: String
    private let runAs: [String]
    private let log: Logger
    private var lockFD: Int32 = -1
    public private(set) var started = false
    /// Whether this process stops the cluster at exit: it started it, or adopted one left
    /// running by a dispatchd that died.
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
            let candidates: [String] = ["/usr/sbin/runuser", "/sbin/runuser", "/usr/bin/runuser"]
            let runuser = candidates.first { access($0, X_OK) == 0 } ?? "runuser"
            runAs = [runuser, "-u", "postgres", "--"]
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

    /// Whether a cluster was initialised under `dataDir` (as `init` would place it).
    public static func clusterExists(dataDir: String) -> Bool {
        guard let pg = try? EmbeddedPostgres(dataDir: dataDir, log: Logger(level: .error)) else { return false }
        return Files.exists(pg.clusterDir + "/PG_VERSION")
    }

    /// libpq reads the password from `passfile` (0600), so it appears in no environment or
    /// command line.
    public var conninfo: String { conninfo(database: "dispatch") }
    public func conninfo(database: String) -> String {
        "host=\(socketDir) port=5432 user=dispatch dbname=\(database) passfile=\(passFile)"
    }

    var passwordFile: String { dataDir + "/pg-password" }
    var passFile: String { dataDir + "/pgpass" }

    /// Starts the cluster (initialising it the first time). `exclusive`: this process serves
    /// with it and stops it at exit; a second server on the same data dir is refused, and a
    /// cluster left running by a server that died is adopted. Admin commands pass false and
    /// leave a running cluster alone.
    public func start(exclusive: Bool = true) throws {
        try Files.makeDirectory(dataDir, mode: 0o700)
        if exclusive { try lock() }
        let password = try Files.readOrCreateSecret(passwordFile) { Hex.encode(SecureRandom.bytes(24)) }
        try Files.write(passFile, "*:*:*:dispatch:\(password)\n", mode: 0o600)
        try prepareDirectories()
        if !Files.exists(clusterDir + "/PG_VERSION") { try initialise(password: password) }
        let running = Subprocess.run(runAs + [binDir + "/pg_ctl", "-D", clusterDir, "status"]).status == 0
        if running {
            // Only a server that died leaves a cluster running while nobody holds the lock.
            ownsServer = exclusive
            if exclusive { log.warning("embedded_postgres.adopted", [("cluster", clusterDir), ("why", "left running by a dispatchd that exited")]) }
        } else {
            ownsServer = true
            // Autovacuum looks at each database every 5 s rather than every minute: the push
            // outbox is a queue whose dead row versions pile up quickly (Migrations/0004).
            let options = "-k \(socketDir) -c listen_addresses='' -c unix_socket_permissions=0700 -c max_connections=200 -c shared_buffers=128MB"
                + " -c autovacuum_naptime=5s -c track_commit_timestamp=on"
            let r = Subprocess.run(runAs + [binDir + "/pg_ctl", "-D", clusterDir, "-o", options, "-l", clusterDir + "/server.log",
                                            "-w", "-t", "60", "start"])
            guard r.status == 0 else {
                throw PGError("cannot start the embedded PostgreSQL: \(r.output.trimmingNewlines) (see \(clusterDir)/server.log)")
            }
        }
        started = true
        try requirePassword(password)
        log.info("embedded_postgres.started", [("cluster", clusterDir), ("socket", socketDir)])
        try createDatabase("dispatch")
    }

    /// One serving dispatchd per data dir: an flock held for the life of the process (the
    /// kernel releases it however the process ends).
    private func lock() throws {
        let path = dataDir + "/dispatchd.lock"
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw PGError("cannot open \(path): \(String(cString: strerror(errno)))") }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            close(fd)
            throw PGError("another dispatchd is serving with the data dir \(dataDir)")
        }
        lockFD = fd
    }

    /// The cluster's directory and its socket's: owned by the user the cluster runs as, mode
    /// 0700, so no other local account can reach the socket or the files.
    private func prepareDirectories() throws {
        let home = clusterDir.dropLastPathComponent
        if home != dataDir {
            // Relocated under /var/lib/dispatch: that directory only needs to be passable for
            // the postgres user (not listable); each cluster's own directory stays 0700.
            let shared = home.dropLastPathComponent
            try Files.makeDirectory(shared, mode: 0o711)
            chmod(shared, 0o711)
        }
        for dir in [home, socketDir] {
            try Files.makeDirectory(dir, mode: 0o700)
            if getuid() == 0 { _ = Subprocess.run(["chown", "postgres:postgres", dir]) }
            chmod(dir, 0o700)
        }
    }

    private func initialise(password: String) throws {
        log.info("embedded_postgres.initdb", [("cluster", clusterDir)])
        // initdb reads the password from a file the cluster's user can read; it goes at once.
        let pwfile = socketDir.dropLastPathComponent + "/initdb-password"
        try Files.write(pwfile, password + "\n", mode: 0o600)
        if getuid() == 0 { _ = Subprocess.run(["chown", "postgres:postgres", pwfile]) }
        defer { unlink(pwfile) }
        let r = Subprocess.run(runAs + [binDir + "/initdb", "-D", clusterDir, "-U", "dispatch", "--auth=scram-sha-256",
                                        "--pwfile=\(pwfile)", "-E", "UTF8", "--locale=C.UTF-8", "--no-instructions"])
        guard r.status == 0 else { throw PGError("initdb failed: \(r.output.trimmingNewlines)") }
    }

    /// Clusters made before passwords (with `trust`) get the password and scram-sha-256 now.
    private func requirePassword(_ password: String) throws {
        let hbaPath = clusterDir + "/pg_hba.conf"
        let hba = Subprocess.run(runAs + ["cat", hbaPath]).output
        let rules = hba.split(separator: "\n").filter { !$0.hasPrefix("#") && !$0.allSatisfy(\.isWhitespace) }
        guard rules.contains(where: { $0.split(whereSeparator: \.isWhitespace).last == "trust" }) else { return }
        let db = try BlockingPG(conninfo(database: "postgres"))
        try db.query("SELECT set_config('password_encryption', 'scram-sha-256', false)")
        try db.script("ALTER ROLE dispatch PASSWORD '\(password)'")
        let scram = "local all all scram-sha-256\n"
        let temp = socketDir.dropLastPathComponent + "/pg_hba.conf.new"
        try Files.write(temp, scram, mode: 0o600)
        if getuid() == 0 { _ = Subprocess.run(["chown", "postgres:postgres", temp]) }
        let moved = Subprocess.run(runAs + ["cp", temp, hbaPath])
        unlink(temp)
        guard moved.status == 0 else { throw PGError("cannot rewrite \(hbaPath): \(moved.output)") }
        _ = Subprocess.run(runAs + [binDir + "/pg_ctl", "-D", clusterDir, "reload"])
        log.warning("embedded_postgres.secured", [("cluster", clusterDir), ("was", "trust"), ("now", "scram-sha-256")])
    }

    public func createDatabase(_ name: String) throws {
        let admin = try BlockingPG(conninfo(database: "postgres"))
        let exists = try admin.query("SELECT 1 FROM pg_database WHERE datname = $1", [name])
        if exists.rows.isEmpty { try admin.script("CREATE DATABASE \"\(name)\"") }
    }

    public func stop() {
        defer {
            if lockFD >= 0 { close(lockFD); lockFD = -1 }
        }
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
