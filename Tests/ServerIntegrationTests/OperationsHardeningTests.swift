import DispatchCore
import DispatchIO
import DispatchSystem
import DispatchTestSupport
import Glibc
import XCTest

/// Issue 24's operational findings: signals, secrets on the command line, start-up order.
final class SignalTests: XCTestCase {
    /// SIGHUP killed dispatchd at once, without a drain or a log line; now it is logged and
    /// ignored, by a single worker and by the supervisor of several.
    func testSIGHUPIsLoggedAndIgnored() throws {
        for workers in ["1", "2"] {
            let s = try TestServer.start(environment: ["DISPATCH_WORKERS": workers])
            defer { s.stop() }
            try s.startActivity("HUP-\(workers)")
            XCTAssertEqual(kill(s.pid, SIGHUP), 0)
            XCTAssertTrue(waitUntil(10) { s.log().contains("signal.hangup_ignored") }, s.log())
            XCTAssertEqual(waitpid(s.pid, nil, WNOHANG), 0, "dispatchd exited on SIGHUP (workers \(workers))")
            XCTAssertEqual(try s.update("HUP-\(workers)").status, 200)
            XCTAssertEqual(try HTTPClient(port: s.port).get("/readyz").status, 200)
        }
    }
}
