import DispatchCore
import DispatchSystem
import DispatchBenchKit
#if canImport(Glibc)
import Glibc
#endif

/// **Carrier outage** (NATS mode): streams spread over every node, publishers on every node
/// at a steady rate, and in the middle every nats-server killed (SIGKILL), ~2 s without any,
/// then all started again on the same ports. PostgreSQL stays the truth: every stream must
/// end with every event, once, in order.
///
/// *Catch-up* is from the moment the NATS cluster is back until every stream holds the seq
/// that was acknowledged on its activity at that moment (publishing goes on meanwhile).
extension Orchestrator {
    func carrierOutage(rep: Int) throws {
        guard let nats = nodeNATS, !nodeTargets.isEmpty else { return }
        let running = nodeTargets
        let t = running[0]
        let label = "outage nats \(running.count) nodes \(Self.count(config.nodeSubscribers))/\(Self.count(config.nodeActivities))"
        nodeRuns += 1
        let prefix = "b\(runTag)-co\(rep)-\(nodeRuns)"
        let k = config.nodeActivities
        try batch(t, t.createRequests(names(prefix, k)), what: "creating outage activities")
        let s = try subscribe(t, count: config.nodeSubscribers, path: t.streamPath("\(prefix)-{ch}"), channels: k, trackSeqs: false) { w in
            w.key("ports"); w.beginArray(); for n in running { w.int(Int64(n.port)) }; w.endArray()
            w.field("spreadNodes", true)
        }
        let repairs0 = nodeSeries(running, "dispatch_carrier_repairs_total")
        startPublishing(t, prefix: prefix, channels: k, conns: config.nodePublishers, seconds: config.outageSettle + 60) { w in
            w.key("ports"); w.beginArray(); for n in running { w.int(Int64(n.port)) }; w.endArray()
            w.field("rate", config.outageRate)
        }
        Control.sleep(1.5)
        let killed = Clock.monotonicNanoseconds()
        nats.stopAll()
        Control.sleep(2)
        for i in 0..<nats.size { try nats.start(i) }
        let back = Clock.monotonicNanoseconds()
        publisher.send { $0.field("cmd", "acked") }
        guard let acked = Control.collect([publisher], "acked", timeout: 10)[0] else { throw BenchError("\(label): no acked seqs") }
        var atBack: [Int64] = []
        if case .array(let a)? = acked["finals"] { atBack = a.map { if case .number(let d) = $0 { return Int64(d) } else { return 0 } } }

        // Until every stream has what was acknowledged when NATS came back (seqs past it are
        // the ongoing publishing: "extra" here is not a duplicate).
        var caughtUp: Double?
        var behind = 0
        let deadline = back + Int64(config.outageSettle * 1e9)
        while Clock.monotonicNanoseconds() < deadline {
            for w in subscribers {
                w.send { w in
                    w.field("cmd", "verify")
                    w.key("finals"); w.beginArray(); for f in atBack { w.int(f) }; w.endArray()
                }
            }
            let r = Control.collect(subscribers, "verify", timeout: 10)
            behind = r.reduce(0) { $0 + ($1?.int("missing") ?? 1) + ($1?.int("notOpen") ?? 0) }
            if behind == 0 { caughtUp = Double(Clock.monotonicNanoseconds() - back) / 1e9; break }
            Control.sleep(0.05)
        }
        // A second of publishing through the carrier again, then everything checked.
        Control.sleep(1)
        publisher.send { $0.field("cmd", "stop") }
        guard let p = Control.collect([publisher], "published", timeout: 30)[0] else { throw BenchError("\(label): publishers did not finish") }
        var finals: [Int64] = []
        if case .array(let a)? = p["finals"] { finals = a.map { if case .number(let d) = $0 { return Int64(d) } else { return 0 } } }
        let v = verifyCounts(finals: finals)
        let repairs1 = nodeSeries(running, "dispatch_carrier_repairs_total")
        let up = running.map { Metrics.scrape(port: $0.port).sum("dispatch_carrier_up") }
        closeSubscribers()

        let elapsed = p.double("elapsed") ?? 1
        record(label, "publishes/s (steady rate)", "1/s", higher: true, t, Double(p.int("count") ?? 0) / elapsed)
        record(label, "NATS down (kill->all back)", "s", higher: false, t, Double(back - killed) / 1e9)
        record(label, "catch-up after NATS back", "s", higher: false, t, caughtUp)
        record(label, "events lost", "", higher: false, t, Double(v.lost))
        record(label, "events duplicated/reordered", "", higher: false, t, Double(v.duplicated))
        let repaired = repairs1.map { ($0.key, $0.value - (repairs0[$0.key] ?? 0)) }.filter { $0.1 > 0 }.sorted { $0.1 > $1.1 }
        record(label, "repairs from PostgreSQL", "", higher: false, t, repaired.reduce(0) { $0 + $1.1 }, table: false)
        check(t, "\(label): events lost", v.lost)
        check(t, "\(label): events duplicated", v.duplicated)
        check(t, "\(label): publish errors", Int64(p.int("errors") ?? 0))
        if caughtUp == nil { check(t, "\(label): streams not caught up within \(Int(config.outageSettle)) s", Int64(behind)) }
        notes.append("\(label) rep \(rep + 1): repairs by reason " + (repaired.isEmpty ? "none"
            : repaired.map { "\($0.0) \(Int($0.1))" }.joined(separator: ", ")) + "; dispatch_carrier_up after: \(up.map { fmt($0) }.joined(separator: "/"))")
        log("bench: \(label) rep \(rep + 1): \(s.ready) streams, NATS down \(fmt(Double(back - killed) / 1e9)) s, caught up "
            + "\(caughtUp.map { fmt($0) + " s" } ?? "never (\(behind) behind)") after, lost \(v.lost), duplicated \(v.duplicated), "
            + "\(p.int("errors") ?? 0) publish errors")
    }
}
