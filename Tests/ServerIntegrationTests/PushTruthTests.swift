@testable import DispatchServer
import DispatchCore
import DispatchIO
import DispatchLiveActivity
import DispatchSystem
import DispatchTestSupport
import Foundation
import Glibc
import XCTest

/// What the phone shows is always true (issue 37; contract §5.2, §5.4, §5.5): stale dates on
/// starts and after touches, cancel requests, channels per environment, the push-to-start
/// budget, broadcasts that cannot freeze, the deployment's pause, and APNs connections whose
/// peer went silent. Real dispatchd and PostgreSQL against the fake APNs.
final class PushTruthTests: XCTestCase {
    static let apns = ClassFakeAPNs()
    nonisolated(unsafe) static var sandbox: FakeAPNs?

    override class func tearDown() {
        apns.stop()
        sandbox?.stop()
        sandbox = nil
        super.tearDown()
    }

    func fake() throws -> FakeAPNs { try Self.apns.fresh() }

    func sandboxFake() throws -> FakeAPNs {
        if Self.sandbox == nil { Self.sandbox = try FakeAPNs.start(environment: "sandbox") }
        let f = Self.sandbox!
        try f.resetBehavior()
        try f.clearRequests()
        return f
    }

    func server(_ f: FakeAPNs, _ extra: [String: String] = [:]) throws -> TestServer {
        try TestServer.start(environment: f.serverEnvironment.merging(extra) { $1 })
    }

    func token(bytes: Int = 32) -> String { randomToken(bytes: bytes) }

    func register(_ s: TestServer, _ body: String) throws {
        let r = try s.client.post("/v1/activity-tokens", body)
        XCTAssertEqual(r.status, 200, r.text)
    }

    func delivered(_ rs: [FakeAPNs.Recorded]) -> [FakeAPNs.Recorded] { rs.filter { $0.status == 200 } }

    func decode(_ r: FakeAPNs.Recorded) throws -> LiveActivityPush {
        try JSONDecoder().decode(LiveActivityPush.Envelope.self, from: Data(r.bodyBytes)).aps
    }

    func sql(_ s: TestServer, _ query: String) throws -> [[String?]] { try TestPostgres.shared().sql(s.conninfo, query) }

    // MARK: - 0. a change committed while the one before it is being pushed

    /// Starts `id` with one phone's update token, waits for seq 1's push, then commits
    /// `change` (seq 2), whose push the fake holds for 1 s; returns the token once it is held.
    func holdSecondPush(_ f: FakeAPNs, _ s: TestServer, _ id: String, startState: String, change: String) throws -> String {
        try s.startActivity(id, state: startState)
        let t = token()
        try register(s, #"{"deviceToken":"\#(token())","activityTokens":{"\#(id)":"\#(t)"}}"#)
        _ = try f.wait(token: t) { self.delivered($0).contains { $0.seq == 1 } }
        try f.script(token: t, respond: [#"{"action":"delay","seconds":1,"status":200}"#])
        XCTAssertEqual(try s.client.post("/v1/activities/\(id)/update", change).status, 200)
        _ = try f.wait(token: t) { $0.contains { $0.seq == 2 && $0.status == nil } }
        return t
    }

    /// A progress-only change committed while the state change before it is still being
    /// pushed (APNs has not answered) goes at priority 5 after the pace, like any progress: the
    /// entry's priority had stayed the pushed change's 10, so it went at 10 and at once. Found as
    /// a flaky `PushTests.testPrioritiesAndTheEndWithItsDismissalDate` (its next update raced
    /// the sender's mark); here the fake holds the state change's answer to make the race certain.
    func testAProgressChangeDuringAStatePushKeepsItsPriorityAndThePace() throws {
        let f = try fake()
        let s = try server(f, ["DISPATCH_PUSH_PACE": "2"])
        defer { s.stop() }
        let t = try holdSecondPush(f, s, "raced", startState: "queued", change: #"{"state":"processing"}"#)
        XCTAssertEqual(try s.client.post("/v1/activities/raced/update", #"{"progress":0.4}"#).status, 200, "committed while seq 2 is held")
        let all = try f.wait(token: t) { self.delivered($0).contains { $0.seq == 3 } }
        let state = try XCTUnwrap(all.first { $0.seq == 2 }), progress = try XCTUnwrap(all.first { $0.seq == 3 })
        XCTAssertEqual(state.priority, 10)
        XCTAssertEqual(progress.priority, 5, "progress only")
        XCTAssertGreaterThanOrEqual(progress.time - state.time, 1.5, "paced (2 s) from the state change, not sent on its answer (1 s)")
    }

    /// The other side of that race: a state change that commits while the previous push's
    /// mark waits for the outbox entry's row lock. Under READ COMMITTED the mark then sees the
    /// entry as the publish left it (raised to 10) but reads the history with a snapshot taken
    /// before that commit; deciding from that history alone lowered the priority to 5, and the
    /// state change went at 5 after the pace (a loaded run found it). A test session holds the
    /// entry's lock until both the publish and the mark queue behind it, publish first.
    func testAStateChangeCommittedWhileTheMarkWaitsForTheEntryGoesAt10() throws {
        let f = try fake()
        let s = try server(f, ["DISPATCH_PUSH_PACE": "2"])
        defer { s.stop() }
        let t = try holdSecondPush(f, s, "locked", startState: "processing", change: #"{"progress":0.2}"#)

        let lock = try BlockingPG(s.conninfo)
        try lock.script("BEGIN; SELECT 1 FROM push_activity_outbox WHERE activity_id = 'locked' FOR UPDATE")
        let waiting = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        func waiters() throws -> Int { (try sql(s, waiting).first?.first ?? nil).flatMap { Int($0) } ?? 0 }
        let published = Collected<Int>()
        let done = DispatchSemaphore(value: 0)
        DispatchQueue.global().async {
            published.append((try? s.client.post("/v1/activities/locked/update", #"{"state":"idle"}"#).status) ?? 0)
            done.signal()
        }
        XCTAssertTrue(try waitUntil(10) { try waiters() >= 1 }, "the state change's commit waits on the entry")
        XCTAssertTrue(try waitUntil(10) { try waiters() >= 2 }, "then the mark of seq 2's push, once APNs answered it")
        try lock.script("COMMIT")
        XCTAssertEqual(done.wait(timeout: .now() + 10), .success)
        XCTAssertEqual(published.all, [200])

        let all = try f.wait(token: t) { self.delivered($0).contains { $0.seq == 3 } }
        let progress = try XCTUnwrap(all.first { $0.seq == 2 }), state = try XCTUnwrap(all.first { $0.seq == 3 })
        XCTAssertEqual(progress.priority, 5)
        XCTAssertEqual(state.priority, 10, "a state change waited: the mark must not lower it")
    }

    // MARK: - 1. stale-date on the start, and a touch that moves it

    /// The start carries the stale-date; a touch that moves the deadline less than half of
    /// staleAfter past what the phone shows pushes nothing, one that moves it further pushes
    /// the same content-state at priority 5 with the new date.
    func testTheStartCarriesTheStaleDateAndATouchMovesItOnThePhone() throws {
        let f = try fake()
        let s = try server(f)
        defer { s.stop() }
        let pts = token(bytes: 80), update = token(bytes: 80)
        try register(s, #"{"deviceToken":"\#(token())","pushToStartToken":"\#(pts)"}"#)
        let before = Int(Clock.nowMilliseconds() / 1000)
        try s.startActivity("kept", extra: #","liveActivity":true,"staleAfter":10"#)
        let start = try decode(try XCTUnwrap(delivered(try f.wait(token: pts) { !self.delivered($0).isEmpty }).first))
        XCTAssertEqual(start.event, "start")
        let startStale = try XCTUnwrap(start.staleDate, "a start carries the stale-date (a phone whose update token never comes)")
        XCTAssertTrue((before + 10...before + 12).contains(startStale), "\(startStale) vs \(before) + 10")

        try register(s, #"{"deviceToken":"\#(token())","activityTokens":{"kept":"\#(update)"}}"#)
        let first = try XCTUnwrap(delivered(try f.wait(token: update) { !self.delivered($0).isEmpty }).first)
        let shown = try XCTUnwrap(try decode(first).staleDate)
        // A touch at once moves the deadline by less than 5 s: nothing is pushed.
        XCTAssertEqual(try s.client.post("/v1/activities/kept/touch", "").status, 204)
        try waitForPushesSettled(s)
        XCTAssertEqual(try f.requests(token: update).count, 1, "a small move pushes nothing")
        // Half of staleAfter past what the phone shows: pushed, same content, new date, at 5.
        let due = Double(shown - 10 + 5 + 1) - Double(Clock.nowMilliseconds()) / 1000
        if due > 0 { usleep(UInt32(due * 1_000_000)) }
        XCTAssertEqual(try s.client.post("/v1/activities/kept/touch", "").status, 204)
        let got = try f.wait(token: update) { self.delivered($0).count >= 2 }
        let refreshed = try XCTUnwrap(delivered(got).dropFirst().first, "the touch's push")
        let aps = try decode(refreshed)
        XCTAssertEqual(aps.event, "update")
        XCTAssertEqual(refreshed.priority, 5)
        XCTAssertEqual(aps.contentState, try decode(first).contentState, "the same content-state")
        XCTAssertGreaterThanOrEqual(try XCTUnwrap(aps.staleDate), shown + 5)
        XCTAssertGreaterThan(aps.timestamp, try decode(first).timestamp)
        XCTAssertEqual(try s.client.get("/v1/activities/kept").json?["seq"], .number(1), "no event, no seq")
    }

    // MARK: - 2. cancel requests

    func testACancelRequestIsPushedAtPriority5WithCancelRequested() throws {
        let f = try fake()
        let s = try server(f)
        defer { s.stop() }
        let t = token(bytes: 80)
        try s.startActivity("cancelme")
        try register(s, #"{"deviceToken":"\#(token())","activityTokens":{"cancelme":"\#(t)"}}"#)
        let first = try XCTUnwrap(delivered(try f.wait(token: t) { !self.delivered($0).isEmpty }).first)
        XCTAssertEqual(try decode(first).contentState.cancelRequested, false)
        XCTAssertEqual(try s.client.post("/v1/activities/cancelme/cancel", #"{"reason":"user"}"#).status, 202)
        let got = try f.wait(token: t) { self.delivered($0).count >= 2 }
        let cancel = try XCTUnwrap(delivered(got).dropFirst().first)
        XCTAssertEqual(cancel.priority, 5, "a cancel request spends no priority-10 budget")
        XCTAssertEqual(try decode(cancel).contentState.cancelRequested, true)
        XCTAssertEqual(try decode(cancel).contentState.state, "processing", "the state does not change")
    }

    /// `GET /v1/activities/{id}/live-activity` shows the push as a phone gets it: the start's
    /// stale-date, and a cancel request at 5 with `cancelRequested`.
    func testTheLiveActivityViewShowsTheStaleDateAndTheCancelRequest() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        let before = Int(Clock.nowMilliseconds() / 1000)
        try s.startActivity("viewed", extra: #","liveActivity":true,"staleAfter":600"#)
        var p = try s.client.get("/v1/activities/viewed/live-activity").json
        XCTAssertEqual(p?["event"], .string("start"))
        guard case .number(let stale)? = p?["payload"]?["aps"]?["stale-date"] else { return XCTFail("no stale-date: \(String(describing: p))") }
        XCTAssertTrue((before + 600...before + 602).contains(Int(stale)))
        XCTAssertEqual(p?["payload"]?["aps"]?["content-state"]?["cancelRequested"], .bool(false))
        XCTAssertEqual(try s.client.post("/v1/activities/viewed/cancel", "").status, 202)
        p = try s.client.get("/v1/activities/viewed/live-activity").json
        XCTAssertEqual(p?["event"], .string("update"))
        XCTAssertEqual(p?["priority"], .number(5))
        XCTAssertEqual(p?["payload"]?["aps"]?["content-state"]?["cancelRequested"], .bool(true))
    }

    // MARK: - 3. channels per environment

    /// A broadcast start names the channel only to devices registered in the channel's
    /// environment; a sandbox phone is asked for an update token instead.
    func testABroadcastStartNamesTheChannelOnlyInItsEnvironment() throws {
        let f = try fake(), sb = try sandboxFake()
        let s = try server(f, ["DISPATCH_APNS_SANDBOX_URL": "https://127.0.0.1:\(sb.port)"])
        defer { s.stop() }
        let prodPTS = token(bytes: 80), sandboxPTS = token(bytes: 80)
        try f.declare(token: prodPTS, environment: "production")
        try sb.declare(token: sandboxPTS, environment: "sandbox")
        try register(s, #"{"deviceToken":"\#(token())","pushToStartToken":"\#(prodPTS)"}"#)
        try register(s, #"{"deviceToken":"\#(token())","pushToStartToken":"\#(sandboxPTS)","environment":"sandbox"}"#)
        try s.startActivity("team-release", extra: #","liveActivity":true,"broadcast":true"#)
        let channel = try XCTUnwrap(try f.wait { $0.contains { $0.channel == "create" && $0.status == 201 } }.first { $0.channel == "create" }?.channelID)
        let prod = try XCTUnwrap(try f.wait(token: prodPTS) { !$0.isEmpty }.first)
        XCTAssertEqual(prod.status, 200, prod.detail ?? "")
        XCTAssertEqual(try decode(prod).inputPushChannel, channel)
        let sandbox = try XCTUnwrap(try sb.wait(token: sandboxPTS) { !$0.isEmpty }.first)
        XCTAssertEqual(sandbox.status, 200, sandbox.detail ?? "a channel of another environment")
        XCTAssertNil(try decode(sandbox).inputPushChannel)
        XCTAssertEqual(try decode(sandbox).inputPushToken, 1)
    }

    /// A device registered in the channel's environment whose token turns out to be of the
    /// other one: the retry there asks for an update token, not the channel (§5.1 and §5.2).
    func testABroadcastStartRetriedInTheOtherEnvironmentDropsTheChannel() throws {
        let f = try fake(), sb = try sandboxFake()
        let s = try server(f, ["DISPATCH_APNS_SANDBOX_URL": "https://127.0.0.1:\(sb.port)"])
        defer { s.stop() }
        let pts = token(bytes: 80)
        try f.declare(token: pts, environment: "sandbox")
        try sb.declare(token: pts, environment: "sandbox")
        try register(s, #"{"deviceToken":"\#(token())","pushToStartToken":"\#(pts)"}"#)
        try s.startActivity("mixed-release", extra: #","liveActivity":true,"broadcast":true"#)
        let first = try XCTUnwrap(try f.wait(token: pts) { !$0.isEmpty }.first)
        XCTAssertEqual(first.reason, "BadDeviceToken")
        XCTAssertNotNil(try decode(first).inputPushChannel, "registered as production: the channel")
        let retried = try XCTUnwrap(try sb.wait(token: pts) { !$0.isEmpty }.first)
        XCTAssertEqual(retried.status, 200, retried.detail ?? "")
        XCTAssertNil(try decode(retried).inputPushChannel)
        XCTAssertEqual(try decode(retried).inputPushToken, 1)
    }

    // MARK: - 4. the push-to-start budget

    func testStartsPastTheDevicesBudgetAreNotSentAndAreCounted() throws {
        let f = try fake()
        let s = try server(f, ["DISPATCH_PUSH_TO_START_LIMIT": "3"])
        defer { s.stop() }
        let pts = token(bytes: 80), other = token(bytes: 80)
        try register(s, #"{"deviceToken":"\#(token())","pushToStartToken":"\#(pts)"}"#)
        for i in 1...5 { try s.startActivity("burst-\(i)", extra: #","liveActivity":true"#) }
        XCTAssertTrue(try waitUntil(10) { try s.metric("dispatch_push_starts_over_budget_total") == 2 }, "two over the budget, counted")
        XCTAssertEqual(delivered(try f.wait(token: pts) { self.delivered($0).count >= 3 }).count, 3, "three sent")
        XCTAssertEqual(try sql(s, "SELECT count(*) FROM activities WHERE activity_id LIKE 'burst-%' AND ended_ms IS NULL").first?.first, "5",
                       "the activities are unaffected")
        // Another device has a budget of its own.
        try register(s, #"{"deviceToken":"\#(token())","pushToStartToken":"\#(other)"}"#)
        try s.startActivity("burst-6", extra: #","liveActivity":true"#)
        try f.wait(token: other) { !self.delivered($0).isEmpty }
        XCTAssertEqual(delivered(try f.requests(token: other)).count, 1)
        try waitForPushesSettled(s)
        XCTAssertEqual(delivered(try f.requests(token: pts)).count, 3, "still three for the spent device")
    }

    // MARK: - 5. broadcasts that cannot freeze, and the pause

    /// A broadcast refused for its content is dropped; the next change is broadcast; an end
    /// that cannot be delivered still lets the channel be deleted after the dismissal date.
    func testARefusedBroadcastIsDroppedAndTheChannelIsDeletedWhateverItsPushes() throws {
        let f = try fake()
        let s = try server(f, ["DISPATCH_PUSH_DISMISSAL": "2"])
        defer { s.stop() }
        try s.startActivity("pipeline", extra: #","broadcast":true"#)
        let channel = try XCTUnwrap(try f.wait { $0.contains { $0.channel == "create" && $0.status == 201 } }.first { $0.channel == "create" }?.channelID)
        XCTAssertTrue(try waitUntil(10) { try s.client.get("/v1/activities/pipeline").json?["channelId"] == .string(channel) })
        try f.script(token: channel, respond: [#"{"status":413,"reason":"PayloadTooLarge"}"#])
        try s.update("pipeline", #"{"progress":0.2}"#)
        try f.wait { $0.contains { $0.channel == "push" && $0.status == 413 } }
        try s.update("pipeline", #"{"state":"idle","status":"waiting"}"#)
        let after = try f.wait { $0.contains { $0.channel == "push" && $0.status == 200 } }
        let next = try XCTUnwrap(after.first { $0.channel == "push" && $0.status == 200 })
        XCTAssertEqual(try decode(next).contentState.state, "idle", "the channel went on with the next change")
        XCTAssertTrue(try waitUntil(5) { try s.metric("dispatch_push_broadcasts_total", labels: #"result="dropped""#) == 1 })
        // From now on APNs fails every broadcast: the end is never delivered, yet the channel
        // goes once the dismissal date has passed.
        try f.script(token: channel, respond: [], otherwise: #"{"status":503,"reason":"ServiceUnavailable"}"#)
        XCTAssertEqual(try s.end("pipeline", #"{"state":"completed"}"#).status, 200)
        let all = try f.wait(timeout: 15) { $0.contains { $0.channel == "delete" && $0.status == 204 } }
        XCTAssertTrue(all.contains { $0.channel == "delete" && $0.status == 204 && $0.headers["apns-channel-id"] == channel },
                      "deleted: \(all.map { "\($0.channel ?? "-") \($0.status ?? 0)" })")
        XCTAssertFalse(all.contains { $0.channel == "push" && $0.status == 200 && (try? self.decode($0).event) == "end" })
        XCTAssertTrue(try waitUntil(5) { try self.sql(s, "SELECT count(*) FROM broadcast_outbox").first?.first == "0" })
    }

    /// A touch moves a broadcast channel's stale-date too: one broadcast, the same content.
    func testATouchMovesTheStaleDateOnABroadcastChannel() throws {
        let f = try fake()
        let s = try server(f)
        defer { s.stop() }
        try s.startActivity("team-job", extra: #","broadcast":true,"staleAfter":10"#)
        XCTAssertTrue(try waitUntil(10) { try s.client.get("/v1/activities/team-job").json?["channelId"] != .null })
        try s.update("team-job", #"{"state":"idle","status":"waiting"}"#)
        let first = try XCTUnwrap(try f.wait { $0.contains { $0.channel == "push" && $0.status == 200 } }.first { $0.channel == "push" })
        XCTAssertEqual(first.priority, 10, "a state change")
        let shown = try XCTUnwrap(try decode(first).staleDate)
        let due = Double(shown - 10 + 5 + 1) - Double(Clock.nowMilliseconds()) / 1000
        if due > 0 { usleep(UInt32(due * 1_000_000)) }
        XCTAssertEqual(try s.client.post("/v1/activities/team-job/touch", "").status, 204)
        let got = try f.wait { $0.filter { $0.channel == "push" && $0.status == 200 }.count >= 2 }
        let casts = got.filter { $0.channel == "push" && $0.status == 200 }
        XCTAssertEqual(casts.count, 2, "one broadcast for the touch")
        guard casts.count == 2 else { return }
        XCTAssertEqual(try decode(casts[1]).contentState, try decode(first).contentState)
        XCTAssertEqual(casts[1].priority, 5, "the refresh alone goes at 5, whatever the last change")
        XCTAssertGreaterThanOrEqual(try XCTUnwrap(try decode(casts[1]).staleDate), shown + 5)
    }

    /// While the deployment's sending is paused (429 TooManyProviderTokenUpdates, stored for
    /// every process), no channel is made or pushed; after the pause it is.
    func testBroadcastsAndChannelManagementWaitForTheDeploymentsPause() throws {
        let f = try fake()
        let s = try server(f)
        defer { s.stop() }
        // A first push stores the deployment's provider token.
        let t = token(bytes: 80)
        try s.startActivity("warm")
        try register(s, #"{"deviceToken":"\#(token())","activityTokens":{"warm":"\#(t)"}}"#)
        try f.wait(token: t) { !self.delivered($0).isEmpty }
        XCTAssertEqual(try sql(s, "UPDATE apns_provider_tokens SET paused_until = extract(epoch FROM now())::bigint + 60 RETURNING 1").count, 1)
        try s.startActivity("paused-release", extra: #","broadcast":true"#)
        usleep(1_500_000)
        XCTAssertFalse(try f.requests().contains { $0.listener == "manage" }, "no channel management during the pause")
        _ = try sql(s, "UPDATE apns_provider_tokens SET paused_until = NULL")
        let got = try f.wait { $0.contains { $0.channel == "create" && $0.status == 201 } }
        XCTAssertTrue(got.contains { $0.channel == "create" && $0.status == 201 }, "made once the pause is over")
    }

    /// A channel request answered `429 TooManyProviderTokenUpdates` pauses the deployment:
    /// stored for every process, and this process's token pushes stop too.
    func testTooManyProviderTokenUpdatesOnAChannelRequestPausesEverything() throws {
        let f = try fake()
        let s = try server(f)
        defer { s.stop() }
        try f.script(token: "create", respond: [#"{"status":429,"reason":"TooManyProviderTokenUpdates"}"#])
        try s.startActivity("throttled-release", extra: #","broadcast":true"#)
        XCTAssertTrue(try waitUntil(10) {
            let v = try self.sql(s, "SELECT coalesce(paused_until, 0) > extract(epoch FROM now()) + 60 FROM apns_provider_tokens").first?.first
            return v == "t"
        }, "the pause is stored for the deployment")
        let t = token(bytes: 80)
        try s.startActivity("waits")
        try register(s, #"{"deviceToken":"\#(token())","activityTokens":{"waits":"\#(t)"}}"#)
        usleep(1_500_000)
        XCTAssertEqual(try f.requests(token: t).count, 0, "token pushes wait for the pause too")
        XCTAssertEqual(try f.requests().filter { $0.channel == "create" }.count, 1, "the channel is not asked for again during the pause")
    }

    // MARK: - 6. connections whose peer went silent, and apns-expiration

    /// An idle connection whose peer stopped answering (no FIN, no answers) is not the one the
    /// next push waits on: idle DISPATCH_APNS_IDLE seconds it gets an HTTP/2 PING (the fake
    /// counts it), no ACK comes, the server closes it with no push waiting.
    func testAnIdleConnectionWhosePeerWentSilentIsReplacedBeforeTheNextPush() throws {
        let f = try fake()
        let s = try server(f, ["DISPATCH_APNS_IDLE": "1"])
        defer { s.stop() }
        let t = token(bytes: 80)
        try s.startActivity("quiet")
        try register(s, #"{"deviceToken":"\#(token())","activityTokens":{"quiet":"\#(t)"}}"#)
        let first = try XCTUnwrap(delivered(try f.wait(token: t) { !self.delivered($0).isEmpty }).first)
        try f.silenceAll()
        XCTAssertTrue(try waitUntil(10) {
            try s.metric("dispatch_apns_connections_replaced_total", labels: "reason=\"unanswered_ping\"") >= 1
        }, "the silent connection was replaced with no push waiting")
        XCTAssertTrue(try waitUntil(5) { try f.stat("connectionsOpen") == 0 }, "and closed")
        XCTAssertGreaterThanOrEqual(try f.stat("pings"), 1, "after an HTTP/2 PING")
        XCTAssertGreaterThanOrEqual(try s.metric("dispatch_apns_pings_total"), 1)
        XCTAssertEqual(s.log().components(separatedBy: "msg=apns.idle_ping").count - 1, 1,
                       "said once per process, whatever the number of workers")
        let sent = Clock.monotonic()
        try s.update("quiet", #"{"state":"idle"}"#)
        let got = try f.wait(token: t) { self.delivered($0).count >= 2 }
        let second = try XCTUnwrap(delivered(got).dropFirst().first, "delivered")
        XCTAssertLessThan(Clock.monotonic() - sent, 3, "never waited on the silent connection (its request would time out after 10 s)")
        XCTAssertNotEqual(second.connection, first.connection, "on a new connection")
    }

    /// A peer that answers its PINGs keeps its connection however long it idles: the next push
    /// goes on the same one.
    func testAnIdleConnectionWhosePeerAnswersPINGsIsKept() throws {
        let f = try fake()
        let s = try server(f, ["DISPATCH_APNS_IDLE": "1"])
        defer { s.stop() }
        let t = token(bytes: 80)
        try s.startActivity("kept")
        try register(s, #"{"deviceToken":"\#(token())","activityTokens":{"kept":"\#(t)"}}"#)
        let first = try XCTUnwrap(delivered(try f.wait(token: t) { !self.delivered($0).isEmpty }).first)
        XCTAssertTrue(try waitUntil(10) { try f.stat("pings") >= 2 }, "PINGed while idle")
        XCTAssertEqual(try s.metric("dispatch_apns_connections_replaced_total", labels: "reason=\"unanswered_ping\""), 0)
        try s.update("kept", #"{"state":"idle"}"#)
        let got = try f.wait(token: t) { self.delivered($0).count >= 2 }
        let second = try XCTUnwrap(delivered(got).dropFirst().first, "delivered")
        XCTAssertEqual(second.connection, first.connection, "on the same connection")
    }

    /// A push that timed out on a connection whose peer went silent mid-use: the retry goes on a
    /// new connection, not on the same dead one.
    func testAfterATimeoutTheNextPushGoesOnANewConnection() throws {
        let f = try fake()
        // A lease of 6 s: requests time out after 2 s.
        let s = try server(f, ["DISPATCH_APNS_IDLE": "3600", "DISPATCH_PUSH_LEASE": "6"])
        defer { s.stop() }
        let t = token(bytes: 80)
        try s.startActivity("mid")
        try register(s, #"{"deviceToken":"\#(token())","activityTokens":{"mid":"\#(t)"}}"#)
        let first = try XCTUnwrap(delivered(try f.wait(token: t) { !self.delivered($0).isEmpty }).first)
        try f.silenceAll()
        try s.update("mid", #"{"state":"idle"}"#)
        let got = try f.wait(timeout: 12, token: t) { self.delivered($0).count >= 2 }
        let second = try XCTUnwrap(delivered(got).dropFirst().first, "the retry was delivered")
        XCTAssertNotEqual(second.connection, first.connection)
        XCTAssertEqual(try decode(second).contentState.state, "idle")
    }

    /// `apns-expiration` counts from the send: a token registered well after the change still
    /// gets the full hour.
    func testExpirationCountsFromTheSend() throws {
        let f = try fake()
        let s = try server(f)
        defer { s.stop() }
        try s.startActivity("late-token")
        usleep(2_500_000)
        let t = token(bytes: 80)
        try register(s, #"{"deviceToken":"\#(token())","activityTokens":{"late-token":"\#(t)"}}"#)
        let push = try XCTUnwrap(delivered(try f.wait(token: t) { !self.delivered($0).isEmpty }).first)
        let expiration = try XCTUnwrap(push.headers["apns-expiration"].flatMap { Int($0) })
        let changed = try decode(push).timestamp  // the change's second
        XCTAssertGreaterThanOrEqual(expiration, changed + 3602, "not from the change")
        XCTAssertLessThanOrEqual(abs(expiration - (Int(push.time) + 3600)), 1, "from the send")
    }
}
