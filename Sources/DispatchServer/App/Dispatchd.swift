import DispatchCore
import DispatchCrypto
import DispatchIO
import DispatchSystem
import Glibc

/// The `dispatchd` command: serve (as a supervisor of worker processes, or a single worker),
/// `migrate`, `keys`, and `push status`.
public enum Dispatchd {
    public static func main(_ arguments: [String]) -> Int32 {
        var args = arguments
        if args.contains("--help") || args.contains("-h") || args.first == "help" {
            print(ServerConfig.usage(), terminator: "")
            return 0
        }
        var command = "serve"
        if let first = args.first, !first.hasPrefix("-") {
            command = first
            args.removeFirst()
        }
        var keyArgs: [String] = []
        if command == "keys" || command == "push" {
            // The command's own options come first; the rest are server settings (--database-url, ...).
            keyArgs = args
            args = []
            var i = 0
            while i < keyArgs.count {
                if ServerConfig.settings.contains(where: { keyArgs[i] == $0.flag || keyArgs[i].hasPrefix($0.flag + "=") }) {
                    let takesValue = !keyArgs[i].contains("=")
                    args.append(keyArgs.remove(at: i))
                    if takesValue, i < keyArgs.count { args.append(keyArgs.remove(at: i)) }
                } else {
                    i += 1
                }
            }
        }
        let env = Subprocess.currentEnvironment()
        var config: ServerConfig
        do {
            config = try ServerConfig.parse(environment: env, arguments: args, cores: Int(sysconf(Int32(_SC_NPROCESSORS_ONLN))))
            if command == "serve", env["DISPATCH_WORKER_INDEX"] == nil { try PushSetup.check(config) }
        } catch {
            printError("dispatchd: \(error.message)")
            return 2
        }
        let log = Logger(level: Logger.Level(name: config.logLevel) ?? .info, format: config.logFormat)
        if let index = env["DISPATCH_WORKER_INDEX"].flatMap({ Int($0) }), let conninfo = env["DISPATCH_WORKER_CONNINFO"] {
            log.staticFields = [("worker", String(index))]
            return runWorker(config: config, conninfo: conninfo, index: index, log: log, supervisor: getppid())
        }
        switch command {
        case "serve", "migrate", "keys", "push": break
        default:
            printError("dispatchd: unknown command \(command) (see --help)")
            return 2
        }
        var embedded: EmbeddedPostgres?
        let conninfo: String
        if let url = config.databaseURL {
            conninfo = url
        } else {
            do {
                let pg = try EmbeddedPostgres(dataDir: config.dataDir, log: log)
                try pg.start()
                embedded = pg
                conninfo = pg.conninfo
            } catch {
                log.error("embedded_postgres.failed", [("error", "\(error)")])
                return 1
            }
        }
        defer { embedded?.stop() }
        do {
            guard let dir = Migrations.locateDirectory() else {
                throw PGError("cannot find the Migrations directory (set DISPATCH_MIGRATIONS_DIR)")
            }
            try Migrations.apply(try Migrations.load(from: dir), conninfo: conninfo, log: log)
        } catch {
            log.error("migration.failed", [("error", "\(error)")])
            return 1
        }
        switch command {
        case "migrate":
            log.info("migration.done")
            return 0
        case "keys":
            return KeysCommand.run(keyArgs, conninfo: conninfo)
        case "push":
            return PushCommand.run(keyArgs, conninfo: conninfo)
        default:
            break
        }
        do {
            try PushSetup.ensureTokenKey(&config, embedded: embedded, log: log)
            try ensureKeys(config: config, conninfo: conninfo, embedded: embedded, log: log)
        } catch {
            log.error("keys.bootstrap_failed", [("error", "\(error)")])
            return 1
        }
        if config.workers == 1 {
            return runWorker(config: config, conninfo: conninfo, index: 0, log: log)
        }
        return Supervisor(config: config, conninfo: conninfo, log: log).run()
    }

    static func runWorker(config: ServerConfig, conninfo: String, index: Int, log: Logger, supervisor: pid_t? = nil) -> Int32 {
        let worker = Worker(config: config, conninfo: conninfo, index: index, log: log)
        worker.supervisor = supervisor
        do {
            try worker.run()
        } catch {
            log.error("worker.failed", [("error", "\(error)")])
            return 1
        }
        return 0
    }

    static func ensureKeys(config: ServerConfig, conninfo: String, embedded: EmbeddedPostgres?, log: Logger) throws {
        let db = try BlockingPG(conninfo)
        if let secret = config.bootstrapKey {
            try db.query(KeySQL.ensureAdmin(name: "bootstrap", secretHash: SHA256.hex(Array(secret.utf8))))
            log.info("keys.bootstrap", [("name", "bootstrap")])
        } else if let embedded {
            // A newcomer's first curl needs a key: keep one for this private cluster.
            let path = embedded.dataDir + "/dev-key"
            var secret = Files.read(path)?.trimmingNewlines ?? ""
            if secret.isEmpty {
                var rng = SystemRandomNumberGenerator()
                secret = RandomID.secret(using: &rng)
                try Files.write(path, secret + "\n", mode: 0o600)
            }
            try db.query(KeySQL.ensureAdmin(name: "development", secretHash: SHA256.hex(Array(secret.utf8))))
            log.info("keys.development", [("key_file", path), ("hint", "export DISPATCH_TOKEN=$(cat \(path))")])
        }
    }
}

func printError(_ s: String) {
    let line = s + "\n"
    _ = line.withCString { write(2, $0, strlen($0)) }
}

