import DispatchIO
import DispatchSystem
import Glibc

/// Start-up checks and the embedded default's token key.
enum PushSetup {
    /// Refuses a configuration that cannot push (exit 2): an unusable .p8, or APNs against an
    /// external database without a token key (tokens would be unreadable after a restart with
    /// a new one, so a key is never made up there).
    static func check(_ config: ServerConfig) throws(ConfigError) {
        guard let apns = config.apns else { return }
        _ = try apns.loadSigner()
        if config.tokenKey == nil && config.databaseURL != nil {
            throw ConfigError("DISPATCH_TOKEN_KEY is required with DATABASE_URL and APNs: 32 bytes (openssl rand -hex 32) that seal device tokens at rest; keep it with the database's other secrets")
        }
    }

    /// The embedded default keeps its token key under the data dir (0600), made once, like the
    /// development API key; the workers inherit it through the environment.
    static func ensureTokenKey(_ config: inout ServerConfig, embedded: EmbeddedPostgres?, log: Logger) throws {
        guard config.tokenKey == nil, let embedded else { return }
        let path = embedded.dataDir + "/token-key"
        let text = try Files.readOrCreateSecret(path) { TokenKey.generate() }
        config.tokenKey = try TokenKey.parse(text)
        setenv("DISPATCH_TOKEN_KEY", text, 1)
        log.info("push.token_key", [("key_file", path)])
    }
}
