import DispatchCore
import DispatchIO
import DispatchSystem
import DispatchTestSupport
import Foundation
import XCTest

/// `POST /v1/changes` (contract §2.1) against real dispatchd processes and PostgreSQL, in the
/// carrier mode of the run (`DISPATCH_TEST_CARRIER=nats` for the NATS carrier).
final class ChangesTests: XCTestCase {
    func sql(_ s: TestServer, _ query: String) throws -> [[String?]] { try TestPostgres.shared().sql(s.conninfo, query) }

    func count(_ s: TestServer, _ query: String) throws -> Int {
        guard let v = try sql(s, query).first?.first ?? nil, let n = Int(v) else { return -1 }
        return n
    }

    /// Sends `changes` (JSON objects) as one request; its results, or a failure when the answer is not 200.
    func changes(_ c: HTTPClient, _ changes: [String], file: StaticString = #filePath, line: UInt = #line) throws -> [JSONValue] {
        let r = try c.post("/v1/changes", #"{"changes":["# + changes.joined(separator: ",") + "]}")
        XCTAssertEqual(r.status, 200, r.text, file: file, line: line)
        guard case .array(let results)? = r.json?["results"] else { throw TestError("no results: \(r.status) \(r.text)") }
        XCTAssertEqual(results.count, changes.count, "one result per change", file: file, line: line)
        return results
    }

    /// `status seq` or `status code` per result.
    func lines(_ results: [JSONValue]) -> [String] {
        results.map { r in
            let status = r["status"]?.numberValue.map { String(Int($0)) } ?? "?"
            if let seq = r["snapshot"]?["seq"]?.numberValue { return "\(status) \(Int(seq))" }
            return "\(status) \(r["error"]?["code"]?.stringValue ?? "?")"
        }
    }

    func testMixedChangesAnswerOnePerChangeInOrderAndStreamsSeeEachOnce() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        try s.startActivity("live")
        try s.startActivity("done")
        XCTAssertEqual(try s.end("done").status, 200)
        let feed = try s.feed()
        guard let synced = try feed.waitSynced() else { return XCTFail("no synced: \(feed.events)") }
        let status = try s.stream("live")
        XCTAssertEqual(try status.waitForEvents(1).count, 1)

        let results = try changes(s.client, [
            #"{"op":"start","activityId":"a","taskName":"Job a","state":"processing"}"#,
            #"{"op":"update","activityId":"a","progress":0.5,"status":"half"}"#,
            #"{"op":"update","activityId":"live","progress":0.25}"#,
            #"{"op":"end","activityId":"done","state":"error"}"#,
            #"{"op":"update","activityId":"missing","progress":0.1}"#,
            #"{"op":"bogus","activityId":"a"}"#,
            #"{"op":"start","activityId":"a","taskName":"Job a","state":"processing"}"#,
            #"{"op":"start","activityId":"a","taskName":"Another job"}"#,
            #"{"op":"update","activityId":"a","progress":7}"#,
            #"{"op":"end","activityId":"a","status":"done"}"#,
            #"{"op":"update","activityId":"a","progress":0.9}"#,
            #"{"op":"end","activityId":"a","status":"done"}"#,
            #"{"op":"end","activityId":"done"}"#,
        ])
        XCTAssertEqual(lines(results), ["201 1", "200 2", "200 2", "409 already_finished", "404 not_found", "400 invalid_field",
                                        "200 2", "409 conflict", "400 invalid_field", "200 3", "409 already_finished", "200 3", "200 2"])
        XCTAssertEqual(results[1]["snapshot"]?["status"]?.stringValue, "half", "the update saw the start before it")
        XCTAssertEqual(results[3]["activity"]?["state"]?.stringValue, "completed", "a 409 carries the stored snapshot, as the single call's")
        XCTAssertEqual(results[9]["snapshot"]?["state"]?.stringValue, "completed")

        // Stored: exactly the accepted changes.
        XCTAssertEqual(try sql(s, "SELECT activity_id || ':' || seq || ':' || event FROM activity_events WHERE activity_id IN ('a', 'live', 'done', 'missing') ORDER BY activity_id, seq").map { $0[0] ?? "" },
                       ["a:1:processing", "a:2:processing", "a:3:completed", "done:1:processing", "done:2:completed", "live:1:processing", "live:2:processing"])
        // The stream of `live` and the feed see each change once, the feed in position order.
        XCTAssertEqual(try status.waitForEvents(2).map { $0.id }, ["1", "2"])
        let expected = try s.positions(after: synced)
        XCTAssertEqual(expected.count, 4)
        try feed.pump(timeout: 20) { $0.changeIDs.count >= expected.count }
        try feed.pump(timeout: 0.5)
        XCTAssertEqual(feed.changeIDs, expected, "each change once, in position order")
        let seen = feed.events.drop { $0.event != "synced" }.dropFirst().compactMap { e -> String? in
            guard let v = try? JSONParser.parse(e.data) else { return nil }
            return "\(v["activityId"]?.stringValue ?? "?"):\(Int(v["seq"]?.numberValue ?? -1)):\(e.event)"
        }
        XCTAssertEqual(seen.filter { $0.hasPrefix("a:") }, ["a:1:processing", "a:2:processing", "a:3:completed"])
        XCTAssertEqual(seen.filter { $0.hasPrefix("live:") }, ["live:2:processing"])
    }

    func testIdempotencyKeysMeanWhatTheHeaderMeans() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        try s.startActivity("job")
        let body = [#"{"op":"update","activityId":"job","progress":0.5,"idempotencyKey":"step-1"}"#,
                    #"{"op":"start","activityId":"made","taskName":"Made","idempotencyKey":"make-1"}"#]
        XCTAssertEqual(lines(try changes(s.client, body)), ["200 2", "201 1"])
        XCTAssertEqual(lines(try changes(s.client, body)), ["200 2", "200 1"], "a retried request applies nothing again")
        XCTAssertEqual(try count(s, "SELECT count(*) FROM activity_events WHERE activity_id = 'job'"), 2)
        // The same key as a header of a single call, and the other way round.
        let single = try s.client.post("/v1/activities/job/update", #"{"progress":0.5}"#, headers: ["Idempotency-Key": "step-1"])
        XCTAssertEqual(single.status, 200)
        XCTAssertEqual(single.json?["seq"]?.numberValue, 2)
        XCTAssertEqual(try s.client.post("/v1/activities/job/update", #"{"progress":0.6}"#, headers: ["Idempotency-Key": "step-2"]).json?["seq"]?.numberValue, 3)
        XCTAssertEqual(lines(try changes(s.client, [
            #"{"op":"update","activityId":"job","progress":0.6,"idempotencyKey":"step-2"}"#,
            #"{"op":"end","activityId":"job","idempotencyKey":"step-2"}"#,
            #"{"op":"update","activityId":"job","idempotencyKey":"x y"}"#,
        ])), ["200 3", "409 conflict", "400 invalid_field"], "a replay, a key used for another call, a key that is not printable")
        XCTAssertEqual(try count(s, "SELECT count(*) FROM activity_events WHERE activity_id = 'job'"), 3)
    }

    func testScopesOwnershipAndTheLivePerKeyLimit() throws {
        let s = try TestServer.start(environment: ["DISPATCH_MAX_LIVE_PER_KEY": "3"])
        defer { s.stop() }
        let a = HTTPClient(port: s.port, token: try AuthKit.createKey(s, "pub-a", ["publish"]))
        let b = HTTPClient(port: s.port, token: try AuthKit.createKey(s, "pub-b", ["publish"], machine: "shodan"))
        let reader = HTTPClient(port: s.port, token: try AuthKit.createKey(s, "reader", ["read"]))
        let one = #"{"changes":[{"op":"start","activityId":"r","taskName":"x"}]}"#
        AuthKit.assertError(try reader.post("/v1/changes", one), 403, "forbidden", "a read key")
        AuthKit.assertError(try HTTPClient(port: s.port).post("/v1/changes", one), 401, "unauthorized", "no key")

        XCTAssertEqual(lines(try changes(a, (1...5).map { #"{"op":"start","activityId":"a\#($0)","taskName":"x"}"# })),
                       ["201 1", "201 1", "201 1", "429 too_many_live_activities", "429 too_many_live_activities"])
        let results = try changes(b, [
            #"{"op":"update","activityId":"a1","progress":0.5}"#,
            #"{"op":"start","activityId":"b1","taskName":"x"}"#,
            #"{"op":"start","activityId":"b2","taskName":"x","machine":"xerxes"}"#,
            #"{"op":"end","activityId":"b1"}"#,
        ])
        XCTAssertEqual(lines(results), ["403 forbidden", "201 1", "403 forbidden", "200 2"])
        XCTAssertEqual(results[1]["snapshot"]?["machine"]?.stringValue, "shodan", "a machine-bound key's start gets its machine")
        // Ending frees a place under the limit, in the same request.
        XCTAssertEqual(lines(try changes(a, [#"{"op":"end","activityId":"a1"}"#, #"{"op":"start","activityId":"a4","taskName":"x"}"#])),
                       ["200 2", "201 1"])
        XCTAssertEqual(try count(s, "SELECT count(*) FROM activities WHERE activity_id IN ('a5', 'b2', 'r')"), 0)
        XCTAssertEqual(try count(s, "SELECT count(*) FROM activity_events WHERE activity_id = 'a1'"), 2)
    }

    func testBodiesOfTheWrongShapeAreRefusedAsAWholeAndWriteNothing() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        let start = #"{"op":"start","activityId":"x","taskName":"x"}"#
        let many = "{\"changes\":[" + Array(repeating: start, count: 1001).joined(separator: ",") + "]}"
        let big = #"{"changes":[\#(start),{"op":"start","taskName":"x","status":""# + String(repeating: "y", count: (1 << 20) + 10) + #""}]}"#
        let table: [(String, String, [String: String], Int, String)] = [
            ("not JSON", "{\"changes\":[", [:], 400, "invalid_json"),
            ("no changes", #"{"change":[\#(start)]}"#, [:], 400, "unknown_field"),
            ("changes not an array", #"{"changes":\#(start)}"#, [:], 400, "invalid_field"),
            ("no change at all", #"{"changes":[]}"#, [:], 400, "invalid_field"),
            ("1,001 changes", many, [:], 413, "body_too_large"),
            ("over 1 MiB", big, [:], 413, "body_too_large"),
            ("not application/json", #"{"changes":[\#(start)]}"#, ["Content-Type": "text/plain"], 415, "unsupported_media_type"),
        ]
        for (what, body, headers, status, code) in table {
            AuthKit.assertError(try s.client.post("/v1/changes", body, headers: headers), status, code, what)
        }
        XCTAssertEqual(try count(s, "SELECT count(*) FROM activities"), 0)
        AuthKit.assertError(try s.client.request("GET", "/v1/changes"), 405, "method_not_allowed")
        // A single call keeps its 16 KiB.
        AuthKit.assertError(try s.client.post("/v1/activities/start", #"{"taskName":""# + String(repeating: "x", count: 20 * 1024) + #""}"#),
                            413, "body_too_large")
    }

    /// Pushes see a batch's changes as single publishes: a push-to-start for the start that asks
    /// for a Live Activity (only that one), and the activity's updates up to its end.
    func testPushesSeeEachChangeAsIfPublishedAlone() throws {
        let f = try FakeAPNs.start()
        defer { f.stop() }
        let s = try TestServer.start(environment: f.serverEnvironment)
        defer { s.stop() }
        let pts = randomToken(bytes: 80), t = randomToken(bytes: 80)
        XCTAssertEqual(try s.client.post("/v1/activity-tokens", #"{"deviceToken":"\#(randomToken(bytes: 32))","pushToStartToken":"\#(pts)"}"#).status, 200)
        try s.startActivity("tracked")
        XCTAssertEqual(try s.client.post("/v1/activity-tokens", #"{"deviceToken":"\#(randomToken(bytes: 32))","activityTokens":{"tracked":"\#(t)"}}"#).status, 200)
        XCTAssertEqual(lines(try changes(s.client, [
            #"{"op":"start","activityId":"live-job","taskName":"Live","liveActivity":true}"#,
            #"{"op":"start","activityId":"plain-job","taskName":"Plain"}"#,
            #"{"op":"update","activityId":"tracked","progress":0.5,"state":"processing"}"#,
            #"{"op":"end","activityId":"tracked","status":"done"}"#,
        ])), ["201 1", "201 1", "200 2", "200 3"])
        let starts = try f.wait(token: pts) { $0.contains { $0.status == 200 } }
        let ended = try f.wait(token: t) { $0.contains { $0.status == 200 && $0.event == "end" } }
        XCTAssertEqual(ended.filter { $0.status == 200 }.last?.seq, 3, "the end, with its seq")
        try waitForPushesSettled(s)
        XCTAssertEqual(try f.requests(token: pts).count, 1, "one push-to-start, for the start that asked: \(starts.map(\.event))")
    }

    /// Many changes of one activity in one request apply in request order, each planned on the
    /// one before it.
    func testManyChangesOfOneActivityApplyInRequestOrder() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        let n = 200
        let started = Clock.monotonic()
        let results = try changes(s.client, [#"{"op":"start","activityId":"chain","taskName":"Chain","state":"processing"}"#]
            + (1...n).map { #"{"op":"update","activityId":"chain","status":"step \#($0)"}"# }
            + [#"{"op":"end","activityId":"chain","status":"done"}"#])
        print("ChangesTests: \(n + 2) changes of one activity answered in \(Int((Clock.monotonic() - started) * 1000)) ms")
        XCTAssertEqual(lines(results), ["201 1"] + (1...n).map { "200 \($0 + 1)" } + ["200 \(n + 2)"])
        XCTAssertEqual(results[n]["snapshot"]?["status"]?.stringValue, "step \(n)")
        let stored = try sql(s, "SELECT data::json->>'status' FROM activity_events WHERE activity_id = 'chain' AND seq BETWEEN 2 AND \(n + 1) ORDER BY seq")
        XCTAssertEqual(stored.map { $0[0] ?? "" }, (1...n).map { "step \($0)" })
    }

    /// Single publishes from 17 publishers at once on one worker: batches of several
    /// publishers, so the commit window (DISPATCH_COMMIT_WINDOW_MS, default 4) opens and holds
    /// the next batch. Two feed readers and a status stream each see every one of the 340
    /// changes exactly once, the feeds in position order and each activity in seq order.
    /// The first batch waits on a row lock until others queue behind it, so batches of several
    /// publishers happen however fast the machine is (a fast run once committed each alone).
    func testConcurrentPublishesThroughTheCommitWindowReachEveryReaderOnceInOrder() throws {
        let s = try TestServer.start(environment: ["DISPATCH_WORKERS": "1", "DISPATCH_PUBLISH_RATE": "0", "DISPATCH_DB_TIMEOUT": "60"])
        defer { s.stop() }
        let publishers = 17, each = 20
        for p in 0..<publishers { try s.startActivity("w\(p)") }
        let feeds = [try s.feed(), try s.feed()]
        var synced: [Int64] = []
        for f in feeds { synced.append(try XCTUnwrap(try f.waitSynced(), "no synced")) }
        let status = try s.stream("w0")
        XCTAssertEqual(try status.waitForEvents(1).count, 1)
        let batchesBefore = try s.metric("dispatch_publish_batches_total")
        let lock = try BlockingPG(s.conninfo)
        try lock.script("BEGIN; SELECT 1 FROM activities WHERE activity_id LIKE 'w%' FOR UPDATE")

        let failures = Collected<String>()
        let done = DispatchGroup()
        for p in 0..<publishers {
            DispatchQueue.global().async(group: done) {
                let c = s.client
                for k in 1...each {
                    guard let r = try? c.post("/v1/activities/w\(p)/update", #"{"status":"step \#(k)"}"#), r.status == 200 else {
                        return failures.append("w\(p) step \(k)")
                    }
                }
            }
        }
        XCTAssertTrue(try waitUntil(30) { try s.metric("dispatch_publish_queued") >= 2 }, "changes queue behind the locked batch")
        try lock.script("COMMIT")
        let readers = feeds + [status]
        let expectedCount = publishers * each
        XCTAssertTrue(try keepReading(readers, timeout: 60) {
            done.wait(timeout: .now()) == .success && feeds.allSatisfy { $0.changeIDs.count >= expectedCount } && status.ids.count >= each + 1
        }, "every change delivered: feeds \(feeds.map { $0.changeIDs.count }), status \(status.ids.count)")
        for r in readers { _ = try r.pump(timeout: 0.3) }
        XCTAssertEqual(failures.all, [])

        let expected = try s.positions(after: synced[0])
        XCTAssertEqual(expected.count, expectedCount)
        for (i, f) in feeds.enumerated() {
            XCTAssertEqual(f.changeIDs, expected, "feed \(i): each change once, in position order")
            var seqs: [String: [Int]] = [:]
            for e in f.events.drop(while: { $0.event != "synced" }).dropFirst() {
                guard let v = try? JSONParser.parse(e.data), let id = v["activityId"]?.stringValue, let seq = v["seq"]?.numberValue else { continue }
                seqs[id, default: []].append(Int(seq))
            }
            for p in 0..<publishers { XCTAssertEqual(seqs["w\(p)"], Array(2...(each + 1)), "feed \(i), w\(p)") }
        }
        XCTAssertEqual(status.ids, (1...Int64(each + 1)).map { $0 }, "the status stream: each change of w0 once, in order")
        XCTAssertFalse(status.ended)
        let batches = try s.metric("dispatch_publish_batches_total") - batchesBefore
        print("ChangesTests: \(expectedCount) concurrent publishes in \(Int(batches)) batches")
        XCTAssertLessThan(batches, Double(expectedCount), "several changes per commit")
    }

    /// A thousand changes, each to an activity of its own: one transaction, also when the
    /// updates must first read rows this server process never saw (another worker wrote them).
    func testAThousandChangesCommitInOneTransaction() throws {
        let s = try TestServer.start(environment: ["DISPATCH_WORKERS": "2"])
        defer { s.stop() }
        let starts = (0..<1000).map { #"{"op":"start","activityId":"bulk-\#($0)","taskName":"Bulk \#($0)","state":"processing"}"# }
        XCTAssertEqual(Set(lines(try changes(s.client, starts))), ["201 1"])
        XCTAssertEqual(try count(s, "SELECT count(DISTINCT xmin::text) FROM activities WHERE activity_id LIKE 'bulk-%'"), 1)
        for round in 0..<3 {
            let updates = (0..<1000).map { #"{"op":"update","activityId":"bulk-\#($0)","progress":0.\#(round + 1)}"# }
            XCTAssertEqual(Set(lines(try changes(s.client, updates))), ["200 \(round + 2)"])
            XCTAssertEqual(try count(s, "SELECT count(DISTINCT xmin::text) FROM activities WHERE activity_id LIKE 'bulk-%'"), 1, "round \(round)")
        }
        XCTAssertEqual(try count(s, "SELECT count(*) FROM activity_events WHERE activity_id LIKE 'bulk-%'"), 4000)
    }
}

private extension JSONValue {
    var numberValue: Double? {
        if case .number(let d) = self { return d }
        return nil
    }
}
