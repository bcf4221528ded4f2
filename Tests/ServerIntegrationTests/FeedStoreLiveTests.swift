import DispatchCore
import DispatchLiveActivity
import DispatchSystem
import DispatchTestSupport
import Foundation
import XCTest

/// The iOS app's feed loop (docs/clients.md) against a live dispatchd: the feed's bytes into
/// `FeedStreamParser`, snapshots decoded with `JSONDecoder`, into `ActivityFeedStore`, resumed
/// with `Last-Event-ID: store.position` after a server restart, and through a `reset`. The
/// store ends up holding what the server holds.
final class FeedStoreLiveTests: XCTestCase {
    /// One feed connection feeding the store until `until` holds or the stream ends.
    private final class Feed {
        let socket: TestSocket
        var http = HTTPResponseParser()
        var sse = FeedStreamParser()
        var status = 0
        var ended = false
        var names: [String] = []

        init(port: Int, key: String, position: String?) throws {
            socket = try TestSocket.connect(port: port)
            var headers = [("Accept", "text/event-stream"), ("Authorization", "Bearer \(key)")]
            if let position { headers.append(("Last-Event-ID", position)) }
            try socket.send(HTTPRequestEncoder.encode(method: "GET", target: "/v1/stream", host: "127.0.0.1", headers: headers, close: false))
        }

        func run(_ store: inout ActivityFeedStore, timeout: Double = 20, until: (ActivityFeedStore) -> Bool) throws -> Bool {
            let deadline = Clock.monotonic() + timeout
            while !until(store) {
                if ended || Clock.monotonic() > deadline { return false }
                guard let chunk = try socket.read(timeout: 0.5) else { continue }
                if chunk.isEmpty { ended = true; continue }
                for part in try http.feed(chunk) {
                    switch part {
                    case .head(let head): status = head.status
                    case .end: ended = true
                    case .body(let bytes):
                        for m in sse.push(contentsOf: bytes) {
                            names.append(m.event)
                            switch m.event {
                            case "synced": store.apply(.synced(position: m.id ?? ""))
                            case "reset": store.apply(.reset)
                            default:
                                let a = try JSONDecoder().decode(FeedActivity.self, from: Data(m.data.utf8))
                                store.apply(.snapshot(a, position: m.id))
                            }
                        }
                    }
                }
            }
            return true
        }
    }

    /// What GET /v1/activities says: id -> (state, seq).
    private func serverView(_ s: TestServer) throws -> [String: [String]] {
        guard case .array(let list)? = try s.client.get("/v1/activities?limit=100").json?["activities"] else { throw TestError("no list") }
        var out: [String: [String]] = [:]
        for a in list {
            guard case .string(let id)? = a["activityId"], case .string(let state)? = a["state"], case .number(let seq)? = a["seq"] else { continue }
            out[id] = [state, String(Int(seq))]
        }
        return out
    }

    private func storeView(_ store: ActivityFeedStore) -> [String: [String]] {
        Dictionary(uniqueKeysWithValues: store.activities.map { ($0.activityId, [$0.state, String($0.seq)]) })
    }

    func testTheStoreFollowsTheFeedAcrossARestartAndAReset() throws {
        let s = try TestServer.start(environment: ["DISPATCH_PUBLISH_RATE": "0"])
        defer { s.stop() }
        try s.startActivity("first")
        try s.startActivity("done")
        try s.end("done")

        var store = ActivityFeedStore()
        let feed = try Feed(port: s.port, key: s.adminKey, position: nil)
        XCTAssertTrue(try feed.run(&store) { $0.isSynced }, "synced: \(feed.names)")
        XCTAssertEqual(store.activities.map(\.activityId), ["first", "done"], "active, then finished")
        XCTAssertEqual(storeView(store), try serverView(s))

        try s.startActivity("second")
        try s.update("first")
        XCTAssertTrue(try feed.run(&store) { $0["first"]?.seq == 2 && $0["second"] != nil })
        XCTAssertEqual(store.activities.map(\.activityId), ["second", "first", "done"])

        // A restart: the stream ends; changes made meanwhile arrive on the resumed stream.
        try s.restart()
        XCTAssertTrue(try feed.run(&store) { _ in false } == false && feed.ended, "the old stream ended")
        try s.update("second")
        try s.end("first")
        let before = store.position
        let resumed = try Feed(port: s.port, key: s.adminKey, position: before)
        // The store is still synced from the first stream: wait for this stream's own `synced`.
        XCTAssertTrue(try resumed.run(&store) { _ in resumed.names.contains("synced") }, "resumed: \(resumed.names)")
        XCTAssertTrue(store.isSynced)
        XCTAssertEqual(store["first"]?.state, "completed")
        XCTAssertEqual(store["second"]?.seq, 2)
        XCTAssertFalse(resumed.names.contains("reset"), "resumed by position: \(resumed.names)")
        XCTAssertEqual(resumed.names.filter { $0 == "synced" }.count, 1)
        XCTAssertEqual(storeView(store), try serverView(s))
        XCTAssertEqual(store.activities.map(\.activityId), ["second", "first", "done"], "first ended after done")

        // A position the server never issued (a database restored from a backup): reset, and
        // the store starts over without losing what the server still has.
        var restored = store
        restored.apply(.snapshot(FeedActivity(activityId: "ghost", taskName: "gone", state: "processing", seq: 1,
                                              createdAt: "2026-01-01T00:00:00.000Z", updatedAt: "2026-01-01T00:00:00.000Z"), position: "999999999999"))
        let reset = try Feed(port: s.port, key: s.adminKey, position: restored.position)
        XCTAssertTrue(try reset.run(&restored) { _ in reset.names.contains("synced") }, "after reset: \(reset.names)")
        XCTAssertTrue(restored.isSynced)
        XCTAssertEqual(reset.names.first, "reset")
        XCTAssertNil(restored["ghost"], "what the server no longer has is gone")
        XCTAssertEqual(storeView(restored), try serverView(s))
    }
}
