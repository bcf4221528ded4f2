import XCTest
@testable import DispatchCore

/// The webhook outbox's sender, one transition per line, and the signature's format.
final class WebhookSenderTests: XCTestCase {
    typealias Action = WebhookSender.Action
    static let policy = Backoff(initial: 2, maximum: 3600, jitter: .equal)

    static func row(_ id: Int64, attempt: Int = 1, left: Double = 86_400) -> WebhookDelivery {
        WebhookDelivery(rowID: id, deliveryID: "d-\(id)", activityID: "a-\(id)", url: "https://example.com/hook", body: "{}",
                        attempt: attempt, secondsLeft: left)
    }

    func decide(_ answer: WebhookAnswer, attempt: Int = 1, now: Double = 100, giveUpAt: Double = 86_500, random: Double = 0.5) -> Action {
        WebhookSender.decide(Self.row(1, attempt: attempt), answer, now: now, giveUpAt: giveUpAt, policy: Self.policy, random: random)
    }

    func testAnyTwoHundredIsDeliveredAndEverythingElseIsRetried() {
        let d = Self.row(1)
        XCTAssertEqual(decide(.status(200)), .markDelivered(d, status: "HTTP 200"))
        XCTAssertEqual(decide(.status(204)), .markDelivered(d, status: "HTTP 204"))
        XCTAssertEqual(decide(.status(299)), .markDelivered(d, status: "HTTP 299"))
        // Redirects are not followed, and a 4xx may be a receiver being deployed: retried like a 5xx.
        XCTAssertEqual(decide(.status(301)), .markRetry(d, after: 1.5, status: "HTTP 301"))
        XCTAssertEqual(decide(.status(404)), .markRetry(d, after: 1.5, status: "HTTP 404"))
        XCTAssertEqual(decide(.status(500)), .markRetry(d, after: 1.5, status: "HTTP 500"))
        XCTAssertEqual(decide(.transient("timeout: 10 s")), .markRetry(d, after: 1.5, status: "timeout: 10 s"))
        XCTAssertEqual(decide(.transient("retryOnNewConnection: reset")), .markRetry(d, after: 1.5, status: "retryOnNewConnection: reset"))
    }

    func testRefusedAddressesAndBadURLsFailAtOnce() {
        let d = Self.row(1)
        XCTAssertEqual(decide(.refused("refused address 127.0.0.1 (loopback)")),
                       .markFailed(d, status: "refused: refused address 127.0.0.1 (loopback)", reason: .refused))
        XCTAssertEqual(decide(.invalid("bad URL")), .markFailed(d, status: "invalid: bad URL", reason: .invalid))
    }

    func testBackoffGrowsWithJitterUpToTheDeadline() {
        // attempt n waits uniformly in [cap/2, cap], cap = 2 s * 2^(n-1), at most an hour.
        for (attempt, low, high) in [(1, 1.0, 2.0), (2, 2.0, 4.0), (5, 16.0, 32.0), (20, 1800.0, 3600.0)] {
            guard case .markRetry(_, let lo, _) = decide(.status(503), attempt: attempt, random: 0),
                  case .markRetry(_, let hi, _) = decide(.status(503), attempt: attempt, random: 0.999_999_9) else { return XCTFail() }
            XCTAssertEqual(lo, low, accuracy: 1e-6, "attempt \(attempt)")
            XCTAssertEqual(hi, high, accuracy: 0.01, "attempt \(attempt)")
        }
        // The last retry lands on the 24-hour deadline, and a failure at or past it is final.
        XCTAssertEqual(decide(.status(500), attempt: 20, now: 1000, giveUpAt: 1100), .markRetry(Self.row(1, attempt: 20), after: 100, status: "HTTP 500"))
        XCTAssertEqual(decide(.status(500), attempt: 21, now: 1100, giveUpAt: 1100), .markFailed(Self.row(1, attempt: 21), status: "HTTP 500", reason: .gaveUp))
        XCTAssertEqual(decide(.transient("connect: refused"), now: 2000, giveUpAt: 1100), .markFailed(Self.row(1), status: "connect: refused", reason: .gaveUp))
        // A success after the deadline still counts.
        XCTAssertEqual(decide(.status(200), now: 2000, giveUpAt: 1100), .markDelivered(Self.row(1), status: "HTTP 200"))
    }

    func testClaimSendAnswerMark() {
        var s = WebhookSender(policy: Self.policy, maxInFlight: 4)
        XCTAssertEqual(s.tick(), [.claim(limit: 4)])
        XCTAssertEqual(s.tick(), [], "one claim at a time")
        XCTAssertEqual(s.claimed([Self.row(1), Self.row(2, attempt: 3)], now: 10), [.send(Self.row(1)), .send(Self.row(2, attempt: 3))])
        XCTAssertEqual(s.inFlight, 2)
        XCTAssertEqual(s.tick(), [.claim(limit: 2)], "room for two more")
        XCTAssertEqual(s.claimed([], now: 10), [])
        XCTAssertEqual(s.answered(1, .status(200), now: 11, random: 0), [.markDelivered(Self.row(1), status: "HTTP 200")])
        XCTAssertEqual(s.answered(1, .status(500), now: 11, random: 0), [], "a second answer for a row is ignored")
        XCTAssertEqual(s.inFlight, 2, "marking still holds its place")
        XCTAssertEqual(s.marked(1), [])
        XCTAssertEqual(s.answered(2, .status(500), now: 12, random: 0), [.markRetry(Self.row(2, attempt: 3), after: 4, status: "HTTP 500")])
        XCTAssertEqual(s.marked(2), [])
        XCTAssertEqual(s.inFlight, 0)
    }

    func testTheDeadlineCountsFromTheClaim() {
        var s = WebhookSender(policy: Self.policy, maxInFlight: 4)
        _ = s.tick()
        _ = s.claimed([Self.row(1, attempt: 7, left: 30)], now: 1000)
        XCTAssertEqual(s.answered(1, .status(502), now: 1010, random: 0), [.markRetry(Self.row(1, attempt: 7, left: 30), after: 20, status: "HTTP 502")])
        var t = WebhookSender(policy: Self.policy, maxInFlight: 4)
        _ = t.tick()
        _ = t.claimed([Self.row(1, attempt: 7, left: 30)], now: 1000)
        XCTAssertEqual(t.answered(1, .status(502), now: 1031, random: 0),
                       [.markFailed(Self.row(1, attempt: 7, left: 30), status: "HTTP 502", reason: .gaveUp)])
    }

    func testAFullClaimClaimsAgainOnceHalfTheRoomIsFree() {
        var s = WebhookSender(policy: Self.policy, maxInFlight: 2)
        XCTAssertEqual(s.tick(), [.claim(limit: 2)])
        _ = s.claimed([Self.row(1), Self.row(2)], now: 0)
        XCTAssertEqual(s.tick(), [], "no room")
        _ = s.answered(1, .status(200), now: 1, random: 0)
        XCTAssertEqual(s.marked(1), [.claim(limit: 1)], "more rows were due")
        XCTAssertEqual(s.claimed([Self.row(3)], now: 1), [.send(Self.row(3))])
        var quiet = WebhookSender(policy: Self.policy, maxInFlight: 4)
        _ = quiet.tick()
        _ = quiet.claimed([Self.row(1)], now: 0)
        _ = quiet.answered(1, .status(200), now: 1, random: 0)
        XCTAssertEqual(quiet.marked(1), [], "the claim was not full: wait for the next tick")
    }

    func testClaimFailureAndStop() {
        var s = WebhookSender(policy: Self.policy, maxInFlight: 4)
        _ = s.tick()
        XCTAssertEqual(s.claimFailed(), [])
        XCTAssertEqual(s.tick(), [.claim(limit: 4)], "a failed claim does not wedge the sender")
        _ = s.claimed([Self.row(1), Self.row(2)], now: 0)
        _ = s.answered(2, .status(200), now: 1, random: 0)
        XCTAssertEqual(s.stop(), [.release([Self.row(1)])], "unanswered claims go back; the answered one is being marked")
        XCTAssertEqual(s.answered(1, .status(200), now: 2, random: 0), [], "answers after stop are ignored")
        XCTAssertEqual(s.tick(), [])
        XCTAssertEqual(s.marked(2), [])
        XCTAssertEqual(s.stop(), [])
        var claiming = WebhookSender(policy: Self.policy, maxInFlight: 4)
        _ = claiming.tick()
        _ = claiming.stop()
        XCTAssertEqual(claiming.claimed([Self.row(5)], now: 0), [.release([Self.row(5)])], "a claim answered after stop is given back")
    }

    func testSignatureFormatRoundTrips() {
        let body = CancelWebhook.body(activityID: "job-1", reason: "user asked", requestedAt: 1_796_070_000_123, seq: 7)
        XCTAssertEqual(body, #"{"activityId":"job-1","reason":"user asked","requestedAt":"2026-11-30T20:20:00.123Z","seq":7}"#)
        XCTAssertEqual(CancelWebhook.signedText(timestamp: 1_796_070_000, body: "{}"), "1796070000.{}")
        let header = CancelWebhook.signatureHeader(timestamp: 1_796_070_000, hexMAC: String(repeating: "ab", count: 32))
        XCTAssertEqual(header, "t=1796070000,v1=" + String(repeating: "ab", count: 32))
        let parsed = CancelWebhook.parseSignature(header)
        XCTAssertEqual(parsed?.timestamp, 1_796_070_000)
        XCTAssertEqual(parsed?.signatures, [String(repeating: "ab", count: 32)])
        let (a, b) = (String(repeating: "a", count: 64), String(repeating: "b", count: 64))
        XCTAssertEqual(CancelWebhook.parseSignature("v1=\(a), t=5 ,v1=\(b.uppercased()),v0=zz")?.signatures, [a, b])
        XCTAssertNil(CancelWebhook.parseSignature("t=5"))
        XCTAssertNil(CancelWebhook.parseSignature("v1=aa"))
        XCTAssertNil(CancelWebhook.parseSignature("t=now,v1=aa"))
        XCTAssertNil(CancelWebhook.parseSignature("garbage"))
    }

    // MARK: - Fairness (issue 24 item 2)

    static func row(_ id: Int64, key: Int64, host: String) -> WebhookDelivery {
        WebhookDelivery(rowID: id, deliveryID: "d-\(id)", activityID: "a-\(id)", url: "https://\(host)/hook", body: "{}",
                        attempt: 1, secondsLeft: 86_400, key: key, host: host)
    }

    func testRowsAreInterleavedRoundRobinBetweenKeys() {
        let rows = [Self.row(1, key: 7, host: "a"), Self.row(2, key: 7, host: "a"), Self.row(3, key: 7, host: "a"),
                    Self.row(4, key: 8, host: "b"), Self.row(5, key: 9, host: "c"), Self.row(6, key: 8, host: "b")]
        XCTAssertEqual(WebhookSender.roundRobin(rows).map(\.rowID), [1, 4, 5, 2, 6, 3])
        XCTAssertEqual(WebhookSender.roundRobin([]).map(\.rowID), [])
    }

    /// A claim that brings more of one key or one host than its cap sends up to the cap and
    /// gives the rest back at once; the busy counts tell the next claim what to skip.
    func testCapsPerKeyAndPerHost() {
        var s = WebhookSender(policy: Self.policy, maxInFlight: 64, perKey: 2, perHost: 3)
        _ = s.tick()
        let tarpit = (1...5).map { Self.row($0, key: 1, host: "tarpit:80") }
        let actions = s.claimed(tarpit + [Self.row(9, key: 2, host: "hooks.example")], now: 0)
        XCTAssertEqual(actions, [.send(tarpit[0]), .send(Self.row(9, key: 2, host: "hooks.example")), .send(tarpit[1]),
                                 .release([tarpit[2], tarpit[3], tarpit[4]])])
        XCTAssertEqual(s.busyKeys, [1: 2, 2: 1])
        XCTAssertEqual(s.busyHosts, ["tarpit:80": 2, "hooks.example": 1])
        // Several keys on one host: the host's cap holds.
        var h = WebhookSender(policy: Self.policy, maxInFlight: 64, perKey: 8, perHost: 2)
        _ = h.tick()
        let shared = (1...4).map { Self.row($0, key: $0, host: "one:443") }
        XCTAssertEqual(h.claimed(shared, now: 0), [.send(shared[0]), .send(shared[1]), .release([shared[2], shared[3]])])
    }

    /// The tarpit holds its cap and never answers; another key's row is sent the moment it is
    /// claimed, and an answer frees the tarpit's slot for its next row.
    func testATarpitHoldsOnlyItsCap() {
        var s = WebhookSender(policy: Self.policy, maxInFlight: 64, perKey: 8, perHost: 4)
        XCTAssertEqual(s.tick(), [.claim(limit: 64)])
        let tarpit = (1...4).map { Self.row($0, key: 1, host: "tarpit:80") }
        XCTAssertEqual(s.claimed(tarpit, now: 0).count, 4)
        XCTAssertEqual(s.tick(), [.claim(limit: 60)], "room for everyone else")
        XCTAssertEqual(s.busyHosts["tarpit:80"], 4, "the claim skips this host")
        let legit = Self.row(50, key: 2, host: "hooks.example")
        XCTAssertEqual(s.claimed([legit], now: 1), [.send(legit)])
        _ = s.answered(1, .transient("timeout: no answer"), now: 10, random: 0)
        XCTAssertEqual(s.busyHosts["tarpit:80"], 3)
    }

    /// Issue 24 item 10: a retry's log line says what kind of failure, never the host.
    func testLoggableStatusesCarryNoHost() {
        XCTAssertEqual(WebhookSender.loggable("HTTP 503"), "HTTP 503")
        XCTAssertEqual(WebhookSender.loggable("connect: Failed to connect to hooks.example.com port 443 after 3 ms: Connection refused"), "connect")
        XCTAssertEqual(WebhookSender.loggable("timeout: Operation timed out after 10001 milliseconds with 0 bytes received"), "timeout")
        XCTAssertEqual(WebhookSender.loggable("refused: refused address 10.0.0.5 (private)"), "refused")
    }

    /// Issue 24 item 7: every header a signer would not write is refused (the CLI exits 1),
    /// the time that overflowed the age check first of all.
    func testMalformedSignatureHeadersAreRefused() {
        let mac = String(repeating: "ab", count: 32)
        for header in [
            "t=-9223372036854775808,v1=\(mac)", "t=9223372036854775807,v1=\(mac)", "t=-5,v1=\(mac)", "t=+5,v1=\(mac)",
            "t=1796070000,t=1796070001,v1=\(mac)", "t=1796070000,t=1796070000,v1=\(mac)",
            "t=1796070000", "t=1796070000,v1=", "t=1796070000,v1=\(mac),v1=\(mac)", "t=1796070000,v1=\(mac),v1=\(mac.uppercased())",
            "t=1796070000,v1=zz" + mac.dropFirst(2), "t=1796070000,v1=\(mac)00", "t=1796070000,v1=00", "t=,v1=\(mac)",
            "t=1796070000,v1", "t=1e9,v1=\(mac)", "t=0x10,v1=\(mac)", "t=1 796070000,v1=\(mac)",
        ] {
            XCTAssertNil(CancelWebhook.parseSignature(header), header)
        }
        XCTAssertEqual(CancelWebhook.parseSignature("t=1796070000,v1=\(mac)")?.timestamp, 1_796_070_000)
        XCTAssertEqual(CancelWebhook.parseSignature("t=0,v1=\(mac)")?.timestamp, 0)
    }
}
