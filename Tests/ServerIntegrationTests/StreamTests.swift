// Long: the status stream's whole contract (lifecycle, resume, edges, memory) in one place.
import DispatchSystem
import DispatchCore
import DispatchIO
import DispatchTestSupport
import Glibc
import Foundation
import XCTest

/// Issue 3: activities and status streams, end to end over real sockets and PostgreSQL.
final class StreamTests: XCTestCase {
    var server: TestServer!

    override func setUpWithError() throws {
        server = try TestServer.start(environment: ["DISPATCH_HEARTBEAT": "0.5"])
    }

    override func tearDown() {
        server?.stop()
        server = nil
    }

    func testFullLifecycle() throws {
        let s = server!
        let started = try s.client.post("/v1/activities/start", #"{"activityId":"TEST-RTORRENT-01","taskName":"  Debian 13 Trixie ISO ","systemImage":"arrow.down.circle.fill","machine":"shodan","cancelURL":"https://actions.shodan.example/cancel"}"#)
        XCTAssertEqual(started.status, 201, started.text)
        let snap = try XCTUnwrap(started.json)
        XCTAssertEqual(snap["taskName"], .string("Debian 13 Trixie ISO"))
        XCTAssertEqual(snap["state"], .string("queued"))
        XCTAssertEqual(snap["seq"], .number(1))
        XCTAssertEqual(snap["attempt"], .number(1))
        XCTAssertEqual(snap["endedAt"], .null)
        XCTAssertEqual(snap["cancelRequested"], .bool(false))

        let stream = try s.stream("TEST-RTORRENT-01")
        XCTAssertEqual(try stream.waitForEvents(1).map(\.event), ["queued"])
        XCTAssertEqual(stream.status, 200)
        XCTAssertEqual(stream.headers["content-type"], "text/event-stream")
        XCTAssertEqual(stream.headers["cache-control"], "no-cache")
        XCTAssertEqual(stream.headers["x-accel-buffering"], "no")

        XCTAssertEqual(try s.update("TEST-RTORRENT-01", #"{"progress":0.68,"status":"Downloading at 18.4 MB/s (68%)"}"#).status, 200)
        let retry = try s.update("TEST-RTORRENT-01", #"{"state":"retrying","status":"mirror down"}"#)
        XCTAssertEqual(retry.json?["attempt"], .number(2))
        XCTAssertEqual(try s.update("TEST-RTORRENT-01", #"{"progress":0.9}"#).json?["state"], .string("processing"))
        let end = try s.end("TEST-RTORRENT-01", #"{"status":"Completed"}"#)
        XCTAssertEqual(end.status, 200)
        XCTAssertEqual(end.json?["progress"], .number(1))
        XCTAssertEqual(end.json?["seq"], .number(5))
        // The exact same end again is idempotent; a different one conflicts and changes nothing.
        XCTAssertEqual(try s.end("TEST-RTORRENT-01", #"{"status":"Completed"}"#).status, 200)
        let conflict = try s.end("TEST-RTORRENT-01", #"{"state":"error"}"#)
        XCTAssertEqual(conflict.status, 409)
        XCTAssertEqual(conflict.json?["activity"]?["state"], .string("completed"))
        XCTAssertEqual(try s.update("TEST-RTORRENT-01").status, 409)
        XCTAssertEqual(try s.client.post("/v1/activities/start", #"{"activityId":"TEST-RTORRENT-01","taskName":"again"}"#).status, 409)

        XCTAssertTrue(try stream.waitForEnd())
        XCTAssertEqual(stream.events.map(\.event), ["queued", "processing", "retrying", "processing", "completed"])
        assertConsecutive(stream.ids, from: 1, through: 5)
        let last = try JSONParser.parse(stream.events.last!.data)
        XCTAssertEqual(last["state"], .string("completed"))
        XCTAssertEqual(last["status"], .string("Completed"))

        let history = try s.client.get("/v1/activities/TEST-RTORRENT-01/events?after=2")
        guard case .array(let events)? = history.json?["events"] else { return XCTFail(history.text) }
        XCTAssertEqual(events.map { $0["seq"] }, [.number(3), .number(4), .number(5)])
        XCTAssertEqual(events.last?["data"]?["state"], .string("completed"))
        XCTAssertEqual(try s.client.get("/v1/activities/nope/events").status, 404)
    }

    func testIdenticalStartIsIdempotentAndDifferentStartConflicts() throws {
        let s = server!
        let body = #"{"activityId":"same","taskName":"Backup","machine":"xerxes"}"#
        XCTAssertEqual(try s.client.post("/v1/activities/start", body).status, 201)
        XCTAssertEqual(try s.client.post("/v1/activities/start", body).status, 200)
        XCTAssertEqual(try s.client.post("/v1/activities/start", #"{"activityId":"same","taskName":"Other"}"#).status, 409)
        XCTAssertEqual(try s.seq("same"), 1)
        let generated = try s.client.post("/v1/activities/start", #"{"taskName":"no id"}"#)
        guard case .string(let id)? = generated.json?["activityId"] else { return XCTFail(generated.text) }
        XCTAssertEqual(id.count, 36)
    }

    func testIdempotencyKeyAppliesAPublishOnce() throws {
        let s = server!
        try s.startActivity("idem")
        let first = try s.client.post("/v1/activities/idem/update", #"{"progress":0.2}"#, headers: ["Idempotency-Key": "req-1"])
        let again = try s.client.post("/v1/activities/idem/update", #"{"progress":0.2}"#, headers: ["Idempotency-Key": "req-1"])
        XCTAssertEqual(first.status, 200)
        XCTAssertEqual(again.status, 200)
        XCTAssertEqual(first.json?["seq"], again.json?["seq"])
        XCTAssertEqual(try s.seq("idem"), 2)
    }

    func testTerminalActivityShortCircuitsAndReconnectGets204() throws {
        let s = server!
        try s.startActivity("done")
        try s.update("done")
        try s.end("done", #"{"state":"error","error":"disk full"}"#)
        let stream = try s.stream("done")
        XCTAssertTrue(try stream.waitForEnd())
        XCTAssertEqual(stream.events.map(\.event), ["error"])
        XCTAssertEqual(stream.ids, [3])
        XCTAssertEqual(try JSONParser.parse(stream.events[0].data)["error"], .string("disk full"))

        let reconnect = try s.stream("done", lastEventID: 3)
        XCTAssertTrue(try reconnect.waitForEnd())
        XCTAssertEqual(reconnect.status, 204)
        XCTAssertEqual(reconnect.events.count, 0)

        let replay = try s.stream("done", lastEventID: 1)
        XCTAssertTrue(try replay.waitForEnd())
        XCTAssertEqual(replay.ids, [2, 3])
    }

    func testUnknownActivityGetsNotFoundEvent() throws {
        let stream = try server.stream("no-such-job")
        XCTAssertTrue(try stream.waitForEnd())
        XCTAssertEqual(stream.status, 200)
        XCTAssertEqual(stream.events.map(\.event), ["not_found"])
        XCTAssertEqual(try JSONParser.parse(stream.events[0].data), .object([("activityId", .string("no-such-job"))]))
    }

    func testLastEventIDReplayOnLiveActivity() throws {
        let s = server!
        try s.startActivity("live")
        for _ in 0..<4 { try s.update("live") }
        let stream = try s.stream("live", lastEventID: 2)
        XCTAssertEqual(try stream.waitForEvents(3).compactMap { $0.id }, ["3", "4", "5"])
        try s.update("live")
        try s.end("live")
        XCTAssertTrue(try stream.waitForEnd())
        assertConsecutive(stream.ids, from: 3, through: 7)
    }

    func testHeartbeatArrivesOnIdleStream() throws {
        try server.startActivity("idle")
        let stream = try server.stream("idle")
        XCTAssertTrue(try stream.pump(timeout: 5) { $0.heartbeats >= 2 })
        XCTAssertEqual(stream.events.count, 1)
    }

    func testStreamsOpenedDuringPublishingSeeConsecutiveIds() throws {
        let s = server!
        try s.startActivity("busy")
        var streams: [SSEClient] = []
        for i in 0..<150 {
            if i % 4 == 0 && streams.count < 40 { streams.append(try s.stream("busy")) }
            XCTAssertEqual(try s.update("busy", #"{"progress":\#(Double(i) / 150)}"#).status, 200)
        }
        while streams.count < 40 { streams.append(try s.stream("busy")) }
        try s.end("busy")
        for st in streams {
            XCTAssertTrue(try st.waitForEnd(), "stream did not end")
            assertConsecutive(st.ids, through: 152)
            XCTAssertEqual(st.events.last?.event, "completed")
        }
    }

    func testFiveHundredSubscribersSeeEveryEvent() throws {
        let s = server!
        try s.startActivity("wide")
        var streams: [SSEClient] = []
        for _ in 0..<500 { streams.append(try s.stream("wide")) }
        XCTAssertTrue(try waitUntil(20) { try s.metric("dispatch_streams_active") >= 500 })
        for i in 1...20 { XCTAssertEqual(try s.update("wide", #"{"progress":\#(Double(i) / 20)}"#).status, 200) }
        try s.end("wide")
        for st in streams {
            XCTAssertTrue(try st.waitForEnd())
            assertConsecutive(st.ids, from: 1, through: 22)
        }
        XCTAssertTrue(try waitUntil { try s.metric("dispatch_streams_active") == 0 })
    }

    func testResetClientsAreCleanedUp() throws {
        let s = server!
        try s.startActivity("rst")
        let baseline = try s.metric("dispatch_streams_active")
        var streams: [SSEClient] = []
        for _ in 0..<200 { streams.append(try s.stream("rst")) }
        for st in streams { _ = try st.waitForEvents(1) }
        XCTAssertEqual(try s.metric("dispatch_streams_active"), baseline + 200)
        for st in streams { st.reset() }
        XCTAssertTrue(try waitUntil(10) { try s.metric("dispatch_streams_active") == baseline })
        XCTAssertGreaterThanOrEqual(try s.metric("dispatch_stream_closes_total", labels: "client_closed"), 200)
        // The activity's fan-out still works for a newcomer.
        let after = try s.stream("rst")
        XCTAssertEqual(try after.waitForEvents(1).count, 1, "subscribed before the update")
        try s.update("rst")
        XCTAssertEqual(try after.waitForEvents(2).count, 2)
    }

    func testSlowReaderIsCutOffWhileFastReaderGetsEverything() throws {
        server.stop()
        server = try TestServer.start(environment: ["DISPATCH_STREAM_BACKLOG": "4096"])
        let s = server!
        try s.startActivity("flood")
        let slow = try s.stream("flood", smallBuffer: true)
        let fast = try s.stream("flood")
        _ = try slow.waitForEvents(1)
        _ = try fast.waitForEvents(1)
        let status = String(repeating: "x", count: 190)
        var n = 1
        // Publish until the slow reader is dropped (bounded), reading the fast one as we go.
        while try s.metric("dispatch_stream_closes_total", labels: "slow_client") < 1 && n < 2000 {
            for _ in 0..<50 {
                XCTAssertEqual(try s.update("flood", #"{"status":"\#(status)"}"#).status, 200)
                n += 1
            }
            try fast.pump(timeout: 0.2)
        }
        XCTAssertEqual(try s.metric("dispatch_stream_closes_total", labels: "slow_client"), 1)
        try s.end("flood")
        XCTAssertTrue(try fast.waitForEnd(timeout: 30))
        assertConsecutive(fast.ids, from: 1, through: Int64(n + 1))
        // The slow one was cut: draining it ends early; it resumes with Last-Event-ID and loses nothing.
        XCTAssertTrue(try slow.waitForEnd(timeout: 30))
        let lastSeen = slow.ids.last ?? 0
        XCTAssertLessThan(lastSeen, Int64(n + 1))
        let resumed = try s.stream("flood", lastEventID: lastSeen)
        XCTAssertTrue(try resumed.waitForEnd(timeout: 30))
        XCTAssertEqual(resumed.status, 200, "resumed after \(lastSeen): \(resumed.events.count) events")
        assertConsecutive(slow.ids + resumed.ids, from: 1, through: Int64(n + 1))
    }

    func testBadInputIsRejectedAndChangesNothing() throws {
        let s = server!
        try s.startActivity("strict")
        let cases: [(String, String, Int, String)] = [
            ("update", #"{"progress":1.5}"#, 400, "invalid_field"),
            ("update", #"{"progress":-0.1}"#, 400, "invalid_field"),
            ("update", #"{"progress":"half"}"#, 400, "invalid_field"),
            ("update", #"{"progress":1e999}"#, 400, "invalid_json"),
            ("update", #"{"status":"two\nlines"}"#, 400, "invalid_field"),
            ("update", #"{"status":"tab\there"}"#, 400, "invalid_field"),
            ("update", #"{"status":"\#(String(repeating: "s", count: 201))"}"#, 400, "invalid_field"),
            ("update", #"{"state":"completed"}"#, 400, "invalid_field"),
            ("update", #"{"progres":0.5}"#, 400, "unknown_field"),
            ("update", #"{"progress":0.5"#, 400, "invalid_json"),
            ("update", #"[1,2]"#, 400, "invalid_json"),
            ("update", #"{"progress":0.1,"progress":0.2}"#, 400, "invalid_json"),
            ("end", #"{"state":"processing"}"#, 400, "invalid_field"),
            ("end", #"{"error":"\#(String(repeating: "e", count: 501))"}"#, 400, "invalid_field"),
        ]
        for (call, body, status, code) in cases {
            let r = try s.client.post("/v1/activities/strict/\(call)", body)
            XCTAssertEqual(r.status, status, "\(call) \(body): \(r.text)")
            XCTAssertEqual(r.errorCode, code, "\(call) \(body): \(r.text)")
        }
        let starts: [(String, String)] = [
            (#"{"activityId":"bad id","taskName":"x"}"#, "invalid_field"),
            (#"{"activityId":"\#(String(repeating: "a", count: 129))","taskName":"x"}"#, "invalid_field"),
            (#"{"taskName":"   "}"#, "invalid_field"),
            (#"{"taskName":"a\u0007b"}"#, "invalid_field"),
            (#"{}"#, "missing_field"),
            (#"{"taskName":"x","systemImage":"Arrow.Down"}"#, "invalid_field"),
            (#"{"taskName":"x","machine":"a b"}"#, "invalid_field"),
            (#"{"taskName":"x","cancelURL":"ftp://x/y"}"#, "invalid_field"),
            (#"{"taskName":"x","cancelURL":"/relative"}"#, "invalid_field"),
            (#"{"taskName":"x","state":"retrying"}"#, "invalid_field"),
            (#"{"taskName":"x","initialProgress":2}"#, "invalid_field"),
            (#"{"taskName":"x","extra":1}"#, "unknown_field"),
        ]
        for (body, code) in starts {
            let r = try s.client.post("/v1/activities/start", body)
            XCTAssertEqual(r.status, 400, "\(body): \(r.text)")
            XCTAssertEqual(r.errorCode, code, "\(body): \(r.text)")
        }
        XCTAssertEqual(try s.client.request("POST", "/v1/activities/strict/update", json: "{}", headers: ["Content-Type": "text/plain"]).status, 415)
        XCTAssertEqual(try s.client.post("/v1/activities/%00/update", "{}").status, 400)
        XCTAssertEqual(try s.client.post("/v1/activities/missing/update", "{}").status, 404)
        XCTAssertEqual(try s.client.get("/v1/activities/strict/update").status, 405)
        XCTAssertEqual(try s.client.get("/v1/activities/missing").status, 404)
        XCTAssertEqual(try s.client.get("/v1/activities?state=weird").status, 400)
        XCTAssertEqual(try s.client.get("/v1/activities?limit=0").status, 400)
        XCTAssertEqual(try s.seq("strict"), 1)
        XCTAssertEqual(try s.client.get("/v1/activities?limit=500").json?["activities"].map { if case .array(let a) = $0 { return a.count } else { return -1 } }, 1)
    }

    func testListFiltersAndPaginates() throws {
        let s = server!
        for i in 0..<5 { try s.startActivity("list-\(i)", extra: #","machine":"\#(i % 2 == 0 ? "xerxes" : "shodan")""#) }
        try s.end("list-0")
        func ids(_ query: String) throws -> ([String], String?) {
            let r = try s.client.get("/v1/activities?\(query)")
            guard case .array(let items)? = r.json?["activities"] else { XCTFail(r.text); return ([], nil) }
            let next: String? = { if case .string(let c)? = r.json?["nextCursor"] { return c } else { return nil } }()
            return (items.compactMap { if case .string(let id)? = $0["activityId"] { return id } else { return nil } }, next)
        }
        XCTAssertEqual(try ids("state=finished").0, ["list-0"])
        XCTAssertEqual(Set(try ids("state=active").0), ["list-1", "list-2", "list-3", "list-4"])
        XCTAssertEqual(Set(try ids("machine=shodan").0), ["list-1", "list-3"])
        let (page1, cursor) = try ids("limit=2")
        XCTAssertEqual(page1.count, 2)
        let (page2, cursor2) = try ids("limit=2&cursor=\(try XCTUnwrap(cursor))")
        let (page3, _) = try ids("limit=2&cursor=\(try XCTUnwrap(cursor2))")
        XCTAssertEqual(Set(page1 + page2 + page3).count, 5)
        // Newest first, ties broken by id: the pages together are every activity, in order, once.
        XCTAssertEqual(page1 + page2 + page3, ["list-4", "list-3", "list-2", "list-1", "list-0"])
    }

    /// `idle` (alive but waiting) and `rejected` (refused before it ran) on the wire: the
    /// moves the contract allows, the ones it refuses (nothing written), streams, history and
    /// the list filters.
    func testIdleAndRejected() throws {
        let s = server!
        try s.startActivity("paused", state: "processing")
        let stream = try s.stream("paused")
        // Subscribed before the changes below: without it a stream read after them starts there.
        XCTAssertEqual(try stream.waitForEvents(1).map(\.event), ["processing"])
        XCTAssertEqual(try s.update("paused", #"{"state":"idle","status":"waiting for a GPU"}"#).json?["state"], .string("idle"))
        AuthKitless.assert(try s.update("paused", #"{"state":"retrying"}"#), 409, "invalid_transition")
        AuthKitless.assert(try s.update("paused", #"{"state":"queued"}"#), 409, "invalid_transition")
        AuthKitless.assert(try s.end("paused", #"{"state":"rejected"}"#), 409, "invalid_transition")
        XCTAssertEqual(try s.seq("paused"), 2, "refused moves write nothing")
        XCTAssertEqual(try s.update("paused", #"{"state":"idle","progress":0.3}"#).status, 200)
        XCTAssertEqual(try s.update("paused", #"{"state":"processing"}"#).status, 200)
        XCTAssertEqual(try s.update("paused", #"{"state":"idle"}"#).status, 200)

        try s.startActivity("refused", state: "queued")
        func ids(_ query: String) throws -> Set<String> {
            guard case .array(let items)? = try s.client.get("/v1/activities?\(query)").json?["activities"] else { return [] }
            return Set(items.compactMap { if case .string(let id)? = $0["activityId"] { return id } else { return nil } })
        }
        XCTAssertEqual(try ids("state=active"), ["paused", "refused"], "idle is active")
        let rejected = try s.end("refused", #"{"state":"rejected","status":"quota exceeded"}"#)
        XCTAssertEqual(rejected.status, 200, rejected.text)
        XCTAssertEqual(rejected.json?["state"], .string("rejected"))
        XCTAssertNotEqual(rejected.json?["endedAt"], .null)
        XCTAssertEqual(try s.end("refused", #"{"state":"rejected","status":"quota exceeded"}"#).status, 200, "the same end again")
        AuthKitless.assert(try s.end("refused", #"{"state":"error"}"#), 409, "already_finished")
        XCTAssertEqual(try ids("state=finished"), ["refused"], "rejected is finished")
        XCTAssertEqual(try ids("state=active"), ["paused"])

        // A finished-job stream of a rejected activity: its final event, then the end.
        let final = try s.stream("refused")
        XCTAssertTrue(try final.waitForEnd())
        XCTAssertEqual(final.events.map(\.event), ["rejected"])

        try s.end("paused", #"{"state":"error","error":"stalled"}"#)
        XCTAssertTrue(try stream.waitForEnd())
        XCTAssertEqual(stream.events.map(\.event), ["processing", "idle", "idle", "processing", "idle", "error"])
        assertConsecutive(stream.ids, from: 1, through: 6)
        let history = try s.client.get("/v1/activities/paused/events")
        guard case .array(let events)? = history.json?["events"] else { return XCTFail(history.text) }
        XCTAssertEqual(events.map { $0["event"] }, ["processing", "idle", "idle", "processing", "idle", "error"].map { .string($0) })
    }
}

/// Error answers in tests that do not need the auth helpers.
enum AuthKitless {
    static func assert(_ r: HTTPClient.Response, _ status: Int, _ code: String, file: StaticString = #filePath, line: UInt = #line) {
        XCTAssertEqual(r.status, status, r.text, file: file, line: line)
        XCTAssertEqual(r.errorCode, code, r.text, file: file, line: line)
    }
}

final class RetentionTests: XCTestCase {
    func testFinishedActivitiesArePrunedAfterRetentionLiveOnesNever() throws {
        // 0.00003 days is about 2.6 s; the prune job runs every retention/4.
        let s = try TestServer.start(environment: ["DISPATCH_RETENTION_DAYS": "0.00003"])
        defer { s.stop() }
        try s.startActivity("old-done")
        try s.end("old-done")
        try s.startActivity("still-live")
        XCTAssertTrue(try waitUntil(20) { try s.client.get("/v1/activities/old-done").status == 404 })
        let rows = try TestPostgres.shared().sql(s.conninfo, "SELECT count(*) FROM activity_events WHERE activity_id = 'old-done'")
        XCTAssertEqual(rows.first?.first, "0")
        XCTAssertEqual(try s.client.get("/v1/activities/still-live").status, 200)
        XCTAssertEqual(try s.seq("still-live"), 1)
    }
}

/// Found in review: streams that start with nothing to send, keep-alive after a stream,
/// HTTP/1.0 streams, and a reused id after retention.
final class StreamEdgeTests: XCTestCase {
    func testLastEventIDAtTheNewestEventStillStartsTheStream() throws {
        let s = try TestServer.start(environment: ["DISPATCH_HEARTBEAT": "0.5"])
        defer { s.stop() }
        try s.startActivity("caught-up")
        try s.update("caught-up")
        let st = try s.stream("caught-up", lastEventID: 2)
        XCTAssertTrue(try st.pump(timeout: 5) { $0.heartbeats >= 1 }, "no headers or heartbeat for a caught-up client")
        XCTAssertEqual(st.status, 200)
        try s.update("caught-up")
        try s.end("caught-up")
        XCTAssertTrue(try st.waitForEnd())
        assertConsecutive(st.ids, from: 3, through: 4)
        // A Last-Event-ID from the future still ends when the activity does.
        try s.startActivity("future")
        let ahead = try s.stream("future", lastEventID: 999)
        XCTAssertTrue(try ahead.pump(timeout: 5) { $0.heartbeats >= 1 })
        try s.end("future")
        XCTAssertTrue(try ahead.waitForEnd(timeout: 10), "the stream never ended")
    }

    func testKeepAliveConnectionAfterAStreamGetsItsDeadlineBack() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        try s.startActivity("ka")
        try s.end("ka")
        let sock = try TestSocket.connect(port: s.port)
        try sock.send("GET /v1/activities/ka/status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(s.adminKey)\r\n\r\n")
        var got = ""
        while !got.contains("0\r\n\r\n"), let chunk = try sock.read(timeout: 5), !chunk.isEmpty { got += String(decoding: chunk, as: UTF8.self) }
        XCTAssertTrue(got.contains("event: completed"), got)
        // The same connection serves another request, then is closed when idle.
        try sock.send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        let next = try XCTUnwrap(try sock.read(timeout: 5))
        XCTAssertTrue(String(decoding: next, as: UTF8.self).hasPrefix("HTTP/1.1 200"))
        let start = Clock.monotonic()
        var closed = false
        while Clock.monotonic() - start < 25 {
            if let chunk = try sock.read(timeout: 1), chunk.isEmpty { closed = true; break }
        }
        XCTAssertTrue(closed, "an idle keep-alive connection after a stream was never closed")
    }

    /// A finished job's stream is answered whole from memory: the bytes of a stream that ends
    /// at once (chunked head with the CORS headers, the reconnect delay, the final event, the
    /// last chunk), counted as a stream its terminal event closed; the connection stays open.
    func testAFinishedActivityIsAnsweredWholeOnTheWire() throws {
        let s = try TestServer.start(environment: ["DISPATCH_CORS_ORIGINS": "https://ops.example"])
        defer { s.stop() }
        try s.startActivity("whole")
        try s.end("whole")
        let closes = try s.metric("dispatch_stream_closes_total", labels: "terminal")
        let delivered = try s.metric("dispatch_events_delivered_total")
        let sock = try TestSocket.connect(port: s.port)
        for round in 1...3 {
            try sock.send("GET /v1/activities/whole/status HTTP/1.1\r\nHost: x\r\nOrigin: https://ops.example\r\n"
                          + "Authorization: Bearer \(s.adminKey)\r\n\r\n")
            var got = ""
            while !got.hasSuffix("\r\n0\r\n\r\n"), let chunk = try sock.read(timeout: 5), !chunk.isEmpty {
                got += String(decoding: chunk, as: UTF8.self)
            }
            let parts = got.components(separatedBy: "\r\n\r\n")
            let head = parts[0].components(separatedBy: "\r\n")
            XCTAssertEqual(head.first, "HTTP/1.1 200 OK", got)
            for line in ["Content-Type: text/event-stream", "Cache-Control: no-cache", "Transfer-Encoding: chunked",
                         "Access-Control-Allow-Origin: https://ops.example"] {
                XCTAssertTrue(head.contains(line), "round \(round): \(line) missing in \(got)")
            }
            XCTAssertFalse(head.contains { $0.lowercased().hasPrefix("connection:") || $0.lowercased().hasPrefix("content-length:") }, got)
            // The chunks, decoded (bytes: "\r\n" is one Character): the body a stream that
            // ends at once sends.
            var rest = Array(got.utf8).dropFirst(parts[0].utf8.count + 4)
            var body = ""
            while let cr = rest.firstIndex(of: 0x0D), let size = Int(String(decoding: rest[..<cr], as: UTF8.self), radix: 16) {
                let start = cr + 2
                guard size > 0 else { XCTAssertEqual(Array(rest[start...]), [0x0D, 0x0A]); break }
                body += String(decoding: rest[start..<(start + size)], as: UTF8.self)
                rest = rest[(start + size + 2)...]
            }
            XCTAssertTrue(body.hasPrefix("retry: 3000\n\nid: 2\nevent: completed\ndata: {"), body)
            XCTAssertTrue(body.hasSuffix("}\n\n"), body)
        }
        XCTAssertEqual(try s.metric("dispatch_stream_closes_total", labels: "terminal"), closes + 3)
        XCTAssertEqual(try s.metric("dispatch_events_delivered_total"), delivered + 3)
    }

    func testHTTP10KeepAliveClientGetsTheStream() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        try s.startActivity("old-client")
        try s.end("old-client")
        let sock = try TestSocket.connect(port: s.port)
        try sock.send("GET /v1/activities/old-client/status HTTP/1.0\r\nConnection: keep-alive\r\nAuthorization: Bearer \(s.adminKey)\r\n\r\n")
        let text = String(decoding: try sock.readAll(timeout: 10), as: UTF8.self)
        XCTAssertFalse(text.lowercased().contains("content-length: 0"), text)
        XCTAssertTrue(text.contains("event: completed"), text)
    }

    func testAReusedIdAfterPruningIsNotAnsweredFromTheOldFinalEvent() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        try s.startActivity("reused")
        try s.end("reused")
        let first = try s.stream("reused")
        XCTAssertTrue(try first.waitForEnd())
        XCTAssertEqual(first.events.map(\.event), ["completed"])
        let pg = try TestPostgres.shared()
        // An operator's DELETE: the activity's history goes with it (Migrations/0022).
        _ = try pg.sql(s.conninfo, "DELETE FROM activities WHERE activity_id = 'reused'")
        XCTAssertEqual(try pg.sql(s.conninfo, "SELECT count(*) FROM activity_events WHERE activity_id = 'reused'").first?.first, "0")
        try s.startActivity("reused")
        let second = try s.stream("reused")
        XCTAssertEqual(try second.waitForEvents(1).first?.event, "processing")
        XCTAssertEqual(second.ids, [1])
    }
}

final class StreamMemoryTests: XCTestCase {
    /// Streams whose clients vanish (RST) leave nothing behind: after a warm-up round, more
    /// rounds of the same size do not grow the server (each leaked reply was ~0.5 KB).
    func testVanishedClientsLeaveNoMemoryBehind() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        try s.startActivity("vanish")
        func rss() throws -> Int { (ProcessFigures.residentBytes(of: s.pid) ?? 0) / 1024 }
        func round() throws {
            var streams: [SSEClient] = []
            for _ in 0..<2000 { streams.append(try s.stream("vanish")) }
            for st in streams { _ = try st.waitForEvents(1) }
            for st in streams { st.reset() }
            // The connection (and its buffers) goes a moment after its stream: wait for both.
            XCTAssertTrue(try waitUntil(10) { try s.metric("dispatch_streams_active") == 0 })
            XCTAssertTrue(try waitUntil(10) { try s.metric("dispatch_connections_open") <= 1 })
        }
        // What a round frees, libevent frees on later turns of the loop (a detached reply, a
        // connection at the guard's next sweep): the lowest reading over a moment after it,
        // so that a round's memory on its way out is not taken for a leak (a leak stays).
        func settledRSS() throws -> Int {
            var lowest = try rss()
            for _ in 0..<15 { usleep(100_000); lowest = min(lowest, try rss()) }
            return lowest
        }
        try round()
        try round()
        let warm = try settledRSS()
        var rounds: [Int] = []
        for _ in 0..<3 { try round(); rounds.append(try rss()) }
        let after = try settledRSS()
        XCTAssertLessThan(after - warm, 1500, "RSS grew by \(after - warm) KiB over 6000 vanished streams (warm \(warm), rounds \(rounds))")
    }
}

