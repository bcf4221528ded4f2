import XCTest
@testable import DispatchServer

final class MetricsMergeTests: XCTestCase {
    func testTwoWorkersAddUp() {
        let w0 = """
        # HELP dispatch_streams_active Status streams open now.
        # TYPE dispatch_streams_active gauge
        dispatch_streams_active{worker="0"} 3
        # HELP dispatch_stream_closes_total Status streams ended, by reason.
        # TYPE dispatch_stream_closes_total counter
        dispatch_stream_closes_total{worker="0",reason="terminal"} 2
        dispatch_stream_closes_total{worker="0",reason="slow_client"} 0
        # HELP dispatch_db_up 1 when the database connections are up.
        # TYPE dispatch_db_up gauge
        dispatch_db_up{worker="0"} 1
        # HELP dispatch_db_query_seconds Database round trips.
        # TYPE dispatch_db_query_seconds histogram
        dispatch_db_query_seconds_bucket{worker="0",le="0.001"} 5
        dispatch_db_query_seconds_bucket{worker="0",le="+Inf"} 7
        dispatch_db_query_seconds_sum{worker="0"} 0.25
        dispatch_db_query_seconds_count{worker="0"} 7
        # HELP process_resident_memory_bytes Resident memory.
        # TYPE process_resident_memory_bytes gauge
        process_resident_memory_bytes{worker="0"} 1000
        """
        let w1 = w0.replacingOccurrences(of: "worker=\"0\"", with: "worker=\"1\"")
            .replacingOccurrences(of: "dispatch_db_up{worker=\"1\"} 1", with: "dispatch_db_up{worker=\"1\"} 0")
        let merged = MetricsMerge.merge([w0, w1])
        XCTAssertEqual(merged, """
        # HELP dispatch_streams_active Status streams open now.
        # TYPE dispatch_streams_active gauge
        dispatch_streams_active 6
        # HELP dispatch_stream_closes_total Status streams ended, by reason.
        # TYPE dispatch_stream_closes_total counter
        dispatch_stream_closes_total{reason="terminal"} 4
        dispatch_stream_closes_total{reason="slow_client"} 0
        # HELP dispatch_db_up 1 when the database connections are up.
        # TYPE dispatch_db_up gauge
        dispatch_db_up 0
        # HELP dispatch_db_query_seconds Database round trips.
        # TYPE dispatch_db_query_seconds histogram
        dispatch_db_query_seconds_bucket{le="0.001"} 10
        dispatch_db_query_seconds_bucket{le="+Inf"} 14
        dispatch_db_query_seconds_sum 0.5
        dispatch_db_query_seconds_count 14
        # HELP process_resident_memory_bytes Resident memory.
        # TYPE process_resident_memory_bytes gauge
        process_resident_memory_bytes{worker="0"} 1000
        process_resident_memory_bytes{worker="1"} 1000

        """)
    }

    /// A deployment-wide count every worker reads for itself is not multiplied by the workers
    /// (the push outbox depth once showed twice the real rows with two workers).
    func testOutboxDepthsTakeTheHighestNotTheSum() {
        let text = { (w: Int, depth: Int) in """
            # HELP dispatch_push_outbox_depth Outbox rows with a push to make.
            # TYPE dispatch_push_outbox_depth gauge
            dispatch_push_outbox_depth{worker="\(w)"} \(depth)
            # HELP dispatch_webhook_outbox_pending Webhook deliveries waiting.
            # TYPE dispatch_webhook_outbox_pending gauge
            dispatch_webhook_outbox_pending{worker="\(w)"} \(depth + 1)
            """ }
        let merged = MetricsMerge.merge([text(0, 4), text(1, 5)])
        XCTAssertTrue(merged.contains("dispatch_push_outbox_depth 5\n"), merged)
        XCTAssertTrue(merged.contains("dispatch_webhook_outbox_pending 6\n"), merged)
    }

    /// Whatever the workers, the build is one series at 1, a carrier down on one worker shows,
    /// and the live count (one database figure) is not multiplied.
    func testBuildInfoCarrierAndLiveCountAreNotMultiplied() {
        let text = { (w: Int, up: Int) in """
            # HELP dispatch_build_info Build.
            # TYPE dispatch_build_info gauge
            dispatch_build_info{worker="\(w)",version="0.2.0",commit="abc"} 1
            # HELP dispatch_carrier_up Carrier.
            # TYPE dispatch_carrier_up gauge
            dispatch_carrier_up{worker="\(w)"} \(up)
            # HELP dispatch_activities_live Live.
            # TYPE dispatch_activities_live gauge
            dispatch_activities_live{worker="\(w)",state="processing"} 3
            """ }
        let merged = MetricsMerge.merge([text(0, 1), text(1, 0)])
        XCTAssertTrue(merged.contains("dispatch_build_info{version=\"0.2.0\",commit=\"abc\"} 1\n"), merged)
        XCTAssertTrue(merged.contains("dispatch_carrier_up 0\n"), merged)
        XCTAssertTrue(merged.contains("dispatch_activities_live{state=\"processing\"} 3\n"), merged)
    }
}
