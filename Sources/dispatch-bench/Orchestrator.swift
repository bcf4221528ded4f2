// The run itself: the four side-by-side scenarios and the report. The configuration is in
// BenchConfig.swift; the storms, the nodes and the push bench live in their own files.
import DispatchCore
import DispatchSystem
import DispatchBenchKit
#if canImport(Glibc)
import Glibc
#endif

/// One figure of one scenario, measured for each target in each repetition.
struct Figure {
    let scenario: String
    let metric: String
    let unit: String
    let higherIsBetter: Bool
    /// Shown in the table (false: in the JSON only, to keep the table readable).
    var inTable = true
    var runs: [String: [Double]] = [:]

    func median(_ target: String) -> Double? { BenchStats.median(runs[target] ?? []) }
}

/// Runs every scenario against each target, alternating which goes first, and reports.
final class Orchestrator {
    var config: BenchConfig
    var targets: [Target] = []
    var subscribers: [WorkerHandle] = []
    var publisher: WorkerHandle!
    var figures: [Figure] = []
    var problems: [String] = []
    var checks: [String: [String: Int64]] = [:]
    /// Printed under the table and kept in the JSON.
    var notes: [String] = []
    /// The nodes scenario's dispatchd supervisors (node 1 owns their PostgreSQL).
    var nodeTargets: [Target] = []
    /// Measured nodes runs so far (names each run's activities).
    var nodeRuns = 0
    /// The nodes scenario's NATS cluster while it runs in NATS mode.
    var nodeNATS: BenchNATS?
    let runTag: String
    var tempDir = ""

    init(config: BenchConfig) {
        self.config = config
        let chars = Array("abcdefghijklmnopqrstuvwxyz0123456789")
        runTag = String((0..<5).map { _ in chars[Int.random(in: 0..<chars.count)] })
    }

    var addrs: [String] { Array(Servers.addresses.prefix(max(1, config.addressCount))) }

    // MARK: - Figures

    func record(_ scenario: String, _ metric: String, _ unit: String, higher: Bool, _ target: Target, _ value: Double?,
                table: Bool = true) {
        guard let value, value.isFinite else { return }
        if let k = figures.firstIndex(where: { $0.scenario == scenario && $0.metric == metric }) {
            figures[k].runs[target.name, default: []].append(value)
        } else {
            var f = Figure(scenario: scenario, metric: metric, unit: unit, higherIsBetter: higher)
            f.inTable = table
            f.runs[target.name] = [value]
            figures.append(f)
        }
    }

    /// CPU per operation over a measured window: the server's own processes (dispatchd, or
    /// nginx) and, for Dispatch, its PostgreSQL, in µs. Rates move 10–30 % between runs on a
    /// shared machine; CPU per operation moves far less, and is what sizes a deployment.
    func recordCPU(_ scenario: String, per operation: String, _ t: Target, since a: (server: Double, postgres: Double)?,
                   until end: (server: Double, postgres: Double)? = nil, operations: Int) {
        guard let a, let b = end ?? t.cpu(), operations > 0 else { return }
        record(scenario, "server CPU per \(operation)", "µs", higher: false, t, (b.server - a.server) / Double(operations) * 1e6)
        if t.kind == .dispatch {
            record(scenario, "PostgreSQL CPU per \(operation)", "µs", higher: false, t, (b.postgres - a.postgres) / Double(operations) * 1e6)
        }
    }

    func check(_ target: Target, _ what: String, _ n: Int64) {
        checks[target.name, default: [:]][what, default: 0] += n
        if n != 0 { problems.append("\(target.name): \(what) = \(n)") }
    }

    // MARK: - Run

    func run() throws -> Int32 {
        let start = Clock.monotonicNanoseconds()
        tempDir = makeTempDir()
        defer { cleanup() }
        try startTargets()
        let maxConns = max(config.idleCounts.max() ?? 0, config.fanoutSubscribers, config.throughputSubscribers,
                           config.stormStreams, config.nodeSubscribers * (config.nodeWeakScaling ? config.nodeCounts.max() ?? 1 : 1),
                           config.replayStreams)
        let subWorkers = max(2, (maxConns + 15999) / 16000)
        for k in 0..<subWorkers { subscribers.append(try WorkerHandle(name: "sub\(k)")) }
        publisher = try WorkerHandle(name: "pub")
        log("bench: \(config.mode) run \(runTag): targets \(targets.map(\.name).joined(separator: ", ")), "
            + "\(subWorkers) subscriber processes, \(config.serverWorkers) server processes each")

        let want = config.scenarios
        if want.contains("idle") { try setupIdleActivities() }
        for rep in 0..<config.repeats where !want.isDisjoint(with: ["idle", "fanout", "throughput", "batch", "terminal"]) {
            // Alternate which server goes first so neither always gets the warmer machine.
            let order = rep % 2 == 0 ? targets : targets.reversed()
            if want.contains("idle") { for t in order { try idle(t, rep: rep) } }
            if want.contains("fanout") { for t in order { try fanout(t, rep: rep) } }
            if want.contains("throughput") { for t in order { try throughput(t, rep: rep) } }
            if want.contains("batch") { for t in order { try batchScenario(t, rep: rep) } }
            if want.contains("terminal") { for t in order { try terminal(t, rep: rep) } }
        }
        for rep in 0..<config.stormRepeats {
            let order = rep % 2 == 0 ? targets : targets.reversed()
            if want.contains("restart") { for t in order { try restartStorm(t, rep: rep) } }
            if want.contains("replay") { for t in order where t.kind == .dispatch { try replayStorm(t, rep: rep) } }
            if want.contains("feed") { for t in order where t.kind == .dispatch { try feedScenario(t, rep: rep) } }
            // Nodes start their own dispatchd supervisors: not with an already running Dispatch.
            if want.contains("nodes") && config.targets.contains(.dispatch) && config.externalDispatchPort == nil { try nodes(rep: rep) }
        }
        let elapsed = Double(Clock.monotonicNanoseconds() - start) / 1e9
        // A run of some scenarios only does not replace the latest complete run.
        let tag = config.scenarios == BenchConfig.allScenarios ? config.mode
            : config.mode + "-" + config.scenarios.sorted().joined(separator: "+")
        return try BenchReport.finish(table: renderTable(elapsed: elapsed), json: json(elapsed: elapsed),
                                      to: .init(explicit: config.jsonOut, resultsDir: config.resultsDir, tag: tag), problems: problems)
    }

    func makeTempDir() -> String {
        var template = Array("/tmp/dispatch-bench-XXXXXX".utf8CString)
        let p = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
        let dir = p.map { String(cString: $0) } ?? "/tmp/dispatch-bench-\(getpid())"
        // dispatchd runs its embedded PostgreSQL as the postgres user, who must reach the data dir.
        chmod(dir, 0o755)
        return dir
    }

    func startTargets() throws {
        for kind in config.targets {
            switch kind {
            case .dispatch:
                if let port = config.externalDispatchPort {
                    targets.append(Target(kind: .dispatch, port: port, key: config.externalDispatchKey, rootPid: nil))
                } else {
                    let port = Servers.freePort(startingAt: 18080)
                    targets.append(try Servers.startDispatch(binary: config.dispatchd, dir: tempDir,
                                                             workers: config.serverWorkers, port: port))
                }
            case .nchan:
                let port = Servers.freePort(startingAt: 19080)
                targets.append(try Servers.startNginx(template: config.template, dir: tempDir,
                                                      workers: config.serverWorkers, port: port))
            }
        }
    }

    func cleanup() {
        for w in subscribers { w.stop() }
        publisher?.stop()
        for t in nodeTargets.reversed() { t.stop() }
        nodeTargets.removeAll()
        nodeNATS?.stopAll()
        for t in targets { t.stop() }
        if !tempDir.isEmpty, tempDir.hasPrefix("/tmp/dispatch-bench-") {
            _ = Proc.run("/bin/rm", ["-rf", tempDir])
        }
    }

    // MARK: - Worker helpers

    /// Sends a batch of requests through the publisher process; fails on any non-2xx.
    func batch(_ t: Target, _ requests: [(String, String, String)], what: String, auth: String? = nil) throws {
        guard !requests.isEmpty else { return }
        publisher.send { w in
            w.field("cmd", "batch")
            w.key("addrs"); w.beginArray(); for a in addrs { w.string(a) }; w.endArray()
            w.field("port", Int64(t.port))
            w.field("auth", auth ?? t.key)
            w.field("target", t.name)
            w.field("conns", Int64(16))
            w.key("requests"); w.beginArray()
            for (m, p, b) in requests {
                w.beginObject(); w.field("method", m); w.field("path", p); w.field("body", b); w.endObject()
            }
            w.endArray()
        }
        guard let r = Control.collect([publisher], "batch", timeout: 30 + Double(requests.count) / 200)[0] else { throw BenchError("\(t.name): \(what) timed out") }
        if (r.int("errors") ?? 1) != 0 {
            throw BenchError("\(t.name): \(what): \(r.int("errors") ?? 0) of \(requests.count) failed (\(r.string("error") ?? ""))")
        }
    }

    struct Subscribed {
        var ready = 0
        var failed = 0
        var elapsed = 0.0
    }

    /// Opens `count` streams spread over the subscriber processes; returns when all are ready.
    /// `extra` adds fields to each process's command (reconnecting, Last-Event-ID, nodes…).
    func subscribe(_ t: Target, count: Int, path: String, channels: Int, trackSeqs: Bool,
                   firstIndex: Int = 0, extra: (inout JSONWriter) -> Void = { _ in }) throws -> Subscribed {
        startSubscribe(t, count: count, path: path, channels: channels, trackSeqs: trackSeqs, firstIndex: firstIndex, extra: extra)
        return try collectSubscribed(t, count: count, path: path, timeout: 60)
    }

    /// Sends the subscribe commands without waiting (the replay storm samples memory meanwhile).
    func startSubscribe(_ t: Target, count: Int, path: String, channels: Int, trackSeqs: Bool,
                        firstIndex: Int = 0, extra: (inout JSONWriter) -> Void = { _ in }) {
        let n = subscribers.count
        var first = firstIndex
        for (k, w) in subscribers.enumerated() {
            let share = count / n + (k < count % n ? 1 : 0)
            let f = first
            first += share
            w.send { w in
                w.field("cmd", "subscribe")
                w.key("addrs"); w.beginArray(); for a in addrs { w.string(a) }; w.endArray()
                w.field("port", Int64(t.port))
                w.field("path", path)
                w.field("count", Int64(share))
                w.field("first", Int64(f))
                w.field("channels", Int64(channels))
                w.field("inflight", Int64(256))
                w.field("needFirstEvent", t.readyOnFirstEvent)
                w.field("seqAtSubscribe", t.seqAtSubscribe)
                w.field("trackSeqs", trackSeqs)
                extra(&w)
            }
        }
    }

    func collectSubscribed(_ t: Target, count: Int, path: String, timeout: Double) throws -> Subscribed {
        let got = Control.collect(subscribers, "subscribed", timeout: timeout)
        var s = Subscribed()
        for (k, g) in got.enumerated() {
            guard let g else { throw BenchError("\(t.name): subscriber process \(k) did not get all \(count / subscribers.count) streams open within \(Int(timeout)) s (\(path))") }
            s.ready += g.int("ready") ?? 0
            s.failed += g.int("failed") ?? 0
            s.elapsed = max(s.elapsed, g.double("elapsed") ?? 0)
            if (g.int("failed") ?? 0) > 0 { log("bench: \(t.name): \(g.int("failed") ?? 0) streams failed: \(g.string("error") ?? "")") }
        }
        check(t, "streams failed to open", Int64(s.failed))
        return s
    }

    /// Tells the publisher process to publish to `t`'s activities `<prefix>-{ch}` over `conns`
    /// connections for `seconds` (through `port` when not `t`'s); `more` adds a scenario's fields.
    func startPublishing(_ t: Target, port: UInt16? = nil, prefix: String, channels: Int, conns: Int, seconds: Double,
                         more: (inout JSONWriter) -> Void = { _ in }) {
        publisher.send { w in
            w.field("cmd", "publish")
            w.key("addrs"); w.beginArray(); for a in addrs { w.string(a) }; w.endArray()
            w.field("port", Int64(port ?? t.port))
            w.field("auth", t.key)
            w.field("target", t.name)
            w.field("conns", Int64(conns))
            w.field("channels", Int64(channels))
            w.field("name", "\(prefix)-{ch}")
            w.field("duration", seconds)
            w.field("seqAtSubscribe", t.seqAtSubscribe)
            more(&w)
        }
    }

    func closeSubscribers() {
        for w in subscribers { w.send { $0.field("cmd", "close") } }
        _ = Control.collect(subscribers, "closed", timeout: 30)
    }

    struct Verified {
        var lost: Int64 = 0
        var duplicated: Int64 = 0
        var notOpen: Int64 = 0
        var checked: Int64 = 0
        /// Of streams that were away across a restart (restart storm).
        var awayLost: Int64 = 0
        var awayDuplicated: Int64 = 0
    }

    /// Waits until every stream has seen its channel's final seq (or 10 s), then records losses.
    func verify(_ t: Target, finals: [Int64], scenario: String) {
        let v = verifyCounts(finals: finals)
        check(t, "\(scenario): events lost", v.lost)
        check(t, "\(scenario): events duplicated", v.duplicated)
    }

    /// The same wait, returning what it found (lost: gaps, never-received finals and a first
    /// event after a skipped one; duplicated: repeats and ids past the final).
    func verifyCounts(finals: [Int64]) -> Verified {
        var last: [JSONValue?] = []
        let deadline = Clock.monotonicNanoseconds() + 10_000_000_000
        repeat {
            for w in subscribers {
                w.send { w in
                    w.field("cmd", "verify")
                    w.key("finals"); w.beginArray(); for f in finals { w.int(f) }; w.endArray()
                }
            }
            last = Control.collect(subscribers, "verify", timeout: 10)
            let missing = last.reduce(Int64(0)) { $0 + Int64($1?.int("missing") ?? 0) + Int64($1?.int("notOpen") ?? 0) }
            if missing == 0 { break }
            Control.sleep(0.2)
        } while Clock.monotonicNanoseconds() < deadline
        func sum(_ k: String) -> Int64 { last.reduce(Int64(0)) { $0 + Int64($1?.int(k) ?? 0) } }
        return Verified(lost: sum("missing") + sum("gaps") + sum("lostAtStart"), duplicated: sum("dups") + sum("extra"),
                        notOpen: sum("notOpen"), checked: sum("checked"), awayLost: sum("awayLost"), awayDuplicated: sum("awayDuplicated"))
    }

    func reports() -> (deliveries: Int, hist: BenchHistogram) {
        for w in subscribers { w.send { $0.field("cmd", "report") } }
        var h = BenchHistogram()
        var d = 0
        for r in Control.collect(subscribers, "report", timeout: 10) {
            guard let r else { continue }
            d += r.int("deliveries") ?? 0
            h.merge(Self.histogram(r["hist"]))
        }
        return (d, h)
    }

    static func histogram(_ v: JSONValue?) -> BenchHistogram {
        var h = BenchHistogram()
        if case .array(let pairs)? = v {
            for p in pairs {
                if case .array(let ic) = p, ic.count == 2, case .number(let i) = ic[0], case .number(let c) = ic[1] {
                    h.add(bucket: Int(i), count: Int(c))
                }
            }
        }
        return h
    }

    /// 10000 -> "10k", 300 -> "300": scenario labels.
    static func count(_ n: Int) -> String { n >= 1000 && n % 1000 == 0 ? "\(n / 1000)k" : n >= 1000 ? "\(Double(n / 100) / 10)k" : "\(n)" }

    func names(_ prefix: String, _ n: Int) -> [String] { (0..<n).map { "\(prefix)-\($0)" } }

    // MARK: - Scenarios

    var idlePrefix: String { "b\(runTag)-idle" }

    func setupIdleActivities() throws {
        for t in targets { try batch(t, t.createRequests(names(idlePrefix, config.idleActivities)), what: "creating idle activities") }
    }

    /// Streams are added in steps (1k, then up to 10k, then up to 50k) on a freshly started
    /// server: memory freed by an earlier step or scenario would otherwise be reused and hide
    /// the cost. Per stream = (RSS now - RSS of the fresh, empty server) / streams open.
    func idle(_ t: Target, rep: Int) throws {
        try t.restart()
        Control.sleep(1)
        let before = t.memory()
        var open = 0
        for n in config.idleCounts.sorted() where n > open {
            let scenario = "idle \(Self.count(n))"
            let cpu0 = t.cpu()
            let client0 = subscribers.reduce(0.0) { $0 + PushRun.cpuSeconds($1.pid) }
            let s = try subscribe(t, count: n - open, path: t.streamPath("\(idlePrefix)-{ch}"),
                                  channels: config.idleActivities, trackSeqs: false, firstIndex: open)
            recordCPU(scenario, per: "connect", t, since: cpu0, operations: s.ready)
            // The bench's own side (its subscriber processes): whether the client bounds the rate.
            let client = subscribers.reduce(0.0) { $0 + PushRun.cpuSeconds($1.pid) } - client0
            if s.ready > 0 { record(scenario, "client CPU per connect", "µs", higher: false, t, client / Double(s.ready) * 1e6) }
            open += s.ready + s.failed
            Control.sleep(1.5)
            let after = t.memory()
            record(scenario, "connect rate", "streams/s", higher: true, t, Double(s.ready) / max(s.elapsed, 1e-6))
            if let b = before, let a = after, open > 0 {
                record(scenario, "memory per stream (RSS)", "B", higher: false, t, Double(a.rss - b.rss) / Double(open))
                record(scenario, "memory per stream (PSS)", "B", higher: false, t, Double(a.pss - b.pss) / Double(open))
            }
            log("bench: \(t.name) \(scenario) rep \(rep + 1): +\(s.ready) streams in \(fmt(s.elapsed))s"
                + (before != nil && after != nil ? ", rss \(before!.rss / 1024) -> \(after!.rss / 1024) KiB over \(after!.processes) processes" : ""))
        }
        closeSubscribers()
    }

    func fanout(_ t: Target, rep: Int) throws {
        let activity = "b\(runTag)-fan\(rep)-\(t.name)"
        try batch(t, t.createRequests([activity]), what: "creating the fan-out activity")
        let s = try subscribe(t, count: config.fanoutSubscribers, path: t.streamPath(activity), channels: 1, trackSeqs: true)
        Control.sleep(0.5)
        var firsts: [Double] = [], lasts: [Double] = []
        var seq = t.seqAtSubscribe
        var cpu = (server: 0.0, postgres: 0.0)
        for _ in 0..<config.fanoutEvents {
            seq += 1
            // CPU per delivery: only while an event goes out (not the pauses between them).
            let cpu0 = t.cpu()
            let pubT = try t.publishNow(activity, seq: seq)
            let s = seq
            let got = Control.collect(subscribers, "fan", timeout: 15) { $0.int("seq") == Int(s) }
            if let a = cpu0, let b = t.cpu() {
                cpu.server += b.server - a.server
                cpu.postgres += b.postgres - a.postgres
            }
            let done = got.compactMap { $0 }
            if done.count < got.count { problems.append("\(t.name): fan-out event \(seq) did not reach every subscriber within 15 s") }
            if let f = done.compactMap({ $0.double("first") }).min(), let l = done.compactMap({ $0.double("last") }).max() {
                firsts.append((f - Double(pubT)) / 1e6)
                lasts.append((l - Double(pubT)) / 1e6)
            }
            Control.sleep(0.05)
        }
        verify(t, finals: [seq], scenario: "fanout")
        closeSubscribers()
        let scenario = "fanout \(Self.count(config.fanoutSubscribers))"
        recordCPU(scenario, per: "delivery", t, since: (0, 0), until: cpu, operations: config.fanoutEvents * s.ready)
        record(scenario, "last receipt p50", "ms", higher: false, t, BenchStats.percentile(lasts, 0.5))
        record(scenario, "last receipt p99", "ms", higher: false, t, BenchStats.percentile(lasts, 0.99))
        record(scenario, "first receipt p50", "ms", higher: false, t, BenchStats.percentile(firsts, 0.5))
        log("bench: \(t.name) fanout rep \(rep + 1): \(s.ready) subscribers, last p50 \(fmt(BenchStats.percentile(lasts, 0.5) ?? -1)) ms")
    }

    func throughput(_ t: Target, rep: Int) throws {
        let prefix = "b\(runTag)-tp\(rep)-\(t.name)"
        let k = config.throughputActivities
        try batch(t, t.createRequests(names(prefix, k)), what: "creating throughput activities")
        let s = try subscribe(t, count: config.throughputSubscribers, path: t.streamPath("\(prefix)-{ch}"),
                              channels: k, trackSeqs: false)
        Control.sleep(0.5)
        for w in subscribers { w.send { $0.field("cmd", "reset") } }
        _ = Control.collect(subscribers, "reset", timeout: 10)
        // Dispatch's writer round trips (each one batch, one commit): the commit's share of a publish.
        let commitsBefore = t.kind == .dispatch ? Metrics.scrape(port: t.port).histogram("dispatch_db_query_seconds", "session=\"writer\"") : nil
        let cpu0 = t.cpu()
        startPublishing(t, prefix: prefix, channels: k, conns: config.throughputPublishers, seconds: config.throughputSeconds)
        guard let p = Control.collect([publisher], "published", timeout: config.throughputSeconds + 60)[0] else {
            throw BenchError("\(t.name): publishers did not finish")
        }
        let windowReport = reports()
        let cpu1 = t.cpu()
        let commits = commitsBefore.map { Metrics.scrape(port: t.port).histogram("dispatch_db_query_seconds", "session=\"writer\"").subtracting($0) }
        var finals: [Int64] = []
        if case .array(let a)? = p["finals"] { finals = a.map { if case .number(let d) = $0 { return Int64(d) } else { return 0 } } }
        verify(t, finals: finals, scenario: "throughput")
        let final = reports()
        closeSubscribers()
        let elapsed = p.double("elapsed") ?? 1
        let published = Double(p.int("count") ?? 0)
        check(t, "throughput: publish errors", Int64(p.int("errors") ?? 0))
        if (p.int("errors") ?? 0) > 0 { log("bench: \(t.name) publish error: \(p.string("error") ?? "")") }
        let scenario = "throughput \(Self.count(config.throughputSubscribers))/\(Self.count(k))"
        let ack = Self.histogram(p["ackHist"])
        record(scenario, "publishes/s", "1/s", higher: true, t, published / elapsed)
        record(scenario, "deliveries/s", "1/s", higher: true, t, Double(windowReport.deliveries) / elapsed)
        record(scenario, "publish->receipt p50", "ms", higher: false, t, final.hist.percentile(0.5).map { Double($0) / 1e6 })
        record(scenario, "publish->receipt p99", "ms", higher: false, t, final.hist.percentile(0.99).map { Double($0) / 1e6 })
        record(scenario, "publish ack p50", "ms", higher: false, t, ack.percentile(0.5).map { Double($0) / 1e6 })
        if let cpu1 {
            recordCPU(scenario, per: "publish", t, since: cpu0, until: cpu1, operations: Int(published))
            recordCPU(scenario, per: "delivery", t, since: cpu0, until: cpu1, operations: windowReport.deliveries)
        }
        if let commits {
            record(scenario, "commit round trip p50", "ms", higher: false, t, commits.percentile(0.5).map { $0 * 1000 })
        }
        log("bench: \(t.name) throughput rep \(rep + 1): \(s.ready) subscribers, \(Int(published / elapsed)) publishes/s, "
            + "\(Int(Double(windowReport.deliveries) / elapsed)) deliveries/s")
    }

    func terminal(_ t: Target, rep: Int) throws {
        let prefix = "b\(runTag)-term\(rep)-\(t.name)"
        let list = names(prefix, config.terminalActivities)
        try batch(t, t.createRequests(list), what: "creating terminal activities")
        try batch(t, t.finishRequests(list), what: "finishing terminal activities")
        let paths = list.map { t.finishedStreamPath($0) }
        let per = max(1, config.terminalConnections / subscribers.count)
        let cpu0 = t.cpu()
        for w in subscribers {
            w.send { w in
                w.field("cmd", "terminal")
                w.key("addrs"); w.beginArray(); for a in addrs { w.string(a) }; w.endArray()
                w.field("port", Int64(t.port))
                w.field("target", t.name)
                w.field("conns", Int64(per))
                w.field("duration", config.terminalSeconds)
                w.field("expectTerminal", t.kind == .dispatch)
                w.key("paths"); w.beginArray(); for p in paths { w.string(p) }; w.endArray()
            }
        }
        let got = Control.collect(subscribers, "terminal", timeout: config.terminalSeconds + 60)
        var count = 0, errors = 0, wrong = 0
        var elapsed = 0.0
        for g in got {
            guard let g else { throw BenchError("\(t.name): terminal streams did not finish") }
            count += g.int("count") ?? 0
            errors += g.int("errors") ?? 0
            wrong += g.int("wrongEvent") ?? 0
            elapsed = max(elapsed, g.double("elapsed") ?? 0)
            if (g.int("errors") ?? 0) > 0 { log("bench: \(t.name) terminal: \(g.string("error") ?? "")") }
        }
        check(t, "terminal: failed streams", Int64(errors))
        check(t, "terminal: wrong final event", Int64(wrong))
        record("terminal", "finished streams/s", "1/s", higher: true, t, Double(count) / max(elapsed, 1e-6))
        recordCPU("terminal", per: "finished stream", t, since: cpu0, operations: count)
        log("bench: \(t.name) terminal rep \(rep + 1): \(count) streams in \(fmt(elapsed))s")
    }

    // MARK: - Output

    func fmt(_ v: Double) -> String {
        if v.isNaN { return "-" }
        let a = abs(v)
        if a >= 100_000 { return String(Int(v.rounded())) }
        if a >= 100 { return String(Int(v.rounded())) }
        if a >= 10 { return String(Double(Int(v * 10)) / 10) }
        return String(Double(Int(v * 100)) / 100)
    }

    func renderTable(elapsed: Double) -> String {
        var lines: [String] = []
        let names = targets.map(\.name)
        let hasBoth = names.contains("dispatch") && names.contains("nchan")
        lines.append("Dispatch vs nginx+nchan — \(config.mode) mode, \(config.repeats) run(s) each, medians; \(fmt(elapsed)) s")
        lines.append(BenchReport.machine().map { "\($0.0): \($0.1)" }.joined(separator: "; "))
        var header = BenchReport.pad("scenario", 22) + BenchReport.pad("figure", 32) + BenchReport.pad("unit", 10)
        for n in names { header += BenchReport.pad(n, 12, right: true) }
        if hasBoth { header += BenchReport.pad("D/nchan", 10, right: true) + "  better" }
        lines.append(header)
        lines.append(String(repeating: "-", count: header.count))
        for f in figures where f.inTable {
            var l = BenchReport.pad(f.scenario, 22) + BenchReport.pad(f.metric, 32) + BenchReport.pad(f.unit, 10)
            for n in names { l += BenchReport.pad(f.median(n).map(fmt) ?? "-", 12, right: true) }
            if hasBoth {
                if let d = f.median("dispatch"), let c = f.median("nchan"), c != 0 {
                    l += BenchReport.pad(fmt(d / c), 10, right: true)
                } else {
                    l += BenchReport.pad("-", 10, right: true)
                }
                l += "  " + (f.higherIsBetter ? "higher" : "lower")
            }
            lines.append(l)
        }
        lines.append("")
        for n in names {
            let c = checks[n] ?? [:]
            let bad = c.filter { $0.value != 0 }
            lines.append("\(n): " + (bad.isEmpty ? "no lost, duplicated or failed events/streams"
                                                 : bad.map { "\($0.key) = \($0.value)" }.sorted().joined(separator: "; ")))
        }
        for n in notes { lines.append("note: " + n) }
        return lines.joined(separator: "\n")
    }

    func json(elapsed: Double) -> JSONWriter {
        var w = JSONWriter(capacity: 8192)
        w.beginObject()
        w.field("mode", config.mode)
        w.field("runTag", runTag)
        w.field("unixTime", Clock.nowMilliseconds() / 1000)
        w.field("elapsedSeconds", elapsed)
        w.field("repeats", Int64(config.repeats))
        w.field("serverProcesses", Int64(config.serverWorkers))
        w.field("subscriberProcesses", Int64(subscribers.count))
        BenchReport.writeMachine(&w)
        w.key("figures"); w.beginArray()
        for f in figures {
            w.beginObject()
            w.field("scenario", f.scenario)
            w.field("figure", f.metric)
            w.field("unit", f.unit)
            w.field("better", f.higherIsBetter ? "higher" : "lower")
            if !f.inTable { w.field("inTable", false) }
            for t in targets { if let m = f.median(t.name) { w.field(t.name, m) } else { w.key(t.name); w.null() } }
            if let d = f.median("dispatch"), let c = f.median("nchan"), c != 0 { w.field("ratio", d / c) }
            w.key("runs"); w.beginObject()
            for t in targets { w.key(t.name); w.beginArray(); for v in f.runs[t.name] ?? [] { w.number(v) }; w.endArray() }
            w.endObject()
            w.endObject()
        }
        w.endArray()
        w.key("checks"); w.beginObject()
        for t in targets {
            w.key(t.name); w.beginObject()
            for (k, v) in (checks[t.name] ?? [:]).sorted(by: { $0.key < $1.key }) { w.field(k, v) }
            w.endObject()
        }
        w.endObject()
        w.key("problems"); w.beginArray(); for p in problems { w.string(p) }; w.endArray()
        w.key("notes"); w.beginArray(); for n in notes { w.string(n) }; w.endArray()
        w.endObject()
        return w
    }
}
