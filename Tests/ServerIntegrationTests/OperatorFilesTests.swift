import DispatchSystem
import Foundation
import DispatchTestSupport
import Glibc
import XCTest

/// contrib/dispatchd.service as shipped (issue 36: it held `@PREFIX@`, so copying it did not
/// work): no placeholder, and systemd's own checker finds nothing to say about it once
/// dispatchd is where it says (the path `make install` rewrites for another PREFIX).
final class OperatorFilesTests: XCTestCase {
    var unit: String { TestPaths.repositoryRoot + "/contrib/dispatchd.service" }

    func testTheSystemdUnitHasNoPlaceholders() throws {
        let text = try XCTUnwrap(Files.read(unit))
        XCTAssertFalse(text.contains("@"), "a placeholder left for sed")
        XCTAssertTrue(text.contains("ExecStart=/usr/local/bin/dispatchd"), "the path make install uses by default")
    }

    func testSystemdAnalyzeVerifiesTheUnit() throws {
        guard access("/usr/bin/systemd-analyze", X_OK) == 0 else { throw XCTSkip("systemd-analyze is not installed") }
        let dir = "/tmp/dispatch-unit-\(getpid())"
        _ = Subprocess.run(["rm", "-rf", dir])
        defer { _ = Subprocess.run(["rm", "-rf", dir]) }
        XCTAssertEqual(Subprocess.run(["mkdir", "-p", dir + "/prefix/bin", dir + "/units"]).status, 0)
        XCTAssertEqual(symlink(TestPaths.binary("dispatchd"), dir + "/prefix/bin/dispatchd"), 0)
        // What `make install PREFIX=...` does to the unit, and nothing else.
        let text = try XCTUnwrap(Files.read(unit)).replacingOccurrences(of: "/usr/local/", with: dir + "/prefix/")
        try Files.write(dir + "/units/dispatchd.service", text, mode: 0o644)
        let verify = Subprocess.run(["/usr/bin/systemd-analyze", "verify", dir + "/units/dispatchd.service"])
        XCTAssertEqual(verify.status, 0, verify.output)
        let complaints = verify.output.split(separator: "\n").filter { $0.contains("dispatchd.service") }
        XCTAssertEqual(complaints, [], "systemd-analyze has something to say about the unit")
    }
}
