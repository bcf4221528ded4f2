import DispatchLiveActivity
import Foundation
import XCTest

/// The Activities tab's store (ActivityFeedStore) and the SSE parser an app feeds it through.
final class ActivityFeedStoreTests: XCTestCase {
    private func a(_ id: String, _ state: String = "processing", seq: Int = 1, created: String = "2026-12-01T10:00:00.000Z",
                   ended: String? = nil) -> FeedActivity {
        FeedActivity(activityId: id, taskName: "Job " + id, state: state, seq: seq, createdAt: created,
                     updatedAt: ended ?? created, endedAt: ended)
    }

    private func ids(_ s: ActivityFeedStore) -> [String] { s.activities.map(\.activityId) }

    /// One line per event: what it changes, the list after it, synced and position.
    func testEventsAsATable() {
        let t = { (m: Int) in "2026-12-01T10:0\(m):00.000Z" }
        let rows: [(FeedEvent, FeedChange, [String], Bool, String?)] = [
            (.snapshot(a("old", created: t(1)), position: "10"), .updated("old"), ["old"], false, "10"),
            (.snapshot(a("new", created: t(2)), position: "11"), .updated("new"), ["new", "old"], false, "11"),
            (.snapshot(a("done", "completed", seq: 4, created: t(0), ended: t(3)), position: "12"), .updated("done"), ["new", "old", "done"], false, "12"),
            (.synced(position: "12"), .synced(removed: []), ["new", "old", "done"], true, "12"),
            // The same change again, and an older one: nothing.
            (.snapshot(a("new", created: t(2)), position: "13"), .none, ["new", "old", "done"], true, "13"),
            (.snapshot(a("done", "processing", seq: 3, created: t(0)), position: "14"), .none, ["new", "old", "done"], true, "14"),
            // A state change moves the row to the finished part, last ended first.
            (.snapshot(a("old", "error", seq: 2, created: t(1), ended: t(5)), position: "15"), .updated("old"), ["new", "old", "done"], true, "15"),
            (.snapshot(a("new", "completed", seq: 2, created: t(2), ended: t(4)), position: "16"), .updated("new"), ["old", "new", "done"], true, "16"),
            // A reset keeps the list until synced; what is not sent again goes then.
            (.reset, .reset, ["old", "new", "done"], false, "16"),
            (.snapshot(a("new", "completed", seq: 2, created: t(2), ended: t(4)), position: "3"), .none, ["old", "new", "done"], false, "3"),
            (.snapshot(a("fresh", created: t(6)), position: "4"), .updated("fresh"), ["fresh", "old", "new", "done"], false, "4"),
            (.synced(position: "4"), .synced(removed: ["done", "old"]), ["fresh", "new"], true, "4"),
        ]
        var s = ActivityFeedStore()
        XCTAssertNil(s.position)
        for (i, (event, change, list, synced, position)) in rows.enumerated() {
            XCTAssertEqual(s.apply(event), change, "row \(i)")
            XCTAssertEqual(ids(s), list, "row \(i)")
            XCTAssertEqual(s.isSynced, synced, "row \(i)")
            XCTAssertEqual(s.position, position, "row \(i)")
        }
        XCTAssertEqual(s["new"]?.state, "completed")
        XCTAssertEqual(s.count, 2)
    }

    func testInsertedActivitiesOutliveAResetAndYieldToTheFeed() {
        var s = ActivityFeedStore(position: "40")
        XCTAssertEqual(s.position, "40", "resume from a position kept by the app")
        XCTAssertEqual(s.insert(a("archived", "completed", seq: 3, ended: "2026-11-01T00:00:00.000Z")), .updated("archived"))
        XCTAssertEqual(s.insert(a("archived", "completed", seq: 3, ended: "2026-11-01T00:00:00.000Z")), .none)
        s.apply(.snapshot(a("live"), position: "41"))
        s.apply(.reset)
        XCTAssertEqual(s.apply(.synced(position: "2")), .synced(removed: ["live"]))
        XCTAssertEqual(ids(s), ["archived"])
    }

    func testTiesAreOrderedByIdWhateverTheArrivalOrder() {
        let list = ["c", "a", "b"].map { a($0) }
        for order in [[0, 1, 2], [2, 1, 0], [1, 0, 2]] {
            var s = ActivityFeedStore()
            for i in order { s.apply(.snapshot(list[i], position: nil)) }
            XCTAssertEqual(ids(s), ["a", "b", "c"], "\(order)")
        }
    }

    /// The feed's bytes as the server frames them: LF, CRLF and CR endings, heartbeats, retry,
    /// a message cut anywhere between two reads.
    func testFeedStreamParser() throws {
        let snapshot = #"{"activityId":"iso","taskName":"ISO","state":"processing","progress":0.5,"attempt":1,"seq":2,"createdAt":"2026-12-01T10:00:00.000Z","updatedAt":"2026-12-01T10:00:01.000Z","endedAt":null,"unknownField":1}"#
        let wire = "retry: 3000\n\n: heartbeat\n\nid: 7\nevent: processing\ndata: \(snapshot)\n\nid: 7\r\nevent: synced\r\ndata: {\"position\":7}\r\n\r\nevent: reset\rdata: {}\r\r"
        let bytes = Array(wire.utf8)
        for cut in [0, 1, 17, bytes.count / 2, bytes.count - 1] {
            var p = FeedStreamParser()
            let msgs = p.push(contentsOf: bytes[..<cut]) + p.push(contentsOf: bytes[cut...])
            XCTAssertEqual(msgs.map(\.event), ["processing", "synced", "reset"], "cut at \(cut)")
            XCTAssertEqual(msgs.map(\.id), ["7", "7", nil])
            XCTAssertEqual(msgs[1].data, #"{"position":7}"#)
            XCTAssertEqual(p.retryMilliseconds, 3000)
            let decoded = try JSONDecoder().decode(FeedActivity.self, from: Data(msgs[0].data.utf8))
            XCTAssertEqual(decoded.progress, 0.5)
            XCTAssertEqual(decoded.seq, 2)
            XCTAssertNil(decoded.endedAt)
        }
        var p = FeedStreamParser()
        XCTAssertEqual(p.push(contentsOf: Array("data: a\ndata: b\n\ndata\n\n".utf8)).map(\.data), ["a\nb", ""])
    }
}
