import DispatchCore
import DispatchSystem
import DispatchBenchKit
#if canImport(Glibc)
import Glibc
#endif

/// **Restart storm**: streams that behave like a browser's EventSource (they honour `retry:`,
/// reconnect with `Last-Event-ID`, and retry after the reconnection time when the connection
/// is refused) on live activities, publishers that keep publishing (each publish retried
/// until answered, with an Idempotency-Key for Dispatch), and the server restarted in the
/// middle: SIGTERM, wait for it to exit, start it again.
///
/// Times are from the SIGTERM. A stream has *resumed* when its new connection answered
/// `200 text/event-stream`; it has *caught up* when it holds every event published before it
/// resumed (the receipt time of the newest such event, known once a later one arrives; the
/// order checks make sure nothing in between is missing).
extension Orchestrator {
    func restartStorm(_ t: Target, rep: Int) throws {
        guard t.starter != nil else {
            log("bench: \(t.name) restart storm skipped: the bench did not start this server")
            return
        }
        let scenario = "restart \(Self.count(config.stormStreams))/\(Self.count(config.stormActivities))"
        let prefix = "b\(runTag)-rs\(rep)-\(t.name)"
        let k = config.stormActivities
        try batch(t, t.createRequests(names(prefix, k)), what: "creating restart-storm activities")
        let s = try subscribe(t, count: config.stormStreams, path: t.streamPath("\(prefix)-{ch}"), channels: k, trackSeqs: false) { w in
            w.field("reconnect", true)
        }
        startPublishing(t, prefix: prefix, channels: k, conns: config.stormPublishers,
                        seconds: config.stormWarmup + config.stormSettle + 60) { w in
            w.field("rate", config.stormRate)
            w.field("retryDelay", 0.25)
            w.field("idempotent", t.kind == .dispatch)
        }
        // A few clients lose their network 1 s before the restart and come back 4 s later (a
        // phone changing networks): they resume with Last-Event-ID from before the restart,
        // which only a server that keeps its history can answer.
        Control.sleep(max(0, config.stormWarmup - 1))
        for w in subscribers { w.send { $0.field("cmd", "away"); $0.field("every", Int64(config.stormAwayEvery)); $0.field("ms", Int64(4000)) } }
        let away = Control.collect(subscribers, "away", timeout: 10).reduce(0) { $0 + ($1?.int("count") ?? 0) }
        Control.sleep(min(1, config.stormWarmup))

        // The restart.
        let t0 = Clock.wallNanoseconds()
        t.stop()
        let down = Clock.wallNanoseconds()
        t.rootPid = try t.starter!()
        let ready = Clock.wallNanoseconds()
        log("bench: \(t.name) \(scenario) rep \(rep + 1): stopped in \(fmt(Double(down - t0) / 1e9)) s, ready again after "
            + "\(fmt(Double(ready - t0) / 1e9)) s")

        // Until every stream has resumed and caught up (publishing goes on meanwhile).
        var last: [JSONValue?] = []
        let deadline = Clock.monotonicNanoseconds() + Int64(config.stormSettle * 1e9)
        var settled = false
        while Clock.monotonicNanoseconds() < deadline {
            Control.sleep(0.25)
            last = stormReports(since: t0)
            let caught = last.reduce(0) { $0 + ($1?.int("caughtUp") ?? 0) }
            let awayBack = last.reduce(0) { $0 + ($1?.int("awayResumed") ?? 0) }
            if caught >= s.ready - away && awayBack >= away { settled = true; break }
        }
        // A little more publishing after the last stream caught up, then stop and check.
        Control.sleep(0.5)
        publisher.send { $0.field("cmd", "stop") }
        guard let p = Control.collect([publisher], "published", timeout: 30)[0] else {
            throw BenchError("\(t.name): restart-storm publishers did not finish")
        }
        var finals: [Int64] = []
        if case .array(let a)? = p["finals"] { finals = a.map { if case .number(let d) = $0 { return Int64(d) } else { return 0 } } }
        let v = verifyCounts(finals: finals)
        last = stormReports(since: t0)
        closeSubscribers()

        func sum(_ key: String) -> Int { last.reduce(0) { $0 + ($1?.int(key) ?? 0) } }
        var reopen = BenchHistogram(), caught = BenchHistogram()
        var lastResumed: Int64 = 0, lastCaught: Int64 = 0
        for r in last {
            guard let r else { continue }
            reopen.merge(Self.histogram(r["reopen"]))
            caught.merge(Self.histogram(r["caught"]))
            lastResumed = max(lastResumed, Int64(r.double("lastResumed") ?? 0))
            lastCaught = max(lastCaught, Int64(r.double("lastCaughtUp") ?? 0))
            if let e = r.string("error"), !e.isEmpty { log("bench: \(t.name) \(scenario): a stream's last error: \(e)") }
        }
        let streams = s.ready - away
        let resumed = sum("resumed"), caughtUp = sum("caughtUp")
        func sec(_ ns: Int64?) -> Double? { ns.map { Double($0) / 1e9 } }
        record(scenario, "server down (SIGTERM->ready)", "s", higher: false, t, sec(ready - t0))
        record(scenario, "reconnect p50 (after SIGTERM)", "s", higher: false, t, sec(reopen.percentile(0.5)))
        record(scenario, "reconnect p99", "s", higher: false, t, sec(reopen.percentile(0.99)))
        if resumed == streams { record(scenario, "all resumed", "s", higher: false, t, sec(lastResumed - t0)) }
        if caughtUp == streams { record(scenario, "all resumed and caught up", "s", higher: false, t, sec(lastCaught - t0)) }
        record(scenario, "caught up p99", "s", higher: false, t, sec(caught.percentile(0.99)))
        record(scenario, "connects per stream", "", higher: false, t, Double(sum("attempts")) / Double(max(1, streams)))
        record(scenario, "events lost", "", higher: false, t, Double(v.lost))
        record(scenario, "events duplicated", "", higher: false, t, Double(v.duplicated))
        if away > 0 {
            record(scenario, "lost by \(away) streams away", "", higher: false, t, Double(v.awayLost))
            record(scenario, "duplicated, streams away", "", higher: false, t, Double(v.awayDuplicated), table: false)
        }
        record(scenario, "publishes retried", "", higher: false, t, p.double("retries"))
        if sum("httpErrors") > 0 { record(scenario, "reconnects answered non-200", "", higher: false, t, Double(sum("httpErrors"))) }
        let lost = "\(scenario): events lost", dup = "\(scenario): events duplicated"
        if t.kind == .dispatch {
            check(t, lost, v.lost + v.awayLost)
            check(t, dup, v.duplicated + v.awayDuplicated)
            check(t, "\(scenario): streams not resumed", Int64(streams - resumed))
            check(t, "\(scenario): publish errors", Int64(p.int("errors") ?? 0))
        } else {
            // nchan's buffer is in memory: what it loses in a restart is the figure, not a failure.
            if v.lost + v.duplicated + v.awayLost + v.awayDuplicated > 0 {
                notes.append("\(t.name) \(scenario) rep \(rep + 1): \(v.lost) events lost and \(v.duplicated) duplicated by streams "
                             + "connected at the restart, \(v.awayLost) lost and \(v.awayDuplicated) duplicated by the \(away) away "
                             + "(nchan's memory store; reported, not counted as a failure)")
            }
            if streams - resumed > 0 { check(t, "\(scenario): streams not resumed", Int64(streams - resumed)) }
        }
        if !settled {
            notes.append("\(t.name) \(scenario): \(caughtUp) of \(streams) streams caught up within \(Int(config.stormSettle)) s of the restart")
        }
        log("bench: \(t.name) \(scenario) rep \(rep + 1): \(resumed)/\(streams) resumed (last \(fmt(Double(lastResumed - t0) / 1e9)) s), "
            + "\(caughtUp) caught up (last \(fmt(Double(lastCaught - t0) / 1e9)) s), \(sum("attempts")) connects, "
            + "\(sum("refused")) refused, lost \(v.lost), duplicated \(v.duplicated), \(Int(p.double("retries") ?? 0)) publishes retried; "
            + "\(away) away: lost \(v.awayLost), duplicated \(v.awayDuplicated)")
    }

    func stormReports(since: Int64) -> [JSONValue?] {
        for w in subscribers {
            w.send { w in
                w.field("cmd", "storm")
                w.field("since", since)
            }
        }
        return Control.collect(subscribers, "storm", timeout: 10)
    }
}
