@testable import DispatchServer
import DispatchCore
import DispatchIO
import DispatchLiveActivity
import DispatchSystem
import DispatchTestSupport
import Foundation
import Glibc
import XCTest

/// One APNs deployment (contract §5.1, §5.2): environments per device, and one provider token
/// shared by every process.
extension PushTests {
    /// §5.1: pushes go to the device's environment; `BadDeviceToken` there is tried once in
    /// the other before the token goes, and a device registered in the wrong environment
    /// keeps its tokens and is corrected.
    func testEnvironmentsAndADeviceRegisteredInTheWrongOne() throws {
        let f = try fake(), sb = try sandboxFake()
        let s = try server(f, ["DISPATCH_APNS_SANDBOX_URL": "https://127.0.0.1:\(sb.port)"])
        defer { s.stop() }
        func declare(_ token: String, _ environment: String) throws {
            try f.declare(token: token, environment: environment)
            try sb.declare(token: token, environment: environment)
        }
        for id in ["env-wrong", "env-right", "env-bad"] { try s.startActivity(id) }
        // A development build that did not say so: registered as production (the default).
        let wrongDevice = token(), wrong = token()
        try declare(wrong, "sandbox")
        let r = try register(s, device: wrongDevice, tokens: [("env-wrong", wrong)])
        XCTAssertEqual(r.json?["environment"], .string("production"))
        try sb.wait(token: wrong) { !self.delivered($0).isEmpty }
        XCTAssertEqual(try f.requests(token: wrong).map { "\($0.status ?? 0) \($0.reason ?? "")" }, ["400 BadDeviceToken"])
        // The correction is written with the answer's mark, after the fake has answered.
        XCTAssertTrue(try waitUntil(5) { try sql(s, "SELECT environment FROM devices").first?.first == "sandbox" }, "corrected")
        XCTAssertEqual(try count(s, "SELECT count(*) FROM activity_tokens WHERE activity_id = 'env-wrong'"), 1, "the token is kept")
        try s.update("env-wrong", #"{"progress":0.8}"#)
        let next = try sb.wait(token: wrong) { self.delivered($0).count >= 2 }
        XCTAssertEqual(delivered(next).map(\.seq), [1, 2])
        XCTAssertEqual(try f.requests(token: wrong).count, 1, "straight to the sandbox from now on")
        // Registered as sandbox: straight there.
        let right = token()
        try declare(right, "sandbox")
        XCTAssertEqual(try register(s, device: token(), tokens: [("env-right", right)], environment: "sandbox").json?["environment"],
                       .string("sandbox"))
        try sb.wait(token: right) { !self.delivered($0).isEmpty }
        XCTAssertEqual(try f.requests(token: right).count, 0)
        // Bad in both environments: retired, and nothing more is tried.
        let bad = token()
        try declare(bad, "none")
        try register(s, device: token(), tokens: [("env-bad", bad)])
        try sb.wait(token: bad) { !$0.isEmpty }
        let gone = try f.wait { _ in (try? self.count(s, "SELECT count(*) FROM activity_tokens WHERE activity_id = 'env-bad'")) == 0 }
        _ = gone
        XCTAssertEqual(try count(s, "SELECT count(*) FROM activity_tokens WHERE activity_id = 'env-bad'"), 0, "retired")
        XCTAssertEqual(try f.requests(token: bad).count + sb.requests(token: bad).count, 2, "once in each environment")
        XCTAssertEqual(try register(s, device: token(), environment: "staging").status, 400)
    }

    /// §5.2: one provider token for the whole deployment. Two servers with two workers each on
    /// one database push 40 activities' changes; APNs sees one JWT, stored once.
    func testTwoServersWithTwoWorkersEachMakeExactlyOneProviderToken() throws {
        let f = try fake()
        let a = try server(f, ["DISPATCH_WORKERS": "2"])
        defer { a.stop() }
        let b = try server(f, ["DISPATCH_WORKERS": "2"], conninfo: a.conninfo)
        defer { b.stop() }
        let ids = (0..<40).map { "one-jwt\($0)" }
        let tokens = ids.map { _ in token() }
        for (i, id) in ids.enumerated() { try (i % 2 == 0 ? a : b).startActivity(id) }
        for (i, id) in ids.enumerated() { try register(i % 2 == 0 ? b : a, device: token(), tokens: [(id, tokens[i])]) }
        for round in 1...3 {
            for (i, id) in ids.enumerated() { try ((i + round) % 2 == 0 ? a : b).update(id, #"{"progress":0.\#(round)}"#) }
        }
        let all = try f.wait(timeout: 30) { rs in self.delivered(rs).filter { ($0.seq ?? 0) == 4 }.count >= ids.count }
        XCTAssertEqual(delivered(all).filter { ($0.seq ?? 0) == 4 }.count, ids.count)
        XCTAssertEqual(all.filter { $0.status != 200 }.map { "\($0.status ?? 0) \($0.reason ?? "")" }, [])
        XCTAssertEqual(try f.stat("distinctJwts"), 1, "one JWT between four processes")
        XCTAssertEqual(try count(a, "SELECT count(*) FROM apns_provider_tokens"), 1)
        XCTAssertGreaterThanOrEqual(Set(all.map(\.connection)).count, 2, "several processes pushed")
        XCTAssertEqual(try count(a, "SELECT count(*) FROM apns_provider_tokens WHERE strpos(encode(jwt_sealed, 'escape'), 'eyJ') > 0"), 0,
                       "stored sealed, not as the JWT")
    }

    /// A slow commit (a synchronous standby, say) of the new token must not let the processes
    /// waiting on the renewal lock read the table before it lands: they take the stored token
    /// and APNs still sees one JWT. The lock used to go in the store's own transaction, before
    /// its commit, and each waiter made a JWT of its own (a 429 for all but the first).
    func testProcessesWaitingOnTheRenewalLockTakeTheTokenCommittedBeforeIt() throws {
        let f = try fake()
        let a = try server(f, ["DISPATCH_WORKERS": "2"])
        defer { a.stop() }
        let b = try server(f, ["DISPATCH_WORKERS": "2"], conninfo: a.conninfo)
        defer { b.stop() }
        let pg = try BlockingPG(a.conninfo)
        try pg.query("CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(1); RETURN NULL; END $$")
        try pg.query("""
            CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT OR UPDATE ON apns_provider_tokens
              DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()
            """)
        try pg.query("SELECT pg_advisory_lock(\(ProviderTokenStore.lockKey))")
        let waiters = """
            SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objid = \(ProviderTokenStore.lockKey)
            """
        var ids: [String] = [], tokens: [String] = []
        let many = try waitUntil(20) {
            let id = "slow-commit\(ids.count)", t = token()
            let s = ids.count % 2 == 0 ? a : b
            try s.startActivity(id)
            try register(s, device: token(), tokens: [(id, t)])
            ids.append(id)
            tokens.append(t)
            return try count(a, waiters) >= 2
        }
        XCTAssertTrue(many, "several processes wait for a token")
        try pg.query("SELECT pg_advisory_unlock(\(ProviderTokenStore.lockKey))")
        let all = try f.wait(timeout: 30) { rs in Set(self.delivered(rs).map(\.token)) == Set(tokens) }
        XCTAssertEqual(Set(delivered(all).map(\.token)), Set(tokens), "every start was pushed")
        XCTAssertEqual(all.filter { $0.status != 200 }.map { "\($0.status ?? 0) \($0.reason ?? "")" }, [])
        XCTAssertEqual(try f.stat("distinctJwts"), 1)
    }

    /// `429 TooManyProviderTokenUpdates` stops all sending until a token may be made again
    /// (20 minutes after the current one), recorded for the deployment, instead of a retry per push.
    func testTooManyProviderTokenUpdatesPausesAllSending() throws {
        let f = try fake()
        let s = try server(f)
        defer { s.stop() }
        let ids = (0..<5).map { "paused\($0)" }
        let tokens = ids.map { _ in token() }
        for id in ids { try s.startActivity(id) }
        try register(s, device: token(), tokens: Array(zip(ids, tokens.map { Optional($0) })))
        try f.wait { self.delivered($0).count >= 5 }
        // APNs calls the token expired; the renewal is too soon for APNs' 20 minutes.
        // Older than 3 s is expired: the JWT in use is (4 s have passed), a fresh one is not,
        // even when its whole-second iat and a loaded machine's delay add up to over 1 s.
        try f.setMaxJWTAge(3)
        sleep(4)
        try f.clearRequests()
        try s.update(ids[0], #"{"progress":0.9}"#)
        let refused = try f.wait { rs in rs.contains { $0.reason == "TooManyProviderTokenUpdates" } }
        XCTAssertEqual(refused.map { $0.reason ?? "" }, ["ExpiredProviderToken", "TooManyProviderTokenUpdates"])
        try f.setMaxJWTAge(3600)
        for id in ids.dropFirst() { try s.update(id, #"{"progress":0.95}"#) }
        usleep(1_500_000)
        XCTAssertEqual(try f.requests().count, 2, "nothing sent while paused, not even the other activities")
        let paused = try count(s, "SELECT paused_until - extract(epoch FROM now())::bigint FROM apns_provider_tokens")
        XCTAssertTrue((1100...1200).contains(paused), "paused for the deployment until 20 min after the new token: \(paused) s")
        XCTAssertEqual(try s.metric("dispatch_push_sent_total", labels: #"result="jwt_throttled""#), 1)
        // The push that met the pause waits on its device's row; the other activities' changes
        // wait in their entries (Migrations/0016), unclaimed while paused.
        XCTAssertEqual(try count(s, """
            SELECT (SELECT count(*) FROM push_outbox WHERE wanted_seq > sent_seq AND NOT failed)
                 + (SELECT count(*) FROM push_activity_outbox WHERE wanted_seq > sent_seq)
            """), 5, "every push still waits, none given up")
    }
}
