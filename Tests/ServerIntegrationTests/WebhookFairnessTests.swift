import DispatchCore
import DispatchSystem
import DispatchTestSupport
import Glibc
import XCTest

/// Issue 24 item 2: one key whose cancelURLs accept and never answer (a tarpit) cannot delay
/// another key's cancel webhook beyond one attempt's deadline. It used to wait 59 s: 64
/// deliveries in flight at 10 s each, first come first served.
final class WebhookFairnessTests: XCTestCase {
    /// A listening socket nobody accepts from: the kernel completes every connection and
    /// buffers every request, and no answer ever comes.
    final class Tarpit {
        let fd: Int32
        let port: Int

        init() throws {
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var addr = sockaddr_in()
            addr.sin_family = sa_family_t(AF_INET)
            addr.sin_addr.s_addr = inet_addr("127.0.0.1")
            var len = socklen_t(MemoryLayout<sockaddr_in>.size)
            let ok = withUnsafeMutablePointer(to: &addr) { p in
                p.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, len) == 0 && getsockname(fd, $0, &len) == 0 }
            }
            guard ok, listen(fd, 1024) == 0 else { close(fd); throw TestError("tarpit: cannot listen") }
            self.fd = fd
            port = Int(UInt16(bigEndian: addr.sin_port))
        }

        deinit { close(fd) }
    }

    func testATarpitKeyCannotDelayAnotherKeysWebhookBeyondOneDeadline() throws {
        let deadline = 4.0
        let tarpit = try Tarpit()
        let receiver = try WebhookReceiver()
        var env = CancelTests.webhookEnvironment
        env["DISPATCH_WEBHOOK_TIMEOUT"] = String(Int(deadline))
        env["DISPATCH_PUBLISH_RATE"] = "0"
        let s = try TestServer.start(environment: env)
        defer { s.stop() }
        let hostile = HTTPClient(port: s.port, token: try Kit.createKey(s, "tarpit", ["publish"]))
        let legit = HTTPClient(port: s.port, token: try Kit.createKey(s, "legit", ["publish"]))

        let tarpitURL = "http://127.0.0.1:\(tarpit.port)/hook"
        for i in 0..<300 {
            let start = try hostile.post("/v1/activities/start", #"{"activityId":"tar-\#(i)","taskName":"T","cancelURL":"\#(tarpitURL)"}"#)
            XCTAssertEqual(start.status, 201, start.text)
            XCTAssertEqual(try hostile.post("/v1/activities/tar-\(i)/cancel", "{}").status, 202)
        }
        XCTAssertTrue(waitUntil(10) { (try? Kit.sql(s, "SELECT count(*) FROM webhook_outbox WHERE attempts > 0").first ?? nil) != "0" },
                      "the sender took up the tarpit's deliveries")
        // As if the 300 cancels had all come at once: every tarpit delivery not in flight is due,
        // ahead of the legitimate one.
        _ = try Kit.sql(s, "UPDATE webhook_outbox SET due_at = now() - interval '1 minute' WHERE lease_until IS NULL AND state = 'pending'")

        XCTAssertEqual(try legit.post("/v1/activities/start", #"{"activityId":"fair-1","taskName":"F","cancelURL":"\#(receiver.url())"}"#).status, 201)
        let asked = Clock.monotonic()
        XCTAssertEqual(try legit.post("/v1/activities/fair-1/cancel", #"{"reason":"user asked"}"#).status, 202)
        let got = try receiver.waitForRequests(1, timeout: 30)
        let waited = Clock.monotonic() - asked
        XCTAssertEqual(got.count, 1, s.log())
        XCTAssertLessThan(waited, deadline + 1, "the legitimate webhook waited \(waited) s behind the tarpit")
        print("webhook fairness: the legitimate webhook arrived \(waited) s after its cancel, 300 tarpit deliveries queued")

        // Issue 24 item 10: the tarpit's retries are logged without its address.
        XCTAssertTrue(waitUntil(3 * deadline + 5) { s.log().contains("webhook.retry") }, s.log())
        let webhookLines = s.log().split(separator: "\n").filter { $0.contains("msg=webhook.") }
        XCTAssertFalse(webhookLines.isEmpty)
        for line in webhookLines {
            XCTAssertFalse(line.contains("127.0.0.1") || line.contains(String(tarpit.port)) || line.contains(String(receiver.port)), String(line))
        }
        let retry = try XCTUnwrap(webhookLines.first { $0.contains("webhook.retry") })
        XCTAssertTrue(retry.contains("status=timeout"), String(retry))
        // The whole status, host included, stays for the operator (dispatchd webhooks status).
        // The tarpit's rows only: the legitimate delivery's row says 200.
        let stored = try Kit.sql(s, "SELECT last_status FROM webhook_outbox WHERE activity_id LIKE 'tar-%' AND last_status IS NOT NULL ORDER BY activity_id LIMIT 1")
        XCTAssertTrue(stored.first??.hasPrefix("timeout") ?? false, "\(stored)")
    }

    /// Issue 24 item 10: a refused connection's retry line names the kind of failure, not the
    /// host (curl's own message, "Failed to connect to 127.0.0.1 port N", used to be logged).
    func testRetryLinesCarryNoHost() throws {
        let closedPort = try TestServer.freePort()
        let s = try TestServer.start(environment: CancelTests.webhookEnvironment)
        defer { s.stop() }
        try s.startActivity("nohost", extra: #","cancelURL":"http://localhost:\#(closedPort)/hook""#)
        XCTAssertEqual(try s.client.post("/v1/activities/nohost/cancel", "{}").status, 202)
        XCTAssertTrue(waitUntil(20) { s.log().contains("msg=webhook.retry") }, s.log())
        let lines = s.log().split(separator: "\n").filter { $0.contains("msg=webhook.") }
        for line in lines {
            XCTAssertFalse(line.contains("localhost") || line.contains("127.0.0.1") || line.contains(String(closedPort)), String(line))
        }
        XCTAssertTrue(lines.contains { $0.contains("msg=webhook.retry") && $0.contains("status=connect") }, lines.joined(separator: "\n"))
        let stored = try Kit.sql(s, "SELECT last_status FROM webhook_outbox").first ?? nil
        XCTAssertTrue(stored?.contains(String(closedPort)) ?? false, "the operator's view keeps the detail: \(stored ?? "nil")")
    }
}
