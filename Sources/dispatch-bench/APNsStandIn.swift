import DispatchBlockingHTTP
import DispatchCore
import DispatchBenchKit
import DispatchSystem
#if canImport(Glibc)
import Glibc
#endif

/// A local APNs for the bench: the tests' fake (Python, checks everything, records every
/// request) or nginx answering 200 over HTTP/2 + TLS (cheap: the sender's own ceiling).
final class APNsStandIn {
    let kind: String
    let port: UInt16
    let pid: pid_t
    let controlPort: UInt16?
    /// The fake's channel management listener (nginx answers channel calls on `port`).
    var managePort: UInt16?
    private let stdinFD: Int32?
    private var stopped = false

    init(kind: String, port: UInt16, pid: pid_t, controlPort: UInt16?, stdinFD: Int32?) {
        self.kind = kind
        self.port = port
        self.pid = pid
        self.controlPort = controlPort
        self.stdinFD = stdinFD
    }

    static func fake(pki: String, dir: String) throws -> APNsStandIn {
        guard access("/usr/bin/python3", X_OK) == 0 else { throw BenchError("the fake APNs needs /usr/bin/python3 with python3-h2 (make test-deps)") }
        var input: [Int32] = [0, 0], output: [Int32] = [0, 0]
        guard pipe(&input) == 0, pipe(&output) == 0 else { throw BenchError("pipe failed") }
        for fd in [input[1], output[0]] { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        let logFd = open(dir + "/fake_apns.log", O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
        let pid = try Proc.spawn("/usr/bin/python3", [
            "Tests/tools/fake_apns.py", "--cert", pki + "/server.pem", "--key", pki + "/server-key.pem",
            "--auth-key-pub", pki + "/AuthKey_TESTKEY123.pub.pem", "--team-id", "TEAM123456", "--key-id", "TESTKEY123",
            "--topic", "com.example.dispatch", "--port", "0", "--control-port", "0",
        ], stdin: input[0], stdout: output[1], stderr: logFd, closeInChild: [input[1], output[0]])
        Glibc.close(input[0]); Glibc.close(output[1]); Glibc.close(logFd)
        defer { Glibc.close(output[0]) }
        var line: [UInt8] = []
        let deadline = Clock.monotonicNanoseconds() + 20_000_000_000
        while !line.contains(10) && Clock.monotonicNanoseconds() < deadline {
            var p = pollfd(fd: output[0], events: Int16(POLLIN), revents: 0)
            if poll(&p, 1, 200) <= 0 { continue }
            var buf = [UInt8](repeating: 0, count: 256)
            let n = read(output[0], &buf, buf.count)
            if n <= 0 { break }
            line += buf[0..<n]
        }
        guard let v = try? JSONParser.parse(Array(line.prefix { $0 != 10 })), let port = v.int("port"), let control = v.int("controlPort") else {
            Proc.stop(pid)
            throw BenchError("fake_apns.py did not start; see \(dir)/fake_apns.log")
        }
        let standIn = APNsStandIn(kind: "fake", port: UInt16(port), pid: pid, controlPort: UInt16(control), stdinFD: input[1])
        standIn.managePort = v.int("managePort").map { UInt16($0) }
        return standIn
    }

    static let echoModule = "/usr/lib/nginx/modules/ngx_http_echo_module.so"

    static func nginx(pki: String, dir: String) throws -> APNsStandIn {
        guard let nginx = Proc.which("nginx"), access(echoModule, R_OK) == 0 else {
            throw BenchError("the nginx stand-in needs nginx and its echo module (apt-get install nginx-light libnginx-mod-http-echo)")
        }
        let ndir = dir + "/apns-nginx"
        for sub in ["tmp/body", "tmp/proxy", "tmp/fastcgi", "tmp/uwsgi", "tmp/scgi", "logs"] { try? Files.makeDirectory(ndir + "/" + sub) }
        let port = Servers.freePort(startingAt: 19580)
        let config = NginxConfig(
            dir: ndir, modules: [echoModule],
            http: ["keepalive_requests 100000000", "keepalive_timeout 600s", "http2_max_concurrent_streams 1000"],
            listen: ["127.0.0.1:\(port)"], certificate: "\(pki)/server.pem", certificateKey: "\(pki)/server-key.pem",
            server: """
            location / {
                echo_read_request_body;
                echo -n '';
            }
            # Channel management: every creation gets the same id (enough for the bench).
            location /1/apps/ {
                echo_read_request_body;
                add_header apns-channel-id YmVuY2hjaGFubmVsMDAwMQ== always;
                echo -n '';
            }
            """)
        try Files.write(ndir + "/nginx.conf", config.text)
        let logFd = open(ndir + "/stderr.log", O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
        let pid = try Proc.spawn(nginx, ["-p", ndir, "-c", ndir + "/nginx.conf", "-e", ndir + "/logs/error.log"], stdout: logFd, stderr: logFd)
        Glibc.close(logFd)
        let deadline = Clock.monotonicNanoseconds() + 10_000_000_000
        while Clock.monotonicNanoseconds() < deadline && Servers.canBind("127.0.0.1", port) { usleep(50_000) }
        guard Proc.alive(pid), !Servers.canBind("127.0.0.1", port) else { throw BenchError("nginx did not start; see \(ndir)/logs") }
        return APNsStandIn(kind: "nginx", port: port, pid: pid, controlPort: nil, stdinFD: nil)
    }

    func stop() {
        guard !stopped else { return }
        stopped = true
        Proc.stop(pid, signal: SIGTERM, grace: 5)
        if let stdinFD { Glibc.close(stdinFD) }
    }

    func clearRecords() {
        guard let c = controlPort else { return }
        _ = PlainHTTP.request(port: c, method: "DELETE", path: "/requests")
    }

    /// Publish → arrival at the fake, in ms, from the `t=` status the bench publisher sends
    /// (both clocks are this machine's CLOCK_REALTIME).
    func latencySamples(tokens: [String]) -> [Double] {
        guard let c = controlPort else { return [] }
        var out: [Double] = []
        for t in tokens {
            guard let body = PlainHTTP.request(port: c, method: "GET", path: "/requests?token=\(t)"),
                  let v = try? JSONParser.parse(body), case .array(let records)? = v["requests"] else { continue }
            for r in records {
                guard case .number(let arrived)? = r["time"], case .string(let status)? = r["body"]?["aps"]?["content-state"]?["status"],
                      status.hasPrefix("t="), let sent = Double(status.dropFirst(2)) else { continue }
                out.append(arrived * 1000 - sent / 1e6)
            }
        }
        return out
    }
}
