import DispatchCore
import DispatchIO
import DispatchSystem
import Glibc

/// `dispatchd check`: asks the running server's /readyz on the configured listen address and
/// exits 0 when it is ready, 1 otherwise. Health checks (Docker, systemd, scripts) then use
/// the same configuration as the server, whatever its port.
enum ReadyCheck {
    static func run(_ config: ServerConfig) -> Int32 {
        guard let a = config.listen.first else { return 1 }
        let host = a.host == "0.0.0.0" ? "127.0.0.1" : a.host == "::" ? "::1" : a.host
        let fd = socket(host.contains(":") ? AF_INET6 : AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0, let address = try? SocketAddress(host: host, port: a.port) else { return fail("cannot create a socket") }
        defer { close(fd) }
        var tv = timeval(tv_sec: 3, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        guard address.withSockaddr({ connect(fd, $0, $1) }) == 0 else {
            return fail("nothing answers on \(host):\(a.port): \(String(cString: strerror(errno)))")
        }
        let request = "GET /readyz HTTP/1.1\r\nHost: \(host)\r\nConnection: close\r\n\r\n"
        _ = request.withCString { send(fd, $0, strlen($0), Int32(MSG_NOSIGNAL)) }
        var raw: [UInt8] = []
        var buf = [UInt8](repeating: 0, count: 4096)
        while raw.count < 65536 {
            let n = recv(fd, &buf, buf.count, 0)
            if n <= 0 { break }
            raw.append(contentsOf: buf[0..<n])
        }
        guard let (response, _) = try? HTTPResponseParser.response(in: raw[...]) else { return fail("no answer from \(host):\(a.port)") }
        print(String(decoding: response.body, as: UTF8.self))
        return response.head.status == 200 ? 0 : 1
    }

    private static func fail(_ message: String) -> Int32 {
        printError("dispatchd check: \(message)")
        return 1
    }
}
