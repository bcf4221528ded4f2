import DispatchCore
import DispatchIO
import DispatchSystem

/// How committed changes travel between server processes: over NATS when
/// `DISPATCH_NATS_URL` is set (several servers), else PostgreSQL's LISTEN/NOTIFY.
public struct CarrierSettings: Equatable, Sendable {
    /// `nats://host:port` URLs of one NATS cluster; the client fails over between them.
    public var servers: [String]
    /// Subject prefix, so that several deployments can share one NATS cluster.
    public var subjectPrefix = "dispatch"
    /// Seconds between each worker's check that nothing committed went unannounced (a lost
    /// message, a process killed between its commit and its message).
    public var checkSeconds: Double = 1
    /// Credentials file, TLS CA and client certificate (user/password or a token go in the URLs).
    public var security = NATSClient.Security()

    static let settings: [ServerConfig.Setting] = [
        .init(env: "DISPATCH_NATS_URL", flag: "--nats-url",
              help: "nats://host:port of a NATS cluster, comma-separated; carries changes between servers (default: none, LISTEN/NOTIFY for one server)"),
        .init(env: "DISPATCH_NATS_SUBJECT_PREFIX", flag: "--nats-subject-prefix",
              help: "NATS subject prefix, for deployments sharing a NATS cluster (default dispatch)"),
        .init(env: "DISPATCH_CARRIER_CHECK", flag: "--carrier-check",
              help: "seconds between checks for changes whose NATS message was lost (default 1)"),
        .init(env: "DISPATCH_NATS_CREDS", flag: "--nats-creds", help: "NATS credentials file (JWT and NKey seed, as nsc makes it)"),
        .init(env: "DISPATCH_NATS_CA", flag: "--nats-ca",
              help: "PEM file of the CA that signed the NATS servers' certificates (TLS; default the system's CAs for tls:// URLs)"),
        .init(env: "DISPATCH_NATS_CERT", flag: "--nats-cert", help: "client certificate (PEM) when the NATS servers verify clients"),
        .init(env: "DISPATCH_NATS_KEY", flag: "--nats-key", help: "the client certificate's private key (PEM)"),
    ]

    static let dependent = ["DISPATCH_NATS_SUBJECT_PREFIX", "DISPATCH_CARRIER_CHECK", "DISPATCH_NATS_CREDS", "DISPATCH_NATS_CA",
                            "DISPATCH_NATS_CERT", "DISPATCH_NATS_KEY"]

    static func parse(_ values: [String: String]) throws(ConfigError) -> CarrierSettings? {
        guard let text = values["DISPATCH_NATS_URL"], !text.isEmpty else {
            for other in dependent where values[other] != nil {
                throw ConfigError("\(other) needs DISPATCH_NATS_URL")
            }
            return nil
        }
        let servers: [String]
        do {
            servers = try NATSClient.servers(fromSetting: text)
        } catch {
            throw ConfigError("DISPATCH_NATS_URL: \(error.message), e.g. nats://dispatch:PASSWORD@10.0.0.5:4222,nats://dispatch:PASSWORD@10.0.0.6:4222 or tls://10.0.0.5:4222")
        }
        var c = CarrierSettings(servers: servers)
        if let p = values["DISPATCH_NATS_SUBJECT_PREFIX"] {
            let tokens = p.split(separator: ".", omittingEmptySubsequences: false)
            guard !p.isEmpty, p.utf8.count <= 64, tokens.allSatisfy({ t in
                !t.isEmpty && t.utf8.allSatisfy { $0 == 0x2D || $0 == 0x5F || (0x30...0x39).contains($0) || (0x41...0x5A).contains($0) || (0x61...0x7A).contains($0) }
            }) else {
                throw ConfigError("DISPATCH_NATS_SUBJECT_PREFIX must be dot-separated tokens of [A-Za-z0-9_-], at most 64 characters")
            }
            c.subjectPrefix = p
        }
        if let v = values["DISPATCH_CARRIER_CHECK"] {
            guard let d = Double(v), d.isFinite, d >= 0.05, d <= 60 else {
                throw ConfigError("DISPATCH_CARRIER_CHECK must be seconds from 0.05 to 60, not \(v)")
            }
            c.checkSeconds = d
        }
        for (env, path) in [("DISPATCH_NATS_CREDS", \NATSClient.Security.credentialsFile), ("DISPATCH_NATS_CA", \.caFile),
                            ("DISPATCH_NATS_CERT", \.certFile), ("DISPATCH_NATS_KEY", \.keyFile)] {
            guard let file = values[env] else { continue }
            guard Files.read(file) != nil else { throw ConfigError("\(env): cannot read \(file)") }
            c.security[keyPath: path] = file
        }
        if (c.security.certFile == nil) != (c.security.keyFile == nil) {
            throw ConfigError("DISPATCH_NATS_CERT and DISPATCH_NATS_KEY go together")
        }
        return c
    }
}
