import DispatchBlockingHTTP
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
        let request = HTTPRequestEncoder.encode(method: "GET", target: "/readyz", host: host.contains(":") ? "[\(host)]" : host)
        let response: HTTPResponse
        do {
            response = try HTTP1Connection.exchange(host: host, port: a.port, request: request, timeout: 3, maxBody: 65536)
        } catch {
            return fail("no answer from \(host):\(a.port): \(error.message)")
        }
        print(String(decoding: response.body, as: UTF8.self))
        return response.head.status == 200 ? 0 : 1
    }

    private static func fail(_ message: String) -> Int32 {
        printError("dispatchd check: \(message)")
        return 1
    }
}
