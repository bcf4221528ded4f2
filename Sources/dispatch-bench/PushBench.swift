// A whole second benchmark (runner, scenarios, report), kept apart from the stream scenarios so
// neither has to know the other; its APNs stand-ins are in APNsStandIn.swift.
import DispatchBlockingHTTP
import DispatchCore
import DispatchBenchKit
import DispatchSystem
#if canImport(Glibc)
import Glibc
#endif

/// `dispatch-bench push`: Live Activity pushes under load (see bench/README.md, "Pushes").
///
/// 1. **Steady pushes**, against each APNs stand-in (the fake APNs of the tests, and nginx
///    answering 200 over HTTP/2 + TLS for the server's own ceiling): `activities` activities,
///    each with an update token on `devices` phones, updated at a steady `rate` per second
///    (each activity about once a second); pushes/s sustained, change → APNs latency, and
///    where the CPU went.
/// 2. **Stream throughput with pushes on vs off**: the throughput scenario's shape (closed-loop
///    publishers, streams open on every activity), once without APNs and once with a token on
///    every activity.
enum PushBench {
    struct Options {
        var activities = 1000
        var devices = 5
        var rate = 1000.0
        var seconds = 10.0
        var workers = 2
        var standIns = ["fake", "nginx"]
        var throughput = true
        var throughputStandIn = "nginx"
        var tpActivities = 1000
        var tpSubscribers = 5000
        var tpPublishers = 64
        var tpSeconds = 5.0
        var repeats = 3
        var dispatchd = ""
        var json: String?
        var mode = "push"
        /// Broadcast vs tokens (PushBroadcastBench.swift): phones watching one activity.
        var broadcast = true
        var broadcastOnly = false
        var watchers = 10_000
        var broadcastRate = 1.0
    }

    static let usage = """
    usage: dispatch-bench push [options]
      --activities N        activities with tokens (default 1000)
      --devices N           phones (update tokens) per activity (default 5)
      --rate R              updates per second, spread over the activities (default 1000)
      --seconds S           length of the steady phase (default 10)
      --apns LIST           stand-ins, comma-separated: fake (the tests' fake APNs), nginx (default both)
      --no-throughput       skip stream throughput with pushes on vs off
      --repeats N           throughput runs per mode, alternating order; medians (default 3)
      --throughput-apns K   stand-in for the "on" run (default nginx: it measures dispatchd, not the fake)
      --server-workers N    DISPATCH_WORKERS (default 2)
      --dispatchd PATH      dispatchd binary (default: next to dispatch-bench)
      --json PATH           results JSON (default bench/results/<time>-push.json)
      --watchers N          phones watching the one activity of the broadcast scenario (default 10000)
      --broadcast-rate R    its changes per second (default 1)
      --no-broadcast        skip broadcast vs tokens
      --broadcast-only      run only broadcast vs tokens
      --smoke               tiny sizes, seconds (for the tests)
    """

    static func run(_ args: [String]) -> Int32 {
        var o = Options()
        o.dispatchd = "/" + Subprocess.executablePath().split(separator: "/").dropLast().joined(separator: "/") + "/dispatchd"
        var i = 0
        func value() -> String? { i += 1; return i < args.count ? args[i] : nil }
        while i < args.count {
            switch args[i] {
            case "--activities": o.activities = max(1, Int(value() ?? "") ?? o.activities)
            case "--devices": o.devices = max(1, Int(value() ?? "") ?? o.devices)
            case "--rate": o.rate = max(1, Double(value() ?? "") ?? o.rate)
            case "--seconds": o.seconds = max(1, Double(value() ?? "") ?? o.seconds)
            case "--apns": o.standIns = (value() ?? "").split(separator: ",").map(String.init)
            case "--no-throughput": o.throughput = false
            case "--repeats": o.repeats = max(1, Int(value() ?? "") ?? o.repeats)
            case "--throughput-apns": o.throughputStandIn = value() ?? o.throughputStandIn
            case "--server-workers": o.workers = max(1, Int(value() ?? "") ?? 2)
            case "--dispatchd": o.dispatchd = value() ?? o.dispatchd
            case "--json": o.json = value()
            case "--watchers": o.watchers = max(1, Int(value() ?? "") ?? o.watchers)
            case "--broadcast-rate": o.broadcastRate = max(0.1, Double(value() ?? "") ?? o.broadcastRate)
            case "--no-broadcast": o.broadcast = false
            case "--broadcast-only": o.broadcastOnly = true
            case "--smoke":
                o.mode = "push-smoke"
                o.activities = 20; o.devices = 2; o.rate = 40; o.seconds = 2
                o.tpActivities = 20; o.tpSubscribers = 40; o.tpPublishers = 4; o.tpSeconds = 1.5; o.repeats = 1
                o.watchers = 20
            case "--help", "-h":
                log(usage)
                return 0
            default:
                log("unknown option \(args[i])\n" + usage)
                return 64
            }
            i += 1
        }
        guard o.standIns.allSatisfy({ $0 == "fake" || $0 == "nginx" }), ["fake", "nginx"].contains(o.throughputStandIn) else {
            log(usage)
            return 64
        }
        BenchMain.installSignalHandlers(deadline: 900)
        let bench = PushRun(options: o)
        do {
            return try bench.run()
        } catch {
            log("bench push: \(error)")
            bench.cleanup()
            return 1
        }
    }
}

/// One `dispatch-bench push` run: its processes, figures and output.
final class PushRun {
    let o: PushBench.Options
    let orchestrator: Orchestrator
    var dir = ""
    var pki = ""
    var rows: [(scenario: String, figure: String, unit: String, value: Double)] = []
    var notes: [String] = []
    var problems: [String] = []
    var standIns: [APNsStandIn] = []
    var targets: [Target] = []

    init(options: PushBench.Options) {
        o = options
        var c = BenchConfig.preset("quick")
        c.addressCount = 8
        c.serverWorkers = options.workers
        c.throughputSubscribers = options.tpSubscribers
        orchestrator = Orchestrator(config: c)
    }

    func record(_ scenario: String, _ figure: String, _ unit: String, _ value: Double?) {
        guard let value, value.isFinite else { return }
        rows.append((scenario, figure, unit, value))
        log("bench push: \(scenario): \(figure) = \(orchestrator.fmt(value)) \(unit)")
    }

    func run() throws -> Int32 {
        let started = Clock.monotonicNanoseconds()
        dir = orchestrator.makeTempDir()
        orchestrator.tempDir = dir
        defer { cleanup() }
        pki = dir + "/pki"
        guard Proc.run("/bin/sh", ["Tests/tools/make_test_pki.sh", pki]) == 0 else {
            throw BenchError("Tests/tools/make_test_pki.sh failed (run from the repository root; needs openssl)")
        }
        orchestrator.publisher = try WorkerHandle(name: "pub")
        if !o.broadcastOnly {
            for kind in o.standIns { try steady(kind) }
            if o.throughput { try throughputOnOff() }
        }
        if o.broadcast || o.broadcastOnly { try broadcastVsTokens() }
        let elapsed = Double(Clock.monotonicNanoseconds() - started) / 1e9
        return try BenchReport.finish(table: render(elapsed: elapsed), json: json(elapsed: elapsed),
                                      to: .init(explicit: o.json, resultsDir: "bench/results", tag: o.mode), problems: problems)
    }

    func cleanup() {
        for t in targets { t.stop() }
        targets.removeAll()
        for s in standIns { s.stop() }
        standIns.removeAll()
        for w in orchestrator.subscribers { w.stop() }
        orchestrator.subscribers.removeAll()
        orchestrator.publisher?.stop()
        orchestrator.publisher = nil
        if dir.hasPrefix("/tmp/dispatch-bench-") { _ = Proc.run("/bin/rm", ["-rf", dir]) }
        dir = ""
    }

    // MARK: - Servers

    func startDispatch(name: String, standIn: APNsStandIn?, extra: [String: String] = [:]) throws -> Target {
        var env = extra
        if let s = standIn {
            // Every APNs host at the stand-in: the bench never reaches Apple.
            let url = "https://127.0.0.1:\(s.port)", manage = "https://127.0.0.1:\(s.managePort ?? s.port)"
            env.merge(["DISPATCH_APNS_KEY_FILE": pki + "/AuthKey_TESTKEY123.p8", "DISPATCH_APNS_KEY_ID": "TESTKEY123",
                       "DISPATCH_APNS_TEAM_ID": "TEAM123456", "DISPATCH_APNS_TOPIC": "com.example.dispatch",
                       "DISPATCH_APNS_URL": url, "DISPATCH_APNS_SANDBOX_URL": url, "DISPATCH_APNS_MANAGE_URL": manage,
                       "DISPATCH_APNS_MANAGE_SANDBOX_URL": manage, "DISPATCH_APNS_CA_FILE": pki + "/ca.pem"]) { $1 }
        }
        let sub = dir + "/" + name
        try? Files.makeDirectory(sub)
        let t = try Servers.startDispatch(binary: o.dispatchd, dir: sub, workers: o.workers,
                                          port: Servers.freePort(startingAt: 18580), env: env)
        targets.append(t)
        // /readyz answers for the whole server; also wait until its metrics say the database
        // sessions of every worker are up (the lowest of them).
        let deadline = Clock.monotonicNanoseconds() + 30_000_000_000
        while Clock.monotonicNanoseconds() < deadline {
            let m = Metrics.scrape(port: t.port, workers: o.workers)
            if m.sum("dispatch_db_up") >= 1 { break }
            Control.sleep(0.1)
        }
        return t
    }

    func stop(_ t: Target) {
        t.stop()
        targets.removeAll { $0 === t }
    }

    static func token(device: Int, activity: Int) -> String {
        let d = String(device, radix: 16), a = String(activity, radix: 16)
        return String(repeating: "0", count: 24 - d.count) + d + String(repeating: "0", count: 40 - a.count) + a
    }

    /// Starts the activities and registers an update token for each on `devices` phones. A phone
    /// keeps at most 64 activity tokens (DISPATCH_MAX_ACTIVITY_TOKENS_PER_DEVICE), so each 64
    /// activities get phones of their own: one device token per (phone, 64 activities).
    func setUp(_ t: Target, prefix: String, activities: Int, devices: Int) throws {
        let names = (0..<activities).map { "\(prefix)-\($0)" }
        try orchestrator.batch(t, t.createRequests(names), what: "creating activities")
        var registrations: [(String, String, String)] = []
        for d in 0..<devices {
            for chunk in stride(from: 0, to: activities, by: 64) {
                let pairs = (chunk..<min(activities, chunk + 64)).map { #""\#(names[$0])":"\#(Self.token(device: d, activity: $0))""# }
                registrations.append(("POST", "/v1/activity-tokens",
                                      #"{"deviceToken":"\#(Self.token(device: d, activity: 0xFFFFFF - chunk / 64))","activityTokens":{\#(pairs.joined(separator: ","))}}"#))
            }
        }
        try orchestrator.batch(t, registrations, what: "registering tokens")
    }

    /// Waits until every worker's sender has delivered `count` pushes in all (or `timeout`).
    func waitDelivered(_ t: Target, _ count: Double, timeout: Double) -> Bool {
        let deadline = Clock.monotonicNanoseconds() + Int64(timeout * 1e9)
        while Clock.monotonicNanoseconds() < deadline {
            if Metrics.scrape(port: t.port, workers: o.workers).sum("dispatch_push_sent_total", #"result="delivered""#) >= count { return true }
            Control.sleep(0.25)
        }
        return false
    }

    // MARK: - 1. Steady pushes

    func steady(_ kind: String) throws {
        let standIn = try kind == "fake" ? APNsStandIn.fake(pki: pki, dir: dir) : APNsStandIn.nginx(pki: pki, dir: dir)
        standIns.append(standIn)
        defer { standIn.stop(); standIns.removeAll { $0 === standIn } }
        let t = try startDispatch(name: "steady-\(kind)", standIn: standIn)
        defer { stop(t) }
        let scenario = "push \(Orchestrator.count(o.activities))x\(o.devices) -> \(kind)"
        let prefix = "p\(orchestrator.runTag)-\(kind)"
        let tokens = Double(o.activities * o.devices)
        try setUp(t, prefix: prefix, activities: o.activities, devices: o.devices)
        guard waitDelivered(t, tokens, timeout: 120) else {
            throw BenchError("\(scenario): the first push to each of \(Int(tokens)) tokens did not arrive within 120 s; see \(t.logPath)")
        }
        Control.sleep(1.5)
        standIn.clearRecords()
        let before = Metrics.scrape(port: t.port, workers: o.workers)
        let cpuBefore = cpu(t, standIn), machineBefore = PushRun.machineBusySeconds()
        let windowStart = Clock.monotonicNanoseconds()
        orchestrator.startPublishing(t, prefix: prefix, channels: o.activities, conns: max(4, min(64, Int(o.rate / 25))),
                                     seconds: o.seconds) { w in
            w.field("rate", o.rate)
        }
        guard let p = Control.collect([orchestrator.publisher], "published", timeout: o.seconds + 60)[0] else {
            throw BenchError("\(scenario): the publisher did not finish")
        }
        let window = Double(Clock.monotonicNanoseconds() - windowStart) / 1e9
        let after = Metrics.scrape(port: t.port, workers: o.workers)
        let cpuAfter = cpu(t, standIn), machineAfter = PushRun.machineBusySeconds()
        let updates = Double(p.int("count") ?? 0)
        if (p.int("errors") ?? 0) > 0 { problems.append("\(scenario): \(p.int("errors") ?? 0) publish errors: \(p.string("error") ?? "")") }
        let delivered = after.sum("dispatch_push_sent_total", #"result="delivered""#) - before.sum("dispatch_push_sent_total", #"result="delivered""#)
        let failed = PushResultNames.failures.reduce(0.0) { $0 + after.sum("dispatch_push_sent_total", "result=\"\($1)\"")
            - before.sum("dispatch_push_sent_total", "result=\"\($1)\"") }
        record(scenario, "updates/s", "1/s", updates / window)
        record(scenario, "pushes/s sustained", "1/s", delivered / window)
        record(scenario, "pushes per update", "", updates > 0 ? delivered / updates : nil)
        let hist = after.histogram("dispatch_push_latency_seconds").subtracting(before.histogram("dispatch_push_latency_seconds"))
        record(scenario, "commit->APNs answer p50", "ms", hist.percentile(0.5).map { $0 * 1000 })
        record(scenario, "commit->APNs answer p99", "ms", hist.percentile(0.99).map { $0 * 1000 })
        if kind == "fake" {
            let samples = standIn.latencySamples(tokens: (0..<min(100, o.activities)).map { Self.token(device: $0 % o.devices, activity: $0) })
            record(scenario, "publish->APNs received p50", "ms", BenchStats.percentile(samples, 0.5))
            record(scenario, "publish->APNs received p99", "ms", BenchStats.percentile(samples, 0.99))
        }
        for (name, seconds) in zip(["dispatchd", "postgres", "apns stand-in", "load generator"], zip(cpuAfter, cpuBefore).map { $0 - $1 }) {
            record(scenario, "CPU \(name)", "%", seconds / window * 100)
        }
        record(scenario, "CPU machine (all processes)", "%", (machineAfter - machineBefore) / window * 100)
        if failed > 0 { problems.append("\(scenario): \(Int(failed)) pushes not delivered (see \(t.logPath))") }
        // Everything pushed in the end: the outbox drains (the gauge is read every 5 s).
        var depth = 1.0
        let drainDeadline = Clock.monotonicNanoseconds() + 15_000_000_000
        while depth > 0 && Clock.monotonicNanoseconds() < drainDeadline {
            Control.sleep(1)
            depth = Metrics.scrape(port: t.port, workers: o.workers).max("dispatch_push_outbox_depth")
        }
        if depth > 0 { notes.append("\(scenario): \(Int(depth)) rows still pending 15 s after the last update") }
    }

    /// CPU seconds so far of dispatchd (its processes but PostgreSQL), PostgreSQL, the stand-in
    /// and the load generator.
    func cpu(_ t: Target, _ s: APNsStandIn?) -> [Double] {
        let server = t.rootPid.map { Proc.tree($0).filter { !Proc.comm($0).hasPrefix("postgres") } } ?? []
        var pg: [pid_t] = []
        if let cluster = t.postgresCluster, let text = Files.read(cluster + "/postmaster.pid"),
           let first = text.split(separator: "\n").first, let pid = pid_t(first) { pg = Proc.tree(pid) }
        return [server, pg, s.map { Proc.tree($0.pid) } ?? [], [orchestrator.publisher.pid]].map { $0.reduce(0.0) { $0 + Self.cpuSeconds($1) } }
    }

    static func cpuSeconds(_ pid: pid_t) -> Double {
        guard let stat = Files.read("/proc/\(pid)/stat"), let close = stat.lastIndex(of: ")") else { return 0 }
        let f = stat[stat.index(after: close)...].split(separator: " ")
        guard f.count > 13, let u = Double(f[11]), let s = Double(f[12]) else { return 0 }
        return (u + s) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    // MARK: - 2. Stream throughput, pushes off and on

    func throughputOnOff() throws {
        for k in 0..<2 where orchestrator.subscribers.count <= k {
            orchestrator.subscribers.append(try WorkerHandle(name: "sub\(k)"))
        }
        // Alternating which goes first, so neither always gets the warmer (or busier) machine.
        var runs: [String: [[String: Double]]] = [:]
        for rep in 0..<o.repeats {
            for mode in rep % 2 == 0 ? ["off", "on"] : ["on", "off"] {
                runs[mode, default: []].append(try throughputOnce(mode))
            }
        }
        var medians: [String: [String: Double]] = [:]
        for (mode, list) in runs {
            let scenario = "throughput \(Orchestrator.count(o.tpSubscribers))/\(Orchestrator.count(o.tpActivities)) pushes \(mode)"
            for (figure, unit) in [("publishes/s", "1/s"), ("deliveries/s", "1/s"), ("pushes/s", "1/s"), ("CPU dispatchd", "%"),
                                   ("CPU postgres", "%"), ("CPU apns stand-in", "%"), ("CPU machine", "%")] {
                let values = list.compactMap { $0[figure] }
                guard let m = BenchStats.median(values), mode == "on" || !figure.hasPrefix("push") else { continue }
                medians[mode, default: [:]][figure] = m
                record(scenario, figure, unit, m)
            }
        }
        if let on = medians["on"], let off = medians["off"] {
            for figure in ["publishes/s", "deliveries/s"] {
                if let a = on[figure], let b = off[figure], b > 0 { record("throughput on/off (medians)", "\(figure) ratio", "", a / b) }
            }
        }
    }

    /// One throughput run on a fresh server: closed-loop publishers, streams on every activity,
    /// and (pushes on) an update token for every activity.
    func throughputOnce(_ mode: String) throws -> [String: Double] {
        var standIn: APNsStandIn?
        if mode == "on" {
            let s = try o.throughputStandIn == "fake" ? APNsStandIn.fake(pki: pki, dir: dir) : APNsStandIn.nginx(pki: pki, dir: dir)
            standIns.append(s)
            standIn = s
        }
        defer { if let s = standIn { s.stop(); standIns.removeAll { $0 === s } } }
        let t = try startDispatch(name: "tp-\(mode)-\(rows.count)", standIn: standIn)
        defer { stop(t) }
        let prefix = "t\(orchestrator.runTag)-\(mode)-\(rows.count)"
        if mode == "on" {
            try setUp(t, prefix: prefix, activities: o.tpActivities, devices: 1)
            _ = waitDelivered(t, Double(o.tpActivities), timeout: 60)
        } else {
            try orchestrator.batch(t, t.createRequests((0..<o.tpActivities).map { "\(prefix)-\($0)" }), what: "creating activities")
        }
        _ = try orchestrator.subscribe(t, count: o.tpSubscribers, path: t.streamPath("\(prefix)-{ch}"), channels: o.tpActivities,
                                       trackSeqs: false)
        Control.sleep(0.5)
        for w in orchestrator.subscribers { w.send { $0.field("cmd", "reset") } }
        _ = Control.collect(orchestrator.subscribers, "reset", timeout: 10)
        let before = Metrics.scrape(port: t.port, workers: o.workers)
        let cpuBefore = cpu(t, standIn), machineBefore = Self.machineBusySeconds()
        orchestrator.startPublishing(t, prefix: prefix, channels: o.tpActivities, conns: o.tpPublishers, seconds: o.tpSeconds)
        guard let p = Control.collect([orchestrator.publisher], "published", timeout: o.tpSeconds + 60)[0] else {
            throw BenchError("throughput (pushes \(mode)): the publishers did not finish")
        }
        let cpuUsed = zip(cpu(t, standIn), cpuBefore).map { $0 - $1 }
        let machine = Self.machineBusySeconds() - machineBefore
        let report = orchestrator.reports()
        let after = Metrics.scrape(port: t.port, workers: o.workers)
        orchestrator.closeSubscribers()
        let elapsed = p.double("elapsed") ?? 1
        if (p.int("errors") ?? 0) > 0 { problems.append("throughput (pushes \(mode)): \(p.int("errors") ?? 0) publish errors") }
        let pushes = after.sum("dispatch_push_sent_total", #"result="delivered""#) - before.sum("dispatch_push_sent_total", #"result="delivered""#)
        var f: [String: Double] = ["publishes/s": Double(p.int("count") ?? 0) / elapsed, "deliveries/s": Double(report.deliveries) / elapsed,
                                   "pushes/s": pushes / elapsed, "CPU machine": machine / elapsed * 100]
        for (name, seconds) in zip(["CPU dispatchd", "CPU postgres", "CPU apns stand-in"], cpuUsed) { f[name] = seconds / elapsed * 100 }
        log("bench push: throughput pushes \(mode): \(Int(f["publishes/s"]!)) publishes/s, \(Int(f["deliveries/s"]!)) deliveries/s, "
            + "\(Int(pushes / elapsed)) pushes/s; CPU dispatchd \(Int(f["CPU dispatchd"]!))%, postgres \(Int(f["CPU postgres"]!))%, "
            + "machine \(Int(f["CPU machine"]!))%")
        return f
    }

    /// CPU seconds the whole machine spent busy (all cores, every process), from /proc/stat.
    static func machineBusySeconds() -> Double {
        guard let line = Files.read("/proc/stat")?.split(separator: "\n").first else { return 0 }
        let v = line.split(separator: " ").dropFirst().compactMap { Double($0) }
        guard v.count >= 5 else { return 0 }
        return (v.reduce(0, +) - v[3] - v[4]) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    // MARK: - Output

    func render(elapsed: Double) -> String {
        var lines = ["Dispatch Live Activity pushes — \(o.activities) activities x \(o.devices) tokens, \(Int(o.rate)) updates/s for "
                     + "\(orchestrator.fmt(o.seconds)) s, \(o.workers) server processes; \(orchestrator.fmt(elapsed)) s",
                     BenchReport.machine().map { "\($0.0): \($0.1)" }.joined(separator: "; ")]
        lines.append(BenchReport.pad("scenario", 34) + BenchReport.pad("figure", 30) + BenchReport.pad("unit", 6)
                     + BenchReport.pad("value", 12, right: true))
        lines.append(String(repeating: "-", count: 82))
        for r in rows {
            lines.append(BenchReport.pad(r.scenario, 34) + BenchReport.pad(r.figure, 30) + BenchReport.pad(r.unit, 6)
                         + BenchReport.pad(orchestrator.fmt(r.value), 12, right: true))
        }
        for n in notes { lines.append("note: " + n) }
        return lines.joined(separator: "\n")
    }

    func json(elapsed: Double) -> JSONWriter {
        var w = JSONWriter(capacity: 4096)
        w.beginObject()
        w.field("mode", o.mode)
        w.field("unixTime", Int64(time(nil)))
        w.field("elapsedSeconds", elapsed)
        w.field("activities", Int64(o.activities))
        w.field("devices", Int64(o.devices))
        w.field("rate", o.rate)
        w.field("seconds", o.seconds)
        w.field("serverProcesses", Int64(o.workers))
        BenchReport.writeMachine(&w)
        w.key("figures"); w.beginArray()
        for r in rows {
            w.beginObject(); w.field("scenario", r.scenario); w.field("figure", r.figure); w.field("unit", r.unit)
            w.field("value", r.value); w.endObject()
        }
        w.endArray()
        w.key("notes"); w.beginArray(); for n in notes { w.string(n) }; w.endArray()
        w.key("problems"); w.beginArray(); for p in problems { w.string(p) }; w.endArray()
        w.endObject()
        return w
    }
}

enum PushResultNames {
    static let failures = ["retired", "throttled", "server_error", "connection_error", "jwt_expired", "jwt_rejected", "rejected"]
}
