import DispatchCore
import DispatchSystem
import DispatchTestSupport
import Glibc
import XCTest

/// Contract §5.3: remote cancel, its signed webhook through the outbox, and touch (§5.4).
final class CancelTests: XCTestCase {
    static let secret = "whsec-test-0123456789abcdef"
    static let webhookEnvironment = ["DISPATCH_WEBHOOK_SECRET": secret, "DISPATCH_WEBHOOK_ALLOW_PRIVATE": "1"]

    // MARK: - Cancel

    func testCancelScopesOwnershipEventRepeatAndFinished() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        let pub1 = HTTPClient(port: s.port, token: try Kit.createKey(s, "pub1", ["publish"]))
        let pub2 = HTTPClient(port: s.port, token: try Kit.createKey(s, "pub2", ["publish"]))
        let device = HTTPClient(port: s.port, token: try Kit.createKey(s, "phone", ["device"]))
        let reader = HTTPClient(port: s.port, token: try Kit.createKey(s, "reader", ["read"]))
        XCTAssertEqual(try pub1.post("/v1/activities/start", #"{"activityId":"owned","taskName":"Owned","state":"processing"}"#).status, 201)
        XCTAssertEqual(try pub2.post("/v1/activities/start", #"{"activityId":"other","taskName":"Other"}"#).status, 201)

        // Who may ask.
        Kit.assertError(try reader.post("/v1/activities/owned/cancel", "{}"), 403, "forbidden")
        Kit.assertError(try pub2.post("/v1/activities/owned/cancel", "{}"), 403, "forbidden", "a publish key that did not start it")
        Kit.assertError(try HTTPClient(port: s.port).post("/v1/activities/owned/cancel", "{}"), 401, "unauthorized")
        Kit.assertError(try s.client.post("/v1/activities/nobody/cancel", "{}"), 404, "not_found")
        // Bad input changes nothing.
        Kit.assertError(try pub1.post("/v1/activities/owned/cancel", #"{"reason":"\#(String(repeating: "x", count: 201))"}"#), 400, "invalid_field")
        Kit.assertError(try pub1.post("/v1/activities/owned/cancel", #"{"reason":"two\nlines"}"#), 400, "invalid_field")
        Kit.assertError(try pub1.post("/v1/activities/owned/cancel", #"{"why":"x"}"#), 400, "unknown_field")
        Kit.assertError(try pub1.post("/v1/activities/owned/cancel", "reason=x", headers: ["Content-Type": "text/plain"]), 415, "unsupported_media_type")
        Kit.assertError(try pub1.request("GET", "/v1/activities/owned/cancel"), 405, "method_not_allowed")
        XCTAssertEqual(try s.seq("owned"), 1)

        // The owner asks: 202, cancelRequested, a new seq, the state unchanged, and the event on a live stream.
        let stream = try s.stream("owned")
        XCTAssertEqual(try stream.waitForEvents(1).count, 1)
        let r = try pub1.post("/v1/activities/owned/cancel", #"{"reason":"disk full"}"#)
        XCTAssertEqual(r.status, 202, r.text)
        XCTAssertEqual(r.json?["cancelRequested"], .bool(true))
        XCTAssertEqual(r.json?["seq"], .number(2))
        XCTAssertEqual(r.json?["state"], .string("processing"))
        let events = try stream.waitForEvents(2)
        XCTAssertEqual(events.count, 2)
        XCTAssertEqual(events.last?.event, "cancel_requested")
        XCTAssertEqual(events.last?.id, "2")
        let data = try JSONParser.parse(events.last?.data ?? "")
        XCTAssertEqual(data["cancelRequested"], .bool(true))
        XCTAssertEqual(data["state"], .string("processing"))
        XCTAssertEqual(data["cancelReason"], .string("disk full"), "the publisher learns why from the stream")
        XCTAssertEqual(try s.client.get("/v1/activities/owned").json?["cancelReason"], .string("disk full"))
        XCTAssertEqual(try Kit.sql(s, "SELECT cancel_reason FROM activities WHERE activity_id = 'owned'"), ["disk full"])

        // A repeat (from anyone allowed) is 202 and writes nothing.
        let again = try device.post("/v1/activities/owned/cancel", "")
        XCTAssertEqual(again.status, 202, again.text)
        XCTAssertEqual(again.json, .object([("activityId", .string("owned")), ("cancelRequested", .bool(true))]),
                       "a device-only key may not read: no snapshot (§6)")
        XCTAssertEqual(try pub1.post("/v1/activities/owned/cancel", "").json?["seq"], .number(2))
        XCTAssertEqual(try s.client.post("/v1/activities/owned/cancel", #"{"reason":"again"}"#).status, 202)
        XCTAssertEqual(try Kit.sql(s, "SELECT count(*) FROM activity_events WHERE activity_id = 'owned'"), ["2"])
        XCTAssertEqual(try Kit.sql(s, "SELECT cancel_reason FROM activities WHERE activity_id = 'owned'"), ["disk full"])
        XCTAssertEqual(try Kit.sql(s, "SELECT count(*) FROM webhook_outbox"), ["0"], "no cancelURL, no webhook")

        // device and admin keys may cancel any activity; without a body is fine.
        XCTAssertEqual(try device.post("/v1/activities/other/cancel", "").status, 202)
        XCTAssertEqual(try s.client.request("POST", "/v1/activities/other/cancel").status, 202)

        // The publisher ends it; watchers saw the request before the end. Then 409 with the snapshot.
        XCTAssertEqual(try pub1.post("/v1/activities/owned/end", #"{"state":"cancelled","status":"Stopped"}"#).status, 200)
        XCTAssertTrue(try stream.waitForEnd())
        XCTAssertEqual(stream.events.map(\.event), ["processing", "cancel_requested", "cancelled"])
        let late = try device.post("/v1/activities/owned/cancel", "{}")
        Kit.assertError(late, 409, "already_finished")
        XCTAssertNil(late.json?["activity"], "no snapshot to a key that may not read")
        let lateOwner = try pub1.post("/v1/activities/owned/cancel", "{}")
        Kit.assertError(lateOwner, 409, "already_finished")
        XCTAssertEqual(lateOwner.json?["activity"]?["state"], .string("cancelled"))
    }

    // MARK: - Touch

    func testTouchRenewsTheDeadlineWithoutAnEvent() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        let pub1 = HTTPClient(port: s.port, token: try Kit.createKey(s, "pub1", ["publish"]))
        let pub2 = HTTPClient(port: s.port, token: try Kit.createKey(s, "pub2", ["publish"]))
        let reader = HTTPClient(port: s.port, token: try Kit.createKey(s, "reader", ["read"]))
        XCTAssertEqual(try pub1.post("/v1/activities/start", #"{"activityId":"t1","taskName":"T","staleAfter":600}"#).status, 201)
        XCTAssertEqual(try pub1.post("/v1/activities/start", #"{"activityId":"never","taskName":"N","staleAfter":600}"#).status, 201)
        let before = try XCTUnwrap(Int64(try Kit.sql(s, "SELECT greatest(updated_ms, coalesce(touched_ms, 0)) + stale_after_s * 1000 FROM activities WHERE activity_id = 't1'")[0] ?? ""))
        let stream = try s.stream("t1")
        XCTAssertEqual(try stream.waitForEvents(1).count, 1)
        waitForNextMillisecond()

        let r = try pub1.request("POST", "/v1/activities/t1/touch")
        XCTAssertEqual(r.status, 204, r.text)
        XCTAssertTrue(r.body.isEmpty)
        let after = try XCTUnwrap(Int64(try Kit.sql(s, "SELECT greatest(updated_ms, coalesce(touched_ms, 0)) + stale_after_s * 1000 FROM activities WHERE activity_id = 't1'")[0] ?? ""))
        XCTAssertGreaterThan(after, before)
        XCTAssertEqual(try s.client.request("POST", "/v1/activities/t1/touch").status, 204, "an admin may touch")
        // No event, no history row, no new seq, no feed position.
        XCTAssertEqual(try s.seq("t1"), 1)
        XCTAssertEqual(try Kit.sql(s, "SELECT count(*) FROM activity_events WHERE activity_id = 't1'"), ["1"])
        try stream.pump(timeout: 0.5)
        XCTAssertEqual(stream.events.count, 1)

        Kit.assertError(try pub2.request("POST", "/v1/activities/t1/touch"), 403, "forbidden")
        Kit.assertError(try reader.request("POST", "/v1/activities/t1/touch"), 403, "forbidden")
        Kit.assertError(try pub1.request("POST", "/v1/activities/nobody/touch"), 404, "not_found")
        Kit.assertError(try pub1.request("GET", "/v1/activities/t1/touch"), 405, "method_not_allowed")
        XCTAssertEqual(try pub1.post("/v1/activities/t1/end", "{}").status, 200)
        let finished = try pub1.request("POST", "/v1/activities/t1/touch")
        Kit.assertError(finished, 409, "already_finished")
        XCTAssertEqual(finished.json?["activity"]?["state"], .string("completed"))
        XCTAssertEqual(try Kit.sql(s, "SELECT stale_at_ms IS NULL FROM activities WHERE activity_id = 't1'"), ["t"])
    }

    // MARK: - Webhooks

    /// The documented verification, done independently of our code: openssl's HMAC-SHA256 of
    /// "t.body" under the secret must be the header's v1.
    func testWebhookIsSignedVerifiableAndOnlySentWithACancelURL() throws {
        let receiver = try WebhookReceiver()
        let s = try TestServer.start(environment: Self.webhookEnvironment)
        defer { s.stop() }
        try s.startActivity("no-url")
        try s.startActivity("with-url", extra: #","cancelURL":"\#(receiver.url("/hook?job=1"))""#)
        XCTAssertEqual(try s.client.post("/v1/activities/no-url/cancel", #"{"reason":"not wanted"}"#).status, 202)
        let before = Int64(Clock.wallSeconds())
        XCTAssertEqual(try s.client.post("/v1/activities/with-url/cancel", #"{"reason":"user asked"}"#).status, 202)
        let got = try receiver.waitForRequests(1)
        XCTAssertEqual(got.count, 1, s.log())
        let call = try XCTUnwrap(got.first)
        XCTAssertEqual(call.path, "/hook?job=1")
        XCTAssertEqual(call.headers["content-type"], "application/json")
        let deliveryID = try Kit.sql(s, "SELECT delivery_id FROM webhook_outbox WHERE activity_id = 'with-url'")
        XCTAssertEqual(call.headers["dispatch-delivery"], deliveryID.first ?? nil)
        let body = try JSONParser.parse(call.body)
        XCTAssertEqual(body["activityId"], .string("with-url"))
        XCTAssertEqual(body["reason"], .string("user asked"))
        XCTAssertEqual(body["seq"], .number(2))
        guard case .string(let requestedAt)? = body["requestedAt"] else { return XCTFail(call.body) }
        XCTAssertNotNil(Timestamp.parse(requestedAt))

        let header = try XCTUnwrap(call.headers["dispatch-signature"])
        let parts = Dictionary(header.split(separator: ",").map { p -> (String, String) in
            let kv = p.split(separator: "=", maxSplits: 1)
            return (String(kv[0]), String(kv.count > 1 ? kv[1] : ""))
        }, uniquingKeysWith: { a, _ in a })
        let t = try XCTUnwrap(parts["t"].flatMap { Int64($0) }, header)
        XCTAssertTrue((before - 5)...(Int64(Clock.wallSeconds()) + 5) ~= t, "t is the time of sending: \(t)")
        XCTAssertEqual(parts["v1"], try Kit.opensslHMAC(key: Self.secret, message: "\(t).\(call.body)"))
        XCTAssertNotEqual(parts["v1"], try Kit.opensslHMAC(key: "another-secret-0123456789", message: "\(t).\(call.body)"))

        XCTAssertTrue(try waitUntil { try Kit.sql(s, "SELECT state || ' ' || attempts FROM webhook_outbox") == ["delivered 1"] })
        XCTAssertEqual(try Kit.sql(s, "SELECT count(*) FROM webhook_outbox WHERE activity_id = 'no-url'"), ["0"])
        // The no-URL cancel was committed before the other; still nothing came for it.
        XCTAssertEqual(try receiver.requests().count, 1)
        XCTAssertEqual(try s.metric("dispatch_webhook_deliveries_total", labels: "result=\"delivered\""), 1)
    }

    func testWebhookRetriedAfterA500AndADroppedConnectionWithOneDeliveryID() throws {
        let receiver = try WebhookReceiver()
        // The drop comes first, on a fresh connection: curl itself resends a request once when a
        // reused keep-alive connection turns out dead, which would hide our own retry.
        try receiver.script([#"{"action":"drop"}"#, #"{"status":500}"#])
        let s = try TestServer.start(environment: Self.webhookEnvironment)
        defer { s.stop() }
        try s.startActivity("flaky", extra: #","cancelURL":"\#(receiver.url())""#)
        XCTAssertEqual(try s.client.post("/v1/activities/flaky/cancel", "{}").status, 202)
        let got = try receiver.waitForRequests(3)
        XCTAssertEqual(got.count, 3, s.log())
        XCTAssertEqual(Set(got.compactMap { $0.headers["dispatch-delivery"] }).count, 1, "every attempt carries the same delivery id")
        XCTAssertEqual(Set(got.map(\.body)).count, 1, "and the same body")
        // Each attempt is signed when it is sent, and each signature verifies.
        for call in got {
            let sig = try XCTUnwrap(CancelWebhook.parseSignature(call.headers["dispatch-signature"] ?? ""))
            XCTAssertEqual(sig.signatures, [try Kit.opensslHMAC(key: Self.secret, message: "\(sig.timestamp).\(call.body)")])
        }
        let row = "SELECT state || ' ' || attempts || ' ' || last_status FROM webhook_outbox"
        XCTAssertTrue(try waitUntil { try Kit.sql(s, row) == ["delivered 3 HTTP 200"] }, "\((try? Kit.sql(s, row)) ?? [])")
        XCTAssertGreaterThan(got[1].time - got[0].time, 0.9, "backoff: at least half the first 2 s step")
        XCTAssertEqual(try s.metric("dispatch_webhook_deliveries_total", labels: "result=\"retried\""), 2)
        XCTAssertEqual(try s.metric("dispatch_webhook_deliveries_total", labels: "result=\"delivered\""), 1)
    }

    /// "Once" is at least once under one delivery id: a receiver that answers after the 10 s
    /// deadline gets the same delivery again (and de-duplicates on `Dispatch-Delivery`); once a
    /// 2xx is received the row is delivered and never sent again.
    func testALateAnswerIsRetriedUnderTheSameDeliveryIDThenNeverAgain() throws {
        let receiver = try WebhookReceiver()
        try receiver.script([#"{"action":"delay","seconds":12,"status":200}"#])
        let s = try TestServer.start(environment: Self.webhookEnvironment)
        defer { s.stop() }
        try s.startActivity("slow", extra: #","cancelURL":"\#(receiver.url())""#)
        XCTAssertEqual(try s.client.post("/v1/activities/slow/cancel", "{}").status, 202)
        let got = try receiver.waitForRequests(2, timeout: 40)
        XCTAssertEqual(got.count, 2, s.log())
        XCTAssertEqual(got[0].headers["dispatch-delivery"], got[1].headers["dispatch-delivery"])
        XCTAssertEqual(got[0].body, got[1].body)
        XCTAssertTrue(try waitUntil { try Kit.sql(s, "SELECT state || ' ' || attempts FROM webhook_outbox") == ["delivered 2"] })
        XCTAssertTrue(try Kit.sql(s, "SELECT last_status FROM webhook_outbox").first??.contains("HTTP 200") ?? false)
        // Delivered means done: nothing more comes (a bounded look, past the next retry step).
        Clock.sleep(seconds: 3)
        XCTAssertEqual(try receiver.requests().count, 2)
    }

    func testTheOutboxSurvivesARestart() throws {
        let receiver = try WebhookReceiver()
        try receiver.script([], otherwise: #"{"status":503}"#)
        let s = try TestServer.start(environment: Self.webhookEnvironment)
        defer { s.stop() }
        try s.startActivity("durable", extra: #","cancelURL":"\#(receiver.url())""#)
        XCTAssertEqual(try s.client.post("/v1/activities/durable/cancel", "{}").status, 202)
        let first = try receiver.waitForRequests(1)
        XCTAssertEqual(first.count, 1, s.log())
        s.stop()
        XCTAssertEqual(try Kit.sql(s, "SELECT state FROM webhook_outbox"), ["pending"])
        try receiver.script([], otherwise: #"{"status":200}"#)
        try receiver.clear()
        try s.launch()
        let after = try receiver.waitForRequests(1)
        XCTAssertEqual(after.count, 1, s.log())
        XCTAssertEqual(after.first?.headers["dispatch-delivery"], first.first?.headers["dispatch-delivery"])
        XCTAssertTrue(try waitUntil { try Kit.sql(s, "SELECT state FROM webhook_outbox") == ["delivered"] })
    }

    func testAPrivateAddressIsRefusedWithoutAllowPrivate() throws {
        let receiver = try WebhookReceiver()
        let s = try TestServer.start(environment: ["DISPATCH_WEBHOOK_SECRET": Self.secret])
        defer { s.stop() }
        try s.startActivity("ssrf", extra: #","cancelURL":"\#(receiver.url())""#)
        XCTAssertEqual(try s.client.post("/v1/activities/ssrf/cancel", "{}").status, 202)
        XCTAssertTrue(try waitUntil { try Kit.sql(s, "SELECT state FROM webhook_outbox") == ["failed"] }, s.log())
        let status = try Kit.sql(s, "SELECT last_status FROM webhook_outbox").first ?? nil
        XCTAssertTrue(status?.contains("refused") == true && status?.contains("127.0.0.1") == true, status ?? "")
        XCTAssertEqual(try receiver.requests().count, 0)
        XCTAssertEqual(try s.metric("dispatch_webhook_deliveries_total", labels: "result=\"refused\""), 1)
        XCTAssertTrue(s.log().contains("webhook.refused"))

        // The operator sees it, and can send it again once the configuration allows it.
        let status1 = Kit.dispatchd(s, ["webhooks", "status"])
        XCTAssertEqual(status1.status, 0, status1.output)
        XCTAssertTrue(status1.output.contains("failed 1"), status1.output)
        XCTAssertTrue(status1.output.contains("refused"), status1.output)
        s.stop()
        s.environment["DISPATCH_WEBHOOK_ALLOW_PRIVATE"] = "1"
        let id = try XCTUnwrap(try Kit.sql(s, "SELECT delivery_id FROM webhook_outbox").first ?? nil)
        XCTAssertEqual(Kit.dispatchd(s, ["webhooks", "retry", id]).status, 0)
        XCTAssertEqual(Kit.dispatchd(s, ["webhooks", "retry", "no-such-delivery"]).status, 3)
        try s.launch()
        XCTAssertEqual(try receiver.waitForRequests(1).count, 1, s.log())
        XCTAssertTrue(try waitUntil { try Kit.sql(s, "SELECT state FROM webhook_outbox") == ["delivered"] })
    }
}

/// Helpers shared by the cancel and stale tests.
enum Kit {
    static func assertError(_ r: HTTPClient.Response, _ status: Int, _ code: String, _ context: String = "",
                            file: StaticString = #filePath, line: UInt = #line) {
        XCTAssertEqual(r.status, status, "\(context): \(r.text)", file: file, line: line)
        XCTAssertEqual(r.errorCode, code, "\(context): \(r.text)", file: file, line: line)
    }

    static func createKey(_ s: TestServer, _ name: String, _ scopes: [String]) throws -> String {
        let r = try s.client.post("/v1/keys", #"{"name":"\#(name)","scopes":[\#(scopes.map { "\"\($0)\"" }.joined(separator: ","))]}"#)
        guard r.status == 201, case .string(let secret)? = r.json?["secret"] else { throw TestError("create key \(name): \(r.status) \(r.text)") }
        return secret
    }

    /// One column of a query's rows.
    static func sql(_ s: TestServer, _ query: String) throws -> [String?] {
        try TestPostgres.shared().sql(s.conninfo, query).map { $0.first ?? nil }
    }

    /// HMAC-SHA256 as hex, computed by the openssl CLI (not our code).
    static func opensslHMAC(key: String, message: String) throws -> String {
        let path = "/tmp/dispatch-hmac-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        defer { unlink(path) }
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        _ = Array(message.utf8).withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        close(fd)
        let out = Subprocess.run(["/usr/bin/openssl", "dgst", "-sha256", "-hmac", key, "-r", path])
        guard out.status == 0, let hex = out.output.split(separator: " ").first else { throw TestError("openssl: \(out.output)") }
        return String(hex)
    }

    /// `dispatchd ARGS` against the server's database.
    static func dispatchd(_ s: TestServer, _ args: [String]) -> Subprocess.Output {
        var env = Subprocess.currentEnvironment()
        env["DATABASE_URL"] = s.conninfo
        env["DISPATCH_MIGRATIONS_DIR"] = TestPaths.repositoryRoot + "/Migrations"
        env["DISPATCH_LOG_LEVEL"] = "warning"
        return Subprocess.run([TestPaths.binary("dispatchd")] + args, environment: env)
    }
}
