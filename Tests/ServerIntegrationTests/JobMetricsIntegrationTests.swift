import DispatchCore
import DispatchSystem
import DispatchTestSupport
import Glibc
import XCTest

/// /metrics from a real server: the jobs, the requests by route, the build, and the process
/// figures that `sum()` may add up without counting twice.
final class JobMetricsIntegrationTests: XCTestCase {
    /// Two workers: endings and cancel requests add up over both, the live count is the
    /// database's (not doubled), the build is one series at 1, and every `process_*` sample is
    /// one worker's (no unlabelled total beside them, which made `sum()` count twice).
    func testJobFiguresAddUpOverWorkersAndProcessFiguresArePerWorker() throws {
        let s = try TestServer.start(environment: ["DISPATCH_WORKERS": "2"])
        defer { s.stop() }
        for id in ["jm-a", "jm-b", "jm-c", "jm-d"] { try s.startActivity(id) }
        XCTAssertEqual(try s.end("jm-a").status, 200)
        XCTAssertEqual(try s.end("jm-b", #"{"state":"error","error":"boom"}"#).status, 200)
        XCTAssertEqual(try s.client.post("/v1/activities/jm-c/cancel", "{}").status, 202)
        XCTAssertEqual(try s.client.get("/v1/activities/jm-secret-id-404").status, 404)

        // Worker figures reach the merged page within a second or two; the live count every 10 s.
        XCTAssertTrue(try waitUntil(30) {
            try s.metric("dispatch_activities_ended_total", labels: #"state="completed""#) == 1
                && s.metric("dispatch_activities_ended_total", labels: #"state="error""#) == 1
                && s.metric("dispatch_cancel_requests_total") == 1
                && s.metric("dispatch_activities_live", labels: #"state="processing""#) == 2
        }, (try? HTTPClient(port: s.port).get("/metrics"))?.text ?? "")
        let text = try HTTPClient(port: s.port).get("/metrics").text
        let lines = text.split(separator: "\n").map(String.init)
        XCTAssertEqual(try s.metric("dispatch_activity_duration_seconds_count", labels: #"state="completed""#), 1)
        XCTAssertEqual(try s.metric("dispatch_activities_ended_total", labels: #"state="cancelled""#), 0)

        for family in ["process_resident_memory_bytes", "process_open_fds", "process_cpu_seconds_total"] {
            let samples = lines.filter { $0.hasPrefix(family + " ") || $0.hasPrefix(family + "{") }
            XCTAssertEqual(samples.count, 2, "one per worker: \(samples)")
            XCTAssertTrue(samples.allSatisfy { $0.contains("worker=\"") }, "no unlabelled total: \(samples)")
        }
        let build = lines.filter { $0.hasPrefix("dispatch_build_info{") }
        XCTAssertEqual(build.count, 1, "\(build)")
        XCTAssertTrue(build.first?.hasSuffix("} 1") == true, "\(build)")
        XCTAssertTrue(build.first?.contains("version=\"") == true && build.first?.contains("commit=\"") == true)
        XCTAssertEqual(try s.metric("dispatch_carrier_up"), 1)
        XCTAssertGreaterThanOrEqual(try s.metric("dispatch_carrier_messages_total", labels: #"direction="out""#), 7)

        // Requests by route pattern and status class; never an id.
        XCTAssertGreaterThanOrEqual(try s.metric("dispatch_http_request_duration_seconds_count",
                                                 labels: #"route="/v1/activities/{id}/end",code="2xx""#), 2)
        XCTAssertEqual(try s.metric("dispatch_http_request_duration_seconds_count", labels: #"route="/v1/activities/{id}",code="4xx""#), 1)
        XCTAssertFalse(text.contains("jm-"), "an activity id in /metrics")
        XCTAssertFalse(text.contains("machine="), "no machine label unless asked for")
    }

    /// Opted in with a cap of 1: the first machine keeps its name, the rest are `other`.
    func testMachineLabelWhenAskedForIsCapped() throws {
        let s = try TestServer.start(environment: ["DISPATCH_METRICS_MACHINE_LABEL": "1", "DISPATCH_METRICS_MACHINES": "1"])
        defer { s.stop() }
        try s.startActivity("jm-m1", extra: #","machine":"m1""#)
        try s.startActivity("jm-m2", extra: #","machine":"m2""#)
        try s.startActivity("jm-m3", extra: #","machine":"m3""#)
        XCTAssertEqual(try s.end("jm-m1").status, 200)
        XCTAssertEqual(try s.end("jm-m2").status, 200)
        XCTAssertEqual(try s.metric("dispatch_activities_ended_total", labels: #"state="completed",machine="m1""#), 1)
        XCTAssertEqual(try s.metric("dispatch_activities_ended_total", labels: #"state="completed",machine="other""#), 1)
        // The live count shares the same names: m3 came after the cap.
        XCTAssertTrue(try waitUntil(15) {
            try s.metric("dispatch_activities_live", labels: #"state="processing",machine="other""#) == 1
        }, (try? HTTPClient(port: s.port).get("/metrics"))?.text ?? "")
        let text = try HTTPClient(port: s.port).get("/metrics").text
        XCTAssertFalse(text.contains("machine=\"m2\"") || text.contains("machine=\"m3\""), "past the cap: \(text)")
    }
}
