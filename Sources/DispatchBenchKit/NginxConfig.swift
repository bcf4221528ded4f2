/// The one nginx.conf for the helper servers of the bench and the tests (the bench's APNs
/// stand-in, the tests' HTTP/2 server, the TLS proxy in front of dispatchd): one process in the
/// foreground, every file under `dir`, one TLS server block on `listen`. Pure text; the caller
/// writes it and runs `nginx -p dir -c dir/nginx.conf`. (The nchan comparison server has its
/// own template, bench/nginx.conf.template.)
public struct NginxConfig: Equatable, Sendable {
    public var dir: String
    /// `load_module` paths (the echo module).
    public var modules: [String]
    public var workerConnections: Int
    /// Extra `http` directives (keepalive_requests, http2_max_concurrent_streams...).
    public var http: [String]
    /// `address:port` pairs, each `ssl http2`.
    public var listen: [String]
    public var certificate: String
    public var certificateKey: String
    /// The server block's content after its listen and TLS lines (locations, default_type).
    public var server: String

    public init(dir: String, modules: [String] = [], workerConnections: Int = 1024, http: [String] = [], listen: [String],
                certificate: String, certificateKey: String, server: String) {
        self.dir = dir
        self.modules = modules
        self.workerConnections = workerConnections
        self.http = http
        self.listen = listen
        self.certificate = certificate
        self.certificateKey = certificateKey
        self.server = server
    }

    public var text: String {
        var lines = modules.map { "load_module \($0);" }
        lines += [
            "daemon off;",
            "master_process off;",
            "worker_processes 1;",
            "pid \(dir)/nginx.pid;",
            "error_log \(dir)/logs/error.log warn;",
            "events { worker_connections \(workerConnections); }",
            "http {",
            "    access_log off;",
        ]
        lines += ["body", "proxy", "fastcgi", "uwsgi", "scgi"].map { "    \($0 == "body" ? "client_body" : $0)_temp_path \(dir)/tmp/\($0);" }
        lines += http.map { "    \($0);" }
        lines.append("    server {")
        lines += listen.map { "        listen \($0) ssl http2;" }
        lines += ["        ssl_certificate \(certificate);", "        ssl_certificate_key \(certificateKey);"]
        lines += server.split(separator: "\n", omittingEmptySubsequences: false).map { $0.isEmpty ? "" : "        " + $0 }
        lines += ["    }", "}", ""]
        return lines.joined(separator: "\n")
    }
}
