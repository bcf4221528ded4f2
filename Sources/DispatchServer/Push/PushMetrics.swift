import DispatchCore

/// Push figures of one worker (rendered with the worker's other metrics).
final class PushMetrics {
    var sent: [PushResult: Int] = [:]
    /// Rows with something to push, deployment-wide (the same figure on every worker: take
    /// the max over the label, not the sum). -1 until first read.
    var outboxDepth = -1
    var inFlight = 0
    /// Broadcast channel requests by outcome (contract §5.5).
    var broadcasts: [String: Int] = [:]
    static let broadcastOutcomes = ["created", "refused", "pushed", "dropped", "paused", "deleted", "retry"]
    /// Push-to-start pushes not sent because the device's hourly budget was spent (contract §5.2).
    var startsOverBudget = 0
    private var broadcastLatencySum = 0.0
    private var broadcastLatencyCount = 0
    /// Open connections to APNs, read when rendered.
    var connections: () -> Int = { 0 }
    /// Times an APNs connection was closed because it did not answer a PING, by why the PING
    /// was sent (`ConnectionUpkeep.Reason`), read when rendered.
    var replaced: () -> [String: Int] = { [:] }
    static let replacementReasons = ConnectionUpkeep.Reason.allCases.map(\.rawValue)
    /// HTTP/2 PINGs sent to APNs, read when rendered.
    var pings: () -> Int = { 0 }
    static let bounds: [Double] = [0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5,
                                   1, 2.5, 5, 10, 30, 60, 300]
    private var buckets = [Int](repeating: 0, count: bounds.count)
    private var latencySum = 0.0
    private var latencyCount = 0

    /// Commit of the oldest change a push carried → APNs' answer.
    func observeLatency(_ seconds: Double) {
        for (i, b) in Self.bounds.enumerated() where seconds <= b { buckets[i] += 1 }
        latencySum += seconds
        latencyCount += 1
    }

    func observeBroadcastLatency(_ seconds: Double) {
        broadcastLatencySum += seconds
        broadcastLatencyCount += 1
    }

    func render(worker w: String) -> String {
        var s = "# HELP dispatch_push_sent_total Live Activity pushes answered (or failed) by result.\n# TYPE dispatch_push_sent_total counter\n"
        for r in PushResult.allCases { s += "dispatch_push_sent_total{\(w),result=\"\(r.rawValue)\"} \(sent[r] ?? 0)\n" }
        s += "# HELP dispatch_push_outbox_depth Outbox rows and activity entries with a push to make, deployment-wide.\n"
        s += "# TYPE dispatch_push_outbox_depth gauge\ndispatch_push_outbox_depth{\(w)} \(max(0, outboxDepth))\n"
        s += "# HELP dispatch_push_in_flight Pushes sent and not yet answered.\n# TYPE dispatch_push_in_flight gauge\n"
        s += "dispatch_push_in_flight{\(w)} \(inFlight)\n"
        s += "# HELP dispatch_apns_connections Connections to APNs open now.\n# TYPE dispatch_apns_connections gauge\n"
        s += "dispatch_apns_connections{\(w)} \(connections())\n"
        let replacements = replaced()
        s += "# HELP dispatch_apns_pings_total HTTP/2 PINGs sent to APNs (idle connections, and after a push timed out).\n"
        s += "# TYPE dispatch_apns_pings_total counter\ndispatch_apns_pings_total{\(w)} \(pings())\n"
        s += "# HELP dispatch_apns_connections_replaced_total Times an APNs connection was closed because it did not answer a PING, by reason.\n"
        s += "# TYPE dispatch_apns_connections_replaced_total counter\n"
        for r in Self.replacementReasons { s += "dispatch_apns_connections_replaced_total{\(w),reason=\"\(r)\"} \(replacements[r] ?? 0)\n" }
        s += "# HELP dispatch_push_latency_seconds Change committed to APNs answered, per delivered push.\n"
        s += "# TYPE dispatch_push_latency_seconds histogram\n"
        for (i, b) in Self.bounds.enumerated() { s += "dispatch_push_latency_seconds_bucket{\(w),le=\"\(b)\"} \(buckets[i])\n" }
        s += "dispatch_push_latency_seconds_bucket{\(w),le=\"+Inf\"} \(latencyCount)\n"
        s += "dispatch_push_latency_seconds_sum{\(w)} \(latencySum)\ndispatch_push_latency_seconds_count{\(w)} \(latencyCount)\n"
        s += "# HELP dispatch_push_broadcasts_total Broadcast channel requests (create, push, delete) by outcome.\n"
        s += "# TYPE dispatch_push_broadcasts_total counter\n"
        for r in Self.broadcastOutcomes { s += "dispatch_push_broadcasts_total{\(w),result=\"\(r)\"} \(broadcasts[r] ?? 0)\n" }
        s += "# HELP dispatch_push_starts_over_budget_total Push-to-start pushes not sent: the device had DISPATCH_PUSH_TO_START_LIMIT starts in the last hour.\n"
        s += "# TYPE dispatch_push_starts_over_budget_total counter\ndispatch_push_starts_over_budget_total{\(w)} \(startsOverBudget)\n"
        s += "# HELP dispatch_push_broadcast_latency_seconds Change committed to APNs answered, per broadcast push.\n"
        s += "# TYPE dispatch_push_broadcast_latency_seconds summary\n"
        s += "dispatch_push_broadcast_latency_seconds_sum{\(w)} \(broadcastLatencySum)\n"
        s += "dispatch_push_broadcast_latency_seconds_count{\(w)} \(broadcastLatencyCount)\n"
        return s
    }
}
