import DispatchSystem
import DispatchCore
import DispatchCLIKit
import DispatchTestSupport
import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// `dispatch list` against a real server: filters, paging past the server's 500 per page, and
/// the three outputs (lines for pipes, a table on a terminal, JSON lines).
final class ListCLIIntegrationTests: CLIServerTestCase {
    func testFiltersOutputsAndPaging() throws {
        let machine = "list-\(UUID().uuidString.prefix(8))"
        var ids: [String] = []
        for i in 0..<3 {
            let (code, out, err) = try ctx.run(["start", "--name", "job \(i)", "--machine", machine, "--status", "step \(i)",
                                              "--state", i == 0 ? "queued" : "processing"])
            XCTAssertEqual(code, 0, err)
            ids.append(out.trimmingCharacters(in: .whitespacesAndNewlines))
        }
        XCTAssertEqual(try ctx.run(["progress", "--id", ids[1], "--idle"]).0, 0)
        XCTAssertEqual(try ctx.run(["end", "--id", ids[0], "--state", "rejected", "--error", "quota"]).0, 0)

        let (code, out, err) = try ctx.run(["list", "--machine", machine])
        XCTAssertEqual(code, 0, err)
        let rows = out.split(separator: "\n").map { $0.split(separator: "\t", omittingEmptySubsequences: false).map(String.init) }
        XCTAssertEqual(rows.map { $0.count }, [7, 7, 7], out)
        guard rows.count == 3, rows.allSatisfy({ $0.count == 7 }) else { return }
        XCTAssertEqual(rows.map { $0[0] }, ids.reversed(), "newest first")
        XCTAssertEqual(rows.map { $0[1] }, ["processing", "idle", "rejected"])
        XCTAssertEqual(rows[0][3], machine)
        XCTAssertEqual(rows[0][5], "job 2")
        XCTAssertEqual(rows[0][6], "step 2")

        XCTAssertEqual(try ctx.run(["list", "--machine", machine, "--active"]).1.split(separator: "\n").map { String($0.prefix(36)) },
                       [ids[2], ids[1]], "idle is active")
        XCTAssertEqual(try ctx.run(["list", "--machine", machine, "--finished"]).1.split(separator: "\n").count, 1, "rejected is finished")
        XCTAssertEqual(try ctx.run(["list", "--machine", machine, "--limit", "2"]).1.split(separator: "\n").count, 2)

        let (_, json, _) = try ctx.run(["list", "--machine", machine, "--json"])
        let snapshots = try json.split(separator: "\n").map { try JSONParser.parse(String($0)) }
        XCTAssertEqual(snapshots.compactMap { $0["activityId"]?.stringValue }, ids.reversed())
        XCTAssertEqual(snapshots.last?["error"]?.stringValue, "quota")

        // On a terminal: a table with a header.
        let pty = try CLIProcess("/usr/bin/script", ["-qfec", "'\(ctx.dispatch)' list --machine \(machine)", "/dev/null"],
                                 environment: ctx.environment.merging(["COLUMNS": "150"]) { $1 })
        XCTAssertEqual(pty.wait(), 0, pty.stdout)
        let screen = pty.stdout.replacingOccurrences(of: "\r", with: "").split(separator: "\n").map(String.init)
        XCTAssertEqual(screen.count, 4, pty.stdout)
        guard screen.count == 4 else { return }
        XCTAssertTrue(screen[0].hasPrefix("ID "), pty.stdout)
        XCTAssertTrue(screen[0].contains("STATE") && screen[0].hasSuffix("TASK"), pty.stdout)
        XCTAssertTrue(screen[1].hasPrefix(ids[2]) && screen[1].contains("job 2 — step 2"), pty.stdout)

        let (_, none, noneErr) = try ctx.run(["list", "--machine", "nobody-\(machine)"])
        XCTAssertEqual(none, "")
        XCTAssertEqual(noneErr, "", "an empty list is no error")
    }

    /// More than the server's page of 500: the CLI follows nextCursor and stops at --limit.
    func testPagesAreFollowedUpToTheLimit() throws {
        let machine = "page-\(UUID().uuidString.prefix(8))"
        for i in 0..<520 {
            let r = try ctx.server.client.post("/v1/activities/start", #"{"activityId":"\#(machine)-\#(i)","taskName":"bulk","machine":"\#(machine)"}"#)
            XCTAssertEqual(r.status, 201, r.text)
        }
        let (code, out, err) = try ctx.run(["list", "--machine", machine, "--limit", "510"])
        XCTAssertEqual(code, 0, err)
        let listed = out.split(separator: "\n").map { String($0.split(separator: "\t")[0]) }
        XCTAssertEqual(listed.count, 510)
        XCTAssertEqual(Set(listed).count, 510, "no activity twice across pages")
        XCTAssertEqual(listed.first, "\(machine)-519", "newest first")
        XCTAssertEqual(try ctx.run(["list", "--machine", machine, "--limit", "100000"]).1.split(separator: "\n").count, 520)
    }
}
