import DispatchBuildInfo
import DispatchCore
import DispatchCrypto
import DispatchIO
import DispatchSystem
import Glibc

/// The `dispatchd` command: serve (as a supervisor of worker processes, or a single worker),
/// `migrate`, `keys`, `webhooks` and `push status`.
public enum Dispatchd {
    public static func main(_ arguments: [String]) -> Int32 {
        let invocation = DispatchdInvocation.parse(arguments) { arg in
            ServerConfig.settings.contains { arg == $0.flag || arg.hasPrefix($0.flag + "=") }
        }
        let command: DispatchdCommand?
        let args: [String]
        var keyArgs: [String] = []
        switch invocation {
        case .help:
            print(ServerConfig.usage(), terminator: "")
            return 0
        case .version:
            print("dispatchd \(Version.description)")
            return 0
        case .run(let c, let serverArguments, let commandArguments):
            command = c
            args = serverArguments
            keyArgs = commandArguments
        case .unknown(_, let serverArguments):
            command = nil
            args = serverArguments
        }
        // A hangup (a closed terminal, a reflexive `kill -HUP`) must not end a server: ignored
        // from the start (migrations included), then logged by the loops (Worker, Supervisor).
        if command == .serve { signal(SIGHUP, SIG_IGN) }
        let env = Subprocess.currentEnvironment()
        var config: ServerConfig
        do {
            config = try ServerConfig.parse(environment: env, arguments: args, cores: Int(sysconf(Int32(_SC_NPROCESSORS_ONLN))))
            if command == .serve, env["DISPATCH_WORKER_INDEX"] == nil { try PushSetup.check(config) }
        } catch {
            printError("dispatchd: \(error.message)")
            return 2
        }
        let log = Logger(level: Logger.Level(name: config.logLevel) ?? .info, format: config.logFormat)
        log.accessRule = config.accessLog.rule
        if env["DISPATCH_WORKER_INDEX"] == nil {
            for flag in config.secretsOnCommandLine {
                log.warning("config.secret_on_command_line", [("flag", flag), ("why", "every local user sees it in ps"),
                                                               ("instead", flag + "-file, or the environment")])
            }
        }
        if let index = env["DISPATCH_WORKER_INDEX"].flatMap({ Int($0) }), let conninfo = env["DISPATCH_WORKER_CONNINFO"] {
            log.staticFields = [("worker", String(index))]
            var workerConfig = config
            // The supervisor reserved the addresses (and chose the ports asked as 0).
            if let listen = env["DISPATCH_WORKER_LISTEN"], let addresses = try? ServerConfig.parseListen(listen) {
                workerConfig.listen = addresses
            }
            return runWorker(config: workerConfig, conninfo: conninfo, index: index, log: log, supervisor: getppid())
        }
        guard let command else {
            if case .unknown(let name, _) = invocation { printError("dispatchd: unknown command \(name) (see --help)") }
            return 2
        }
        if command == .check { return ReadyCheck.run(config) }
        // Only this server's workers may share its addresses: reserve them before any worker
        // binds, and fail once, clearly, when something else holds one. First of all: a second
        // server on a taken port must not run initdb or a migration (on a shared DATABASE_URL:
        // against the shared database) before it notices.
        var reservations: [PortReservation] = []
        if command == .serve {
            do {
                reservations = try config.listen.map { a throws(SystemError) in try PortReservation(host: a.host, port: a.port) }
            } catch {
                log.error("listen.failed", [("error", "\(error)")])
                printError("dispatchd: \(error)")
                return 1
            }
        }
        var embedded: EmbeddedPostgres?
        let conninfo: String
        if let url = config.databaseURL {
            conninfo = url
            if command.isAdmin { printError("dispatchd \(command.rawValue): using DATABASE_URL") }
        } else {
            // An admin command never creates a database: one made here would not be the server's.
            if command.isAdmin {
                guard EmbeddedPostgres.clusterExists(dataDir: config.dataDir) else {
                    printError("""
                        dispatchd \(command.rawValue): no database: DATABASE_URL is not set and there is no embedded cluster under \
                        \(Files.absolutePath(config.dataDir)) (run this where dispatchd runs, or pass --data-dir or --database-url)
                        """)
                    return 2
                }
                printError("dispatchd \(command.rawValue): using the embedded PostgreSQL under \(Files.absolutePath(config.dataDir))")
            }
            do {
                let pg = try EmbeddedPostgres(dataDir: config.dataDir, log: log)
                try pg.start(exclusive: command == .serve)
                embedded = pg
                conninfo = pg.conninfo
            } catch let error as DataDirError {
                // Nothing was started: say what to do, as for a bad setting.
                log.error("embedded_postgres.data_dir_unusable", [("error", error.description)])
                printError("dispatchd: \(error.description)")
                return 2
            } catch {
                log.error("embedded_postgres.failed", [("error", "\(error)")])
                return 1
            }
        }
        defer { embedded?.stop() }
        do {
            try Migrations.apply(try Migrations.toApply(), conninfo: conninfo, log: log)
        } catch {
            log.error("migration.failed", [("error", "\(error)")])
            return 1
        }
        if command == .serve {
            do {
                try Sequencer.carrierSwitch(toNATS: config.carrier != nil, conninfo: conninfo, log: log)
            } catch {
                log.error("carrier.switch_failed", [("error", "\(error)")])
                return 1
            }
        }
        switch command {
        case .migrate:
            log.info("migration.done")
            return 0
        case .keys:
            return KeysCommand.run(keyArgs, conninfo: conninfo)
        case .webhooks:
            return WebhooksCommand.run(keyArgs, conninfo: conninfo)
        case .push:
            return PushCommand.run(keyArgs, conninfo: conninfo)
        case .check:
            return ReadyCheck.run(config)
        case .serve:
            break
        }
        do {
            try PushSetup.ensureTokenKey(&config, embedded: embedded, log: log)
            try ensureKeys(config: config, conninfo: conninfo, embedded: embedded, log: log)
        } catch {
            log.error("keys.bootstrap_failed", [("error", "\(error)")])
            return 1
        }
        do {
            if try WebhookSecret.ensure(config) != nil, config.webhookSecret == nil {
                log.info("webhooks.secret", [("secret_file", WebhookSecret.path(config))])
            }
        } catch {
            log.error("webhooks.secret_failed", [("error", "\(error)")])
            return 1
        }
        var serving = config
        serving.listen = reservations.map { ServerConfig.Address(host: $0.host, port: $0.port) }
        if let first = serving.listen.first {
            // Tell a newcomer where the Activities view is and how to sign in to it.
            let host = ["0.0.0.0", "::", ""].contains(first.host) ? "localhost" : (first.host.contains(":") ? "[\(first.host)]" : first.host)
            let key = config.bootstrapKey != nil ? "the bootstrap key" : (config.databaseURL == nil ? "the key in \(config.dataDir)/dev-key"
                : "a key from: dispatchd keys create --name browser --scope read")
            log.info("web.open", [("url", "http://\(host):\(first.port)/"), ("sign_in_with", key)])
        }
        let files = PortReservation.raiseOpenFileLimit()
        log.info("server.limits", [("open_files", files)])
        let code: Int32
        if config.workers == 1 {
            code = runWorker(config: serving, conninfo: conninfo, index: 0, log: log)
        } else {
            code = Supervisor(config: serving, conninfo: conninfo, log: log).run()
        }
        withExtendedLifetime(reservations) {}
        return code
    }

    static func runWorker(config: ServerConfig, conninfo: String, index: Int, log: Logger, supervisor: pid_t? = nil) -> Int32 {
        let worker = Worker(config: config, conninfo: conninfo, index: index, log: log)
        worker.supervisor = supervisor
        if supervisor != nil { worker.stateDir = Subprocess.environment("DISPATCH_WORKER_STATE_DIR") }
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

