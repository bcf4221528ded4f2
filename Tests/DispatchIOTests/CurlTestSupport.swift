@testable import DispatchIO
import DispatchBenchKit
import DispatchSystem
import DispatchTestSupport
import Glibc
import XCTest

/// Runs the loop until `done()` holds or `timeout` seconds pass; returns `done()`.
@discardableResult
func runLoop(_ loop: EventLoop, timeout: Double, until done: @escaping () -> Bool) -> Bool {
    let deadline = Clock.monotonic() + timeout
    if done() { return true }
    let check = loop.timer(after: 0.002, repeating: true) {
        if done() || Clock.monotonic() > deadline { loop.stop() }
    }
    loop.run()
    check.cancel()
    return done()
}

/// Runs the loop for `seconds`, whatever happens.
func spin(_ loop: EventLoop, _ seconds: Double) {
    let deadline = Clock.monotonic() + seconds
    runLoop(loop, timeout: seconds + 1) { Clock.monotonic() >= deadline }
}

func waitFor(_ timeout: Double, _ condition: () -> Bool) -> Bool {
    let deadline = Clock.monotonic() + timeout
    while Clock.monotonic() < deadline {
        if condition() { return true }
        usleep(20_000)
    }
    return condition()
}

/// A scratch directory under /tmp, removed by `remove()`.
func makeTempDir(_ name: String) -> String {
    var template = Array("/tmp/dispatch-\(name)-XXXXXX".utf8CString)
    guard let p = mkdtemp(&template) else { fatalError("mkdtemp failed") }
    return String(cString: p)
}

func writeFile(_ path: String, _ text: String) {
    let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
    precondition(fd >= 0, "cannot write \(path)")
    _ = text.withCString { write(fd, $0, strlen($0)) }
    close(fd)
}

func readFile(_ path: String) -> String? {
    let fd = open(path, O_RDONLY)
    guard fd >= 0 else { return nil }
    defer { close(fd) }
    var out: [UInt8] = []
    var buf = [UInt8](repeating: 0, count: 4096)
    while true {
        let n = read(fd, &buf, buf.count)
        if n <= 0 { break }
        out.append(contentsOf: buf[0..<n])
    }
    return String(decoding: out, as: UTF8.self)
}

func killProcess(_ pid: pid_t?) {
    guard let pid else { return }
    kill(pid, SIGKILL)
    _ = Subprocess.wait(pid)
}

/// A plain HTTP/1.1 server in python3 (the standard library's http.server) with a few
/// misbehaving paths: `/echo`, `/big`, `/redirect`, `/hang`, `/drop`, `/reset`, `/partial`.
final class PythonHTTPServer {
    let dir: String
    let port: Int
    private var pid: pid_t?

    static let script = #"""
import http.server, os, socket, struct, sys, time

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args): pass
    def do_GET(self): self.answer()
    def do_POST(self): self.answer()
    def do_PUT(self): self.answer()
    def do_DELETE(self): self.answer()
    def answer(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        path = self.path
        if path.startswith("/echo"):
            self.send_response(200)
            self.send_header("X-Echo-Method", self.command)
            self.send_header("X-Echo-Test", self.headers.get("X-Test", ""))
            self.send_header("X-Echo-Expect", self.headers.get("Expect", "none"))
            self.send_header("X-Echo-Agent", self.headers.get("User-Agent", ""))
            self.send_header("X-Echo-Port", str(self.client_address[1]))
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif path == "/big":
            data = b"x" * 100000
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        elif path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "/echo")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path == "/hang":
            time.sleep(120)
        elif path == "/drop":
            self.close_connection = True
        elif path == "/reset":
            # Linger 0 and a close without shutdown: the peer gets RST, not FIN.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            os.close(self.connection.detach())
            self.close_connection = True
        elif path == "/partial":
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b"0123456789")
            self.wfile.flush()
            self.close_connection = True
        else:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

server = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
server.daemon_threads = True
server.serve_forever()
"""#

    init() throws {
        dir = makeTempDir("http1")
        port = try TestServer.freePort()
        writeFile(dir + "/server.py", PythonHTTPServer.script)
        pid = Subprocess.start(["/usr/bin/python3", dir + "/server.py", String(port)])
        guard pid != nil, waitFor(10, { isListening(port) }) else {
            stop()
            throw TestFailure("python3 http.server did not start")
        }
    }

    func url(_ path: String, host: String = "127.0.0.1") -> String { "http://\(host):\(port)\(path)" }

    func stop() {
        killProcess(pid)
        pid = nil
        _ = Subprocess.run(["rm", "-rf", dir])
    }
}

/// nginx serving HTTP/2 over TLS with a certificate from a CA made for the test. Every answer
/// carries nginx's connection serial number, so a test can count the connections it used.
/// Uses the echo module (libnginx-mod-http-echo): it reads the whole request body before
/// answering, as APNs does (nginx's `return` answers first, and curl 7.88 then sometimes
/// fails the stream while still sending the body), and `/hang` never answers.
final class NginxH2Server {
    let dir: String
    let port: Int
    var caFile: String { dir + "/ca.pem" }
    private var pid: pid_t?
    static let echoModule = "/usr/lib/nginx/modules/ngx_http_echo_module.so"

    /// `maxRequestsPerConnection`: nginx sends GOAWAY after that many (keepalive_requests).
    init(maxRequestsPerConnection: Int = 10_000_000) throws {
        guard access("/usr/sbin/nginx", X_OK) == 0, access(NginxH2Server.echoModule, R_OK) == 0 else {
            throw TestFailure("needs nginx and its echo module (apt-get install nginx-light libnginx-mod-http-echo)")
        }
        dir = makeTempDir("h2")
        port = try TestServer.freePort()
        try makeCertificates()
        for sub in ["tmp", "logs"] { mkdir(dir + "/" + sub, 0o755) }
        let config = NginxConfig(
            dir: dir, modules: [NginxH2Server.echoModule], workerConnections: 4096,
            http: ["keepalive_requests \(maxRequestsPerConnection)", "http2_max_concurrent_streams 1000"],
            listen: ["127.0.0.1:\(port)"], certificate: "\(dir)/server.pem", certificateKey: "\(dir)/server-key.pem",
            server: """
            default_type application/json;
            location / {
                echo_read_request_body;
                echo -n '{"ok":true,"connection":$connection}';
            }
            location /early {
                return 200 '{"early":true}';
            }
            location /hang {
                echo_sleep 120;
                echo -n '{}';
            }
            """)
        writeFile(dir + "/nginx.conf", config.text)
        try start()
    }

    /// A CA and a certificate it signed for localhost and 127.0.0.1, by the tests' one PKI script.
    private func makeCertificates() throws {
        let root = "\(#filePath)".split(separator: "/").dropLast(3).joined(separator: "/")
        let r = Subprocess.run(["/bin/sh", "/" + root + "/Tests/tools/make_test_pki.sh", dir])
        guard r.status == 0 else { throw TestFailure("make_test_pki.sh failed: \(r.output)") }
    }

    func start() throws {
        pid = Subprocess.start(["/usr/sbin/nginx", "-p", dir, "-e", dir + "/logs/error.log", "-c", dir + "/nginx.conf"])
        guard pid != nil, waitFor(10, { isListening(port) }) else {
            let log = readFile(dir + "/logs/error.log") ?? ""
            stop()
            throw TestFailure("nginx did not start: \(log)")
        }
    }

    /// CPU seconds nginx has used (user + system), from /proc.
    func cpuSeconds() -> Double {
        guard let pid, let stat = readFile("/proc/\(pid)/stat"), let close = stat.lastIndex(of: ")") else { return 0 }
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        // After the command: state is field 3, utime 14 and stime 15 (1-based, /proc/pid/stat).
        guard fields.count > 12, let user = Double(fields[11]), let system = Double(fields[12]) else { return 0 }
        return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    /// kill -9: connections die without GOAWAY or FIN from nginx's side beyond the kernel's.
    func kill9() {
        killProcess(pid)
        pid = nil
    }

    func url(_ path: String) -> String { "https://127.0.0.1:\(port)\(path)" }

    func stop() {
        kill9()
        _ = Subprocess.run(["rm", "-rf", dir])
    }
}

/// Completions of one batch of requests, counted per request (each must run once).
final class Tally {
    var results: [Int: Result<CurlClient.Response, HTTPClientFailure>] = [:]
    var calls = 0
    var duplicates = 0

    func completion(_ i: Int) -> CurlClient.Completion {
        return { [self] result in
            calls += 1
            if results[i] != nil { duplicates += 1 }
            results[i] = result
        }
    }

    var successes: [CurlClient.Response] { results.values.compactMap { try? $0.get() } }
    var failures: [HTTPClientFailure] {
        results.values.compactMap { if case .failure(let f) = $0 { return f } else { return nil } }
    }
}

extension CurlClient.Response {
    var text: String { String(decoding: body, as: UTF8.self) }
}

extension Result where Success == CurlClient.Response, Failure == HTTPClientFailure {
    var failure: HTTPClientFailure? { if case .failure(let f) = self { return f } else { return nil } }
}

/// A missing tool or a server that would not start: the setup (`make test`) installs them all,
/// so this is a failure, not a skip.
struct TestFailure: Error, CustomStringConvertible {
    let description: String
    init(_ d: String) { description = d }
}

/// User + system CPU seconds this process has used.
func cpuSeconds() -> Double {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
}

enum ProcessInfoLite {
    static func env(_ name: String) -> String? { getenv(name).map { String(cString: $0) } }
}
