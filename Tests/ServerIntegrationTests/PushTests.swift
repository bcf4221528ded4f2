// Long: every push case runs against one fake APNs and its scripted answers, set up once here.
@testable import DispatchServer
import DispatchCore
import DispatchIO
import DispatchLiveActivity
import DispatchSystem
import DispatchTestSupport
import Foundation
import Glibc
import XCTest

/// Live Activity pushes end to end (contract §5.1–5.2): real dispatchd processes on a real
/// PostgreSQL, pushing over HTTP/2 + TLS to the fake APNs (Tests/tools/fake_apns.py), which
/// checks the JWT, headers and payload of every request and answers as scripted.
final class PushTests: XCTestCase {
    static let apns = ClassFakeAPNs()
    nonisolated(unsafe) static var sandbox: FakeAPNs?

    override class func tearDown() {
        apns.stop()
        sandbox?.stop()
        sandbox = nil
        super.tearDown()
    }

    /// One fake for the whole class; each test starts with no scripts and no records.
    func fake() throws -> FakeAPNs { try Self.apns.fresh() }

    /// A second fake playing the sandbox, fresh like `fake()`.
    func sandboxFake() throws -> FakeAPNs {
        if Self.sandbox == nil { Self.sandbox = try FakeAPNs.start(environment: "sandbox") }
        let f = Self.sandbox!
        try f.resetBehavior()
        try f.clearRequests()
        return f
    }

    func server(_ f: FakeAPNs, _ extra: [String: String] = [:], conninfo: String? = nil) throws -> TestServer {
        try TestServer.start(environment: f.serverEnvironment.merging(extra) { $1 }, conninfo: conninfo)
    }

    /// A fresh random token of `bytes` bytes, lower-case hex.
    func token(bytes: Int = 32) -> String { randomToken(bytes: bytes) }

    @discardableResult
    func register(_ s: TestServer, device: String, pushToStart: String?? = nil, tokens: [(String, String?)] = [],
                  key: String? = nil, environment: String? = nil) throws -> HTTPClient.Response {
        var body = #"{"deviceToken":"\#(device)""#
        if let environment { body += #","environment":"\#(environment)""# }
        switch pushToStart {
        case .some(.some(let t)): body += #","pushToStartToken":"\#(t)""#
        case .some(.none): body += #","pushToStartToken":null"#
        case .none: break
        }
        if !tokens.isEmpty {
            body += #","activityTokens":{"# + tokens.map { id, t in t.map { #""\#(id)":"\#($0)""# } ?? #""\#(id)":null"# }
                .joined(separator: ",") + "}"
        }
        body += "}"
        let client = key.map { HTTPClient(port: s.port, token: $0) } ?? s.client
        return try client.post("/v1/activity-tokens", body)
    }

    func sql(_ s: TestServer, _ query: String) throws -> [[String?]] { try TestPostgres.shared().sql(s.conninfo, query) }

    func count(_ s: TestServer, _ query: String) throws -> Int {
        guard let v = try sql(s, query).first?.first ?? nil, let n = Int(v) else { return -1 }
        return n
    }

    func delivered(_ rs: [FakeAPNs.Recorded]) -> [FakeAPNs.Recorded] { rs.filter { $0.status == 200 } }

    // MARK: - Push-to-start, the token queue, priorities, the end

    func testPushToStartGoesOnlyToActivitiesThatAskForIt() throws {
        let f = try fake()
        let s = try server(f)
        defer { s.stop() }
        let device = token(), pts = token(bytes: 80)
        let r = try register(s, device: device, pushToStart: pts)
        XCTAssertEqual(r.status, 200, r.text)
        XCTAssertEqual(r.json?["pushToStartToken"], .string("…" + pts.suffix(4)))
        try s.startActivity("plain-job")
        try s.startActivity("live-job", extra: #","liveActivity":true,"machine":"shodan","systemImage":"arrow.down.circle.fill","status":"Starting download...""#)
        try f.wait(token: pts) { !self.delivered($0).isEmpty }
        try waitForPushesSettled(s)
        let got = try f.requests(token: pts)
        XCTAssertEqual(got.count, 1, "one start, for the activity that asked: \(got.map(\.bodyBytes).map { String(decoding: $0, as: UTF8.self) })")
        guard let start = got.first else { return }
        XCTAssertEqual(start.status, 200, start.detail ?? "")
        XCTAssertEqual(start.event, "start")
        XCTAssertEqual(start.priority, 10)
        XCTAssertEqual(start.headers["apns-topic"], "com.example.dispatch.push-type.liveactivity")
        XCTAssertEqual(start.headers["apns-push-type"], "liveactivity")
        XCTAssertNotNil(start.headers["apns-expiration"])
        XCTAssertEqual(start.body?["aps"]?["attributes"]?["activityId"], .string("live-job"))
        XCTAssertEqual(start.body?["aps"]?["alert"]?["body"], .string("Starting download..."))
        // The payload the phone gets decodes into the app's types with a default JSONDecoder.
        let aps = try JSONDecoder().decode(APS.self, from: Data(start.bodyBytes)).aps
        XCTAssertEqual(aps.attributes, DispatchAttributes(activityId: "live-job", taskName: "Job live-job", machine: "shodan",
                                                         systemImage: "arrow.down.circle.fill"))
        XCTAssertEqual(aps.contentState.state, "processing")
        XCTAssertEqual(aps.contentState.seq, 1)
        XCTAssertEqual(aps.inputPushToken, 1, "iOS 18: the push-started Live Activity asks for its update token")
        XCTAssertNil(aps.inputPushChannel)
        // Operations: the figures an operator looks at first.
        XCTAssertEqual(try s.metric("dispatch_push_sent_total", labels: #"result="delivered""#), 1)
        XCTAssertEqual(try s.metric("dispatch_apns_connections"), 1)
        XCTAssertEqual(try s.metric("dispatch_push_latency_seconds_count"), 1)
    }

    /// Changes made before the phone registered the activity's token wait; the registration
    /// brings the newest state, once (older ones are superseded, not replayed).
    func testChangesBeforeTheTokenAreCoalescedIntoOnePushWhenItArrives() throws {
        let f = try fake()
        let s = try server(f)
        defer { s.stop() }
        try s.startActivity("early")
        for i in 1...5 { try s.update("early", #"{"progress":\#(Double(i) / 10)}"#) }
        try waitForPushesSettled(s)
        XCTAssertEqual(try f.requests().count, 0, "no token, nothing sent")
        XCTAssertEqual(try count(s, "SELECT count(*) FROM push_outbox"), 0, "and nothing queued")
        let t = token(bytes: 80)
        try register(s, device: token(), tokens: [("early", t)])
        try f.wait(token: t) { !self.delivered($0).isEmpty }
        try waitForPushesSettled(s)
        let got = try f.requests(token: t)
        XCTAssertEqual(got.map(\.seq), [6], "the newest state, once")
        XCTAssertEqual(got.first?.event, "update")
        XCTAssertEqual(got.first?.body?["aps"]?["content-state"]?["progress"], .number(0.5))
        try s.update("early", #"{"progress":0.9}"#)
        let after = try f.wait(token: t) { self.delivered($0).count == 2 }
        XCTAssertEqual(delivered(after).map(\.seq), [6, 7])
        XCTAssertLessThan(after[0].timestamp ?? 0, after[1].timestamp ?? 0, "timestamps increase")
    }

    /// §5.2: updates of an activity with a stale deadline say when it goes stale (the last
    /// change or touch + staleAfter, Unix seconds); an activity without one carries no key.
    func testUpdatesCarryTheStaleDate() throws {
        let f = try fake()
        let s = try server(f, ["DISPATCH_STALE_AFTER": "0"])
        defer { s.stop() }
        try s.startActivity("staling", extra: #","staleAfter":600"#)
        try s.startActivity("fresh")
        let t1 = token(), t2 = token()
        try register(s, device: token(), tokens: [("staling", t1), ("fresh", t2)])
        try f.wait { self.delivered($0).count >= 2 }
        let before = Int(Clock.nowMilliseconds() / 1000)
        try s.update("staling", #"{"progress":0.7}"#)
        let got = try f.wait(token: t1) { self.delivered($0).count >= 2 }
        let pushed = try JSONDecoder().decode(APS.self, from: Data(got.last!.bodyBytes)).aps
        XCTAssertEqual(pushed.contentState.progress, 0.7)
        let stale = try XCTUnwrap(pushed.staleDate)
        XCTAssertTrue((before + 600...before + 602).contains(stale), "\(stale) vs \(before) + 600")
        let plain = try f.requests(token: t2)
        XCTAssertFalse(plain.isEmpty)
        for r in plain { XCTAssertNil(r.body?["aps"]?["stale-date"]) }
    }

    /// §5.2: progress-only pushes of one activity go at most once per DISPATCH_PUSH_PACE
    /// (the newest state), a state change cuts the pace short. The pace runs from the pushed
    /// change's commit (the start, before the token was registered), so it is long here
    /// (30 s): with 8 s, a loaded run's slow registration and first push let it pass before
    /// the test looked. The state change's push does not wait for it, so the test does not.
    func testProgressIsPacedAndAStateChangeIsNot() throws {
        let f = try fake()
        let s = try server(f, ["DISPATCH_PUSH_PACE": "30"])
        defer { s.stop() }
        try s.startActivity("paced")
        let t = token()
        try register(s, device: token(), tokens: [("paced", t)])
        let first = try f.wait(token: t) { !self.delivered($0).isEmpty }
        let t0 = try XCTUnwrap(first.first?.time)
        for i in 1...4 { try s.update("paced", #"{"progress":0.\#(i)}"#) }
        usleep(2_500_000)
        XCTAssertEqual(delivered(try f.requests(token: t)).count, 1, "progress waits for the pace")
        try s.update("paced", #"{"state":"idle","status":"waiting for disk"}"#)
        let got = try f.wait(token: t) { self.delivered($0).count >= 2 }
        let second = try XCTUnwrap(delivered(got).dropFirst().first)
        XCTAssertEqual(second.seq, 6, "the newest state, once")
        XCTAssertEqual(second.state, "idle")
        XCTAssertEqual(second.body?["aps"]?["content-state"]?["progress"], .number(0.4))
        XCTAssertEqual(second.priority, 10)
        XCTAssertLessThan(second.time - t0, 25, "a state change does not wait for the pace")
        XCTAssertEqual(got.count, 2)
    }

    /// The first push to a new token (its row) and a progress change that committed before
    /// that push was marked: the change's entry, waiting and not yet claimed, is paced from the
    /// row's push like any two pushes of the activity; a waiting state change is not held.
    /// (A loaded run pushed the next progress at once: the entry came due before the mark.)
    /// The statement runs on a server's database with nothing pushing (no APNs configured).
    func testARowPushMarkedAfterAProgressChangePacesTheWaitingEntry() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        _ = try sql(s, """
            INSERT INTO push_activity_outbox (activity_id, wanted_seq, priority, pending_since_ms)
            VALUES ('raced-progress', 2, 5, 0), ('raced-state', 2, 10, 0)
            """)
        let nowMs = Clock.nowMilliseconds()
        let jobs = ["raced-progress", "raced-state"].enumerated().map { i, id in
            var job = PushJob(outboxID: Int64(i + 1), leaseID: 1, kind: .update, activityID: id, deviceID: Int64(i + 1), seq: 1,
                              timestamp: nowMs / 1000, attempts: 0, pendingSinceMs: nil, claimedAtMs: nowMs)
            job.changedAtMs = nowMs - 1000
            return job
        }
        let q = PushFanOutRepository.rowsDelivered(jobs, paceSeconds: 30)
        _ = try TestPostgres.shared().sql(s.conninfo, q.sql, q.params)
        let due = Dictionary(uniqueKeysWithValues: try sql(s, """
            SELECT activity_id, extract(epoch FROM due_at - now())::float8 FROM push_activity_outbox
            """).map { ($0[0] ?? "", Double($0[1] ?? "") ?? -1) })
        XCTAssertGreaterThan(due["raced-progress"] ?? 0, 20, "progress waits for the pace from the row's push")
        XCTAssertLessThan(due["raced-state"] ?? 99, 1, "a state change goes at once")
    }

    func testPrioritiesAndTheEndWithItsDismissalDate() throws {
        let f = try fake()
        let s = try server(f, ["DISPATCH_PUSH_DISMISSAL": "600"])
        defer { s.stop() }
        try s.startActivity("prio", state: "queued")
        let t = token()
        try register(s, device: token(), tokens: [("prio", t)])
        func next(_ path: String, _ body: String, seq: Int) throws -> FakeAPNs.Recorded? {
            if !path.isEmpty { XCTAssertEqual(try s.client.post("/v1/activities/prio/\(path)", body).status, 200) }
            return delivered(try f.wait(token: t) { self.delivered($0).contains { $0.seq == seq } }).first { $0.seq == seq }
        }
        XCTAssertEqual(try next("", "", seq: 1)?.priority, 10, "registration brings the state at once")
        XCTAssertEqual(try next("update", #"{"state":"processing"}"#, seq: 2)?.priority, 10, "a new state")
        XCTAssertEqual(try next("update", #"{"progress":0.4}"#, seq: 3)?.priority, 5, "progress only")
        XCTAssertEqual(try next("update", #"{"status":"copying"}"#, seq: 4)?.priority, 5, "status only")
        XCTAssertEqual(try next("update", #"{"state":"idle"}"#, seq: 5)?.priority, 10, "a new state")
        let end = try s.end("prio", #"{"state":"error","error":"disk full"}"#)
        guard case .string(let endedText)? = end.json?["endedAt"], let endedMs = Timestamp.parse(endedText),
              let last = try next("", "", seq: 6) else { return XCTFail("no end push") }
        XCTAssertEqual(last.priority, 10)
        XCTAssertEqual(last.event, "end")
        XCTAssertEqual(last.body?["aps"]?["dismissal-date"], .number(Double(endedMs / 1000 + 600)), "the configured delay after the end")
        XCTAssertEqual(last.body?["aps"]?["alert"]?["body"], .string("disk full"), "a failure tells the person why")
        let all = delivered(try f.requests(token: t))
        XCTAssertEqual(all.map(\.seq), [1, 2, 3, 4, 5, 6], "each once, in order")
        XCTAssertEqual(all.compactMap(\.timestamp), all.compactMap(\.timestamp).sorted(), "timestamps never go back")
        XCTAssertEqual(Set(all.compactMap(\.timestamp)).count, all.count, "and always grow")
        for r in all { XCTAssertNoThrow(try JSONDecoder().decode(APS.self, from: Data(r.bodyBytes)), "decodes on the phone") }
    }

    // MARK: - APNs answers

    func testGoneTokensAreRetiredAndNothingMoreIsSentToThem() throws {
        let f = try fake()
        let s = try server(f)
        defer { s.stop() }
        let device = token(), gone = token(), back = token()
        try s.startActivity("gone-job")
        try s.startActivity("back-job")
        try f.script(token: gone, respond: [#"{"status":410,"reason":"Unregistered"}"#])
        // Invalid since an hour ago: it was registered again after that, so it stays.
        let hourAgo = Clock.nowMilliseconds() - 3_600_000
        try f.script(token: back, respond: [#"{"status":410,"reason":"Unregistered","timestamp":\#(hourAgo)}"#])
        try register(s, device: device, tokens: [("gone-job", gone), ("back-job", back)])
        try f.wait(token: gone) { $0.contains { $0.status == 410 } }
        XCTAssertTrue(try waitUntil(5) { try self.count(s, "SELECT count(*) FROM activity_tokens WHERE activity_id = 'gone-job'") == 0 },
                      "retired")
        XCTAssertEqual(try count(s, "SELECT count(*) FROM push_outbox WHERE activity_id = 'gone-job'"), 0, "its pushes cancelled")
        for _ in 0..<3 { try s.update("gone-job") }
        try s.end("gone-job")
        let kept = try f.wait(token: back) { !self.delivered($0).isEmpty }
        XCTAssertEqual(kept.map(\.status), [410, 200], "a 410 older than the registration does not retire the token")
        try waitForPushesSettled(s)
        XCTAssertEqual(try f.requests(token: gone).count, 1, "nothing more to the retired token")
        XCTAssertTrue(s.log().contains("msg=push.token_retired"), "a log line per retirement")
        XCTAssertFalse(s.log().contains(gone), "never the token itself")

        // A push-to-start token answered with BadDeviceToken (in both environments: the first
        // answer may mean "wrong environment") is retired from the device.
        let pts = token()
        try f.script(token: pts, respond: [#"{"status":400,"reason":"BadDeviceToken"}"#, #"{"status":400,"reason":"BadDeviceToken"}"#])
        try register(s, device: device, pushToStart: pts)
        try s.startActivity("live-1", extra: #","liveActivity":true"#)
        try f.wait(token: pts) { $0.contains { $0.status == 400 } }
        XCTAssertTrue(try waitUntil(5) { try self.count(s, "SELECT count(*) FROM devices WHERE push_to_start_mac IS NOT NULL") == 0 })
        try s.startActivity("live-2", extra: #","liveActivity":true"#)
        try waitForPushesSettled(s)
        XCTAssertEqual(try f.requests(token: pts).count, 2, "once in each environment, then nothing more")
    }

    func testThrottlingAndServerErrorsAreRetriedWithBackoffAndArriveOnce() throws {
        let f = try fake()
        let s = try server(f)
        defer { s.stop() }
        let t = token()
        try f.script(token: t, respond: [#"{"status":429}"#, #"{"status":500}"#])
        try s.startActivity("flaky")
        try register(s, device: token(), tokens: [("flaky", t)])
        try f.wait(token: t) { $0.contains { $0.status == 429 } }
        // A change while the push waits out its backoff: the row is not rewritten for it (it is
        // already waiting), and the retry carries it all the same.
        try s.update("flaky", #"{"progress":0.7}"#)
        let got = try f.wait(timeout: 15, token: t) { !self.delivered($0).isEmpty }
        XCTAssertEqual(got.map(\.status), [429, 500, 200])
        guard got.count == 3 else { return }
        XCTAssertGreaterThanOrEqual(got[1].time - got[0].time, 0.45, "backed off after the 429 (0.5-1 s)")
        XCTAssertGreaterThanOrEqual(got[2].time - got[1].time, 0.95, "longer after the 500 (1-2 s)")
        XCTAssertEqual(got.map(\.seq), [1, 2, 2], "the newest state each time; delivered once")
        try waitForPushesSettled(s)
        XCTAssertEqual(try f.requests(token: t).count, 3)
        XCTAssertEqual(try s.metric("dispatch_push_sent_total", labels: #"result="throttled""#), 1)
        XCTAssertEqual(try s.metric("dispatch_push_sent_total", labels: #"result="server_error""#), 1)
    }

    /// GOAWAY (APNs rotating a connection) with many pushes in flight, and a connection that
    /// dies under a push: everything is retried on a new connection, nothing lost, nothing twice.
    func testGoawayAndADroppedConnectionLoseNothingAndDuplicateNothing() throws {
        let f = try fake()
        let s = try server(f)
        defer { s.stop() }
        let ids = (0..<40).map { "g\($0)" }
        let tokens = ids.map { _ in token() }
        for id in ids { try s.startActivity(id) }
        try f.script(token: tokens[7], respond: [#"{"action":"goaway"}"#])
        try register(s, device: token(), tokens: Array(zip(ids, tokens.map { Optional($0) })))
        try f.wait(timeout: 15) { rs in Set(self.delivered(rs).map(\.token)).count == ids.count }
        // A burst of updates, and GOAWAY on every connection while it is in flight.
        for id in ids { try s.update(id, #"{"progress":0.5}"#) }
        try f.goawayAll()
        let final = try f.wait(timeout: 20) { rs in self.delivered(rs).filter { $0.seq == 2 }.count >= ids.count }
        XCTAssertEqual(Set(delivered(final).filter { $0.seq == 2 }.map(\.token)), Set(tokens), "every token got the newest state")
        var seen: [String: Int] = [:]
        for r in delivered(final) { seen["\(r.token)#\(r.seq ?? -1)", default: 0] += 1 }
        XCTAssertEqual(seen.values.filter { $0 > 1 }.count, 0, "no (token, seq) delivered twice: \(seen.filter { $0.value > 1 })")
        XCTAssertGreaterThanOrEqual(try f.stat("connectionsOpened"), 3, "new connections after each GOAWAY")
        XCTAssertTrue(final.contains { $0.token == tokens[7] && $0.action == "goaway" })

        // A connection killed under a push: sent again on a new one, once.
        let t = token()
        try s.startActivity("dropped")
        try f.script(token: t, respond: [#"{"action":"drop"}"#])
        let opened = try f.stat("connectionsOpened")
        try register(s, device: token(), tokens: [("dropped", t)])
        let got = try f.wait(token: t) { !self.delivered($0).isEmpty }
        XCTAssertEqual(got.map(\.status), [nil, 200])
        XCTAssertEqual(got.map(\.seq), [1, 1])
        XCTAssertGreaterThan(try f.stat("connectionsOpened"), opened)
    }

    func testTheProviderTokenIsReusedAndRenewedWhenExpired() throws {
        let f = try fake()
        let s = try server(f)
        defer { s.stop() }
        let ids = (0..<10).map { "jwt\($0)" }
        let tokens = ids.map { _ in token() }
        for id in ids { try s.startActivity(id) }
        try register(s, device: token(), tokens: Array(zip(ids, tokens.map { Optional($0) })))
        try f.wait { self.delivered($0).count >= 10 }
        for id in ids { try s.update(id) }
        for id in ids { try s.update(id, #"{"status":"more"}"#) }
        let many = try f.wait { self.delivered($0).filter { ($0.seq ?? 0) == 3 }.count >= 10 }
        XCTAssertGreaterThanOrEqual(delivered(many).count, 20)
        XCTAssertEqual(Set(many.compactMap(\.jwtHash)).count, 1, "one JWT for every push")
        // APNs now calls that JWT expired: a new one, and the push again (APNs called it
        // expired, so the 20 minutes between updates are not waited for: the fake's are cut).
        try f.setMinJWTInterval(0)
        // Older than 3 s is expired: the JWT in use is (4 s have passed), a fresh one is not,
        // even when its whole-second iat and a loaded machine's delay add up to over 1 s.
        try f.setMaxJWTAge(3)
        sleep(4)
        try f.clearRequests()
        try s.update("jwt0", #"{"progress":0.9}"#)
        let last = try f.wait(token: tokens[0]) { !self.delivered($0).isEmpty }
        try f.resetBehavior()
        XCTAssertEqual(last.map(\.status), [403, 200])
        XCTAssertEqual(last.first?.reason, "ExpiredProviderToken")
        XCTAssertNotEqual(last.first?.jwtHash, last.last?.jwtHash, "a new JWT")
        for id in ids.dropFirst() { try s.update(id, #"{"progress":0.95}"#) }
        let after = try f.wait { self.delivered($0).filter { ($0.seq ?? 0) == 4 }.count >= 10 }
        XCTAssertEqual(Set(after.compactMap(\.jwtHash)).count, 2, "the new one is reused in turn")
    }

    // MARK: - Many processes, crashes

    /// Two server processes on one database, 200 activities published through both: every
    /// (token, seq) pushed at most once, and every activity's end reaches its token.
    func testTwoServersAnd200ActivitiesPushEachChangeExactlyOnce() throws {
        let f = try fake()
        // One phone holding 200 Live Activities: past the default bound of 64 tokens a device
        // keeps (DISPATCH_MAX_ACTIVITY_TOKENS_PER_DEVICE), so raised for this load.
        let many = ["DISPATCH_MAX_ACTIVITY_TOKENS_PER_DEVICE": "200"]
        let a = try server(f, many)
        defer { a.stop() }
        let b = try server(f, many, conninfo: a.conninfo)
        defer { b.stop() }
        let ids = (0..<200).map { "pair\($0)" }
        let tokens = ids.map { _ in token() }
        for (i, id) in ids.enumerated() { try (i % 2 == 0 ? a : b).startActivity(id) }
        let device = token()
        for chunk in stride(from: 0, to: ids.count, by: 50) {
            let pairs = (chunk..<chunk + 50).map { (ids[$0], Optional(tokens[$0])) }
            XCTAssertEqual(try register(chunk % 100 == 0 ? a : b, device: device, tokens: pairs).status, 200)
        }
        for round in 0..<2 {
            for (i, id) in ids.enumerated() { try ((i + round) % 2 == 0 ? a : b).update(id, #"{"progress":0.\#(round + 3)}"#) }
        }
        for (i, id) in ids.enumerated() { XCTAssertEqual(try (i % 2 == 0 ? b : a).end(id).status, 200) }
        let all = try f.wait(timeout: 30) { rs in self.delivered(rs).filter { $0.event == "end" }.count >= ids.count }
        var perKey: [String: Int] = [:]
        for r in delivered(all) { perKey["\(r.token)#\(r.seq ?? -1)", default: 0] += 1 }
        XCTAssertEqual(perKey.values.filter { $0 > 1 }.count, 0, "duplicates: \(perKey.filter { $0.value > 1 }.prefix(5))")
        let ends = delivered(all).filter { $0.event == "end" }
        XCTAssertEqual(Set(ends.map(\.token)), Set(tokens), "every activity's end reached its phone")
        XCTAssertTrue(ends.allSatisfy { $0.seq == 4 })
        XCTAssertEqual(all.filter { $0.status != 200 }.count, 0, "every request passed APNs' checks")
        // Per token, pushes are in seq order with increasing timestamps.
        for t in tokens.prefix(20) {
            let mine = delivered(all).filter { $0.token == t }.sorted { $0.time < $1.time }
            XCTAssertEqual(mine.compactMap(\.seq), mine.compactMap(\.seq).sorted())
            XCTAssertEqual(Set(mine.compactMap(\.timestamp)).count, mine.count)
        }
        // Both processes sent: the outbox is shared work.
        let sentA = try a.metric("dispatch_push_sent_total", labels: #"result="delivered""#)
        let sentB = try b.metric("dispatch_push_sent_total", labels: #"result="delivered""#)
        XCTAssertEqual(Int(sentA + sentB), delivered(all).count)
    }

    /// A worker killed between claim and answer: its lease runs out and another process
    /// sends the push; it arrives once.
    func testAWorkerKilledMidSendLeavesThePushToAnotherAfterTheLease() throws {
        let f = try fake()
        let env = ["DISPATCH_PUSH_LEASE": "4"]
        let a = try server(f, env)
        defer { a.stop() }
        let t = token()
        try a.startActivity("crash-push")
        try f.script(token: t, respond: [#"{"action":"delay","seconds":30}"#])
        try register(a, device: token(), tokens: [("crash-push", t)])
        let first = try f.wait(token: t) { !$0.isEmpty }
        XCTAssertEqual(first.count, 1)
        XCTAssertNil(first.first?.status, "held: no answer yet")
        a.kill()
        let claimedAt = first[0].time
        let b = try server(f, env, conninfo: a.conninfo)
        defer { b.stop() }
        let got = try f.wait(timeout: 15, token: t) { !self.delivered($0).isEmpty }
        XCTAssertEqual(got.count, 2)
        XCTAssertEqual(got.map(\.seq), [1, 1])
        XCTAssertEqual(delivered(got).count, 1, "delivered once")
        XCTAssertGreaterThanOrEqual((got.last?.time ?? 0) - claimedAt, 3.5, "only after the lease ran out")
        try waitForPushesSettled(b)
        XCTAssertEqual(try f.requests(token: t).count, 2)
    }

    // MARK: - Devices API, storage, configuration

    func testTokensAreUnreadableInTheDatabaseAndInTheLogs() throws {
        let f = try fake()
        let s = try server(f)
        defer { s.stop() }
        let device = token(), pts = token(bytes: 100), t = token(bytes: 80)
        try s.startActivity("secret-job")
        XCTAssertEqual(try register(s, device: device, pushToStart: pts, tokens: [("secret-job", t)]).status, 200)
        try f.wait(token: t) { !self.delivered($0).isEmpty }
        var dump = ""
        for table in ["devices", "activity_tokens", "push_outbox"] {
            for row in try sql(s, "SELECT t::text FROM \(table) t") { dump += (row.first ?? nil) ?? "" }
        }
        XCTAssertFalse(dump.isEmpty)
        for secret in [device, pts, t] {
            XCTAssertFalse(dump.lowercased().contains(secret), "a token in the clear in the database")
            XCTAssertFalse(dump.lowercased().contains(String(secret.prefix(16))), "part of a token in the clear")
            XCTAssertFalse(s.log().contains(String(secret.prefix(16))), "a token in the log")
        }
        XCTAssertTrue(dump.contains("…" + t.suffix(4)), "hints only")
    }

    func testRegisteringForgettingAndRefusing() throws {
        let f = try fake()
        let s = try server(f)
        defer { s.stop() }
        let device = token(), t1 = token(), t2 = token()
        try s.startActivity("keep")
        try s.startActivity("drop")
        // A token that keeps failing: its pushes stay pending, with backoff.
        try f.script(token: t2, respond: [], otherwise: #"{"status":503}"#)
        let r = try register(s, device: device, tokens: [("keep", t1), ("drop", t2), ("not-started-yet", token())])
        XCTAssertEqual(r.status, 200, r.text)
        XCTAssertEqual(r.json?["activityTokens"]?["keep"], .string("…" + t1.suffix(4)))
        XCTAssertEqual(r.json?["pushes"], .bool(true))
        XCTAssertFalse(r.text.contains(t1), "never returned in full")
        try f.wait(token: t2) { !$0.isEmpty }
        // {"drop": null}: that token and its pending pushes go.
        let forgot = try register(s, device: device, tokens: [("drop", nil)])
        XCTAssertNil(forgot.json?["activityTokens"]?["drop"])
        XCTAssertEqual(try count(s, "SELECT count(*) FROM push_outbox WHERE activity_id = 'drop'"), 0)
        let sentToDropped = try f.requests(token: t2).count
        try s.update("drop")
        try waitForPushesSettled(s)
        XCTAssertEqual(try f.requests(token: t2).count, sentToDropped, "nothing after it was forgotten")
        // The token registered before its activity existed is used once the activity starts.
        XCTAssertEqual(try count(s, "SELECT count(*) FROM activity_tokens WHERE activity_id = 'not-started-yet'"), 1)
        // Refusals.
        let publisher = try s.client.post("/v1/keys", #"{"name":"pub","scopes":["publish"]}"#)
        guard case .string(let pubKey)? = publisher.json?["secret"] else { return XCTFail(publisher.text) }
        XCTAssertEqual(try register(s, device: device, key: pubKey).status, 403, "needs the device scope")
        XCTAssertEqual(try register(s, device: "xyz").status, 400)
        XCTAssertEqual(try register(s, device: String(device.prefix(30))).status, 400, "15 bytes")
        XCTAssertEqual(try s.client.request("DELETE", "/v1/activity-tokens/nothex").status, 400)
        // DELETE: the device, its tokens and its pending pushes are forgotten.
        XCTAssertEqual(try s.client.request("DELETE", "/v1/activity-tokens/\(device.uppercased())").status, 204)
        XCTAssertEqual(try count(s, "SELECT count(*) FROM devices"), 0)
        XCTAssertEqual(try count(s, "SELECT count(*) FROM activity_tokens"), 0)
        XCTAssertEqual(try count(s, "SELECT count(*) FROM push_outbox"), 0)
        XCTAssertEqual(try s.client.request("DELETE", "/v1/activity-tokens/\(device)").status, 204, "idempotent")
    }

    /// Activity tokens go 12 hours after their activity ended (the retention job's SQL).
    func testTokensAreForgottenTwelveHoursAfterTheEnd() throws {
        let f = try fake()
        let s = try server(f)
        defer { s.stop() }
        try s.startActivity("old-job")
        try s.startActivity("recent-job")
        try register(s, device: token(), tokens: [("old-job", token()), ("recent-job", token())])
        try s.end("old-job")
        try s.end("recent-job")
        _ = try sql(s, "UPDATE activities SET ended_ms = ended_ms - 13 * 3600000 WHERE activity_id = 'old-job'")
        let db = try BlockingPG(s.conninfo)
        let pruned = try db.query(DeviceRepository.retention(nowMs: Clock.nowMilliseconds(), deviceRetentionS: 90 * 86_400))
        XCTAssertEqual(pruned.first?.int("tokens"), 1)
        XCTAssertEqual(try sql(s, "SELECT activity_id FROM activity_tokens").map { $0[0] }, ["recent-job"])
        XCTAssertEqual(try count(s, "SELECT count(*) FROM push_outbox WHERE activity_id = 'old-job'"), 0)
    }

    func testPushStatusCommandShowsTheOutboxWithHintsOnly() throws {
        let f = try fake()
        let s = try server(f)
        defer { s.stop() }
        let t = token()
        try f.script(token: t, respond: [], otherwise: #"{"status":400,"reason":"BadPriority"}"#)
        try s.startActivity("status-job")
        try register(s, device: token(), tokens: [("status-job", t)])
        try f.wait(token: t) { !$0.isEmpty }
        XCTAssertTrue(try waitUntil(5) { try self.count(s, "SELECT count(*) FROM push_outbox WHERE failed") == 1 }, "our bug: failed, not retried")
        XCTAssertTrue(s.log().contains("msg=push.rejected"), "said loudly")
        let out = Subprocess.run([TestPaths.binary("dispatchd"), "push", "status", "--database-url", s.conninfo],
                                 environment: ["DISPATCH_MIGRATIONS_DIR": TestPaths.repositoryRoot + "/Migrations", "PATH": "/usr/bin:/bin"])
        XCTAssertEqual(out.status, 0, out.output)
        XCTAssertTrue(out.output.contains("1 failed"), out.output)
        XCTAssertTrue(out.output.contains("…" + t.suffix(4)) || out.output.contains("400 BadPriority"), out.output)
        XCTAssertFalse(out.output.contains(t))
    }

    func testConfiguration() throws {
        let f = try fake()
        // Without APNs: the server runs, tokens are kept, nothing is queued.
        let plain = try TestServer.start(environment: ["DISPATCH_TOKEN_KEY": FakeAPNs.tokenKey])
        defer { plain.stop() }
        try plain.startActivity("quiet")
        let r = try register(plain, device: token(), tokens: [("quiet", token())])
        XCTAssertEqual(r.json?["pushes"], .bool(false))
        try plain.update("quiet")
        XCTAssertEqual(try count(plain, "SELECT count(*) FROM push_outbox"), 0)
        let stray = try f.requests()
        XCTAssertEqual(stray.count, 0, "\(stray.map { ($0.token, $0.status, $0.time, $0.connection, $0.detail) })")
        // Partial APNs configuration, an unusable key, or no token key with DATABASE_URL: exit 2.
        var partial = f.serverEnvironment
        partial["DISPATCH_APNS_TEAM_ID"] = nil
        var badKey = f.serverEnvironment
        badKey["DISPATCH_APNS_KEY_FILE"] = f.pki + "/ca.pem"
        var noTokenKey = f.serverEnvironment
        noTokenKey["DISPATCH_TOKEN_KEY"] = nil
        let badEnv = f.serverEnvironment.merging(["DISPATCH_APNS_BROADCAST_ENV": "staging"]) { $1 }
        let badPace = f.serverEnvironment.merging(["DISPATCH_PUSH_PACE": "61"]) { $1 }
        let badSandbox = f.serverEnvironment.merging(["DISPATCH_APNS_SANDBOX_URL": "http://127.0.0.1:1"]) { $1 }
        for (env, message) in [(partial, "DISPATCH_APNS_TEAM_ID missing"), (badKey, "not an APNs auth key"),
                               (noTokenKey, "DISPATCH_TOKEN_KEY is required"),
                               (badEnv, "DISPATCH_APNS_BROADCAST_ENV must be production or sandbox"),
                               (badPace, "DISPATCH_PUSH_PACE must be seconds from 0 to 60"),
                               (badSandbox, "DISPATCH_APNS_SANDBOX_URL must be https://host[:port]")] {
            do {
                let s = try TestServer.start(environment: env)
                s.stop()
                XCTFail("started with \(message)")
            } catch {
                XCTAssertTrue("\(error)".contains("exited with 2"), "\(error)")
                XCTAssertTrue("\(error)".contains(message), "\(error)")
            }
        }
    }
}

/// A push as the phone's ActivityKit reads it, with a default JSONDecoder.
typealias APS = LiveActivityPush.Envelope
