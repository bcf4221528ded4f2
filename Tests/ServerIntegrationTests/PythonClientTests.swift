import DispatchSystem
import DispatchTestSupport
import Glibc
import XCTest

/// The Python client (clients/python) against a live dispatchd: the package is installed with
/// pip, as a user would (`pip install ./clients/python`, offline: no build isolation), then its
/// pytest suite runs against the server this test starts (clients/python/tests).
final class PythonClientTests: XCTestCase {
    func testPythonClientAgainstALiveServer() throws {
        let root = TestPaths.repositoryRoot
        let python = root + "/.build/pyenv/bin/python"
        guard access(python, X_OK) == 0 else { throw TestError("\(python) is missing: run scripts/install-deps.sh --tests") }
        let s = try TestServer.start(environment: ["DISPATCH_PUBLISH_RATE": "0"])
        defer { s.stop() }
        let dir = "/tmp/dispatch-pyclient-\(getpid())"
        _ = Subprocess.run(["rm", "-rf", dir])
        defer { _ = Subprocess.run(["rm", "-rf", dir]) }
        // A copy, so the build's scratch files never land in the worktree.
        let copy = Subprocess.run(["cp", "-r", root + "/clients/python", dir + "-src"])
        defer { _ = Subprocess.run(["rm", "-rf", dir + "-src"]) }
        XCTAssertEqual(copy.status, 0, copy.output)
        let pip = Subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-build-isolation",
                                  "--no-deps", "--target", dir, dir + "-src"])
        XCTAssertEqual(pip.status, 0, "pip install ./clients/python: \(pip.output)")
        let out = dir + "-out.txt"
        defer { unlink(out) }
        let cmd = "exec '\(python)' -m pytest -p no:cacheprovider -q -rs '\(root)/clients/python/tests' > '\(out)' 2>&1"
        let env = Subprocess.currentEnvironment().merging([
            "PYTHONPATH": dir, "DISPATCH_TEST_URL": s.baseURL, "DISPATCH_TEST_TOKEN": s.adminKey,
            "PYTHONDONTWRITEBYTECODE": "1",
        ]) { $1 }
        guard let pid = Subprocess.start(["/bin/sh", "-c", cmd], environment: env) else { return XCTFail("cannot start pytest") }
        guard let status = Subprocess.wait(pid, seconds: 240) else {
            kill(pid, SIGKILL)
            _ = Subprocess.wait(pid)
            return XCTFail("pytest took over 240 s: \(Files.read(out) ?? "")")
        }
        let output = Files.read(out) ?? ""
        print(output)
        XCTAssertEqual(status, 0, output)
        XCTAssertTrue(output.contains(" passed"), output)
        XCTAssertFalse(output.contains(" failed"), output)
        // Loaded from the installed package, not from the source tree.
        let which = Subprocess.run([python, "-c", "import dispatch_client; print(dispatch_client.__file__)"], environment: env)
        XCTAssertTrue(which.output.hasPrefix(dir + "/dispatch_client/"), which.output)
    }
}
