@testable import DispatchServer
import DispatchCore
import DispatchSystem
import DispatchTestSupport
import Foundation
import XCTest

/// Contract §6's limits per key and private device registrations, against real dispatchd
/// processes on a real PostgreSQL (issue 24, findings 3-5).
final class KeyLimitsTests: XCTestCase {
    static let tokenKey = ["DISPATCH_TOKEN_KEY": FakeAPNs.tokenKey]

    func token(bytes: Int = 32) -> String { randomToken(bytes: bytes) }

    func sql(_ s: TestServer, _ query: String) throws -> [[String?]] { try TestPostgres.shared().sql(s.conninfo, query) }

    func count(_ s: TestServer, _ query: String) throws -> Int {
        guard let v = try sql(s, query).first?.first ?? nil, let n = Int(v) else { return -1 }
        return n
    }

    func keyID(_ s: TestServer, _ name: String) throws -> String {
        guard let id = try sql(s, "SELECT id FROM api_keys WHERE name = '\(name)'").first?.first ?? nil else { throw TestError("no key \(name)") }
        return id
    }

    /// `n` requests at once (threads), their answers in order.
    func concurrently(_ n: Int, _ request: @escaping @Sendable (Int) throws -> HTTPClient.Response) -> [HTTPClient.Response?] {
        let lock = NSLock()
        nonisolated(unsafe) var out = [HTTPClient.Response?](repeating: nil, count: n)
        DispatchQueue.concurrentPerform(iterations: n) { i in
            let r = try? request(i)
            lock.lock(); out[i] = r; lock.unlock()
        }
        return out
    }

    static func body(device: String, pushToStart: String?? = nil, tokens: [(String, String?)] = []) -> String {
        var body = #"{"deviceToken":"\#(device)""#
        switch pushToStart {
        case .some(.some(let t)): body += #","pushToStartToken":"\#(t)""#
        case .some(.none): body += #","pushToStartToken":null"#
        case .none: break
        }
        if !tokens.isEmpty {
            body += #","activityTokens":{"# + tokens.map { id, t in t.map { #""\#(id)":"\#($0)""# } ?? #""\#(id)":null"# }
                .joined(separator: ",") + "}"
        }
        return body + "}"
    }

    // MARK: - Finding 4: devices belong to their key

    func testAnotherKeyNeverSeesChangesOrDeletesARegistration() throws {
        let s = try TestServer.start(environment: Self.tokenKey)
        defer { s.stop() }
        let a = HTTPClient(port: s.port, token: try AuthKit.createKey(s, "app-a", ["device", "read"]))
        let b = HTTPClient(port: s.port, token: try AuthKit.createKey(s, "app-b", ["device", "read"]))
        try s.startActivity("followed")
        try s.startActivity("other")
        let device = token(), pts = token(), activityToken = token()
        var r = try a.post("/v1/activity-tokens", Self.body(device: device, pushToStart: pts, tokens: [("followed", activityToken)]))
        XCTAssertEqual(r.status, 200, r.text)

        // The same device named by another key: a registration of its own, that shows nothing of A's.
        r = try b.post("/v1/activity-tokens", Self.body(device: device, tokens: [("other", token())]))
        XCTAssertEqual(r.status, 200, r.text)
        XCTAssertEqual(r.json?["pushToStartToken"], .null, "B does not see A's push-to-start token: \(r.text)")
        XCTAssertNil(r.json?["activityTokens"]?["followed"], "B does not see what A follows: \(r.text)")
        XCTAssertNotNil(r.json?["activityTokens"]?["other"])

        // B nulls A's tokens and deletes the device: A's registration does not change.
        r = try b.post("/v1/activity-tokens", Self.body(device: device, pushToStart: .some(nil), tokens: [("followed", nil)]))
        XCTAssertEqual(r.status, 200, r.text)
        r = try b.post("/v1/activity-tokens", Self.body(device: device, pushToStart: token()))
        XCTAssertEqual(r.status, 200, r.text)
        XCTAssertEqual(try b.request("DELETE", "/v1/activity-tokens/\(device)").status, 204)
        XCTAssertEqual(try b.request("DELETE", "/v1/activity-tokens/\(device)").status, 204, "already gone: the same answer")
        XCTAssertEqual(try b.request("DELETE", "/v1/activity-tokens/\(token())").status, 204, "never registered: the same answer")

        r = try a.post("/v1/activity-tokens", Self.body(device: device))
        XCTAssertEqual(r.status, 200, r.text)
        XCTAssertEqual(r.json?["pushToStartToken"], .string("…" + pts.suffix(4)), r.text)
        XCTAssertEqual(r.json?["activityTokens"]?["followed"], .string("…" + activityToken.suffix(4)), r.text)
        let aID = try keyID(s, "app-a"), bID = try keyID(s, "app-b")
        XCTAssertEqual(try count(s, "SELECT count(*) FROM devices WHERE key_id = \(aID)"), 1)
        XCTAssertEqual(try count(s, "SELECT count(*) FROM devices WHERE key_id = \(bID)"), 0, "B's own registration is gone")

        // A's own DELETE forgets A's.
        XCTAssertEqual(try a.request("DELETE", "/v1/activity-tokens/\(device)").status, 204)
        XCTAssertEqual(try count(s, "SELECT count(*) FROM devices"), 0)
    }

    func testDevicesPerKeyAreLimitedExactlyEvenWhenRacing() throws {
        let s = try TestServer.start(environment: Self.tokenKey.merging(
            ["DISPATCH_MAX_DEVICES_PER_KEY": "3", "DISPATCH_DEVICE_RATE": "0", "DISPATCH_WORKERS": "2"]) { $1 })
        defer { s.stop() }
        let app = HTTPClient(port: s.port, token: try AuthKit.createKey(s, "app", ["device", "read"]))
        let devices = (0..<4).map { _ in token() }
        for d in devices.prefix(3) { XCTAssertEqual(try app.post("/v1/activity-tokens", Self.body(device: d)).status, 200) }
        let refused = try app.post("/v1/activity-tokens", Self.body(device: devices[3], pushToStart: token()))
        AuthKit.assertError(refused, 429, "too_many_devices")
        XCTAssertEqual(try count(s, "SELECT count(*) FROM devices"), 3, "nothing written")
        XCTAssertEqual(try app.post("/v1/activity-tokens", Self.body(device: devices[0], pushToStart: token())).status, 200,
                       "a device already registered may still be updated")
        XCTAssertEqual(try app.request("DELETE", "/v1/activity-tokens/\(devices[1])").status, 204)
        XCTAssertEqual(try app.post("/v1/activity-tokens", Self.body(device: devices[3])).status, 200, "room again")
        // Another key has its own allowance.
        let other = HTTPClient(port: s.port, token: try AuthKit.createKey(s, "other", ["device"]))
        XCTAssertEqual(try other.post("/v1/activity-tokens", Self.body(device: devices[0])).status, 200)

        // Twenty new devices at once over two workers: exactly three get in.
        let racer = HTTPClient(port: s.port, token: try AuthKit.createKey(s, "racer", ["device"]))
        let fresh = (0..<20).map { _ in token() }
        let answers = concurrently(20) { i in try racer.post("/v1/activity-tokens", Self.body(device: fresh[i])) }
        XCTAssertEqual(answers.filter { $0?.status == 200 }.count, 3, answers.map { "\($0?.status ?? 0)" }.joined(separator: " "))
        XCTAssertEqual(answers.filter { $0?.status == 429 }.count, 17)
        XCTAssertEqual(try count(s, "SELECT count(*) FROM devices WHERE key_id = \(try keyID(s, "racer"))"), 3)
    }

    func testDeviceRegistrationsAreRateLimitedPerKey() throws {
        // One worker: the rate is per key and worker.
        let s = try TestServer.start(environment: Self.tokenKey.merging(["DISPATCH_DEVICE_RATE": "1", "DISPATCH_WORKERS": "1"]) { $1 })
        defer { s.stop() }
        let app = HTTPClient(port: s.port, token: try AuthKit.createKey(s, "app", ["device"]))
        let other = HTTPClient(port: s.port, token: try AuthKit.createKey(s, "other", ["device"]))
        let device = token()
        // A burst of twice the rate, then refusals with Retry-After; nothing written by them.
        var statuses: [Int] = []
        for _ in 0..<6 { statuses.append(try app.post("/v1/activity-tokens", Self.body(device: device, pushToStart: token())).status) }
        XCTAssertEqual(statuses.prefix(2), [200, 200], "\(statuses)")
        XCTAssertTrue(statuses.contains(429), "\(statuses)")
        let refused = try app.request("DELETE", "/v1/activity-tokens/\(device)")
        AuthKit.assertError(refused, 429, "rate_limited")
        XCTAssertNotNil(refused.headers["retry-after"])
        XCTAssertEqual(try count(s, "SELECT count(*) FROM devices"), 1, "the refused DELETE forgot nothing")
        XCTAssertEqual(try other.post("/v1/activity-tokens", Self.body(device: device)).status, 200, "another key is not held back")
        XCTAssertEqual(try s.client.post("/v1/activity-tokens", Self.body(device: token())).status, 200, "admin keys are not limited")
    }

    func testDevicesNobodyRefreshedAndThoseOfRevokedKeysArePruned() throws {
        // 0.0005 days is 43 s; the prune job runs every quarter of it.
        let s = try TestServer.start(environment: Self.tokenKey.merging(["DISPATCH_DEVICE_RETENTION_DAYS": "0.0005"]) { $1 })
        defer { s.stop() }
        let app = HTTPClient(port: s.port, token: try AuthKit.createKey(s, "app", ["device", "read"]))
        let gone = HTTPClient(port: s.port, token: try AuthKit.createKey(s, "gone", ["device", "read"]))
        try s.startActivity("job")
        let stale = token(), fresh = token(), revoked = token()
        XCTAssertEqual(try app.post("/v1/activity-tokens", Self.body(device: stale, tokens: [("job", token())])).status, 200)
        XCTAssertEqual(try app.post("/v1/activity-tokens", Self.body(device: fresh)).status, 200)
        XCTAssertEqual(try gone.post("/v1/activity-tokens", Self.body(device: revoked)).status, 200)
        // A row from before registrations had keys, not refreshed for a day.
        _ = try sql(s, """
            INSERT INTO devices (token_mac, token_sealed, token_hint, updated_at)
            VALUES ('\\x01'::bytea, '\\x02'::bytea, '…0001', now() - interval '1 day')
            """)
        let appID = try keyID(s, "app")
        _ = try sql(s, "UPDATE devices SET updated_at = now() - interval '1 hour' WHERE key_id = \(appID) AND token_hint = '…\(stale.suffix(4))'")
        XCTAssertEqual(try s.client.request("DELETE", "/v1/keys/gone").status, 200)
        let pruned = try waitUntil(40) { try count(s, "SELECT count(*) FROM devices") == 1 }
        XCTAssertTrue(pruned, "left: \(String(describing: try? sql(s, "SELECT token_hint, key_id FROM devices")))")
        XCTAssertEqual(try sql(s, "SELECT token_hint FROM devices").first?.first, "…" + fresh.suffix(4), "the refreshed one stays")
        XCTAssertEqual(try count(s, "SELECT count(*) FROM activity_tokens"), 0, "the stale device's tokens went with it")
        XCTAssertTrue(s.log().contains("retention.push_pruned"))
    }

    // MARK: - Finding 5: read is needed to follow, no snapshot to keys that may not read

    func testRegisteringAnActivityTokenNeedsRead() throws {
        let s = try TestServer.start(environment: Self.tokenKey)
        defer { s.stop() }
        try s.startActivity("secret-job", extra: #","cancelURL":"https://hooks.example/cancel""#)
        let deviceOnly = HTTPClient(port: s.port, token: try AuthKit.createKey(s, "device-only", ["device"]))
        let app = HTTPClient(port: s.port, token: try AuthKit.createKey(s, "app", ["device", "read"]))
        let device = token()
        let refused = try deviceOnly.post("/v1/activity-tokens", Self.body(device: device, pushToStart: token(), tokens: [("secret-job", token())]))
        AuthKit.assertError(refused, 403, "forbidden")
        XCTAssertEqual(try count(s, "SELECT count(*) FROM devices"), 0, "nothing written")
        // The device and its push-to-start token, and forgetting a token, need `device` only.
        XCTAssertEqual(try deviceOnly.post("/v1/activity-tokens", Self.body(device: device, pushToStart: token())).status, 200)
        XCTAssertEqual(try deviceOnly.post("/v1/activity-tokens", Self.body(device: device, tokens: [("secret-job", nil)])).status, 200)
        XCTAssertEqual(try count(s, "SELECT count(*) FROM activity_tokens"), 0)
        XCTAssertEqual(try app.post("/v1/activity-tokens", Self.body(device: device, tokens: [("secret-job", token())])).status, 200)
        XCTAssertEqual(try count(s, "SELECT count(*) FROM activity_tokens"), 1)
    }

    func testCancelAnswersCarryTheSnapshotOnlyToKeysThatMayRead() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        try s.startActivity("job", extra: #","cancelURL":"https://hooks.example/cancel""#)
        let deviceOnly = HTTPClient(port: s.port, token: try AuthKit.createKey(s, "device-only", ["device"]))
        let app = HTTPClient(port: s.port, token: try AuthKit.createKey(s, "app", ["device", "read"]))
        for attempt in ["first", "repeated"] {
            let r = try deviceOnly.post("/v1/activities/job/cancel", #"{"reason":"stop"}"#)
            XCTAssertEqual(r.status, 202, r.text)
            XCTAssertEqual(r.json, .object([("activityId", .string("job")), ("cancelRequested", .bool(true))]), "\(attempt): \(r.text)")
        }
        let readable = try app.post("/v1/activities/job/cancel", "{}")
        XCTAssertEqual(readable.status, 202)
        XCTAssertEqual(readable.json?["taskName"], .string("Job job"), "a key that may read gets the snapshot")
        XCTAssertEqual(try s.end("job").status, 200)

        let finished = try deviceOnly.post("/v1/activities/job/cancel", "{}")
        AuthKit.assertError(finished, 409, "already_finished")
        XCTAssertNil(finished.json?["activity"], "no snapshot to a key that may not read: \(finished.text)")
        XCTAssertFalse(finished.text.contains("hooks.example"), finished.text)
        let finishedReadable = try app.post("/v1/activities/job/cancel", "{}")
        AuthKit.assertError(finishedReadable, 409, "already_finished")
        XCTAssertEqual(finishedReadable.json?["activity"]?["cancelURL"], .string("https://hooks.example/cancel"))
    }

    // MARK: - Finding 3: live activities per key

    func testLiveActivitiesPerKeyAreLimitedAndARefusedStartWritesNothing() throws {
        let s = try TestServer.start(environment: ["DISPATCH_MAX_LIVE_PER_KEY": "3", "DISPATCH_PUBLISH_RATE": "0", "DISPATCH_WORKERS": "2"])
        defer { s.stop() }
        let ci = HTTPClient(port: s.port, token: try AuthKit.createKey(s, "ci", ["publish"]))
        @Sendable func start(_ c: HTTPClient, _ id: String) throws -> HTTPClient.Response {
            try c.post("/v1/activities/start", #"{"activityId":"\#(id)","taskName":"Job \#(id)","state":"processing"}"#)
        }
        for i in 1...3 { XCTAssertEqual(try start(ci, "live-\(i)").status, 201) }
        let refused = try start(ci, "live-4")
        AuthKit.assertError(refused, 429, "too_many_live_activities")
        XCTAssertEqual(try count(s, "SELECT count(*) FROM activities WHERE activity_id = 'live-4'"), 0, "nothing written")
        XCTAssertEqual(try count(s, "SELECT count(*) FROM activity_events WHERE activity_id = 'live-4'"), 0)
        XCTAssertEqual(try s.client.get("/v1/activities/live-4").status, 404)
        XCTAssertEqual(try start(ci, "live-1").status, 200, "the same start again is no new activity: answered as before")
        XCTAssertEqual(try ci.post("/v1/activities/live-1/end", "{}").status, 200)
        XCTAssertEqual(try start(ci, "live-4").status, 201, "an end makes room")
        XCTAssertEqual(try start(s.client, "admin-1").status, 201, "another key (here the admin) is not held back")

        // Thirty starts at once over two workers from a fresh key: exactly three live.
        let racer = HTTPClient(port: s.port, token: try AuthKit.createKey(s, "racer", ["publish"]))
        let answers = concurrently(30) { i in try start(racer, "race-\(i)") }
        XCTAssertEqual(answers.filter { $0?.status == 201 }.count, 3, answers.map { "\($0?.status ?? 0)" }.joined(separator: " "))
        XCTAssertEqual(answers.filter { $0?.errorCode == "too_many_live_activities" }.count, 27)
        XCTAssertEqual(try count(s, "SELECT count(*) FROM activities WHERE owner_key_id = \(try keyID(s, "racer"))"), 3)
    }
}

/// Pushes to devices that belong to keys (contract §5.2, §6): push-to-start only to keys that
/// may read, and a phone two keys registered gets each push once.
final class KeyOwnedPushTests: XCTestCase {
    static let apns = ClassFakeAPNs()

    override class func tearDown() {
        apns.stop()
        super.tearDown()
    }

    func fake() throws -> FakeAPNs { try Self.apns.fresh() }

    func token(bytes: Int = 32) -> String { randomToken(bytes: bytes) }

    func count(_ s: TestServer, _ query: String) throws -> Int {
        guard let v = try TestPostgres.shared().sql(s.conninfo, query).first?.first ?? nil, let n = Int(v) else { return -1 }
        return n
    }

    /// Every outbox row has pushed what it wants: nothing more will be sent.
    func settled(_ s: TestServer) throws -> Bool {
        try count(s, """
            SELECT (SELECT count(*) FROM push_outbox WHERE wanted_seq > sent_seq AND NOT failed)
                 + (SELECT count(*) FROM push_activity_outbox WHERE wanted_seq > sent_seq)
            """) == 0
    }

    func testAPhoneTwoKeysRegisteredGetsEachPushOnceAndPushToStartNeedsRead() throws {
        let f = try fake()
        let s = try TestServer.start(environment: f.serverEnvironment)
        defer { s.stop() }
        let a = HTTPClient(port: s.port, token: try AuthKit.createKey(s, "app-a", ["device", "read"]))
        let b = HTTPClient(port: s.port, token: try AuthKit.createKey(s, "app-b", ["device", "read"]))
        let blind = HTTPClient(port: s.port, token: try AuthKit.createKey(s, "blind", ["device"]))
        let device = token(), pts = token(bytes: 80), blindPTS = token(bytes: 80)
        for c in [a, b] {
            XCTAssertEqual(try c.post("/v1/activity-tokens", KeyLimitsTests.body(device: device, pushToStart: pts)).status, 200)
        }
        XCTAssertEqual(try blind.post("/v1/activity-tokens", KeyLimitsTests.body(device: token(), pushToStart: blindPTS)).status, 200)

        try s.startActivity("shared-job", extra: #","liveActivity":true"#)
        XCTAssertEqual(try count(s, "SELECT count(*) FROM push_outbox WHERE kind = 'start'"), 1,
                       "one start for the token two keys registered, none for the key that may not read")
        _ = try f.wait(token: pts) { $0.contains { $0.status == 200 } }
        XCTAssertTrue(try waitUntil(10) { try self.settled(s) })
        XCTAssertEqual(try f.requests(token: pts).count, 1)
        XCTAssertEqual(try f.requests(token: blindPTS).count, 0)

        // Both keys register the phone's activity token: one registration carries its pushes.
        let activityToken = token(bytes: 80)
        for c in [a, b] {
            XCTAssertEqual(try c.post("/v1/activity-tokens", KeyLimitsTests.body(device: device, tokens: [("shared-job", activityToken)])).status, 200)
        }
        XCTAssertEqual(try s.update("shared-job", #"{"progress":0.5}"#).status, 200)
        XCTAssertEqual(try s.update("shared-job", #"{"state":"idle"}"#).status, 200)
        _ = try f.wait(token: activityToken) { $0.contains { $0.seq == 3 && $0.status == 200 } }
        XCTAssertTrue(try waitUntil(10) { try self.settled(s) })
        let got = try f.requests(token: activityToken)
        XCTAssertEqual(got.count, Set(got.compactMap(\.seq)).count, "no state pushed twice: \(got.map(\.seq))")
        XCTAssertEqual(try count(s, "SELECT count(*) FROM push_outbox WHERE kind = 'update'"), 1)

        // One key forgets its registration: the other's still gets the next change.
        XCTAssertEqual(try a.request("DELETE", "/v1/activity-tokens/\(device)").status, 204)
        XCTAssertEqual(try s.update("shared-job", #"{"progress":0.9}"#).status, 200)
        _ = try f.wait(token: activityToken) { $0.contains { $0.seq == 4 && $0.status == 200 } }
        XCTAssertEqual(try f.requests(token: activityToken).filter { $0.seq == 4 }.count, 1)
    }

    /// A token APNs calls gone is gone for every key that registered it: one 410, not one per key.
    func testAGoneTokenIsRetiredFromEveryKeysRegistration() throws {
        let f = try fake()
        let s = try TestServer.start(environment: f.serverEnvironment)
        defer { s.stop() }
        let a = HTTPClient(port: s.port, token: try AuthKit.createKey(s, "app-a", ["device", "read"]))
        let b = HTTPClient(port: s.port, token: try AuthKit.createKey(s, "app-b", ["device", "read"]))
        try s.startActivity("gone-job")
        let device = token(), gone = token()
        try f.script(token: gone, respond: [#"{"status":410,"reason":"Unregistered"}"#])
        for c in [a, b] {
            XCTAssertEqual(try c.post("/v1/activity-tokens", KeyLimitsTests.body(device: device, tokens: [("gone-job", gone)])).status, 200)
        }
        _ = try f.wait(token: gone) { $0.contains { $0.status == 410 } }
        XCTAssertTrue(try waitUntil(5) { try self.count(s, "SELECT count(*) FROM activity_tokens") == 0 }, "retired from both registrations")
        XCTAssertEqual(try count(s, "SELECT count(*) FROM push_outbox"), 0)
        try s.update("gone-job")
        XCTAssertTrue(try waitUntil(5) { try self.settled(s) })
        XCTAssertEqual(try f.requests(token: gone).count, 1, "one push, one 410, nothing more")
    }
}
