import DispatchCore
import DispatchSystem
import DispatchTestSupport
import Glibc
import XCTest

/// Contract §5.4: an activity nobody updates ends as stale, exactly once, whatever the number
/// of servers; a touched one lives.
final class StaleTests: XCTestCase {
    func testAStaleActivityEndsOnceOnEveryStreamWithTwoServersAndATouchedOneLives() throws {
        let a = try TestServer.start()
        defer { a.stop() }
        let b = try TestServer.start(conninfo: a.conninfo)
        defer { b.stop() }
        let started = Clock.monotonic()
        try a.startActivity("forgotten", extra: #","staleAfter":10"#)
        try b.startActivity("kept", extra: #","staleAfter":10"#)
        try b.startActivity("default")  // the server's default (a day): untouched by the sweep
        let onA = try a.stream("forgotten")
        let onB = try b.stream("forgotten")
        for st in [onA, onB] { XCTAssertEqual(try st.waitForEvents(1).count, 1) }

        // Keep one fresh with touches (through both servers) while the other goes stale.
        var touches = 0
        let deadline = Clock.monotonic() + 30
        while !(onA.ended && onB.ended), Clock.monotonic() < deadline {
            let target = touches % 2 == 0 ? a : b
            XCTAssertEqual(try target.client.request("POST", "/v1/activities/kept/touch").status, 204)
            touches += 1
            try onA.pump(timeout: 1) { $0.ended }
            try onB.pump(timeout: 1) { $0.ended }
        }
        let endedAfter = Clock.monotonic() - started
        for st in [onA, onB] {
            XCTAssertTrue(st.ended, "stream did not end: \(st.events) \(a.log())")
            XCTAssertEqual(st.events.map(\.event), ["processing", "error"])
            assertConsecutive(st.ids, from: 1, through: 2)
            let data = try JSONParser.parse(st.events.last?.data ?? "")
            XCTAssertEqual(data["state"], .string("error"))
            XCTAssertEqual(data["error"], .string("stale: no update for 10s"))
            XCTAssertNotEqual(data["endedAt"], .null)
        }
        XCTAssertGreaterThanOrEqual(endedAfter, 9.5, "not before its staleAfter")
        // Exactly one end, in history and by the servers' own count.
        XCTAssertEqual(try Kit.sql(a, "SELECT event FROM activity_events WHERE activity_id = 'forgotten' ORDER BY seq"), ["processing", "error"])
        XCTAssertEqual(try a.metric("dispatch_stale_ended_total") + b.metric("dispatch_stale_ended_total"), 1)
        let forgotten = try a.client.get("/v1/activities/forgotten")
        XCTAssertEqual(forgotten.json?["state"], .string("error"))
        // A later end from its publisher is a conflict, as for any finished activity.
        Kit.assertError(try a.end("forgotten"), 409, "already_finished")

        // The touched one lives past its staleAfter...
        XCTAssertEqual(try b.client.get("/v1/activities/kept").json?["state"], .string("processing"))
        XCTAssertEqual(try a.seq("kept"), 1, "touches add no events")
        XCTAssertEqual(try b.client.get("/v1/activities/default").json?["state"], .string("processing"))
        // ...and goes stale once the touches stop.
        let kept = try a.stream("kept")
        XCTAssertTrue(try kept.waitForEnd(timeout: 30), a.log())
        XCTAssertEqual(kept.events.last?.event, "error")
        XCTAssertEqual(try Kit.sql(a, "SELECT count(*) FROM activity_events WHERE activity_id = 'kept'"), ["2"])
    }

    func testAnUpdateRenewsTheDeadlineAndAFinishedActivityHasNone() throws {
        let s = try TestServer.start(environment: ["DISPATCH_STALE_AFTER": "0"])
        defer { s.stop() }
        try s.startActivity("never")
        XCTAssertEqual(try Kit.sql(s, "SELECT stale_after_s || ' ' || (stale_at_ms IS NULL) FROM activities WHERE activity_id = 'never'"), ["0 true"])
        XCTAssertEqual(try s.client.request("POST", "/v1/activities/never/touch").status, 204, "0 means never: a touch is fine and changes nothing")
        XCTAssertEqual(try Kit.sql(s, "SELECT stale_at_ms IS NULL FROM activities WHERE activity_id = 'never'"), ["t"])
        try s.startActivity("busy", extra: #","staleAfter":30"#)
        // The real deadline is the last update or touch plus staleAfter (stale_at_ms, indexed,
        // is only when the sweeper looks next: moving it on every update would cost HOT).
        let deadline = "SELECT greatest(updated_ms, coalesce(touched_ms, 0)) + stale_after_s * 1000 FROM activities WHERE activity_id = 'busy'"
        let first = try XCTUnwrap(Int64(try Kit.sql(s, deadline)[0] ?? ""))
        waitForNextMillisecond()
        XCTAssertEqual(try s.update("busy").status, 200)
        let second = try XCTUnwrap(Int64(try Kit.sql(s, deadline)[0] ?? ""))
        XCTAssertGreaterThan(second, first)
        XCTAssertEqual(try s.end("busy").status, 200)
        XCTAssertEqual(try Kit.sql(s, "SELECT stale_at_ms IS NULL FROM activities WHERE activity_id = 'busy'"), ["t"])
        Kit.assertError(try s.client.post("/v1/activities/start", #"{"taskName":"x","staleAfter":9}"#), 400, "invalid_field")
        Kit.assertError(try s.client.post("/v1/activities/start", #"{"taskName":"x","staleAfter":604801}"#), 400, "invalid_field")
    }
}
