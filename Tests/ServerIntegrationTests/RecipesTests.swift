import DispatchCore
import DispatchSystem
import DispatchTestSupport
import Glibc
import XCTest

/// Every recipe of docs/recipes.md against a live dispatchd: the CI steps, the systemd unit
/// and its helper, the cron wrapper, the rTorrent hook, the Python client, the Node script and
/// the browser page in Chromium (Tests/tools/recipes_test.py does the checking).
final class RecipesTests: XCTestCase {
    func testEveryRecipeRunsAgainstALiveServer() throws {
        let python = TestPaths.repositoryRoot + "/.build/pyenv/bin/python"
        guard access(python, X_OK) == 0 else { throw TestError("\(python) is missing: run scripts/install-deps.sh --tests") }
        let pagePort = try TestServer.freePort()
        let s = try TestServer.start(environment: ["DISPATCH_CORS_ORIGINS": "http://127.0.0.1:\(pagePort)", "DISPATCH_PUBLISH_RATE": "0"])
        defer { s.stop() }
        let bin = String(TestPaths.binary("dispatch").split(separator: "/", omittingEmptySubsequences: false).dropLast().joined(separator: "/"))
        let out = "/tmp/dispatch-recipes-\(getpid()).txt"
        defer { unlink(out) }
        let cmd = "exec '\(python)' '\(TestPaths.repositoryRoot)/Tests/tools/recipes_test.py' '\(s.baseURL)' '\(s.adminKey)' \(pagePort) "
            + "'\(bin)' '\(TestPaths.repositoryRoot)' > '\(out)' 2>&1"
        guard let pid = Subprocess.start(["/bin/sh", "-c", cmd]) else { return XCTFail("cannot start python") }
        guard let status = Subprocess.wait(pid, seconds: 300) else {
            kill(pid, SIGKILL)
            _ = Subprocess.wait(pid)
            return XCTFail("the recipes took over 300 s: \(Files.read(out) ?? "")")
        }
        let output = Files.read(out) ?? ""
        XCTAssertEqual(status, 0, output)
        XCTAssertTrue(output.contains(" passed, 0 failed"), output)
        XCTAssertFalse(output.contains("FAIL"), output)
    }
}
