@testable import DispatchServer
import DispatchCore
import DispatchIO
import DispatchLiveActivity
import DispatchSystem
import DispatchTestSupport
import Foundation
import Glibc
import XCTest

/// Broadcast channels (contract §5.5) end to end: real dispatchd on a real PostgreSQL, against
/// the fake APNs' push and channel management listeners, every request checked against the
/// shape Apple documents.
final class BroadcastTests: XCTestCase {
    static let apns = ClassFakeAPNs()

    override class func tearDown() {
        apns.stop()
        super.tearDown()
    }

    func fake() throws -> FakeAPNs { try Self.apns.fresh() }

    func token(bytes: Int = 32) -> String { randomToken(bytes: bytes) }

    func decode(_ r: FakeAPNs.Recorded) throws -> LiveActivityPush {
        try JSONDecoder().decode(LiveActivityPush.Envelope.self, from: Data(r.bodyBytes)).aps
    }

    /// create → start with the channel → one push per change → end → delete, each request as
    /// Apple documents it; three phones, one broadcast per change.
    func testABroadcastActivitysWholeLife() throws {
        let f = try fake()
        let s = try TestServer.start(environment: f.serverEnvironment.merging(["DISPATCH_PUSH_DISMISSAL": "0"]) { $1 })
        defer { s.stop() }
        let phones = (0..<3).map { _ in token(bytes: 80) }
        for p in phones {
            XCTAssertEqual(try s.client.post("/v1/activity-tokens", #"{"deviceToken":"\#(token())","pushToStartToken":"\#(p)"}"#).status, 200)
        }
        let started = try s.startActivity("release", extra: #","liveActivity":true,"broadcast":true"#)
        XCTAssertEqual(started.json?["broadcast"], .bool(true))
        XCTAssertEqual(started.json?["channelId"], .null, "not made yet when the start is answered")

        // 1. The channel, on the management host, before anything needs it.
        let afterCreate = try f.wait { rs in rs.contains { $0.channel == "create" && $0.status != nil } }
        let create = try XCTUnwrap(afterCreate.first { $0.channel == "create" })
        XCTAssertEqual(create.status, 201, create.detail ?? "")
        XCTAssertEqual(create.listener, "manage")
        XCTAssertEqual(create.method, "POST")
        XCTAssertEqual(create.path, "/1/apps/com.example.dispatch/channels")
        XCTAssertNotNil(create.jwtHash, "the same provider token authenticates management requests")
        XCTAssertEqual(create.body?["message-storage-policy"], .number(1))
        XCTAssertEqual(create.body?["push-type"], .string("LiveActivity"))
        let channel = try XCTUnwrap(create.channelID)

        // The snapshot shows it at once; its arrival is no change (no seq, no event).
        var snapshot = try s.client.get("/v1/activities/release").json
        let deadline = Clock.monotonic() + 10
        while snapshot?["channelId"] != .string(channel) && Clock.monotonic() < deadline {
            usleep(50_000)
            snapshot = try s.client.get("/v1/activities/release").json
        }
        XCTAssertEqual(snapshot?["channelId"], .string(channel))
        XCTAssertEqual(snapshot?["seq"], .number(1))

        // 2. Push-to-start names the channel, so the new Live Activity subscribes to it.
        for p in phones {
            let got = try f.wait(token: p) { $0.contains { $0.status == 200 } }
            let start = try decode(try XCTUnwrap(got.first { $0.status == 200 }))
            XCTAssertEqual(start.event, "start")
            XCTAssertEqual(start.inputPushChannel, channel)
            XCTAssertNil(start.inputPushToken)
            XCTAssertGreaterThan(got.first { $0.status == 200 }?.time ?? 0, create.time, "after the channel exists")
        }

        // 3. One broadcast per change, whatever the number of phones.
        let progress = try s.update("release", #"{"progress":0.5,"status":"building"}"#)
        XCTAssertEqual(progress.json?["channelId"], .string(channel), "the next change's snapshot carries it")
        try f.wait { rs in rs.filter { $0.channel == "push" && $0.status == 200 }.count >= 1 }
        try s.update("release", #"{"state":"idle","status":"waiting for approval"}"#)
        try f.wait { rs in rs.filter { $0.channel == "push" && $0.status == 200 }.count >= 2 }
        XCTAssertEqual(try s.end("release", #"{"state":"completed","status":"shipped"}"#).status, 200)
        let all = try f.wait(timeout: 15) { rs in rs.contains { $0.channel == "delete" && $0.status != nil } }
        let casts = all.filter { $0.channel == "push" }
        XCTAssertEqual(casts.count, 3, "one per change: \(casts.map { $0.seq ?? -1 })")
        var lastTimestamp = 0
        for (i, r) in casts.enumerated() {
            XCTAssertEqual(r.status, 200, r.detail ?? "")
            XCTAssertEqual(r.listener, "push")
            XCTAssertEqual(r.method, "POST")
            XCTAssertEqual(r.path, "/4/broadcasts/apps/com.example.dispatch")
            XCTAssertEqual(r.headers["apns-channel-id"], channel)
            XCTAssertEqual(r.headers["apns-push-type"], "liveactivity")
            XCTAssertNotNil(r.headers["apns-expiration"].flatMap { Int($0) })
            XCTAssertNil(r.headers["apns-topic"], "Apple lists none for broadcasts")
            XCTAssertLessThanOrEqual(r.bodyBytes.count, 5120)
            let aps = try decode(r)
            XCTAssertEqual(aps.contentState.seq, i + 2)
            XCTAssertGreaterThan(aps.timestamp, lastTimestamp)
            lastTimestamp = aps.timestamp
        }
        XCTAssertEqual(casts.map { $0.priority }, [5, 10, 10], "progress at 5, a state change and the end at 10")
        XCTAssertEqual(try casts.map { try decode($0).event }, ["update", "update", "end"])
        XCTAssertNotNil(try decode(casts[2]).dismissalDate)
        XCTAssertEqual(all.filter { !$0.token.isEmpty && $0.status == 200 }.count, phones.count,
                       "no per-phone update pushes: only the three starts")

        // 4. Deleted once ended and its dismissal date (0 s here) has passed.
        let delete = try XCTUnwrap(all.first { $0.channel == "delete" })
        XCTAssertEqual(delete.status, 204, delete.detail ?? "")
        XCTAssertEqual(delete.listener, "manage")
        XCTAssertEqual(delete.method, "DELETE")
        XCTAssertEqual(delete.path, "/1/apps/com.example.dispatch/channels")
        XCTAssertEqual(delete.headers["apns-channel-id"], channel)
        XCTAssertGreaterThan(delete.time, casts[2].time)
        let rows = try TestPostgres.shared().sql(s.conninfo, "SELECT count(*) FROM broadcast_outbox")
        XCTAssertEqual(rows.first?.first, "0")
        XCTAssertEqual(all.filter { ($0.status ?? 0) >= 300 }.map { "\($0.status ?? 0) \($0.reason ?? "") \($0.detail ?? "")" }, [])
        XCTAssertEqual(try s.metric("dispatch_push_broadcasts_total", labels: #"result="pushed""#), 3)
    }

    /// A channel APNs will not make: the activity runs normally with `channelId: null`, its
    /// push-to-start asks for a token instead, and the refusal is counted and listed.
    func testAChannelThatCannotBeMadeLeavesTheActivityRunningWithout() throws {
        let f = try fake()
        try f.configureChannels(enabled: false)
        let s = try TestServer.start(environment: f.serverEnvironment)
        defer { s.stop() }
        let pts = token(bytes: 80)
        XCTAssertEqual(try s.client.post("/v1/activity-tokens", #"{"deviceToken":"\#(token())","pushToStartToken":"\#(pts)"}"#).status, 200)
        try s.startActivity("no-channel", extra: #","liveActivity":true,"broadcast":true"#)
        let got = try f.wait(token: pts) { $0.contains { $0.status == 200 } }
        let refused = try XCTUnwrap(try f.requests().first { $0.channel == "create" })
        XCTAssertEqual(refused.reason, "FeatureNotEnabled")
        let start = try decode(try XCTUnwrap(got.first { $0.status == 200 }))
        XCTAssertEqual(start.inputPushToken, 1, "started without a channel: the phone asks for a token")
        XCTAssertNil(start.inputPushChannel)
        XCTAssertEqual(try s.update("no-channel", #"{"progress":0.3}"#).status, 200)
        XCTAssertEqual(try s.client.get("/v1/activities/no-channel").json?["channelId"], .null)
        XCTAssertEqual(try s.metric("dispatch_push_broadcasts_total", labels: #"result="refused""#), 1)
        let status = Subprocess.run([TestPaths.binary("dispatchd"), "push", "status", "--database-url", s.conninfo])
        XCTAssertEqual(status.status, 0, status.output)
        XCTAssertTrue(status.output.contains("no-channel\t-\tfailed\tproduction"), status.output)
        XCTAssertTrue(status.output.contains("400 FeatureNotEnabled"), status.output)
    }

    /// The broadcast sender and the token sender of one process need the provider token at
    /// the same moment (a server starting with both kinds of work due): one JWT, not two (the
    /// advisory lock is reentrant within the process's session, so it cannot keep them apart).
    func testTokenAndBroadcastSendersStartingTogetherMakeOneJWT() throws {
        let f = try fake()
        let env = f.serverEnvironment.merging(["DISPATCH_WORKERS": "1"]) { $1 }
        let first = try TestServer.start(environment: env)
        let conninfo = first.conninfo
        let t = token()
        try first.startActivity("both-b", extra: #","broadcast":true"#)
        try first.startActivity("both-t")
        XCTAssertEqual(try first.client.post("/v1/activity-tokens", #"{"deviceToken":"\#(token())","activityTokens":{"both-t":"\#(t)"}}"#).status, 200)
        try f.wait { rs in rs.contains { $0.channel == "create" && $0.status == 201 } && rs.contains { $0.token == t && $0.status == 200 } }
        first.stop()
        // Work of both kinds due at the next start, and no stored token.
        for statement in ["DELETE FROM apns_provider_tokens",
                          "UPDATE broadcast_outbox SET phase = 'create', channel_id = NULL, due_at = now(), lease_id = NULL",
                          "UPDATE activities SET channel_id = NULL WHERE activity_id = 'both-b'",
                          "UPDATE push_outbox SET wanted_seq = sent_seq + 1, due_at = now(), lease_id = NULL WHERE activity_id = 'both-t'"] {
            _ = try TestPostgres.shared().sql(conninfo, statement)
        }
        try f.resetBehavior()
        try f.clearRequests()
        let second = try TestServer.start(environment: env, conninfo: conninfo)
        defer { second.stop() }
        let seen = try f.wait { rs in rs.contains { $0.channel == "create" && $0.status != nil } && rs.contains { $0.token == t && $0.status != nil } }
        XCTAssertEqual(seen.filter { $0.status != 200 && $0.status != 201 }.map { "\($0.status ?? 0) \($0.reason ?? "")" }, [])
        XCTAssertEqual(try f.stat("distinctJwts"), 1)
    }

    /// APNs calls the JWT expired on a broadcast: the broadcast sender renews it (it may be
    /// the only sender at work) and the push goes.
    func testAnExpiredProviderTokenIsRenewedForBroadcasts() throws {
        let f = try fake()
        let s = try TestServer.start(environment: f.serverEnvironment)
        defer { s.stop() }
        try s.startActivity("expiring", extra: #","broadcast":true"#)
        try f.wait { rs in rs.contains { $0.channel == "create" && $0.status == 201 } }
        try s.update("expiring", #"{"progress":0.2}"#)
        try f.wait { rs in rs.contains { $0.channel == "push" && $0.status == 200 } }
        try f.setMinJWTInterval(0)
        // Older than 3 s is expired: the JWT in use is (4 s have passed), a fresh one is not,
        // even when its whole-second iat and a loaded machine's delay add up to over 1 s.
        try f.setMaxJWTAge(3)
        sleep(4)
        try f.clearRequests()
        try s.update("expiring", #"{"state":"idle"}"#)
        let got = try f.wait(timeout: 15) { rs in rs.contains { $0.channel == "push" && $0.status == 200 } }
        let casts = got.filter { $0.channel == "push" }
        XCTAssertEqual(casts.first?.reason, "ExpiredProviderToken")
        XCTAssertEqual(casts.last?.status, 200)
        XCTAssertNotEqual(casts.first?.jwtHash, casts.last?.jwtHash, "a new JWT")
    }
}
