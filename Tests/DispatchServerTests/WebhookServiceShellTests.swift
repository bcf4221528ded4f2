import DispatchCore
import DispatchCrypto
import DispatchHarness
import DispatchIO
import XCTest
@testable import DispatchServer

/// WebhookService in one process: claims and marks answered on a scripted reader session,
/// deliveries answered by a scripted HTTP client, time on a manual loop.
final class WebhookServiceShellTests: XCTestCase {
    var loop: ManualLoop!
    var scripted: ScriptedDatabase!
    var sender: ScriptedSender!
    var service: WebhookService!
    var metrics: Metrics!
    var options: CurlClient.Options?
    let secret = "whsec-shell-test"

    override func setUp() {
        loop = ManualLoop()
        metrics = Metrics(worker: 0)
        scripted = ScriptedDatabase(loop: loop, metrics: metrics)
        sender = ScriptedSender()
        service = WebhookService(loop: loop, db: scripted.db, secret: secret, allowPrivateAddresses: false, retentionDays: 7,
                                 log: Logger(level: .error), metrics: metrics, attemptTimeout: 10) { [unowned self] in
            self.options = $0
            return self.sender
        }
    }

    override func tearDown() {
        service.stop()
        scripted.answer(on: scripted.reader) { _ in PGResult() }
        scripted.db.close()
        loop.runSoon()
        XCTAssertEqual(scripted.violations, [])
    }

    /// A claimed row as `webhook_claim` returns it.
    func claimed(_ rows: [(id: Int64, attempts: Int)]) -> PGResult {
        PGResult(columns: ["id", "delivery_id", "activity_id", "url", "body", "attempts", "key_id", "host", "seconds_left"],
                 rows: rows.map { r in
                     [String(r.id), "dlv_\(r.id)", "job-\(r.id)", "https://ci.example.com/cancel/\(r.id)",
                      #"{"activityId":"job-\#(r.id)","reason":"stop"}"#, String(r.attempts), "7", "ci.example.com", "86000"]
                 })
    }

    func ok(_ status: Int) -> Result<CurlClient.Response, HTTPClientFailure> {
        .success(CurlClient.Response(status: status, httpVersion: "1.1", headers: [], body: []))
    }

    /// Claims what the scripted reader is asked for with `rows`, and everything else with an
    /// empty result (the marks).
    func answerReader(claim rows: [(id: Int64, attempts: Int)] = []) {
        scripted.answer(on: scripted.reader) { name in name == "webhook_claim" ? self.claimed(rows) : PGResult() }
    }

    func testAClaimedDeliveryIsSignedSentAndMarkedDelivered() throws {
        XCTAssertEqual(options?.maxHostConnections, WebhookService.perHost)
        XCTAssertEqual(options?.connectTimeout, 5, "the connect gets half the attempt at most")
        service.kick()
        XCTAssertEqual(scripted.pending(on: scripted.reader), ["webhook_claim"])
        answerReader(claim: [(id: 1, attempts: 1)])
        XCTAssertEqual(sender.requests.count, 1)
        let request = try XCTUnwrap(sender.requests.first)
        XCTAssertEqual(request.url, "https://ci.example.com/cancel/1")
        XCTAssertEqual(request.timeout, 10)
        let headers = Dictionary(uniqueKeysWithValues: request.headers)
        XCTAssertEqual(headers["Dispatch-Delivery"], "dlv_1")
        // The signature verifies against the body it was sent with.
        let signature = try XCTUnwrap(headers["Dispatch-Signature"])
        let t = try XCTUnwrap(Int64(signature.dropFirst(2).prefix { $0 != "," }))
        let body = String(decoding: request.body, as: UTF8.self)
        let mac = HMACSHA256.hex(key: Array(secret.utf8), message: Array(CancelWebhook.signedText(timestamp: t, body: body).utf8))
        XCTAssertEqual(signature, "t=\(t),v1=\(mac)")

        sender.answer(ok(204))
        XCTAssertEqual(scripted.pending(on: scripted.reader), ["webhook_delivered"])
        answerReader()
        XCTAssertEqual(metrics.webhookDeliveries[.delivered], 1)
    }

    /// No answer comes back later; an address the policy refuses is never retried.
    func testATimeoutIsRetriedLaterAndARefusedAddressFailsAtOnce() {
        service.kick()
        answerReader(claim: [(id: 1, attempts: 1), (id: 2, attempts: 1)])
        XCTAssertEqual(sender.requests.count, 2)
        sender.answer(.failure(HTTPClientFailure(.timeout, message: "no first byte in 6 s")))
        sender.answer(.failure(HTTPClientFailure(.refusedAddress, message: "10.0.0.1 is private")))
        XCTAssertEqual(scripted.pending(on: scripted.reader), ["webhook_retry", "webhook_failed"])
        XCTAssertEqual(metrics.webhookDeliveries[.retried], 1)
        XCTAssertEqual(metrics.webhookDeliveries[.refused], 1)
        answerReader()
    }

    /// Stopping while a delivery is out gives its claim back (due again at once, for any
    /// server) and the cancelled request marks nothing: at least once, never lost.
    func testStoppingMidSendGivesTheClaimBackAndTheCancelledAnswerMarksNothing() {
        service.kick()
        answerReader(claim: [(id: 3, attempts: 2)])
        XCTAssertEqual(sender.unanswered, 1)
        service.stop()
        XCTAssertTrue(sender.closed)
        XCTAssertEqual(scripted.pending(on: scripted.reader), ["webhook_release"])
        XCTAssertEqual(metrics.webhookDeliveries.values.reduce(0, +), 0)
    }

    /// A mark the database refuses is only logged: the row's lease brings it back, and the
    /// sender's slot is free again for the next claim.
    func testAFailedMarkFreesTheSlotAndTheLeaseBringsTheRowBack() {
        service.kick()
        answerReader(claim: [(id: 4, attempts: 1)])
        sender.answer(ok(200))
        XCTAssertEqual(scripted.pending(on: scripted.reader), ["webhook_delivered"])
        scripted.answer(on: scripted.reader) { _ in .failure("could not serialize access", sqlState: "40001") }
        service.kick()
        XCTAssertEqual(scripted.pending(on: scripted.reader), ["webhook_claim"], "a new claim once the mark is over")
        answerReader()
    }
}
