import DispatchCore
import DispatchCrypto
import DispatchHarness
import DispatchIO
import XCTest
@testable import DispatchServer

/// The broadcast channels' service in one process: its session on a scripted libpq driver
/// (the test answers claims, reads, the provider token and marks as PostgreSQL would), APNs on
/// a scripted HTTP client, the loop's time and the Unix clock on a manual loop. One cycle at a
/// time (claim → read → send → mark), and its failure paths: the session lost mid-claim,
/// mid-read or mid-mark, answers arriving after close, a wake-up timer due after close, no
/// provider token, and APNs pausing the deployment.
final class BroadcastServiceShellTests: XCTestCase {
    var loop: ManualLoop!
    var session: ScriptedSession!
    var sender: ScriptedSender!
    var metrics: PushMetrics!
    var service: BroadcastService!
    var paused: [Int64] = []
    let vault = TokenVault(key: [UInt8](repeating: 7, count: 32))
    let settings = APNsSettings(keyFile: "AuthKey_KEY1234567.p8", keyID: "KEY1234567", teamID: "TEAM123456", topic: "com.example.dispatch")
    var storedJWT = ""
    var storedIssuedAt: Int64 = 0

    override func setUp() {
        loop = ManualLoop(now: 1_790_000_000)
        session = ScriptedSession()
        sender = ScriptedSender()
        metrics = PushMetrics()
        let log = Logger(level: .error)
        let clock = loop!
        let db = PGConnection(loop: loop, driver: session.driver, conninfo: "scripted", name: "push", log: log)
        let tokenStore = ProviderTokenStore(db: db, settings: settings, signer: PushServiceShellTests.signer, vault: vault,
                                            policy: ProviderTokenPolicy(), log: log, clock: { clock.now })
        service = BroadcastService(loop: loop, db: db, curl: sender, settings: settings, tokenStore: tokenStore, metrics: metrics,
                                   dismissalSeconds: 900, leaseMs: 30_000, requestTimeout: 10, log: log, clock: { clock.now })
        service.onPaused = { [unowned self] in self.paused.append($0) }
        storedIssuedAt = Int64(loop.now) - 60
        storedJWT = try! APNsRequest.providerToken(keyID: settings.keyID, teamID: settings.teamID, issuedAt: storedIssuedAt,
                                                   signer: PushServiceShellTests.signer)
        db.start()
        session.driver.socketReady()
        loop.runSoon()
    }

    override func tearDown() {
        service.close()
        loop.runSoon()
        XCTAssertEqual(session.driver.violations, [])
    }

    // MARK: - Rows as PostgreSQL returns them

    static let claim = ["broadcast_claim", "broadcast_in_use"]

    /// `broadcast_claim`'s row: `id` in `phase`, under lease 70, first attempt.
    func claimRow(_ id: String, _ phase: BroadcastPhase, channel: String? = nil, attempts: Int = 1) -> PGResult {
        PGResult(columns: ["activity_id", "phase", "channel_id", "environment", "lease_id", "priority", "pending_since_ms", "last_timestamp",
                           "attempts", "claimed_ms", "has_change"],
                 rows: [[id, phase.rawValue, channel, "production", "70", "10", String(nowMs - 300), "0", String(attempts), String(nowMs), "t"]])
    }

    /// `broadcast_read`'s row: `id`, a broadcast activity in `state` at seq 3.
    func activity(_ id: String, state: ActivityState = .processing, channel: String? = nil) -> PGResult {
        let columns = ActivityRepository.columns.split(separator: ",").map { String($0.split(separator: ".").last!) }
        let values: [String: String] = ["activity_id": id, "task_name": "build", "state": state.rawValue, "attempt": "1", "seq": "3",
                                        "created_ms": String(nowMs - 5000), "updated_ms": String(nowMs - 500), "last_event": state.rawValue,
                                        "start_fingerprint": "fp", "live_activity": "t", "broadcast": "t"]
        var row = columns.map { values[$0] }
        if let channel, let i = columns.firstIndex(of: "channel_id") { row[i] = channel }
        return PGResult(columns: columns, rows: [row])
    }

    /// `apns_token_read`'s row: the deployment's provider token, sealed.
    func storedToken() -> PGResult {
        let sealed = try! vault.sealText(storedJWT)
        return PGResult(columns: ["jwt_mac", "jwt_sealed", "issued_at", "paused_until"],
                        rows: [[Bytea.literal(sealed.mac), Bytea.literal(sealed.sealed), String(storedIssuedAt), nil]])
    }

    var nowMs: Int64 { Int64(loop.now * 1000) }

    /// Answers everything pending: `script` by statement name, the rest as an idle database
    /// would (nothing due, a channel in use when `inUse`).
    func answer(_ script: [String: PGResult] = [:], inUse: Bool = false) {
        session.answer { name in
            if let r = script[name] { return r }
            return name == "broadcast_in_use" ? PGResult(columns: ["in_use"], rows: [[inUse ? "t" : "f"]]) : PGResult()
        }
        loop.runSoon()
    }

    func apns(_ status: Int, _ body: String = "", channel: String? = nil) -> Result<CurlClient.Response, HTTPClientFailure> {
        .success(CurlClient.Response(status: status, httpVersion: "2", headers: channel.map { [("apns-channel-id", $0)] } ?? [], body: Array(body.utf8)))
    }

    /// Claims `claimed`, reads `read` and gives the stored provider token: the request is then
    /// with the scripted client.
    func claimAndSend(_ claimed: PGResult, _ read: PGResult) {
        service.poll()
        XCTAssertEqual(session.pending, Self.claim)
        answer(["broadcast_claim": claimed], inUse: true)
        XCTAssertEqual(session.pending, ["broadcast_read"])
        answer(["broadcast_read": read])
        XCTAssertEqual(session.pending, ["apns_token_read"])
        answer(["apns_token_read": storedToken()])
        XCTAssertEqual(sender.unanswered, 1)
    }

    func headers(_ r: CurlClient.Request) -> [String: String] { Dictionary(uniqueKeysWithValues: r.headers) }

    // MARK: - Happy paths

    func testAPollWithNothingDueEndsTheCycleAndCommitsWakeItOnlyWhileAChannelIsInUse() {
        service.poll()
        XCTAssertEqual(session.pending, Self.claim)
        answer(inUse: false)
        XCTAssertEqual(session.pending, [])
        service.kick()
        loop.advance(by: 1)
        XCTAssertEqual(session.pending, [], "no channel in use: a commit costs no claim")
        service.poll()
        answer(inUse: true)
        service.kick()
        XCTAssertEqual(session.pending, [], "within the claim interval")
        loop.advance(by: 5 * BroadcastService.minClaimInterval)
        XCTAssertEqual(session.pending, Self.claim, "a channel in use: the commit's claim, on the wake-up timer")
    }

    func testAChannelIsMadeWithTheProviderTokenMarkedLiveAndTheRowClaimedAgain() {
        claimAndSend(claimRow("job-1", .create), activity("job-1"))
        let request = sender.requests[0]
        XCTAssertEqual(request.method, "POST")
        XCTAssertTrue(request.url.hasSuffix("/1/apps/com.example.dispatch/channels"), request.url)
        XCTAssertEqual(headers(request)["authorization"], "bearer " + storedJWT)
        sender.answer(apns(201, channel: "ch-1"))
        XCTAssertEqual(session.pending, ["broadcast_mark_channel", "broadcast_mark_created"])
        XCTAssertEqual(session.parameters(of: "broadcast_mark_created")?[2], "ch-1")
        answer()
        XCTAssertEqual(metrics.broadcasts["created"], 1)
        loop.advance(by: 5 * BroadcastService.minClaimInterval)
        XCTAssertEqual(session.pending, Self.claim, "the live channel's first push may be due at once")
    }

    func testALiveChannelGetsItsActivitysNewestStateAndTheTokenIsReusedNextCycle() {
        claimAndSend(claimRow("job-1", .live, channel: "ch-1"), activity("job-1", channel: "ch-1"))
        let request = sender.requests[0]
        XCTAssertTrue(request.url.hasSuffix("/4/broadcasts/apps/com.example.dispatch"), request.url)
        XCTAssertEqual(headers(request)["apns-channel-id"], "ch-1")
        XCTAssertEqual(headers(request)["apns-push-type"], "liveactivity")
        sender.answer(apns(200))
        XCTAssertEqual(session.pending, ["broadcast_mark_pushed"])
        answer()
        XCTAssertEqual(metrics.broadcasts["pushed"], 1)
        loop.advance(by: 5 * BroadcastService.minClaimInterval)
        answer(["broadcast_claim": claimRow("job-1", .live, channel: "ch-1")], inUse: true)
        answer(["broadcast_read": activity("job-1", channel: "ch-1")])
        XCTAssertEqual(sender.unanswered, 1, "sent without reading the provider token again")
    }

    func testAnActivityNoLongerStoredIsForgottenWithoutARequest() {
        service.poll()
        answer(["broadcast_claim": claimRow("gone", .create)], inUse: true)
        answer(["broadcast_read": PGResult(columns: ["activity_id"], rows: [])])
        answer(["apns_token_read": storedToken()])
        XCTAssertEqual(sender.requests.count, 0)
        XCTAssertEqual(session.pending, ["broadcast_mark_deleted"])
    }

    func testAChannelAPNsWillNotMakeIsMarkedFailedAndTheActivityRunsWithoutOne() {
        claimAndSend(claimRow("job-1", .create), activity("job-1"))
        sender.answer(apns(400, #"{"reason":"BadRequest"}"#))
        XCTAssertEqual(session.pending, ["broadcast_mark_failed"])
        answer()
        XCTAssertEqual(metrics.broadcasts["refused"], 1)
    }

    func testAnEndedActivitysChannelIsDeletedAndItsRowGoes() {
        claimAndSend(claimRow("job-1", .delete, channel: "ch-1"), activity("job-1", state: .completed, channel: "ch-1"))
        XCTAssertEqual(sender.requests[0].method, "DELETE")
        XCTAssertEqual(headers(sender.requests[0])["apns-channel-id"], "ch-1")
        sender.answer(apns(204))
        XCTAssertEqual(session.pending, ["broadcast_mark_deleted"])
        answer()
        XCTAssertEqual(metrics.broadcasts["deleted"], 1)
        loop.advance(by: 1)
        XCTAssertEqual(session.pending, [], "nothing made the row due again: the cycle is over")
    }

    // MARK: - Failure paths

    func testASessionLostMidClaimEndsTheCycleAndAPollClaimsOnceItIsBack() {
        service.poll()
        session.connectionLost()
        loop.runSoon()
        service.poll()
        XCTAssertEqual(session.pending, [], "no claim while the session is down")
        loop.advance(by: 5)
        session.driver.socketReady()
        loop.runSoon()
        service.poll()
        XCTAssertEqual(session.pending, Self.claim, "the lost claim did not leave a cycle running")
    }

    func testASessionLostMidReadSendsNothingAndTheLeaseBringsTheRowsBack() {
        service.poll()
        answer(["broadcast_claim": claimRow("job-1", .live, channel: "ch-1")], inUse: true)
        XCTAssertEqual(session.pending, ["broadcast_read"])
        session.connectionLost()
        loop.runSoon()
        XCTAssertEqual(sender.requests.count, 0)
        loop.advance(by: 5)
        session.driver.socketReady()
        loop.runSoon()
        service.poll()
        XCTAssertEqual(session.pending, Self.claim, "the cycle ended: the next poll claims")
    }

    func testASessionLostMidMarkEndsTheCycle() {
        claimAndSend(claimRow("job-1", .live, channel: "ch-1"), activity("job-1", channel: "ch-1"))
        sender.answer(apns(200))
        XCTAssertEqual(session.pending, ["broadcast_mark_pushed"])
        session.connectionLost()
        loop.runSoon()
        loop.advance(by: 5)
        session.driver.socketReady()
        loop.runSoon()
        service.poll()
        XCTAssertEqual(session.pending, Self.claim)
    }

    func testAClaimAnsweredAfterCloseReadsNothing() {
        service.poll()
        service.close()
        answer(["broadcast_claim": claimRow("job-1", .live, channel: "ch-1")], inUse: true)
        XCTAssertEqual(session.pending, [])
        service.poll()
        XCTAssertEqual(session.pending, [], "no claim after close")
    }

    func testAnAPNsAnswerAfterCloseMarksNothing() {
        claimAndSend(claimRow("job-1", .create), activity("job-1"))
        service.close()
        sender.answer(apns(201, channel: "ch-1"))
        loop.runSoon()
        XCTAssertEqual(session.pending, [], "the lease brings the row back to whoever runs next")
        XCTAssertEqual(metrics.broadcasts["created"], nil)
    }

    func testAWakeUpTimerDueAfterCloseClaimsNothing() {
        service.poll()
        answer(inUse: true)
        service.kick()
        service.close()
        loop.advance(by: 1)
        XCTAssertEqual(session.pending, [])
    }

    func testWithoutAProviderTokenEachJobIsRetriedInASecond() {
        service.poll()
        answer(["broadcast_claim": claimRow("job-1", .live, channel: "ch-1")], inUse: true)
        answer(["broadcast_read": activity("job-1", channel: "ch-1")])
        XCTAssertEqual(session.pending, ["apns_token_read"])
        answer(["apns_token_read": .failure("relation does not exist", sqlState: "42P01")])
        XCTAssertEqual(sender.requests.count, 0)
        XCTAssertEqual(session.pending, ["broadcast_mark_retry"])
        XCTAssertEqual(session.parameters(of: "broadcast_mark_retry"), ["job-1", "70", "1000", "no provider token"])
    }

    func testTooManyProviderTokenUpdatesPausesTheDeploymentUntilATokenMayBeMadeAgain() {
        claimAndSend(claimRow("job-1", .live, channel: "ch-1"), activity("job-1", channel: "ch-1"))
        sender.answer(apns(429, #"{"reason":"TooManyProviderTokenUpdates"}"#))
        let until = storedIssuedAt + Int64(ProviderTokenPolicy().minRenewAge)
        XCTAssertEqual(paused, [until], "the token sender of this process is told")
        XCTAssertEqual(session.pending, ["apns_token_pause", "broadcast_mark_retry"], "stored for every process's claims, the row retried after it")
        XCTAssertEqual(session.parameters(of: "apns_token_pause")?[2], String(until))
        XCTAssertEqual(session.parameters(of: "broadcast_mark_retry")?[2], String((until - Int64(loop.now)) * 1000))
        XCTAssertEqual(metrics.broadcasts["paused"], 1)
    }

    func testAnExpiredProviderTokenIsNotUsedAgain() {
        claimAndSend(claimRow("job-1", .live, channel: "ch-1"), activity("job-1", channel: "ch-1"))
        sender.answer(apns(403, #"{"reason":"ExpiredProviderToken"}"#))
        XCTAssertEqual(session.pending, ["broadcast_mark_retry"])
        answer()
        loop.advance(by: 1)
        service.poll()
        answer(["broadcast_claim": claimRow("job-1", .live, channel: "ch-1", attempts: 2)], inUse: true)
        answer(["broadcast_read": activity("job-1", channel: "ch-1")])
        XCTAssertEqual(session.pending, ["apns_token_read"], "the refused token is read again, not reused")
        answer(["apns_token_read": storedToken()])
        XCTAssertEqual(session.pending, ["apns_token_lock", "apns_token_read"], "the stored one is the refused one: a new one is made")
        answer(["apns_token_read": storedToken()])
        XCTAssertEqual(session.pending, ["apns_token_store", "apns_token_unlock"])
        answer()
        XCTAssertEqual(sender.unanswered, 1)
        XCTAssertNotEqual(headers(sender.requests[1])["authorization"], "bearer " + storedJWT)
    }
}
