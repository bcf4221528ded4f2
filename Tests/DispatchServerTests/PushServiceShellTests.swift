import DispatchCore
import DispatchCrypto
import DispatchHarness
import DispatchIO
import Foundation
import XCTest
@testable import DispatchServer

/// PushService in one process: its own database session on a scripted driver (the test answers
/// claims, reads, token look-ups and marks as PostgreSQL would), APNs answered by a scripted
/// HTTP client, time (the loop's and the Unix clock the machine reads) on a manual loop.
final class PushServiceShellTests: XCTestCase {
    var loop: ManualLoop!
    var session: ScriptedSession!
    var sender: ScriptedSender!
    var service: PushService!
    var options: H2Client.Options?
    let vault = TokenVault(key: [UInt8](repeating: 7, count: 32))
    let settings = APNsSettings(keyFile: "AuthKey_KEY1234567.p8", keyID: "KEY1234567", teamID: "TEAM123456", topic: "com.example.dispatch")
    /// The provider token already in the database when the test starts (made a minute ago).
    var storedJWT = ""
    var storedIssuedAt: Int64 = 0
    static let signer = makeSigner()

    override func setUp() {
        // The manual clock reads as Unix seconds (a fixed moment, so every run steps the same
        // times): the machine's times, claims and provider tokens use it.
        loop = ManualLoop(now: 1_790_000_000)
        session = ScriptedSession()
        sender = ScriptedSender()
        let clock = loop!
        service = PushService(loop: loop, driver: session.driver, conninfo: "scripted", settings: settings, signer: Self.signer, vault: vault,
                              dismissalSeconds: 900, leaseSeconds: 30, log: Logger(level: .error), clock: { clock.now }) { [unowned self] in
            self.options = $0
            return self.sender
        }
        storedIssuedAt = Int64(loop.now) - 60
        storedJWT = try! APNsRequest.providerToken(keyID: settings.keyID, teamID: settings.teamID, issuedAt: storedIssuedAt, signer: Self.signer)
        service.start()
        session.driver.socketReady()
        // On connecting: the session's settings, a claim, the broadcast channels' claim.
        XCTAssertEqual(session.pending, ["push_claim", "push_fanout_claim", "push_fanout_activities", "push_fanout_targets", "broadcast_claim", "broadcast_in_use"])
        answer()
        // Past the claim interval, short of the next poll: a kick claims at once.
        loop.advance(by: 0.1)
        answer()
    }

    override func tearDown() {
        service.close()
        loop.runSoon()
        XCTAssertEqual(session.driver.violations, [])
    }

    // MARK: - Rows as PostgreSQL returns them

    static let token = String(repeating: "ab", count: 32)

    /// `push_claim`'s rows: one per device, update pushes of activity job-1, first attempts.
    func claimRows(_ devices: [Int64], lease: Int64 = 70) -> PGResult {
        PGResult(columns: ["activity_id", "device_id", "kind", "lease_id", "priority", "pending_since_ms", "last_timestamp", "attempts", "claimed_ms"],
                 rows: devices.map { ["job-1", String($0), "update", String(lease), "5", String(nowMs - 300), "0", "1", String(nowMs)] })
    }

    /// `push_read`'s rows: the activity as it is now and each device's sealed token.
    func readRows(_ devices: [Int64], environment: APNsEnvironment = .production) -> PGResult {
        let sealed = try! vault.seal(Self.token)
        let activity = ActivityRepository.columns.split(separator: ",").map { String($0.split(separator: ".").last!) }
        let columns = ["outbox_activity_id", "outbox_device_id", "outbox_kind"] + activity
            + ["token_mac", "token_sealed", "token_hint", "device_environment", "channel_phase", "entry_timestamp"]
        return PGResult(columns: columns, rows: devices.map { device in
            let values: [String: String] = [
                "outbox_activity_id": "job-1", "outbox_device_id": String(device), "outbox_kind": "update",
                "activity_id": "job-1", "task_name": "build", "state": "processing", "progress": "0.5", "attempt": "1", "seq": "3",
                "created_ms": String(nowMs - 5000), "updated_ms": String(nowMs - 500), "last_event": "processing",
                "start_fingerprint": "fp", "live_activity": "t",
                "token_mac": Bytea.literal(sealed.mac), "token_sealed": Bytea.literal(sealed.sealed), "token_hint": sealed.hint,
                "device_environment": environment.rawValue,
            ]
            return columns.map { values[$0] }
        })
    }

    /// `apns_token_read`'s row: the deployment's provider token, sealed.
    func storedToken(_ jwt: String, issuedAt: Int64) -> PGResult {
        let sealed = try! vault.sealText(jwt)
        return PGResult(columns: ["jwt_mac", "jwt_sealed", "issued_at", "paused_until"],
                        rows: [[Bytea.literal(sealed.mac), Bytea.literal(sealed.sealed), String(issuedAt), nil]])
    }

    var nowMs: Int64 { Int64(loop.now * 1000) }

    /// Answers everything pending: `script` by statement name, the rest as an idle database
    /// would (nothing due, no broadcast channel in use).
    func answer(_ script: [String: PGResult] = [:]) {
        session.answer { name in
            if let r = script[name] { return r }
            switch name {
            case "broadcast_in_use": return PGResult(columns: ["in_use"], rows: [["f"]])
            case "push_depth": return PGResult(columns: ["depth"], rows: [["0"]])
            default: return PGResult()
            }
        }
    }

    /// Runs the manual clock for `seconds`, answering what the polls ask as an idle database.
    func idle(for seconds: Double) {
        for _ in 0..<Int((seconds / 0.2).rounded(.up)) {
            loop.advance(by: 0.2)
            answer()
        }
    }

    func apns(_ status: Int, _ body: String = "") -> Result<CurlClient.Response, HTTPClientFailure> {
        .success(CurlClient.Response(status: status, httpVersion: "2", headers: [], body: Array(body.utf8)))
    }

    /// Kicks, claims `devices` and reads them, with the stored provider token when the machine
    /// asks for one; the pushes are then with the scripted client.
    func kickAndClaim(_ devices: [Int64], environment: APNsEnvironment = .production) {
        service.kick()
        XCTAssertEqual(session.pending, ["push_claim", "push_fanout_claim", "push_fanout_activities", "push_fanout_targets"])
        answer(["push_claim": claimRows(devices)])
        XCTAssertEqual(session.pending, ["push_read"])
        answer(["push_read": readRows(devices, environment: environment)])
        if session.pending == ["apns_token_read"] { answer(["apns_token_read": storedToken(storedJWT, issuedAt: storedIssuedAt)]) }
        XCTAssertEqual(sender.unanswered, devices.count)
    }

    func headers(_ r: CurlClient.Request) -> [String: String] { Dictionary(uniqueKeysWithValues: r.headers) }

    // MARK: - Tests

    /// `push_fanout_claim`'s row: activity job-1's entry, claimed under lease 71.
    func entryClaim() -> PGResult {
        PGResult(columns: ["activity_id", "lease_id", "priority", "pending_since_ms", "last_timestamp", "attempts", "claimed_ms"],
                 rows: [["job-1", "71", "5", String(nowMs - 300), "0", "1", String(nowMs)]])
    }

    /// `push_fanout_activities` and `push_fanout_targets`: job-1 as it is now, and a token on
    /// each of `devices`.
    func entryReads(_ devices: [Int64]) -> (activities: PGResult, targets: PGResult) {
        let row = readRows([devices[0]])
        let activityColumns = ["outbox_activity_id"] + ActivityRepository.columns.split(separator: ",").map { String($0.split(separator: ".").last!) }
        let activity = activityColumns.map { name in row.first.flatMap { $0[name == "outbox_activity_id" ? "outbox_activity_id" : name] } }
        let targets = PGResult(columns: ["activity_id", "device_id", "token_mac", "token_sealed", "token_hint", "environment", "row_wanted", "row_sent", "row_failed"],
                               rows: devices.map { device in
                                   let sealed = try! vault.seal(Self.token + String(device))
                                   return ["job-1", String(device), Bytea.literal(sealed.mac), Bytea.literal(sealed.sealed), sealed.hint, "production", nil, nil, nil]
                               })
        return (PGResult(columns: activityColumns, rows: [activity]), targets)
    }

    func testAnEntryIsClaimedAndReadInOneRoundTripAndFannedOutToEveryToken() throws {
        service.kick()
        XCTAssertEqual(session.pending, ["push_claim", "push_fanout_claim", "push_fanout_activities", "push_fanout_targets"],
                       "the entries' reads go in the claim's batch, as later statements")
        XCTAssertEqual(session.parameters(of: "push_fanout_activities"), [], "what they read is what the claim noted in the transaction")
        let reads = entryReads([21, 22, 23])
        answer(["push_fanout_claim": entryClaim(), "push_fanout_activities": reads.activities, "push_fanout_targets": reads.targets])
        XCTAssertEqual(session.pending, ["apns_token_read"], "no second round trip before the pushes, only the provider token")
        answer(["apns_token_read": storedToken(storedJWT, issuedAt: storedIssuedAt)])
        XCTAssertEqual(sender.requests.map(\.url), [21, 22, 23].map { "https://api.push.apple.com/3/device/" + Self.token + String($0) })
        XCTAssertEqual(Set(sender.requests.map(\.body)).count, 1, "one body for every token")
        XCTAssertEqual(session.pending, [], "nothing is marked before the answers")
        sender.answer(apns(200))
        sender.answer(apns(200))
        XCTAssertEqual(session.pending, [], "the entry is marked once all its pushes are answered")
        sender.answer(apns(200))
        XCTAssertEqual(session.pending, ["push_fanout_mark"])
        let mark = try XCTUnwrap(session.parameters(of: "push_fanout_mark"))
        XCTAssertEqual(Array(mark[1...3]), ["{\"job-1\"}", "{71}", "{3}"], "the entry as claimed (its lease) and the seq pushed")
        answer()
        XCTAssertEqual(service.metrics.sent[.delivered], 3)
    }

    func testAKickClaimsSendsWithTheProviderTokenAndMarksTheRowSent() throws {
        XCTAssertEqual(options?.maxHostConnections, 1, "one multiplexed HTTP/2 connection to APNs")
        XCTAssertEqual(options?.pingIdleSeconds, 15, "idle connections PINGed after DISPATCH_APNS_IDLE")
        service.kick()
        XCTAssertEqual(session.pending, ["push_claim", "push_fanout_claim", "push_fanout_activities", "push_fanout_targets"])
        XCTAssertEqual(session.parameters(of: "push_claim"), ["500", "30000"], "a batch, leased for the lease")
        answer(["push_claim": claimRows([11])])
        XCTAssertEqual(session.pending, ["push_read"])
        answer(["push_read": readRows([11])])
        XCTAssertEqual(session.pending, ["apns_token_read"], "the first push needs the deployment's provider token")
        XCTAssertEqual(sender.requests.count, 0, "the push waits for it")
        answer(["apns_token_read": storedToken(storedJWT, issuedAt: storedIssuedAt)])

        let request = try XCTUnwrap(sender.requests.first)
        XCTAssertEqual(request.url, "https://api.push.apple.com/3/device/" + Self.token)
        XCTAssertEqual(request.method, "POST")
        XCTAssertEqual(request.timeout, 10)
        let h = headers(request)
        XCTAssertEqual(h["authorization"], "bearer " + storedJWT)
        XCTAssertEqual(h["apns-topic"], "com.example.dispatch.push-type.liveactivity")
        XCTAssertEqual(h["apns-push-type"], "liveactivity")
        XCTAssertEqual(h["apns-priority"], "5")
        // The body is the plan for the activity as read, its timestamp its change's second.
        let read = try XCTUnwrap(StoredActivity(row: try XCTUnwrap(readRows([11]).first)))
        guard case .send(let body, let timestamp, _, let expiration) = PushPlan.make(
            kind: .update, snapshot: read.activity, hasToken: true, lastTimestamp: 0, priority: 5, dismissalDelaySeconds: 900,
            sentAtSeconds: nowMs / 1000)
        else { return XCTFail("the plan sends") }
        XCTAssertEqual(timestamp, (nowMs - 500) / 1000)
        XCTAssertEqual(h["apns-expiration"], String(expiration))
        XCTAssertEqual(expiration, nowMs / 1000 + 3600, "apns-expiration counts from the send, not from the change")
        XCTAssertEqual(String(decoding: request.body, as: UTF8.self), String(decoding: body, as: UTF8.self))
        XCTAssertEqual(session.pending, [], "nothing is marked before the answer")

        sender.answer(apns(200))
        XCTAssertEqual(session.pending, ["push_fanout_mark", "push_mark_lock", "push_mark_sent", "push_fanout_row_delivered"])
        let sent = try XCTUnwrap(session.parameters(of: "push_mark_sent"))
        XCTAssertEqual(Array(sent.prefix(6)), ["{\"job-1\"}", "{11}", "{\"update\"}", "{70}", "{3}", "{\(timestamp)}"],
                       "the row as claimed (its lease), the seq and timestamp pushed")
        XCTAssertEqual(sent[8], "{t}", "marked as pushed (status 200)")
        answer()
        XCTAssertEqual(service.metrics.sent[.delivered], 1)
        // A delivered row may be due again (a change during its push): claimed again as soon
        // as the claim interval allows, on the wake-up timer.
        XCTAssertEqual(session.pending, [])
        loop.advance(by: 0.01)
        XCTAssertEqual(session.pending, ["push_claim", "push_fanout_claim", "push_fanout_activities", "push_fanout_targets"])
        answer()
    }

    /// 410: the token goes, as of APNs' time. 400 BadDeviceToken: one try in the other
    /// environment first, then the token goes as of the claim.
    func testAGoneTokenIsRetiredAndABadOneTriesTheOtherEnvironmentFirst() throws {
        kickAndClaim([11])
        sender.answer(apns(410, #"{"reason":"Unregistered","timestamp":1700000000000}"#))
        XCTAssertEqual(session.pending, ["push_mark_lock", "push_mark_retire"])
        var retire = try XCTUnwrap(session.parameters(of: "push_mark_retire"))
        XCTAssertEqual(retire[0...3], ["job-1", "11", "update", "70"])
        XCTAssertEqual(retire[5...6], ["1700000000000", "410 Unregistered"])
        answer()
        XCTAssertEqual(service.metrics.sent[.retired], 1)
        loop.advance(by: 0.01)
        XCTAssertEqual(session.pending, ["push_claim", "push_fanout_claim", "push_fanout_activities", "push_fanout_targets"], "a retired row may be due again (a new token)")
        answer()

        loop.advance(by: 0.05)
        kickAndClaim([12])
        let claimedMs = nowMs
        sender.answer(apns(400, #"{"reason":"BadDeviceToken"}"#))
        XCTAssertEqual(session.pending, [], "not retired yet")
        XCTAssertEqual(sender.requests.last?.url, "https://api.sandbox.push.apple.com/3/device/" + Self.token)
        XCTAssertEqual(headers(try XCTUnwrap(sender.requests.last))["authorization"], "bearer " + storedJWT)
        sender.answer(apns(400, #"{"reason":"BadDeviceToken"}"#))
        XCTAssertEqual(session.pending, ["push_mark_lock", "push_mark_retire"])
        retire = try XCTUnwrap(session.parameters(of: "push_mark_retire"))
        XCTAssertEqual(retire[1], "12")
        XCTAssertEqual(retire[5...6], [String(claimedMs), "400 BadDeviceToken"])
        answer()
        XCTAssertEqual(service.metrics.sent[.retired], 2)
    }

    /// 429 and 5xx: the rows are given back with a backoff; marks coming together wait for the
    /// mark interval on the wake-up timer, which claims again as a poll does.
    func testThrottledAndServerErrorsAreRetriedLaterAndThePollClaimsAgain() throws {
        kickAndClaim([11, 12])
        sender.answer(apns(429, #"{"reason":"TooManyRequests"}"#))
        XCTAssertEqual(session.pending, ["push_mark_lock", "push_mark_retry"])
        var retry = try XCTUnwrap(session.parameters(of: "push_mark_retry"))
        XCTAssertEqual(retry[1], "{11}")
        let delay = try XCTUnwrap(Int(retry[4]!.dropFirst().dropLast()))
        XCTAssertTrue((500...1000).contains(delay), "the first retry waits 0.5-1 s (equal jitter), not \(delay) ms")
        XCTAssertEqual(retry[5], "{\"429 TooManyRequests\"}")
        XCTAssertEqual(retry[6], "{0}", "a real attempt: counted")
        sender.answer(apns(503))
        XCTAssertEqual(session.pending, ["push_mark_lock", "push_mark_retry"], "one batch of marks at a time")
        answer()
        XCTAssertEqual(session.pending, [], "the next batch waits for the mark interval")
        loop.advance(by: 0.01)
        XCTAssertEqual(session.pending, ["push_mark_lock", "push_mark_retry", "push_claim", "push_fanout_claim", "push_fanout_activities", "push_fanout_targets"])
        retry = try XCTUnwrap(session.parameters(of: "push_mark_retry"))
        XCTAssertEqual(retry[1], "{12}")
        XCTAssertEqual(retry[5], "{\"503\"}")
        answer()
        XCTAssertEqual(service.metrics.sent[.throttled], 1)
        XCTAssertEqual(service.metrics.sent[.serverError], 1)
        XCTAssertEqual(session.pending, [], "rows retried later are not claimed again at once")
        loop.advance(by: 0.1)
        XCTAssertEqual(session.pending, ["push_claim", "push_fanout_claim", "push_fanout_activities", "push_fanout_targets", "broadcast_claim", "broadcast_in_use"], "the poll claims")
        answer()
    }

    /// Claims come at most once per claim interval: a kick right after one arms the wake-up
    /// timer, which claims when the interval is over.
    func testAKickRightAfterAClaimWaitsForTheIntervalOnTheWakeUpTimer() {
        service.kick()
        answer()
        service.kick()
        XCTAssertEqual(session.pending, [], "within the claim interval")
        loop.advance(by: 0.004)
        XCTAssertEqual(session.pending, [])
        loop.advance(by: 0.006)
        XCTAssertEqual(session.pending, ["push_claim", "push_fanout_claim", "push_fanout_activities", "push_fanout_targets"])
        answer()
    }

    /// The database goes away under a claim: nothing breaks, claims wait out the database
    /// retry, and once the session is back a claim goes out again.
    func testALostConnectionMidClaimIsSurvivedAndTheNextPollClaimsAgain() {
        service.kick()
        XCTAssertEqual(session.pending, ["push_claim", "push_fanout_claim", "push_fanout_activities", "push_fanout_targets"])
        session.connectionLost()
        loop.runSoon()
        XCTAssertEqual(session.pending, [])
        XCTAssertEqual(session.driver.connects, 1)
        loop.advance(by: 0.5)
        XCTAssertTrue(session.driver.awaitingSocket, "reconnecting")
        XCTAssertEqual(session.driver.connects, 2)
        session.driver.socketReady()
        XCTAssertEqual(session.pending, ["broadcast_claim", "broadcast_in_use"], "no claim within the database retry")
        answer()
        loop.advance(by: 0.3)
        XCTAssertEqual(session.pending, ["broadcast_claim", "broadcast_in_use"], "still within it (a second after the failure)")
        answer()
        loop.advance(by: 0.35)
        XCTAssertEqual(session.pending, ["broadcast_claim", "broadcast_in_use", "push_claim", "push_fanout_claim", "push_fanout_activities", "push_fanout_targets"],
                       "the first poll past the database retry claims again")
        answer(["push_claim": claimRows([11])])
        answer(["push_read": readRows([11])])
        answer(["apns_token_read": storedToken(storedJWT, issuedAt: storedIssuedAt)])
        XCTAssertEqual(sender.unanswered, 1, "and pushes what it claimed")
    }

    /// After `shutdown` nothing is claimed but answers are still marked; after `close` a late
    /// answer (the client's cancellation) marks nothing and the session sends nothing more.
    func testAfterShutdownAnswersAreMarkedAndAfterCloseTheLateAnswerMarksNothing() {
        kickAndClaim([11, 12])
        service.shutdown()
        loop.advance(by: 0.2)
        XCTAssertEqual(session.pending, ["broadcast_claim", "broadcast_in_use"], "no more claims")
        answer()
        sender.answer(apns(200))
        XCTAssertEqual(session.pending, ["push_fanout_mark", "push_mark_lock", "push_mark_sent", "push_fanout_row_delivered"])
        answer()

        let sentBefore = session.driver.sent.count
        service.close()
        XCTAssertTrue(sender.closed)
        XCTAssertEqual(sender.unanswered, 0, "the request in flight was cancelled")
        loop.runSoon()
        loop.advance(by: 2)
        XCTAssertEqual(session.driver.sent.count, sentBefore, "no mark after close")
        XCTAssertEqual(session.driver.finishes, 1, "the session is closed")
        XCTAssertEqual(service.metrics.sent[.delivered], 1)
        XCTAssertEqual(service.metrics.sent[.connectionError], nil, "the cancellation is not counted as an answer")
    }

    /// One provider token serves every push within its lifetime; once it is 40 minutes old the
    /// next push gets a new one, made under the lock and stored for the other processes.
    func testOneProviderTokenServesItsLifetimeThenANewOneIsMade() throws {
        kickAndClaim([11])
        sender.answer(apns(200))
        answer()
        answer()
        loop.advance(by: 0.05)
        kickAndClaim([12])
        XCTAssertEqual(sender.requests.map { headers($0)["authorization"] }, Array(repeating: "bearer " + storedJWT, count: 2))
        XCTAssertEqual(session.driver.sent.filter { $0 == .executePrepared(name: "apns_token_read", params: [settings.teamID, settings.keyID]) }.count,
                       1, "the token was read once")
        sender.answer(apns(200))
        answer()
        answer()

        idle(for: 40 * 60 - 60)
        service.kick()
        answer(["push_claim": claimRows([13])])
        answer(["push_read": readRows([13])])
        XCTAssertEqual(session.pending, ["apns_token_read"], "the token is due for renewal")
        answer(["apns_token_read": storedToken(storedJWT, issuedAt: storedIssuedAt)])
        XCTAssertEqual(session.pending, ["apns_token_lock", "apns_token_read"], "the stored one is as old: renew under the lock")
        answer(["apns_token_read": storedToken(storedJWT, issuedAt: storedIssuedAt)])
        XCTAssertEqual(session.pending, ["apns_token_store", "apns_token_unlock"])
        let issuedAt = Int64(loop.now)
        XCTAssertEqual(session.parameters(of: "apns_token_store")?[4], String(issuedAt))
        XCTAssertEqual(sender.unanswered, 0, "the push waits for the stored token")
        answer()
        XCTAssertEqual(sender.unanswered, 1)
        let bearer = try XCTUnwrap(headers(try XCTUnwrap(sender.requests.last))["authorization"])
        XCTAssertNotEqual(bearer, "bearer " + storedJWT)
        let claims = try XCTUnwrap(Base64.urlDecode(String(bearer.split(separator: ".")[1])))
        XCTAssertEqual(String(decoding: claims, as: UTF8.self), #"{"iss":"TEAM123456","iat":\#(issuedAt)}"#)
    }

    // MARK: -

    /// A fresh P-256 key (what an Apple .p8 holds), made with the openssl tool.
    static func makeSigner() -> ES256Signer {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]
        let out = Pipe()
        process.standardOutput = out
        try! process.run()
        let pem = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        return try! ES256Signer(pem: pem)
    }
}
