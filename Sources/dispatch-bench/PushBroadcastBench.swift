import DispatchCore
import DispatchBenchKit
import DispatchSystem
#if canImport(Glibc)
import Glibc
#endif

/// `dispatch-bench push`, scenario 3: one activity watched by many phones (`--watchers`,
/// default 10,000), updated `--broadcast-rate` times a second for `--seconds`: once as a
/// broadcast activity (one push per change to its APNs channel), once with an update token on
/// every phone (one push per phone per change). Against nginx (the server's own cost).
extension PushRun {
    func broadcastVsTokens() throws {
        let standIn = try APNsStandIn.nginx(pki: pki, dir: dir)
        standIns.append(standIn)
        defer { standIn.stop(); standIns.removeAll { $0 === standIn } }
        // The per-key device limit (contract §6) is raised: one bench key registers every phone.
        let t = try startDispatch(name: "broadcast", standIn: standIn, extra: ["DISPATCH_MAX_DEVICES_PER_KEY": String(o.watchers * 2)])
        defer { stop(t) }
        let tag = orchestrator.runTag
        let watchers = Orchestrator.count(o.watchers)

        // A: the channel.
        let channel = "b\(tag)-channel"
        try orchestrator.batch(t, [("POST", "/v1/activities/start",
                                    #"{"activityId":"\#(channel)-0","taskName":"bench","state":"processing","broadcast":true}"#)],
                               what: "starting the broadcast activity")
        let created = waitFor(t, timeout: 30) { $0.sum("dispatch_push_broadcasts_total", #"result="created""#) >= 1 }
        guard created else { throw BenchError("the broadcast channel was not created within 30 s; see \(t.logPath)") }
        let a = try measure(t, prefix: channel, scenario: "1 x \(watchers) phones, channel") { before, after in
            after.sum("dispatch_push_broadcasts_total", #"result="pushed""#) - before.sum("dispatch_push_broadcasts_total", #"result="pushed""#)
        } latency: { before, after in
            let n = after.sum("dispatch_push_broadcast_latency_seconds_count") - before.sum("dispatch_push_broadcast_latency_seconds_count")
            let sum = after.sum("dispatch_push_broadcast_latency_seconds_sum") - before.sum("dispatch_push_broadcast_latency_seconds_sum")
            return n > 0 ? [("change->APNs answer mean", sum / n * 1000)] : []
        }

        // B: a token on every phone.
        let tokens = "b\(tag)-tokens"
        try orchestrator.batch(t, t.createRequests([tokens + "-0"]), what: "starting the token activity")
        var registrations: [(String, String, String)] = []
        for d in 0..<o.watchers {
            registrations.append(("POST", "/v1/activity-tokens",
                                  #"{"deviceToken":"\#(Self.token(device: d, activity: 0xFFFFFE))","activityTokens":{"\#(tokens)-0":"\#(Self.token(device: d, activity: 0))"}}"#))
        }
        try orchestrator.batch(t, registrations, what: "registering \(watchers) phones")
        guard waitDelivered(t, Double(o.watchers), timeout: 120) else {
            throw BenchError("the first push to each of \(watchers) phones did not arrive within 120 s; see \(t.logPath)")
        }
        let b = try measure(t, prefix: tokens, scenario: "1 x \(watchers) phones, tokens") { before, after in
            after.sum("dispatch_push_sent_total", #"result="delivered""#) - before.sum("dispatch_push_sent_total", #"result="delivered""#)
        } latency: { before, after in
            let hist = after.histogram("dispatch_push_latency_seconds").subtracting(before.histogram("dispatch_push_latency_seconds"))
            return [("change->APNs answer p50", hist.percentile(0.5).map { $0 * 1000 }),
                    ("change->APNs answer p99", hist.percentile(0.99).map { $0 * 1000 })].compactMap { k, v in v.map { (k, $0) } }
        }
        notes.append("broadcast vs tokens: \(orchestrator.fmt(a)) vs \(orchestrator.fmt(b)) pushes per change for \(watchers) phones")
    }

    /// Publishes to `<prefix>-0` at the broadcast rate for `seconds`, waits for the pushes to
    /// drain, and records pushes per change, the time to drain and the latency figures.
    private func measure(_ t: Target, prefix: String, scenario: String, pushes: (Metrics, Metrics) -> Double,
                         latency: (Metrics, Metrics) -> [(String, Double)]) throws -> Double {
        Control.sleep(1.5)
        let before = Metrics.scrape(port: t.port, workers: o.workers)
        let start = Clock.monotonicNanoseconds()
        orchestrator.startPublishing(t, prefix: prefix, channels: 1, conns: 1, seconds: o.seconds) { w in w.field("rate", o.broadcastRate) }
        guard let p = Control.collect([orchestrator.publisher], "published", timeout: o.seconds + 60)[0] else {
            throw BenchError("\(scenario): the publisher did not finish")
        }
        let updates = Double(p.int("count") ?? 0)
        // Drained: no row pending and the pushes stopped growing.
        var last = -1.0, now = 0.0
        let deadline = Clock.monotonicNanoseconds() + 120_000_000_000
        repeat {
            Control.sleep(1)
            last = now
            now = pushes(before, Metrics.scrape(port: t.port, workers: o.workers))
        } while now != last && Clock.monotonicNanoseconds() < deadline
        let elapsed = Double(Clock.monotonicNanoseconds() - start) / 1e9 - 1
        let after = Metrics.scrape(port: t.port, workers: o.workers)
        record(scenario, "changes", "", updates)
        record(scenario, "pushes", "", now)
        record(scenario, "pushes per change", "", updates > 0 ? now / updates : nil)
        record(scenario, "publish start -> last push", "s", elapsed)
        for (figure, ms) in latency(before, after) { record(scenario, figure, "ms", ms) }
        return updates > 0 ? now / updates : 0
    }

    private func waitFor(_ t: Target, timeout: Double, _ condition: (Metrics) -> Bool) -> Bool {
        let deadline = Clock.monotonicNanoseconds() + Int64(timeout * 1e9)
        while Clock.monotonicNanoseconds() < deadline {
            if condition(Metrics.scrape(port: t.port, workers: o.workers)) { return true }
            Control.sleep(0.25)
        }
        return false
    }
}
