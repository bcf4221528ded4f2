import DispatchCore
import DispatchSystem

/// How a webhook attempt ended: the `result` label of `dispatch_webhook_deliveries_total`.
public enum WebhookResult: String, CaseIterable, Sendable {
    case delivered, retried, failed
    /// Not sent: the address is one webhooks may not reach (the SSRF check).
    case refused
}

/// Prometheus figures for one worker process, labelled `worker`; `/metrics` answers with every
/// worker's merged into the server's (`MetricsMerge`).
public final class Metrics {
    public var streamsActive = 0
    public var eventsPublished = 0
    public var eventsDelivered = 0
    public var streamCloses: [StreamCloseReason: Int] = [:]
    public var httpRequests: [Int: Int] = [:]
    public var notifyReceived = 0
    public var resyncs = 0
    /// Re-reads of several topics in one statement (a turn's carrier hints).
    public var resyncBatches = 0
    public var dbConnected = false
    /// The LISTEN session's liveness probe (LISTEN/NOTIFY carrier).
    var carrierStalled = false
    var carrierStalls = 0
    public var dbReconnects = 0
    /// Round trips and connection attempts of the writer and reader sessions past DISPATCH_DB_TIMEOUT.
    public var dbTimeouts = 0
    public var publishBatches = 0
    public var publishQueued = 0
    public var casRetries = 0
    /// Activities this worker ended as stale (contract §5.4).
    public var staleEnded = 0
    /// Webhook attempts by result.
    public var webhookDeliveries: [WebhookResult: Int] = [:]
    /// Pending rows in the webhook outbox, as last counted by this worker's sender (-1: not counted here).
    public var webhookOutboxPending = -1
    /// Read at render time: connections cut by the request deadline or the per-address cap.
    public var connectionsCut: () -> Int = { 0 }
    /// Read at render time: client connections open now (streams and requests alike).
    public var connectionsOpen: () -> Int = { 0 }
    // The feed (contract §8).
    public var feedsActive = 0
    public var feedsOpened = 0
    public var feedDeliveries = 0
    /// Changes framed for feeds: one per change, however many feeds receive it.
    public var feedFramed = 0
    public var feedResyncs = 0
    public var feedInitialReads = 0
    public var feedSharedPages = 0
    public var feedResets = 0
    public var feedCloses: [StreamCloseReason: Int] = [:]
    /// The replay memory budget (ReplayMemory): this worker's share, what streams hold, and
    /// the stalled streams it disconnected.
    public var replayMemoryLimit = 0
    public var replayMemoryHeld = 0
    public var replayMemoryDisconnects = 0
    /// Live Activity pushes, when APNs is configured.
    var push: PushMetrics?
    /// The NATS carrier, when configured.
    var carrier: CarrierMetrics?
    /// Database round trips by session: `writer` is publish batches only (each one commit, so
    /// its figures are the commit's share of a publish), `reader` everything else.
    var writerRoundTrips = Histogram()
    var readerRoundTrips = Histogram()
    let worker: Int

    // MARK: Jobs, requests, build and carrier (JobMetrics.swift)
    var jobs: JobMetrics
    /// Read at render time: whether the carrier (the LISTEN session today) is up.
    var carrierUp: () -> Bool = { true }

    /// An answer went out: counted by status, timed by route pattern and status class.
    func answered(route: String?, status: Int, seconds: Double) {
        httpRequests[status, default: 0] += 1
        jobs.answered(route: route, status: status, seconds: seconds)
    }
    // MARK: -

    init(worker: Int, machines: MachineLabels = MachineLabels(enabled: false, limit: 0)) {
        self.worker = worker
        jobs = JobMetrics(machines: machines)
    }

    struct Histogram {
        static let bounds: [Double] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5]
        var counts = Array(repeating: 0, count: bounds.count)
        var sum = 0.0
        var count = 0

        mutating func observe(_ seconds: Double) {
            for (i, b) in Histogram.bounds.enumerated() where seconds <= b { counts[i] += 1 }
            sum += seconds
            count += 1
        }

        func render(_ name: String, labels: String) -> String {
            var s = ""
            for (i, b) in Histogram.bounds.enumerated() { s += "\(name)_bucket{\(labels),le=\"\(b)\"} \(counts[i])\n" }
            s += "\(name)_bucket{\(labels),le=\"+Inf\"} \(count)\n"
            return s + "\(name)_sum{\(labels)} \(sum)\n\(name)_count{\(labels)} \(count)\n"
        }
    }

    public func render(process: ProcessFigures) -> String {
        let w = "worker=\"\(worker)\""
        var s = ""
        func line(_ name: String, _ type: String, _ help: String, _ samples: [(String, String)]) {
            s += "# HELP \(name) \(help)\n# TYPE \(name) \(type)\n"
            for (labels, v) in samples { s += "\(name){\(labels)} \(v)\n" }
        }
        line("dispatch_streams_active", "gauge", "Status streams open now.", [(w, "\(streamsActive)")])
        line("dispatch_events_published_total", "counter", "Changes committed by this worker.", [(w, "\(eventsPublished)")])
        line("dispatch_events_delivered_total", "counter", "Events written to status streams.", [(w, "\(eventsDelivered)")])
        line("dispatch_stream_closes_total", "counter", "Status streams ended, by reason.",
             StreamCloseReason.allCases.map { ("\(w),reason=\"\($0.rawValue)\"", "\(streamCloses[$0] ?? 0)") })
        line("dispatch_http_requests_total", "counter", "HTTP answers by status.",
             httpRequests.keys.sorted().map { ("\(w),status=\"\($0)\"", "\(httpRequests[$0]!)") })
        line("dispatch_notifications_total", "counter", "NOTIFY messages received.", [(w, "\(notifyReceived)")])
        line("dispatch_topic_resyncs_total", "counter", "Topics re-read from history (gap, lost LISTEN, carrier hint).", [(w, "\(resyncs)")])
        line("dispatch_topic_resync_batches_total", "counter", "Statements that re-read several topics at once (a turn's carrier hints).", [(w, "\(resyncBatches)")])
        line("dispatch_publish_batches_total", "counter", "Group-commit transactions.", [(w, "\(publishBatches)")])
        line("dispatch_publish_queued", "gauge", "Changes planned and waiting for a commit.", [(w, "\(publishQueued)")])
        line("dispatch_publish_conflicts_total", "counter", "Publishes retried after a concurrent change.", [(w, "\(casRetries)")])
        line("dispatch_feeds_active", "gauge", "Feeds (GET /v1/stream) open now.", [(w, "\(feedsActive)")])
        line("dispatch_feeds_opened_total", "counter", "Feeds opened.", [(w, "\(feedsOpened)")])
        line("dispatch_feed_deliveries_total", "counter", "Changes written to feeds.", [(w, "\(feedDeliveries)")])
        line("dispatch_feed_framed_total", "counter", "Changes framed for feeds (once per change, shared by every feed).", [(w, "\(feedFramed)")])
        line("dispatch_feed_resyncs_total", "counter", "Feed catch-up reads (lost LISTEN, notice without data).", [(w, "\(feedResyncs)")])
        line("dispatch_feed_initial_reads_total", "counter", "Pages of feeds' initial sets read from the database.", [(w, "\(feedInitialReads)")])
        line("dispatch_feed_shared_pages_total", "counter", "Initial-set pages a feed got from another feed's read (readers that connected together).",
             [(w, "\(feedSharedPages)")])
        line("dispatch_feed_resets_total", "counter", "Feeds answered event: reset (Last-Event-ID too old or not issued).", [(w, "\(feedResets)")])
        line("dispatch_feed_closes_total", "counter", "Feeds ended, by reason.",
             StreamCloseReason.allCases.map { ("\(w),reason=\"\($0.rawValue)\"", "\(feedCloses[$0] ?? 0)") })
        line("dispatch_replay_memory_limit_bytes", "gauge", "This worker's share of the replay memory budget.", [(w, "\(replayMemoryLimit)")])
        line("dispatch_replay_memory_bytes", "gauge", "Bytes streams hold that their sockets have not taken (replay pages, queued events).",
             [(w, "\(replayMemoryHeld)")])
        line("dispatch_replay_memory_disconnects_total", "counter", "Stalled streams disconnected to keep the replay memory budget.",
             [(w, "\(replayMemoryDisconnects)")])
        line("dispatch_stale_ended_total", "counter", "Activities ended as stale (no update within staleAfter).", [(w, "\(staleEnded)")])
        line("dispatch_webhook_deliveries_total", "counter", "Cancel webhook attempts, by result.",
             WebhookResult.allCases.map { ("\(w),result=\"\($0.rawValue)\"", "\(webhookDeliveries[$0] ?? 0)") })
        if webhookOutboxPending >= 0 {
            line("dispatch_webhook_outbox_pending", "gauge", "Webhook deliveries waiting in the whole outbox.",
                 [(w, "\(webhookOutboxPending)")])
        }
        line("dispatch_db_up", "gauge", "1 when the database connections are up.", [(w, dbConnected ? "1" : "0")])
        line("dispatch_db_reconnects_total", "counter", "Database connections lost.", [(w, "\(dbReconnects)")])
        line("dispatch_db_timeouts_total", "counter", "Database round trips and connection attempts past DISPATCH_DB_TIMEOUT.", [(w, "\(dbTimeouts)")])
        line("dispatch_connections_cut_total", "counter", "Client connections cut: whole-request deadline or per-address cap.",
             [(w, "\(connectionsCut())")])
        line("dispatch_connections_open", "gauge", "Client connections open now.", [(w, "\(connectionsOpen())")])
        s += "# HELP dispatch_db_query_seconds Database round trips (one pipeline batch each), by session: writer (publish batches, each one commit) or reader.\n"
        s += "# TYPE dispatch_db_query_seconds histogram\n"
        s += writerRoundTrips.render("dispatch_db_query_seconds", labels: "\(w),session=\"writer\"")
        s += readerRoundTrips.render("dispatch_db_query_seconds", labels: "\(w),session=\"reader\"")
        if let push { s += push.render(worker: w) }
        // The carrier's figures: NATS's own, or the LISTEN session's (in the jobs' block).
        if let carrier { s += carrier.render(worker: w) }
        s += jobs.render(worker: w, carrierUp: carrier == nil ? carrierUp() : nil, carrierIn: notifyReceived)
        if carrier == nil {
            // The LISTEN session's liveness; positions are drawn at commit, so none waits.
            line("dispatch_carrier_stalled", "gauge", "1 while the carrier is connected but this worker's probes do not come back.",
                 [(w, carrierStalled ? "1" : "0")])
            line("dispatch_carrier_stalls_total", "counter", "Times the carrier was found connected but silent (then repaired).",
                 [(w, "\(carrierStalls)")])
            line("dispatch_feed_unnumbered_oldest_seconds", "gauge",
                 "Age of the oldest committed change not yet in the feed (LISTEN/NOTIFY numbers at commit: always 0).", [(w, "0")])
        }
        line("process_resident_memory_bytes", "gauge", "Resident memory.", [(w, "\(process.residentBytes)")])
        line("process_open_fds", "gauge", "Open file descriptors.", [(w, "\(process.openFDs)")])
        line("process_cpu_seconds_total", "counter", "CPU time used.", [(w, "\(process.cpuSeconds)")])
        return s
    }
}
