import XCTest
import DispatchCore
import DispatchCLIKit

/// `dispatch list`: options, paging, and the two ways of showing activities.
final class CLIListTests: XCTestCase {
    let snapshot = #"{"activityId":"TEST-RTORRENT-01","taskName":"Debian 13 Trixie ISO","machine":"shodan","state":"processing","progress":0.68,"status":"Downloading at 18.4 MB/s (68%)","attempt":1,"seq":5,"cancelRequested":false,"createdAt":"2026-11-29T22:53:26.123Z","updatedAt":"2026-11-29T22:55:01.004Z","endedAt":null}"#

    func testOptions() throws {
        XCTAssertEqual(try command(["list"]).1, .list(CLIListOptions()))
        XCTAssertEqual(try command(["list", "--active", "--machine", "shodan", "--limit", "3"]).1,
                       .list(CLIListOptions(filter: .active, machine: "shodan", limit: 3)))
        XCTAssertEqual(try command(["list", "--finished"]).1, .list(CLIListOptions(filter: .finished)))
        XCTAssertEqual(try command(["list"], env: ["DISPATCH_MACHINE": "xerxes"]).1, .list(CLIListOptions()),
                       "DISPATCH_MACHINE names this machine for publishing; it does not filter the list")
        XCTAssertNotNil(usageError(["list", "--active", "--finished"]))
        XCTAssertNotNil(usageError(["list", "--limit", "0"]))
        XCTAssertNotNil(usageError(["list", "--limit", "ten"]))
        XCTAssertEqual(usageError(["ls"])?.message, "unknown command 'ls' (did you mean 'list'?)")
    }

    /// Pages of at most 500, asking only for what is still wanted, the cursor passed back.
    func testPaging() throws {
        XCTAssertEqual(CLIList.path(CLIListOptions(), remaining: 50, cursor: nil), "/v1/activities?limit=50")
        XCTAssertEqual(CLIList.path(CLIListOptions(filter: .active, machine: "my box", limit: 1200), remaining: 1200, cursor: nil),
                       "/v1/activities?state=active&machine=my%20box&limit=500")
        XCTAssertEqual(CLIList.path(CLIListOptions(filter: .finished, limit: 1200), remaining: 200, cursor: "c/1+2"),
                       "/v1/activities?state=finished&limit=200&cursor=c%2F1%2B2")
        let page = try XCTUnwrap(CLIList.page(Array(#"{"activities":[\#(snapshot),{"activityId":"b"}],"nextCursor":"abc"}"#.utf8)))
        XCTAssertEqual(page.activities.count, 2)
        XCTAssertEqual(page.next, "abc")
        XCTAssertNil(try XCTUnwrap(CLIList.page(Array(#"{"activities":[],"nextCursor":null}"#.utf8))).next)
        XCTAssertNil(CLIList.page(Array(#"{"error":{"code":"x"}}"#.utf8)))
        XCTAssertNil(CLIList.page(Array("<html>".utf8)))
    }

    func testOneLinePerActivityForPipes() throws {
        let v = try XCTUnwrap(CLIActivityView(jsonText: snapshot))
        XCTAssertEqual(CLIList.plainLine(v),
                       "TEST-RTORRENT-01\tprocessing\t68%\tshodan\t2026-11-29T22:55:01.004Z\tDebian 13 Trixie ISO\tDownloading at 18.4 MB/s (68%)")
        var bare = CLIActivityView(activityID: "a", taskName: "tab\there", state: "queued")
        bare.status = ""
        XCTAssertEqual(CLIList.plainLine(bare), "a\tqueued\t-\t-\t-\ttab here\t-", "always seven fields")
    }

    func testTableFitsTheTerminalAndNeverCutsIds() throws {
        let v = try XCTUnwrap(CLIActivityView(jsonText: snapshot))
        var idle = v
        idle.activityID = "3f0c2a4e-9b1d-4c55-8e11-0a7f1f6b2d90"
        idle.state = "idle"
        idle.machine = nil
        idle.progress = nil
        let now = v.updatedAt! + 65
        let wide = CLIList.table([v, idle], width: 160, now: now)
        XCTAssertEqual(wide.count, 3)
        XCTAssertEqual(wide[0], "ID                                    STATE       PROGRESS  MACHINE  UPDATED    TASK")
        XCTAssertEqual(wide[1], "TEST-RTORRENT-01                      processing  68%       shodan   1m05s ago  Debian 13 Trixie ISO — Downloading at 18.4 MB/s (68%)")
        XCTAssertTrue(wide[2].hasPrefix("3f0c2a4e-9b1d-4c55-8e11-0a7f1f6b2d90  idle        -         -        1m05s ago  Debian"), wide[2])
        for width in [100, 120] {
            for line in CLIList.table([v, idle], width: width, now: now) {
                XCTAssertLessThanOrEqual(line.count, width, line)
                XCTAssertTrue(line.hasPrefix("ID ") || line.hasPrefix("TEST-RTORRENT-01 ") || line.hasPrefix("3f0c2a4e-9b1d-4c55-8e11-0a7f1f6b2d90 "))
            }
        }
        let narrow = CLIList.table([v], width: 90, now: now)[1]
        XCTAssertEqual(narrow, "TEST-RTORRENT-01  processing  68%       shodan   1m05s ago  Debian 13 Trixie ISO — Downlo…",
                       "the status shrinks first")
        XCTAssertEqual(CLIList.emptyNote(CLIListOptions(filter: .active, machine: "shodan")), "no active activities on shodan")
    }

    func testJSONLinesKeepTheSnapshotAsSent() throws {
        let value = try JSONParser.parse(snapshot)
        XCTAssertEqual(CLIJSON.encode(value), snapshot)
        XCTAssertEqual(CLIJSON.encode(try JSONParser.parse(#"{"a":[1,2.5,true,null,"x\n\"y\""],"b":{}}"#)), #"{"a":[1,2.5,true,null,"x\n\"y\""],"b":{}}"#)
    }
}
