import DispatchCore
import DispatchCrypto
import DispatchIO
import DispatchSystem
import Glibc

/// A data directory the embedded cluster cannot use as it is (missing pieces, another user's,
/// out of the postgres user's reach): dispatchd says what to do and exits 2, starting nothing.
public struct DataDirError: Error, CustomStringConvertible {
    public let description: String
    init(_ message: String) { description = message }
}

/// A private PostgreSQL cluster under the data directory (`<data dir>/pg`, root or not), for
/// when no DATABASE_URL is given. Uses the server binaries on the machine; as root, runs them
/// as the `postgres` user (initdb refuses root). Private to its owner: no TCP, a socket
/// directory only its owner can enter, and scram-sha-256 with a generated password kept in
/// the data dir (mode 0600). A cluster this process starts never outlives it: a watchdog
/// process stops it once this process is gone, however it ended (docs/operations.md).
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
            // The postgres user must be able to reach the cluster. Older releases moved it to
            // /var/lib/dispatch/<hash> when it could not; such a cluster is still used (and
            // logged), but none is made there any more: the data lives where it is said to.
            if !EmbeddedPostgres.traversable(byOthers: absolute) {
                let legacy = "/var/lib/dispatch/" + String(SHA256.hex(Array(absolute.utf8)).prefix(16))
                guard Files.exists(legacy + "/pg/PG_VERSION") else {
                    throw DataDirError("""
                        as root the embedded PostgreSQL runs as the postgres user, which cannot reach \(absolute) (a parent \
                        directory is private): choose a data dir it can reach (--data-dir /var/lib/dispatch), run dispatchd as an \
                        ordinary user, or set DATABASE_URL
                        """)
                }
                root = legacy
                log.warning("embedded_postgres.legacy_location", [("data_dir", absolute), ("cluster", root),
                                                                 ("why", "made by an older release; move it to <data dir>/pg to keep it with the data dir")])
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
        try checkOwnership()
        if exclusive { try lock() }
        if Files.exists(clusterDir + "/PG_VERSION") && !Files.exists(passwordFile) {
            throw DataDirError("""
                the embedded cluster \(clusterDir) has no password file \(passwordFile) beside it: the data dir was moved or \
                copied in part. Put the whole data dir back (every file in it belongs together), or move \(clusterDir) away \
                to start with an empty database
                """)
        }
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
            // Before the cluster can exist: whatever happens to this process from here on,
            // the watchdog stops what it started.
            startWatchdog()
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
        do {
            try requirePassword(password)
            log.info("embedded_postgres.started", [("cluster", clusterDir), ("socket", socketDir)])
            try createDatabase("dispatch")
        } catch {
            // Never leave a cluster running that nobody will use or stop.
            stop()
            throw error
        }
    }

    /// The data dir, and the cluster directory in it, must be this user's (as root: the
    /// cluster's is the postgres user's): another user's files cannot be ours to serve.
    private func checkOwnership() throws {
        var st = stat()
        guard stat(dataDir, &st) == 0 else { return }
        // As root the data dir is handed to the postgres user (the cluster lives in it).
        let mine: Set<uid_t> = getuid() == 0 ? Set([0] + [EmbeddedPostgres.postgresUID()].compactMap { $0 }) : [getuid()]
        if !mine.contains(st.st_uid) {
            throw DataDirError("""
                the data dir \(dataDir) belongs to uid \(st.st_uid), not to uid \(getuid()) that runs dispatchd: run dispatchd as \
                its owner, or choose another --data-dir
                """)
        }
        let home = clusterDir.dropLastPathComponent
        guard home == dataDir, stat(clusterDir, &st) == 0 else { return }
        let expected = getuid() == 0 ? EmbeddedPostgres.postgresUID() : getuid()
        if let expected, st.st_uid != expected {
            throw DataDirError("""
                the embedded cluster \(clusterDir) belongs to uid \(st.st_uid), not to uid \(expected) that runs it: it was made \
                by another user (or copied without its owner); give it back to uid \(expected) or move it away
                """)
        }
    }

    static func postgresUID() -> uid_t? {
        guard let pw = getpwnam("postgres") else { return nil }
        return pw.pointee.pw_uid
    }

    /// A small process that outlives nothing: once this process is gone (stopped, crashed,
    /// killed with -9, at any step), it stops the cluster unless another dispatchd took the
    /// data dir's lock meanwhile (it adopted the cluster). It keeps looking for 10 s, for a
    /// `pg_ctl start` that was still bringing the cluster up.
    private func startWatchdog() {
        let lockPath = dataDir + "/dispatchd.lock"
        let ctl = (runAs + [binDir + "/pg_ctl", "-D", clusterDir]).map(EmbeddedPostgres.shellQuote).joined(separator: " ")
        let flockTool: String? = ["/usr/bin/flock", "/bin/flock"].first { access($0, X_OK) == 0 }
        // The look and the stop happen under the data dir's lock: a server that starts
        // meanwhile waits for the stop (it takes the cluster over after), never races it.
        let stopIfRunning = "if \(ctl) status >/dev/null 2>&1; then \(ctl) -m fast -w stop; fi"
        let step = flockTool.map {
            "\($0) -n -E 75 \(EmbeddedPostgres.shellQuote(lockPath)) /bin/sh -c \(EmbeddedPostgres.shellQuote(stopIfRunning)); [ $? -eq 75 ] && exit 0"
        } ?? stopIfRunning
        let script = """
            while kill -0 \(getpid()) 2>/dev/null; do sleep 0.2; done
            n=0
            while [ $n -lt 20 ]; do
              \(step)
              n=$((n+1)); sleep 0.5
            done
            """
        var options = Subprocess.Options()
        options.stdin = .null
        options.stdout = .null
        options.stderr = .null
        options.newProcessGroup = true
        if case .failure(let e) = Subprocess.spawn(["/bin/sh", "-c", script], options) {
            log.warning("embedded_postgres.watchdog_failed", [("error", "\(e)")])
        }
    }

    static func shellQuote(_ s: String) -> String {
        var out = "'"
        for c in s { out += c == "'" ? "'\\''" : String(c) }
        return out + "'"
    }

    /// One serving dispatchd per data dir: an flock held for the life of the process (the
    /// kernel releases it however the process ends), with the holder's pid written in it.
    /// A lock held while that pid is gone is the previous server's watchdog stopping its
    /// cluster: wait for it (a restart right after a stop must not be refused).
    private func lock() throws {
        let path = dataDir + "/dispatchd.lock"
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw PGError("cannot open \(path): \(String(cString: strerror(errno)))") }
        let deadline = Clock.monotonic() + Self.lockWait
        var waited = false
        while flock(fd, LOCK_EX | LOCK_NB) != 0 {
            let holder = Self.pidIn(Files.read(path))
            let serverAlive = holder.map { $0 != getpid() && (kill($0, 0) == 0 || errno == EPERM) } ?? false
            guard !serverAlive, Clock.monotonic() < deadline else {
                close(fd)
                throw PGError("another dispatchd is serving with the data dir \(dataDir)")
            }
            if !waited {
                waited = true
                log.info("embedded_postgres.lock_wait", [("data_dir", dataDir), ("reason", "the previous server's watchdog is stopping its cluster")])
            }
            usleep(50_000)
        }
        if ftruncate(fd, 0) == 0 {
            let line = Array("\(getpid())\n".utf8)
            _ = line.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, 0) }
        }
        lockFD = fd
    }

    /// How long a start waits for a previous server's watchdog to let the data dir go.
    static let lockWait: Double = 30

    /// The pid a lock file names (nil: empty, or not a pid).
    static func pidIn(_ text: String?) -> pid_t? {
        guard let word = text?.split(whereSeparator: \.isWhitespace).first, let pid = pid_t(word), pid > 0 else { return nil }
        return pid
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
