import DispatchCore
import DispatchIO
import Glibc

/// The `dispatchd` command: serve (as a supervisor of worker processes, or a single worker),
/// `migrate`, and `keys`.
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
        if command == "keys" {
            // keys' own options come first; the rest are server settings (--database-url, ...).
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
        let config: ServerConfig
        do {
            config = try ServerConfig.parse(environment: env, arguments: args, cores: Int(sysconf(Int32(_SC_NPROCESSORS_ONLN))))
        } catch {
            printError("dispatchd: \(error.message)")
            return 2
        }
        let log = Logger(level: Logger.Level(name: config.logLevel) ?? .info)
        if let index = env["DISPATCH_WORKER_INDEX"].flatMap({ Int($0) }), let conninfo = env["DISPATCH_WORKER_CONNINFO"] {
            log.staticFields = [("worker", String(index))]
            return runWorker(config: config, conninfo: conninfo, index: index, log: log, supervisor: getppid())
        }
        switch command {
        case "serve", "migrate", "keys": break
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
        default:
            break
        }
        do {
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
            try db.query("""
                INSERT INTO api_keys (name, secret_hash, scopes) VALUES ('bootstrap', $1, '{admin}')
                ON CONFLICT (name) DO UPDATE SET secret_hash = EXCLUDED.secret_hash, scopes = '{admin}', revoked_at = NULL
                """, [SHA256.hex(Array(secret.utf8))])
            log.info("keys.bootstrap", [("name", "bootstrap")])
        } else if let embedded {
            // A newcomer's first curl needs a key: keep one for this private cluster.
            let path = embedded.dataDir + "/dev-key"
            var secret = Migrations.readFile(path)?.trimmingNewlines ?? ""
            if secret.isEmpty {
                var rng = SystemRandomNumberGenerator()
                secret = RandomID.secret(using: &rng)
                let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
                if fd >= 0 { _ = (secret + "\n").withCString { write(fd, $0, strlen($0)) }; close(fd) }
            }
            try db.query("""
                INSERT INTO api_keys (name, secret_hash, scopes) VALUES ('development', $1, '{admin}')
                ON CONFLICT (name) DO UPDATE SET secret_hash = EXCLUDED.secret_hash, revoked_at = NULL
                """, [SHA256.hex(Array(secret.utf8))])
            log.info("keys.development", [("key_file", path), ("hint", "export DISPATCH_TOKEN=$(cat \(path))")])
        }
    }
}

func printError(_ s: String) {
    let line = s + "\n"
    _ = line.withCString { write(2, $0, strlen($0)) }
}

/// `dispatchd keys create|list|revoke`, straight against the database.
enum KeysCommand {
    static func run(_ args: [String], conninfo: String) -> Int32 {
        do {
            let db = try BlockingPG(conninfo)
            switch args.first {
            case "create":
                var name: String?, scopes: String?, machine: String?
                var i = 1
                while i < args.count {
                    guard i + 1 < args.count else { printError("dispatchd keys create: \(args[i]) needs a value"); return 2 }
                    switch args[i] {
                    case "--name": name = args[i + 1]
                    case "--scope", "--scopes": scopes = args[i + 1]
                    case "--machine": machine = args[i + 1]
                    default: printError("dispatchd keys create: unknown option \(args[i])"); return 2
                    }
                    i += 2
                }
                guard let name, let scopeText = scopes, let parsed = Scope.parseList(scopeText) else {
                    printError("usage: dispatchd keys create --name NAME --scope publish[,read,device,admin] [--machine M]")
                    return 2
                }
                let spec: KeySpec
                do { spec = try KeySpec(name: name, scopes: parsed, machine: machine) } catch {
                    printError("dispatchd keys create: \(error.message)")
                    return 2
                }
                var rng = SystemRandomNumberGenerator()
                let secret = RandomID.secret(using: &rng)
                let r = try db.query("INSERT INTO api_keys (name, secret_hash, scopes, machine) VALUES ($1, $2, string_to_array($3, ','), $4) ON CONFLICT (name) DO NOTHING RETURNING id",
                                     [spec.name, SHA256.hex(Array(secret.utf8)), spec.scopes.map(\.rawValue).sorted().joined(separator: ","), spec.machine])
                guard !r.rows.isEmpty else { printError("dispatchd keys create: a key named \(name) exists"); return 5 }
                print(secret)
                return 0
            case "list":
                let r = try db.query("SELECT name, array_to_string(scopes, ','), coalesce(machine, '-'), created_at, coalesce(last_used_at::text, '-'), CASE WHEN revoked_at IS NULL THEN 'active' ELSE 'revoked' END FROM api_keys ORDER BY id")
                print("NAME\tSCOPES\tMACHINE\tCREATED\tLAST USED\tSTATUS")
                for row in r.rows { print(row.map { $0 ?? "-" }.joined(separator: "\t")) }
                return 0
            case "revoke":
                guard args.count == 2 else { printError("usage: dispatchd keys revoke NAME"); return 2 }
                let r = try db.query("UPDATE api_keys SET revoked_at = now() WHERE name = $1 AND revoked_at IS NULL RETURNING id", [args[1]])
                guard !r.rows.isEmpty else { printError("dispatchd keys revoke: no active key named \(args[1])"); return 3 }
                try db.query("SELECT pg_notify('\(Auth.keysChannel)', $1)", [args[1]])
                print("revoked \(args[1])")
                return 0
            default:
                printError("usage: dispatchd keys create|list|revoke")
                return 2
            }
        } catch {
            printError("dispatchd keys: \(error)")
            return 1
        }
    }
}
