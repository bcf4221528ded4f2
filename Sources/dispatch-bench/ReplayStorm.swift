import DispatchCore
import DispatchSystem
import DispatchBenchKit
#if canImport(Glibc)
import Glibc
#endif

/// **Replay storm** (Dispatch only; nchan keeps 16 messages): streams reconnecting with
/// `Last-Event-ID: 0` on activities with long histories, every `replayStalledMod`-th one
/// never reading. The histories are made through the API (one closed-loop publisher per
/// activity), so every stored event is a real one. Then a fresh server (so freed memory
/// does not hide growth) gets all the streams at once while the bench samples the RSS of
/// dispatchd's processes (PostgreSQL excluded) every 100 ms.
extension Orchestrator {
    func replayStorm(_ t: Target, rep: Int) throws {
        guard t.starter != nil, t.rootPid != nil else {
            log("bench: replay storm skipped: the bench did not start this dispatchd (its memory is the figure)")
            return
        }
        let scenario = "replay \(Self.count(config.replayStreams))x\(Self.count(config.replayEvents))"
        let prefix = "b\(runTag)-rp\(rep)"
        let k = config.replayActivities
        let events = Int64(config.replayEvents)
        let made = Clock.monotonicNanoseconds()
        try batch(t, t.createRequests(names(prefix, k)), what: "creating replay activities")
        startPublishing(t, prefix: prefix, channels: k, conns: k, seconds: 600) { w in
            w.field("perChannel", events - 1)
        }
        guard let p = Control.collect([publisher], "published", timeout: 600)[0] else {
            throw BenchError("replay storm: making the histories did not finish")
        }
        var finals: [Int64] = []
        if case .array(let a)? = p["finals"] { finals = a.map { if case .number(let d) = $0 { return Int64(d) } else { return 0 } } }
        guard (p.int("errors") ?? 1) == 0, finals.count == k, finals.allSatisfy({ $0 == events }) else {
            throw BenchError("replay storm: histories incomplete (\(p.int("errors") ?? -1) errors, finals \(finals.prefix(5)))")
        }
        log("bench: \(scenario): \(k) histories of \(events) events made in \(fmt(Double(Clock.monotonicNanoseconds() - made) / 1e9)) s")

        // The readers alone, then the same readers with as many streams that never read: the
        // difference is what the stalled streams cost.
        let stalled = config.replayStalledMod > 0 ? config.replayStreams / config.replayStalledMod : 0
        let readers = config.replayStreams - stalled
        var alone: Double?
        for phase in stalled > 0 ? [0, 1] : [1] {
            let mod = phase == 0 ? 0 : config.replayStalledMod
            let count = phase == 0 ? readers : config.replayStreams
            let label = phase == 0 ? "readers only" : "with stalled"
            let r = try replayPhase(t, scenario: scenario, label: label, prefix: prefix, finals: finals, count: count, stalledMod: mod,
                                    readers: readers, rep: rep)
            if phase == 0 {
                alone = r
                record(scenario, "RSS growth, \(readers) readers alone", "MB", higher: false, t, r.map { $0 / 1024 / 1024 })
            } else if let r {
                record(scenario, "RSS growth, +\(stalled) stalled", "MB", higher: false, t, r / 1024 / 1024)
                if let a = alone, stalled > 0 {
                    record(scenario, "RSS per stalled stream", "KB", higher: false, t, (r - a) / 1024 / Double(stalled))
                }
                if r > 64 * 1024 * 1024 {
                    notes.append("\(scenario): peak RSS growth \(fmt(r / 1024 / 1024)) MB is above the 64 MB target (issue 13)")
                }
            }
        }
    }

    /// One wave of streams on a fresh server; returns the peak RSS growth in bytes.
    func replayPhase(_ t: Target, scenario: String, label: String, prefix: String, finals: [Int64], count: Int, stalledMod: Int,
                     readers: Int, rep: Int) throws -> Double? {
        let k = config.replayActivities
        let events = Int64(config.replayEvents)
        let stalled = count - readers
        try t.restart()
        Control.sleep(1)
        guard let before = t.memory() else { throw BenchError("replay storm: cannot read dispatchd's memory") }
        let tcpBefore = Self.kernelTCPBytes()
        let start = Clock.wallNanoseconds()
        let path = t.streamPath("\(prefix)-{ch}")
        startSubscribe(t, count: count, path: path, channels: k, trackSeqs: false) { w in
            w.field("lastEventID", "0")
            w.field("stalledMod", Int64(stalledMod))
            w.field("stalledRcvbuf", Int64(config.replayStalledRcvbuf))
            w.field("untilSeq", events)
        }
        // Sample while the replay runs, then 2 s more (memory that lags behind the readers).
        var peak = before.rss, peakTCP = tcpBefore, peakHeld = 0.0
        var done = 0, lastDone: Int64 = 0, open = 0
        var finishedAt: Int64 = 0
        let deadline = Clock.monotonicNanoseconds() + 120_000_000_000
        while Clock.monotonicNanoseconds() < deadline {
            if let m = t.memory() { peak = max(peak, m.rss) }
            peakTCP = max(peakTCP, Self.kernelTCPBytes())
            // What the streams hold unsent, against the server's replay memory budget.
            peakHeld = max(peakHeld, FeedProbe.metric(t, "dispatch_replay_memory_bytes") ?? 0)
            for w in subscribers { w.send { $0.field("cmd", "progress") } }
            let got = Control.collect(subscribers, "progress", timeout: 10)
            done = got.reduce(0) { $0 + ($1?.int("done") ?? 0) }
            open = got.reduce(0) { $0 + ($1?.int("open") ?? 0) }
            lastDone = got.reduce(Int64(0)) { max($0, Int64($1?.double("lastDone") ?? 0)) }
            if done >= readers && finishedAt == 0 { finishedAt = Clock.monotonicNanoseconds() }
            if finishedAt > 0 && Clock.monotonicNanoseconds() - finishedAt > 2_000_000_000 { break }
            Control.sleep(0.1)
        }
        let s = try collectSubscribed(t, count: count, path: path, timeout: 5)
        let v = verifyCounts(finals: finals)
        let after = t.memory()
        closeSubscribers()

        let mb = 1024.0 * 1024.0
        let name = "\(scenario) (\(label))"
        let cut = FeedProbe.metric(t, "dispatch_replay_memory_disconnects_total")
        record(scenario, "peak held unsent (\(label))", "MB", higher: false, t, peakHeld / mb)
        if stalled > 0 {
            record(scenario, "stalled cut by the budget", "", higher: false, t, cut)
            if done >= readers { record(scenario, "readers have everything", "s", higher: false, t, Double(lastDone - start) / 1e9) }
            record(scenario, "events replayed to readers/s", "1/s", higher: true, t,
                   done >= readers && lastDone > start ? Double(readers) * Double(events) / (Double(lastDone - start) / 1e9) : nil)
            record(scenario, "kernel TCP memory peak growth", "MB", higher: false, t, Double(peakTCP - tcpBefore) / mb, table: false)
        } else if done >= readers {
            record(scenario, "readers alone have everything", "s", higher: false, t, Double(lastDone - start) / 1e9, table: false)
        }
        check(t, "\(name): events lost", v.lost)
        check(t, "\(name): events duplicated", v.duplicated)
        check(t, "\(name): readers without every event", Int64(readers - done))
        log("bench: \(name) rep \(rep + 1): \(s.ready) streams (\(stalled) never reading), \(done)/\(readers) readers complete "
            + "in \(fmt(Double(lastDone - start) / 1e9)) s, \(open) open; RSS \(before.rss / 1024) KiB -> peak \(peak / 1024) KiB"
            + (after.map { ", \($0.rss / 1024) KiB after" } ?? "") + "; kernel TCP +\((peakTCP - tcpBefore) / 1024) KiB; "
            + "lost \(v.lost), duplicated \(v.duplicated)")
        let cutText = cut.map { String(Int($0)) } ?? "?"
        log("bench: \(name): held unsent peak \(fmt(peakHeld / mb)) MB, \(cutText) stalled streams cut by the budget")
        return Double(peak - before.rss)
    }

    /// Memory the kernel holds in TCP socket buffers, machine-wide (/proc/net/sockstat, pages).
    static func kernelTCPBytes() -> Int {
        for line in (Files.read("/proc/net/sockstat") ?? "").split(separator: "\n") where line.hasPrefix("TCP:") {
            let f = line.split(separator: " ")
            if let k = f.firstIndex(of: "mem"), k + 1 < f.count, let pages = Int(f[k + 1]) { return pages * Int(sysconf(Int32(_SC_PAGESIZE))) }
        }
        return 0
    }
}
