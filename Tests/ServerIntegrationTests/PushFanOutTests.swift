import DispatchSystem
import DispatchTestSupport
import Foundation
import Glibc
import XCTest

/// One outbox entry per activity fanned out to its phones (Migrations/0016): a change writes
/// one row whatever the number of phones, every phone gets it once, and a phone whose push
/// failed retries on its own row without holding back the others.
extension PushTests {
    func testAChangeIsOneEntryFannedOutAndAThrottledPhoneRetriesAlone() throws {
        let f = try fake()
        let s = try server(f)
        defer { s.stop() }
        try s.startActivity("fan", state: "queued")
        let tokens = (0..<5).map { _ in token() }
        // One phone after the other, each first push on its own row within a second or so.
        for t in tokens {
            try register(s, device: token(), tokens: [("fan", t)])
            try f.wait(token: t) { !self.delivered($0).isEmpty }
        }
        let rows = "SELECT device_id::text || ':' || xmin::text FROM push_outbox WHERE activity_id = 'fan' ORDER BY device_id"
        let before = try sql(s, rows)
        XCTAssertEqual(before.count, 5, "each registration's first push had its own row")

        let throttled = tokens[0]
        try f.script(token: throttled, respond: [#"{"status":429}"#])
        try s.update("fan", #"{"state":"processing"}"#)
        let got = try f.wait(timeout: 15) { rs in Set(self.delivered(rs).filter { $0.seq == 2 }.map(\.token)) == Set(tokens) }
        let seq2 = got.filter { $0.seq == 2 }
        for r in delivered(got) {
            // Each phone's first push must not push the activity's timestamps ahead of the
            // clock for the next (the next fan-out would wait for them).
            XCTAssertLessThanOrEqual(r.timestamp ?? 0, Int(r.time) + 2, "a timestamp near the clock")
        }
        for t in tokens { XCTAssertEqual(delivered(seq2).filter { $0.token == t }.count, 1, "each phone once") }
        let refused = try XCTUnwrap(seq2.first { $0.token == throttled && $0.status == 429 })
        let retried = try XCTUnwrap(seq2.first { $0.token == throttled && $0.status == 200 })
        XCTAssertGreaterThanOrEqual(retried.time - refused.time, 0.45, "the throttled phone backed off")
        for r in delivered(seq2) where r.token != throttled {
            XCTAssertLessThan(r.time, retried.time, "the other phones did not wait for it")
        }
        XCTAssertEqual(try count(s, "SELECT count(*) FROM push_activity_outbox WHERE activity_id = 'fan' AND sent_seq = 2"), 1,
                       "one entry for the activity")
        let after = try sql(s, rows)
        XCTAssertEqual(zip(before, after).filter { $0 != $1 }.count, 1, "only the throttled phone's row was written: \(before) → \(after)")

        // A state change goes to every phone again, the one that retried included, and writes
        // no per-phone row at all.
        try f.clearRequests()
        let settled = try sql(s, rows)
        try s.update("fan", #"{"state":"idle"}"#)
        let third = try f.wait(timeout: 10) { rs in Set(self.delivered(rs).filter { $0.seq == 3 }.map(\.token)) == Set(tokens) }
        XCTAssertEqual(delivered(third).count, 5, "one push per phone")
        XCTAssertEqual(try sql(s, rows), settled, "no per-phone row written")

        // `push status` shows the entry beside the per-phone rows.
        XCTAssertTrue(try waitUntil(5) { try self.count(s, "SELECT count(*) FROM push_activity_outbox WHERE wanted_seq > sent_seq") == 0 })
        let out = Subprocess.run([TestPaths.binary("dispatchd"), "push", "status", "--database-url", s.conninfo],
                                 environment: ["DISPATCH_MIGRATIONS_DIR": TestPaths.repositoryRoot + "/Migrations", "PATH": "/usr/bin:/bin"])
        XCTAssertEqual(out.status, 0, out.output)
        XCTAssertTrue(out.output.contains("outbox: 0 pending"), out.output)
        XCTAssertTrue(out.output.contains("activities: 0 with a change to push (0 due now, 0 being sent, 0 paced), 1 in all"), out.output)
        XCTAssertTrue(out.output.contains("tokens: 5 devices"), out.output)
    }
}
