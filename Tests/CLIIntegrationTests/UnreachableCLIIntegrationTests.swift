import DispatchCLIKit
import DispatchSystem
import DispatchTestSupport
import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// Issue 36: with the server down or unreachable, the CLI says so within 3 s, not after its
/// retry budget or a long connect.
final class UnreachableCLIIntegrationTests: XCTestCase {
    /// A loopback port whose accept queue is full and never drained: the kernel drops further
    /// SYNs, so a connect hangs as it does towards a host that does not answer.
    final class Blackhole {
        let listenFD: Int32
        var fillers: [Int32] = []
        let port: Int

        init() throws {
            let lfd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            listenFD = lfd
            var addr = sockaddr_in()
            addr.sin_family = sa_family_t(AF_INET)
            addr.sin_addr.s_addr = inet_addr("127.0.0.1")
            addr.sin_port = 0
            var len = socklen_t(MemoryLayout<sockaddr_in>.size)
            _ = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(lfd, $0, len) } }
            guard listen(lfd, 0) == 0 else { throw TestError("listen failed") }
            _ = withUnsafeMutablePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(lfd, $0, &len) } }
            port = Int(UInt16(bigEndian: addr.sin_port))
            // Fill the queue: non-blocking connects until one stays in progress.
            for _ in 0..<8 {
                let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
                var to = addr
                _ = withUnsafePointer(to: &to) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
                fillers.append(fd)
            }
        }

        deinit {
            for fd in fillers { close(fd) }
            close(listenFD)
        }
    }

    func testListSaysTheServerIsUnreachableWithinThreeSeconds() throws {
        let hole = try Blackhole()
        let env = ["DISPATCH_URL": "http://127.0.0.1:\(hole.port)", "DISPATCH_TOKEN": "x"]
        for args in [["list"], ["start", "--name", "T"]] {
            let p = try CLIProcess(TestPaths.binary("dispatch"), args + ["--retry-for", "20"], environment: env)
            let t0 = Date()
            eventually(10, "\(args[0]) says it cannot connect") { p.stderr.contains("cannot connect") }
            let said = Date().timeIntervalSince(t0)
            XCTAssertLessThan(said, 3.5, "\(args[0]): \(p.stderr)")
            XCTAssertTrue(p.stderr.contains("127.0.0.1:\(hole.port)"), p.stderr)
            kill(p.pid, SIGTERM)
            p.wait(timeout: 10)
        }
    }
}
