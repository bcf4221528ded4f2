import DispatchCore
import DispatchBenchKit
import DispatchSystem
#if canImport(Glibc)
import Glibc
#endif

/// The batch scenario: closed-loop publishers sending `POST /v1/changes` with 1, 10 or 100
/// updates per request (each to another activity of the publisher's), one stream per activity.
/// Figures per batch size: changes/s, change->receipt latency, the request's acknowledgement,
/// and the CPU each part spends per change (from /proc: dispatchd's processes, PostgreSQL's).
/// nchan has no batch call: its row is its single publishes, the same under every size, so
/// the ratios compare a batch against what nchan does one message at a time.
extension Orchestrator {
    static let batchSizes = [1, 10, 100]

    func batchScenario(_ t: Target, rep: Int) throws {
        let sizes = t.kind == .dispatch ? Self.batchSizes : [0]
        for size in sizes { try batchRun(t, size: size, rep: rep) }
    }

    /// The server's processes apart from PostgreSQL, and PostgreSQL's (Dispatch's embedded
    /// cluster: the postmaster, from its pid file, and its children).
    func serverPids(_ t: Target) -> (server: [pid_t], postgres: [pid_t]) {
        guard let root = t.rootPid else { return ([], []) }
        let server = Proc.tree(root).filter { !Proc.comm($0).hasPrefix("postgres") }
        guard let cluster = t.postgresCluster, let text = Files.read(cluster + "/postmaster.pid"),
              let first = text.split(separator: "\n").first, let pid = pid_t(first) else { return (server, []) }
        return (server, Proc.tree(pid))
    }

    func batchRun(_ t: Target, size: Int, rep: Int) throws {
        let prefix = "b\(runTag)-bt\(rep)-\(size)-\(t.name)"
        let k = config.throughputActivities
        try batch(t, t.createRequests(names(prefix, k)), what: "creating batch activities")
        let s = try subscribe(t, count: k, path: t.streamPath("\(prefix)-{ch}"), channels: k, trackSeqs: false)
        Control.sleep(0.5)
        for w in subscribers { w.send { $0.field("cmd", "reset") } }
        _ = Control.collect(subscribers, "reset", timeout: 10)
        // Each publisher owns k / conns activities: at least one batch's worth.
        let conns = max(1, min(config.throughputPublishers, k / max(1, size)))
        let pids = serverPids(t)
        let writer0 = t.kind == .dispatch ? Metrics.scrape(port: t.port).histogram("dispatch_db_query_seconds", "session=\"writer\"") : nil
        let cpuS0 = cpuSeconds(pids.server), cpuPG0 = cpuSeconds(pids.postgres)
        let started = Clock.monotonicNanoseconds()
        startPublishing(t, prefix: prefix, channels: k, conns: conns, seconds: config.throughputSeconds) { w in
            if size > 0 { w.field("batch", Int64(size)) }
        }
        guard let p = Control.collect([publisher], "published", timeout: config.throughputSeconds + 60)[0] else {
            throw BenchError("\(t.name): batch publishers did not finish")
        }
        let window = Double(Clock.monotonicNanoseconds() - started) / 1e9
        let cpuS = cpuSeconds(pids.server) - cpuS0, cpuPG = cpuSeconds(pids.postgres) - cpuPG0
        let writes = writer0.map { Metrics.scrape(port: t.port).histogram("dispatch_db_query_seconds", "session=\"writer\"").subtracting($0) }
        let windowReport = reports()
        var finals: [Int64] = []
        if case .array(let a)? = p["finals"] { finals = a.map { if case .number(let d) = $0 { return Int64(d) } else { return 0 } } }
        let label = size > 0 ? "batch \(size)" : "batch"
        verify(t, finals: finals, scenario: label)
        let final = reports()
        closeSubscribers()
        let elapsed = p.double("elapsed") ?? 1
        let changes = Double(p.int("count") ?? 0)
        check(t, "\(label): publish errors", Int64(p.int("errors") ?? 0))
        if (p.int("errors") ?? 0) > 0 { log("bench: \(t.name) \(label) error: \(p.string("error") ?? "")") }
        let ack = Self.histogram(p["ackHist"])
        // nchan's single publishes stand in every size's row.
        for row in size > 0 ? [size] : Self.batchSizes {
            let scenario = "batch of \(row)"
            record(scenario, "changes/s", "1/s", higher: true, t, changes / elapsed)
            record(scenario, "change->receipt p50", "ms", higher: false, t, final.hist.percentile(0.5).map { Double($0) / 1e6 })
            record(scenario, "change->receipt p99", "ms", higher: false, t, final.hist.percentile(0.99).map { Double($0) / 1e6 })
            record(scenario, "request ack p50", "ms", higher: false, t, ack.percentile(0.5).map { Double($0) / 1e6 }, table: false)
            record(scenario, "server CPU per change", "us", higher: false, t, cpuS / max(1, changes) * 1e6)
            if t.kind == .dispatch {
                record(scenario, "PostgreSQL CPU per change", "us", higher: false, t, cpuPG / max(1, changes) * 1e6)
                // The writer session's round trips: one per batch, one commit each (reads too are
                // on other sessions).
                if let commits = writes?.buckets.max(by: { $0.key < $1.key })?.value, commits > 0 {
                    record(scenario, "changes per commit", "", higher: true, t, changes / commits)
                }
            }
            record(scenario, "deliveries/s", "1/s", higher: true, t, Double(windowReport.deliveries) / elapsed, table: false)
        }
        log("bench: \(t.name) \(label) rep \(rep + 1): \(s.ready) subscribers, \(conns) publishers, \(Int(changes / elapsed)) changes/s, "
            + "server CPU \(Int(cpuS / window * 100))% postgres \(Int(cpuPG / window * 100))%")
    }
}
