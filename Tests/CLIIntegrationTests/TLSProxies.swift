import DispatchBenchKit
import DispatchSystem
import DispatchTestSupport
import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// nginx terminating TLS in front of a dispatchd, as docs/deploy.md sets it up (buffering off
/// for SSE), with a certificate from a CA made for the test: the CLI reaches the server over
/// https:// and trusts that CA only through --cacert / DISPATCH_CA_FILE / CURL_CA_BUNDLE.
/// (DispatchIOTests' NginxH2Server makes its certificates the same way; test targets cannot
/// share code outside DispatchTestSupport.)
final class TLSReverseProxy {
    let dir: String
    let port: Int
    var caFile: String { dir + "/ca.pem" }
    var url: String { "https://127.0.0.1:\(port)" }
    private var pid: pid_t?

    init(upstreamPort: Int) throws {
        guard access("/usr/sbin/nginx", X_OK) == 0 else { throw TLSTestFailure("needs nginx (apt-get install nginx-light)") }
        dir = try makeScratchDirectory("tls-proxy")
        port = try TestServer.freePort()
        try makeCertificates(in: dir)
        for sub in ["tmp", "logs"] { mkdir(dir + "/" + sub, 0o755) }
        // 127.0.0.2: an address the certificate does not name.
        let config = NginxConfig(
            dir: dir, listen: ["127.0.0.1:\(port)", "127.0.0.2:\(port)"],
            certificate: "\(dir)/server.pem", certificateKey: "\(dir)/server-key.pem",
            server: """
            location / {
                proxy_pass http://127.0.0.1:\(upstreamPort);
                proxy_http_version 1.1;
                proxy_set_header Connection "";
                proxy_buffering off;
                proxy_read_timeout 1h;
            }
            """)
        try Files.write(dir + "/nginx.conf", config.text)
        try start()
    }

    func start() throws {
        pid = Subprocess.start(["/usr/sbin/nginx", "-p", dir, "-e", dir + "/logs/error.log", "-c", dir + "/nginx.conf"])
        let deadline = Clock.monotonic() + 10
        while Clock.monotonic() < deadline && !isListening(port) { usleep(20_000) }
        guard pid != nil, isListening(port) else {
            let log = Files.read(dir + "/logs/error.log") ?? ""
            stop()
            throw TLSTestFailure("nginx did not start: \(log)")
        }
    }

    /// kill -9: every connection through it dies at once (a proxy restart, seen from the CLI).
    func kill9() {
        if let pid {
            kill(pid, SIGKILL)
            _ = Subprocess.wait(pid)
        }
        pid = nil
    }

    func stop() {
        kill9()
        _ = Subprocess.run(["rm", "-rf", dir])
    }
}

/// A forward proxy that speaks only `CONNECT host:port` (what an HTTPS_PROXY does for https),
/// and counts the tunnels it made.
final class ConnectProxy: @unchecked Sendable {
    let port: Int
    private let listenFD: Int32
    private let lock = NSLock()
    private var tunnels: [String] = []

    /// The `host:port` of every tunnel asked for, in order.
    var targets: [String] { lock.lock(); defer { lock.unlock() }; return tunnels }

    init() throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        listenFD = fd
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        let ok = withUnsafeMutablePointer(to: &addr) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, len) == 0 && listen(fd, 16) == 0 && getsockname(fd, $0, &len) == 0
            }
        }
        guard ok else { throw TLSTestFailure("cannot listen for the CONNECT proxy") }
        port = Int(UInt16(bigEndian: addr.sin_port))
        Thread.detachNewThread { [self] in
            while true {
                let client = accept(listenFD, nil, nil)
                if client < 0 { return }
                Thread.detachNewThread { [self] in tunnel(client) }
            }
        }
    }

    func close() { shutdown(listenFD, Int32(SHUT_RDWR)); Glibc.close(listenFD) }

    private func tunnel(_ client: Int32) {
        defer { Glibc.close(client) }
        var head: [UInt8] = []
        var byte: UInt8 = 0
        while !head.ends(with: Array("\r\n\r\n".utf8)) {
            guard recv(client, &byte, 1, 0) == 1, head.count < 8192 else { return }
            head.append(byte)
        }
        let line = String(decoding: head, as: UTF8.self).split(separator: "\r\n").first.map(String.init) ?? ""
        let parts = line.split(separator: " ")
        guard parts.count == 3, parts[0] == "CONNECT", let colon = parts[1].lastIndex(of: ":"),
              let port = UInt16(parts[1][parts[1].index(after: colon)...]) else {
            _ = send(client, "HTTP/1.1 405 Method Not Allowed\r\n\r\n", 35, Int32(MSG_NOSIGNAL))
            return
        }
        lock.lock()
        tunnels.append(String(parts[1]))
        lock.unlock()
        let socket = try? TestSocket.connect(port: Int(port))  // the tests only tunnel to this machine
        defer { socket?.close() }
        let answer = socket != nil ? "HTTP/1.1 200 Connection established\r\n\r\n" : "HTTP/1.1 502 Bad Gateway\r\n\r\n"
        _ = answer.withCString { send(client, $0, strlen($0), Int32(MSG_NOSIGNAL)) }
        guard let upstream = socket?.fd else { return }
        var fds = [pollfd(fd: client, events: Int16(POLLIN), revents: 0), pollfd(fd: upstream, events: Int16(POLLIN), revents: 0)]
        var buffer = [UInt8](repeating: 0, count: 65536)
        while poll(&fds, 2, -1) > 0 {
            for (i, from) in [client, upstream].enumerated() where fds[i].revents != 0 {
                let n = recv(from, &buffer, buffer.count, 0)
                if n <= 0 { return }
                let to = from == client ? upstream : client
                if send(to, buffer, n, Int32(MSG_NOSIGNAL)) != n { return }
            }
        }
    }
}

/// A CA and a certificate it signed for localhost and 127.0.0.1 (ca.pem, server.pem,
/// server-key.pem), made by the tests' one PKI script.
func makeCertificates(in dir: String) throws {
    let r = Subprocess.run(["/bin/sh", TestPaths.repositoryRoot + "/Tests/tools/make_test_pki.sh", dir])
    guard r.status == 0 else { throw TLSTestFailure("make_test_pki.sh failed: \(r.output)") }
}

func makeScratchDirectory(_ name: String) throws -> String {
    var template = Array("/tmp/dispatch-cli-\(name)-XXXXXX".utf8CString)
    guard let p = mkdtemp(&template) else { throw TLSTestFailure("mkdtemp failed") }
    return String(cString: p)
}

/// Missing tools are a failure, not a skip: `make test` installs them (scripts/install-deps.sh).
typealias TLSTestFailure = TestError

extension Array where Element == UInt8 {
    func ends(with suffix: [UInt8]) -> Bool { count >= suffix.count && Array(self[(count - suffix.count)...]) == suffix }
}
