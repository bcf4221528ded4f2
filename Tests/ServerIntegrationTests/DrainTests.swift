import DispatchCore
import DispatchSystem
import DispatchTestSupport
import Glibc
import XCTest

/// A graceful stop: every stream is told when to come back (spread out), publishes in flight
/// are answered, and after the restart every client resumes with Last-Event-ID, losing nothing.
final class DrainTests: XCTestCase {
    func testThousandsOfStreamsReconnectSpreadOutAndLoseNothing() throws {
        let s = try TestServer.start(environment: ["DISPATCH_WORKERS": "2"])
        defer { s.stop() }
        let activities = (0..<30).map { "DRAIN-\($0)" }
        for id in activities { try s.startActivity(id) }
        let fleet = StreamFleet(port: s.port, token: s.adminKey)
        for id in activities { fleet.add(100, path: "/v1/activities/\(id)/status") }
        XCTAssertTrue(fleet.pump(timeout: 30) { fleet.subscribers.allSatisfy { $0.events.count >= 1 } }, "not every stream opened")

        func publish(_ id: String, _ body: String = #"{"progress":0.5}"#) {
            // Retried across the restart: a publish is answered, or it did not happen.
            let deadline = Clock.monotonic() + 30
            while Clock.monotonic() < deadline {
                if let r = try? s.update(id, body), r.status == 200 { return }
                usleep(100_000)
            }
            XCTFail("could not publish to \(id)")
        }
        for id in activities { publish(id) }
        XCTAssertTrue(fleet.pump(timeout: 20) { fleet.subscribers.allSatisfy { $0.events.count >= 2 } })

        // Stop gracefully, with the streams connected.
        let stopped = Clock.monotonic()
        s.stop()
        XCTAssertLessThan(Clock.monotonic() - stopped, 12, "the stop outlasted its timeout")
        _ = fleet.pump(timeout: 0.3)
        XCTAssertTrue(fleet.subscribers.allSatisfy { !$0.connected }, "a stream stayed open after the stop")
        let told = fleet.subscribers.compactMap { $0.retries.last }.filter { $0 != 3000 }
        XCTAssertEqual(told.count, fleet.subscribers.count, "every stream is told when to come back")
        XCTAssertGreaterThanOrEqual((told.max() ?? 0) - (told.min() ?? 0), 1000, "the reconnects are spread out")

        try s.launch()
        let restarted = Clock.monotonic()
        for id in activities { publish(id, #"{"progress":0.75}"#) }
        for id in activities { XCTAssertEqual(try s.end(id).status, 200) }
        XCTAssertTrue(fleet.pump(timeout: 60) { fleet.subscribers.allSatisfy { $0.lastID == 4 } },
                      "\(fleet.subscribers.filter { $0.lastID != 4 }.count) streams did not catch up")
        for sub in fleet.subscribers { assertConsecutive(sub.ids, from: 1, through: 4) }
        let comeback = fleet.subscribers.compactMap { $0.connectedAt.last.map { $0 - restarted } }
        XCTAssertGreaterThan((comeback.max() ?? 0) - (comeback.min() ?? 0), 0.8, "everyone came back at once")
    }
}
