import DispatchCore
import XCTest
@testable import DispatchServer

final class JobMetricsTests: XCTestCase {
    func ending(_ state: ActivityState, machine: String? = nil, seconds: Int64 = 90) -> ActivityEvent {
        ActivityEvent(name: .state(state), snapshot: Activity(activityId: "a", taskName: "t", machine: machine, state: state,
                                                               createdAt: 1_000, updatedAt: 1_000 + seconds * 1000,
                                                               endedAt: 1_000 + seconds * 1000))
    }

    func testEndingsCountByFinalStateWithTheirDurationAndCancelRequests() {
        var m = JobMetrics(machines: MachineLabels(enabled: false, limit: 0))
        m.committed(ending(.completed, seconds: 90))
        m.committed(ending(.error, seconds: 4))
        m.committed(ActivityEvent(name: .state(.processing), snapshot: Activity(activityId: "b", taskName: "t", state: .processing, createdAt: 0, updatedAt: 0)))
        m.committed(ActivityEvent(name: .cancelRequested,
                                  snapshot: Activity(activityId: "b", taskName: "t", state: .processing, createdAt: 0, updatedAt: 0)))
        let text = m.render(worker: "worker=\"0\"", carrierUp: true, carrierIn: 7)
        XCTAssertTrue(text.contains("dispatch_activities_ended_total{worker=\"0\",state=\"completed\"} 1\n"), text)
        XCTAssertTrue(text.contains("dispatch_activities_ended_total{worker=\"0\",state=\"error\"} 1\n"), text)
        XCTAssertTrue(text.contains("dispatch_activities_ended_total{worker=\"0\",state=\"rejected\"} 0\n"), text)
        // 90 s is above the 60 s bucket and within 300 s; 4 s within 5 s.
        XCTAssertTrue(text.contains("dispatch_activity_duration_seconds_bucket{worker=\"0\",state=\"completed\",le=\"60.0\"} 0\n"), text)
        XCTAssertTrue(text.contains("dispatch_activity_duration_seconds_bucket{worker=\"0\",state=\"completed\",le=\"300.0\"} 1\n"), text)
        XCTAssertTrue(text.contains("dispatch_activity_duration_seconds_sum{worker=\"0\",state=\"completed\"} 90.0\n"), text)
        XCTAssertTrue(text.contains("dispatch_activity_duration_seconds_bucket{worker=\"0\",state=\"error\",le=\"5.0\"} 1\n"), text)
        XCTAssertTrue(text.contains("dispatch_cancel_requests_total{worker=\"0\"} 1\n"), text)
        XCTAssertTrue(text.contains("dispatch_carrier_messages_total{worker=\"0\",direction=\"out\"} 4\n"), text)
        XCTAssertTrue(text.contains("dispatch_carrier_messages_total{worker=\"0\",direction=\"in\"} 7\n"), text)
        XCTAssertTrue(text.contains("dispatch_carrier_up{worker=\"0\"} 1\n"), text)
        XCTAssertTrue(text.contains("dispatch_build_info{worker=\"0\",version=\""), text)
        XCTAssertFalse(text.contains("machine="), "no machine label unless the operator opts in")
        XCTAssertFalse(text.contains("dispatch_activities_live"), "not counted by this worker yet")
    }

    /// Route patterns and status classes only: never an id, never a raw status.
    func testRequestDurationsByRoutePatternAndStatusClass() {
        var m = JobMetrics(machines: MachineLabels(enabled: false, limit: 0))
        m.answered(route: Route.update("job-1").pattern, status: 200, seconds: 0.003)
        m.answered(route: Route.update("job-2").pattern, status: 201, seconds: 0.02)
        m.answered(route: nil, status: 404, seconds: 0.0001)
        let text = m.render(worker: "worker=\"0\"", carrierUp: false, carrierIn: 0)
        XCTAssertTrue(text.contains("dispatch_http_request_duration_seconds_count{worker=\"0\",route=\"/v1/activities/{id}/update\",code=\"2xx\"} 2\n"), text)
        XCTAssertTrue(text.contains("dispatch_http_request_duration_seconds_bucket{worker=\"0\",route=\"/v1/activities/{id}/update\",code=\"2xx\",le=\"0.005\"} 1\n"), text)
        XCTAssertTrue(text.contains("dispatch_http_request_duration_seconds_count{worker=\"0\",route=\"unmatched\",code=\"4xx\"} 1\n"), text)
        XCTAssertFalse(text.contains("job-1"))
        XCTAssertTrue(text.contains("dispatch_carrier_up{worker=\"0\"} 0\n"), text)
        XCTAssertEqual(JobMetrics.statusClass(503), "5xx")
        XCTAssertEqual(JobMetrics.statusClass(42), "other")
    }

    /// Live states never counted show as 0, so a query by state always has its series.
    func testLiveCountShowsEveryLiveState() {
        var m = JobMetrics(machines: MachineLabels(enabled: false, limit: 0))
        m.counted([("processing", nil, 3)])
        let text = m.render(worker: "worker=\"0\"", carrierUp: true, carrierIn: 0)
        XCTAssertTrue(text.contains("dispatch_activities_live{worker=\"0\",state=\"processing\"} 3\n"), text)
        XCTAssertTrue(text.contains("dispatch_activities_live{worker=\"0\",state=\"queued\"} 0\n"), text)
        XCTAssertTrue(text.contains("dispatch_activities_live{worker=\"0\",state=\"idle\"} 0\n"), text)
        XCTAssertFalse(m.liveQuery.contains("GROUP BY state, machine"))
    }

    /// Opted in, the first `limit` machines get their own value and the rest share `other`.
    func testMachineLabelIsCappedWithTheRestAsOther() {
        var labels = MachineLabels(enabled: true, limit: 2)
        XCTAssertEqual(labels.label(for: "a"), "a")
        XCTAssertEqual(labels.label(for: "b"), "b")
        XCTAssertEqual(labels.label(for: "c"), "other")
        XCTAssertEqual(labels.label(for: "a"), "a")
        XCTAssertEqual(labels.label(for: nil), "")
        var off = MachineLabels(enabled: false, limit: 50)
        XCTAssertEqual(off.label(for: "a"), "")

        var m = JobMetrics(machines: MachineLabels(enabled: true, limit: 1))
        m.counted([("processing", "x", 2), ("processing", "y", 1), ("queued", "z", 4)])
        m.committed(ending(.completed, machine: "x"))
        m.committed(ending(.completed, machine: "w"))
        let text = m.render(worker: "worker=\"0\"", carrierUp: true, carrierIn: 0)
        XCTAssertTrue(m.liveQuery.contains("GROUP BY state, machine"))
        XCTAssertTrue(text.contains("dispatch_activities_live{worker=\"0\",state=\"processing\",machine=\"x\"} 2\n"), text)
        XCTAssertTrue(text.contains("dispatch_activities_live{worker=\"0\",state=\"processing\",machine=\"other\"} 1\n"), text)
        XCTAssertTrue(text.contains("dispatch_activities_live{worker=\"0\",state=\"queued\",machine=\"other\"} 4\n"), text)
        XCTAssertTrue(text.contains("dispatch_activities_ended_total{worker=\"0\",state=\"completed\",machine=\"x\"} 1\n"), text)
        XCTAssertTrue(text.contains("dispatch_activities_ended_total{worker=\"0\",state=\"completed\",machine=\"other\"} 1\n"), text)
    }

    func testMachineLabelSettings() throws {
        let off = try ServerConfig.parse(environment: [:], arguments: [], cores: 1)
        XCTAssertFalse(off.metricsMachineLabel)
        let on = try ServerConfig.parse(environment: ["DISPATCH_METRICS_MACHINE_LABEL": "1", "DISPATCH_METRICS_MACHINES": "5"], arguments: [], cores: 1)
        XCTAssertTrue(on.metricsMachineLabel)
        XCTAssertEqual(on.metricsMachineLimit, 5)
        XCTAssertThrowsError(try ServerConfig.parse(environment: ["DISPATCH_METRICS_MACHINES": "0"], arguments: [], cores: 1))
        XCTAssertThrowsError(try ServerConfig.parse(environment: ["DISPATCH_METRICS_MACHINE_LABEL": "maybe"], arguments: [], cores: 1))
    }
}
