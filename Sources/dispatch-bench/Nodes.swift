import DispatchCore
import DispatchSystem
import DispatchBenchKit
#if canImport(Glibc)
import Glibc
#endif

/// **Nodes**: independent dispatchd supervisors (each with `nodeWorkers` workers) on ONE
/// PostgreSQL: the first node's embedded cluster, which the others reach through
/// DATABASE_URL (its unix socket and pgpass). Every worker of every node LISTENs, so every
/// committed change is sent by PostgreSQL to every worker of every node.
///
/// 1. **Cross-node**: subscribers on node A, publishers on node B (the throughput shape).
/// 2. **1, 2, 4 nodes**: by default each node brings its own load (streams, activities and
///    publisher connections per node: weak scaling, as a deployment adds nodes because its
///    load grew); with `--node-load fixed` one total load is spread over the nodes. Figures:
///    publishes/s, deliveries/s, latency, and where the CPU goes per publish (dispatchd,
///    PostgreSQL, nats-server), with PostgreSQL's commits/s and what its sessions wait on.
extension Orchestrator {
    func nodes(rep: Int) throws {
        let key = Servers.randomKey()
        let counts = config.nodeCounts.sorted()
        defer { stopNodes() }
        for carrier in config.nodeCarriers {
            // Every node starts again for each carrier: DISPATCH_NATS_URL is read at start.
            stopNodes()
            let tag = carrier == "nats" ? " nats" : ""
            if carrier == "nats" { nodeNATS = try BenchNATS(size: counts.max() ?? 1, dir: tempDir) }
            for n in counts {
                while nodeTargets.count < n { try startNode(key: key) }
                let cross = "cross-node\(tag) \(Self.count(config.nodeSubscribers))/\(Self.count(config.nodeActivities))"
                if n >= 2 && !scenarioDone(cross, rep) {
                    try nodeRun(label: cross, subs: [nodeTargets[0]], pubs: [nodeTargets[1]], running: Array(nodeTargets.prefix(n)), rep: rep)
                }
                let scale = config.nodeWeakScaling ? n : 1
                let load = "\(Self.count(config.nodeSubscribers * scale))/\(Self.count(config.nodeActivities * scale))"
                let label = "\(n) node\(n == 1 ? "" : "s")\(tag) \(load)\(config.nodeWeakScaling ? " weak" : "")"
                let running = Array(nodeTargets.prefix(n))
                try nodeRun(label: label, subs: running, pubs: running, running: running, rep: rep, scale: scale)
            }
            if carrier == "nats" { try carrierOutage(rep: rep) }
        }
    }

    private func scenarioDone(_ label: String, _ rep: Int) -> Bool {
        figures.contains { $0.scenario == label && ($0.runs["dispatch"]?.count ?? 0) > rep }
    }

    /// Node 1 owns the PostgreSQL cluster (embedded); the others use it through DATABASE_URL.
    func startNode(key: String) throws {
        let index = nodeTargets.count + 1
        let dir = "\(tempDir)/node\(index)"
        try? Files.makeDirectory(dir)
        chmod(dir, 0o755)
        var env: [String: String] = [:]
        if let nats = nodeNATS {
            try nats.start(index - 1)
            env["DISPATCH_NATS_URL"] = nats.url(forNode: index - 1)
        }
        if let first = nodeTargets.first {
            env["DATABASE_URL"] = "host=\(first.dataDir)/run port=5432 user=dispatch dbname=dispatch passfile=\(first.dataDir)/pgpass"
        }
        let t = try Servers.startDispatch(binary: config.dispatchd, dir: dir, workers: config.nodeWorkers,
                                          port: Servers.freePort(startingAt: UInt16(18180 + 20 * index)), env: env, key: key)
        nodeTargets.append(t)
        if index == 1 && config.pgStatStatements { try loadPgStatStatements(t) }
        // /readyz answers for the whole server; its metrics also say when every worker's
        // database sessions are up (dispatch_db_up is the lowest over workers).
        let deadline = Clock.monotonicNanoseconds() + 30_000_000_000
        while Clock.monotonicNanoseconds() < deadline {
            if Metrics.scrape(port: t.port).sum("dispatch_db_up") >= 1 { break }
            Control.sleep(0.1)
        }
        log("bench: node \(index) up on port \(t.port) (\(config.nodeWorkers) workers\(index == 1 ? ", owns PostgreSQL" : ", DATABASE_URL to node 1's")"
            + "\(nodeNATS.map { ", NATS \($0.url(forNode: index - 1))" } ?? ""))")
    }

    func stopNodes() {
        // The others first: node 1 stops the PostgreSQL they use.
        for t in nodeTargets.reversed() { t.stop() }
        nodeTargets.removeAll()
        nodeNATS?.stopAll()
        nodeNATS = nil
    }

    /// Counters summed over the running nodes' /metrics (each answers for all its workers).
    func nodeCounters(_ nodes: [Target], _ names: [String]) -> [String: Double] {
        var out: [String: Double] = [:]
        for t in nodes {
            let m = Metrics.scrape(port: t.port)
            for n in names { out[n, default: 0] += m.sum(n) }
        }
        return out
    }

    /// Every labelled series of `name` summed over the nodes, by its labels.
    func nodeSeries(_ nodes: [Target], _ name: String) -> [String: Double] {
        var out: [String: Double] = [:]
        for t in nodes {
            for (k, v) in Metrics.scrape(port: t.port).samples["server"] ?? [:] where k.hasPrefix(name + "{") {
                // Drop the worker label: the same series of every worker adds up.
                let labels = k.dropFirst(name.count + 1).dropLast().split(separator: ",").filter { !$0.hasPrefix("worker=") }
                out[labels.joined(separator: ","), default: 0] += v
            }
        }
        return out
    }

    static let carrierCounters = ["dispatch_sequencer_positions_total", "dispatch_sequencer_passes_total"]

    /// PostgreSQL of the nodes (node 1's cluster): psql with its conninfo.
    func nodesSQL(_ sql: String) -> String? {
        guard let first = nodeTargets.first, let psql = Proc.which("psql") else { return nil }
        let conninfo = "host=\(first.dataDir)/run port=5432 user=dispatch dbname=dispatch passfile=\(first.dataDir)/pgpass"
        let r = Subprocess.run([psql, conninfo, "-AtX", "-c", sql])
        return r.status == 0 ? r.output.trimmingCharacters(in: "\n") : nil
    }

    /// Adds pg_stat_statements to node 1's cluster: preloaded (a restart of node 1, which
    /// restarts its PostgreSQL) and created in the dispatch database.
    func loadPgStatStatements(_ t: Target) throws {
        guard let cluster = t.postgresCluster else { return }
        let conf = cluster + "/postgresql.conf"
        if !(Files.read(conf) ?? "").contains("pg_stat_statements") {
            guard let h = fopen(conf, "a") else { throw BenchError("cannot append to \(conf)") }
            fputs("\nshared_preload_libraries = 'pg_stat_statements'\npg_stat_statements.track = all\n", h)
            fclose(h)
            t.stop()
            t.rootPid = try t.starter!()
        }
        guard nodesSuperSQL("CREATE EXTENSION IF NOT EXISTS pg_stat_statements") != nil else {
            throw BenchError("pg_stat_statements could not be created in the nodes' PostgreSQL")
        }
    }

    /// psql on node 1's cluster with '|' between fields (initdb made `dispatch` its superuser).
    func nodesSuperSQL(_ sql: String) -> String? {
        guard let first = nodeTargets.first, let psql = Proc.which("psql") else { return nil }
        let conninfo = "host=\(first.dataDir)/run port=5432 user=dispatch dbname=dispatch passfile=\(first.dataDir)/pgpass"
        let r = Subprocess.run([psql, conninfo, "-AtX", "-F", "|", "-c", sql])
        return r.status == 0 ? r.output.trimmingCharacters(in: "\n") : nil
    }

    /// The statements that cost PostgreSQL the most since the last reset, per publish.
    func noteStatements(_ label: String, rep: Int, published: Double) {
        guard config.pgStatStatements, published > 0,
              let out = nodesSuperSQL("SELECT calls, round(total_exec_time::numeric, 1), round(mean_exec_time::numeric, 3), rows, "
                                      + "regexp_replace(left(query, 90), '\\s+', ' ', 'g') FROM pg_stat_statements "
                                      + "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = 'dispatch') "
                                      + "ORDER BY total_exec_time DESC LIMIT 8") else { return }
        let lines = out.split(separator: "\n").map { line -> String in
            let f = line.split(separator: "|", maxSplits: 4, omittingEmptySubsequences: false).map(String.init)
            guard f.count == 5, let calls = Double(f[0]), let total = Double(f[1]) else { return String(line) }
            return "\(fmt(calls / published)) calls/publish, mean \(f[2]) ms, \(fmt(total * 1000 / published)) us/publish: \(f[4])"
        }
        notes.append("\(label) rep \(rep + 1): pg_stat_statements, costliest by total time:\n    " + lines.joined(separator: "\n    "))
    }

    /// Next transaction id (write transactions get one; reading it takes none) and
    /// pg_stat_database.xact_commit of the dispatch database.
    func pgCounters() -> (xid: Double, commits: Double)? {
        guard let out = nodesSQL("SELECT pg_snapshot_xmax(pg_current_snapshot())::text || ' ' || xact_commit FROM pg_stat_database WHERE datname = current_database()")
        else { return nil }
        let f = out.split(separator: " ").compactMap { Double($0) }
        return f.count == 2 ? (f[0], f[1]) : nil
    }

    func postgresPids() -> [pid_t] {
        guard let cluster = nodeTargets.first?.postgresCluster, let text = Files.read(cluster + "/postmaster.pid"),
              let first = text.split(separator: "\n").first, let pid = pid_t(first) else { return [] }
        return Proc.tree(pid)
    }

    func cpuSeconds(_ pids: [pid_t]) -> Double { pids.reduce(0.0) { $0 + PushRun.cpuSeconds($1) } }

    func dispatchdPids(_ nodes: [Target]) -> [pid_t] {
        nodes.flatMap { t in t.rootPid.map { Proc.tree($0).filter { !Proc.comm($0).hasPrefix("postgres") } } ?? [] }
    }

    /// One measured run: streams on `subs`, publishers on `pubs`, `running` nodes up.
    /// `scale`: the per-node load times this (weak scaling: the number of nodes).
    func nodeRun(label: String, subs: [Target], pubs: [Target], running: [Target], rep: Int, scale: Int = 1) throws {
        let t = running[0]
        // Fresh activities for every run: reused ones would start past the seq the streams expect.
        nodeRuns += 1
        let prefix = "b\(runTag)-nd\(rep)-\(nodeRuns)"
        let k = config.nodeActivities * scale
        try batch(t, t.createRequests(names(prefix, k)), what: "creating node activities")
        let s = try subscribe(t, count: config.nodeSubscribers * scale, path: t.streamPath("\(prefix)-{ch}"), channels: k, trackSeqs: false) { w in
            w.key("ports"); w.beginArray(); for n in subs { w.int(Int64(n.port)) }; w.endArray()
            w.field("spreadNodes", true)
        }
        Control.sleep(0.5)
        for w in subscribers { w.send { $0.field("cmd", "reset") } }
        _ = Control.collect(subscribers, "reset", timeout: 10)
        let listeners = Double(nodesSQL("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'dispatchd-%-listener'") ?? "") ?? -1
        let dPids = dispatchdPids(running), pgPids = postgresPids()
        if config.pgStatStatements { _ = nodesSuperSQL("SELECT pg_stat_statements_reset()") }
        let natsPids = nodeNATS?.pidsRunning() ?? []
        let natsMessages0 = nodeNATS?.messages() ?? 0, sequencer0 = nodeCounters(running, Self.carrierCounters)
        let cpuD0 = cpuSeconds(dPids), cpuPG0 = cpuSeconds(pgPids), cpuN0 = cpuSeconds(natsPids), cpuM0 = PushRun.machineBusySeconds()
        let started = Clock.monotonicNanoseconds()
        startPublishing(t, port: pubs[0].port, prefix: prefix, channels: k, conns: config.nodePublishers * scale,
                        seconds: config.nodeSeconds) { w in
            w.key("ports"); w.beginArray(); for n in pubs { w.int(Int64(n.port)) }; w.endArray()
        }
        // While publishers run: PostgreSQL's counters from 1 s in (both reads in steady state:
        // backends report xact_commit at most once a second), and what its sessions wait on.
        var c0: (xid: Double, commits: Double)?, c0At = 0.0
        var c1: (xid: Double, commits: Double)?, c1At = 0.0
        var waits: [String: Int] = [:]
        var samples = 0
        var p: JSONValue?
        while p == nil {
            p = Control.collect([publisher], "published", timeout: 0.25)[0]
            if p != nil { break }
            let el = Double(Clock.monotonicNanoseconds() - started) / 1e9
            if el > config.nodeSeconds + 60 { throw BenchError("\(label): publishers did not finish") }
            guard el < config.nodeSeconds - 0.2 else { continue }
            if c0 == nil && el >= min(1, config.nodeSeconds / 3) {
                c0 = pgCounters(); c0At = Double(Clock.monotonicNanoseconds() - started) / 1e9
                continue
            }
            guard c0 != nil else { continue }
            if let out = nodesSQL("SELECT coalesce(wait_event_type || ':' || wait_event, 'running') FROM pg_stat_activity "
                                  + "WHERE application_name LIKE 'dispatchd-%' AND state = 'active'") {
                samples += 1
                for line in out.split(separator: "\n") { waits[String(line), default: 0] += 1 }
            }
            c1 = pgCounters(); c1At = Double(Clock.monotonicNanoseconds() - started) / 1e9
        }
        let window = Double(Clock.monotonicNanoseconds() - started) / 1e9
        let cpuD = cpuSeconds(dPids) - cpuD0, cpuPG = cpuSeconds(pgPids) - cpuPG0, cpuM = PushRun.machineBusySeconds() - cpuM0
        let cpuN = cpuSeconds(natsPids) - cpuN0
        let natsMessages = (nodeNATS?.messages() ?? 0) - natsMessages0
        let sequencer1 = nodeCounters(running, Self.carrierCounters)
        let windowReport = reports()
        noteStatements(label, rep: rep, published: Double(p!.int("count") ?? 0))
        var finals: [Int64] = []
        if case .array(let a)? = p!["finals"] { finals = a.map { if case .number(let d) = $0 { return Int64(d) } else { return 0 } } }
        verify(t, finals: finals, scenario: label)
        let final = reports()
        closeSubscribers()

        let elapsed = p!.double("elapsed") ?? 1
        let published = Double(p!.int("count") ?? 0)
        check(t, "\(label): publish errors", Int64(p!.int("errors") ?? 0))
        if (p!.int("errors") ?? 0) > 0 { log("bench: \(label) publish error: \(p!.string("error") ?? "")") }
        let ack = Self.histogram(p!["ackHist"])
        record(label, "publishes/s", "1/s", higher: true, t, published / elapsed)
        record(label, "deliveries/s", "1/s", higher: true, t, Double(windowReport.deliveries) / elapsed)
        record(label, "publish->receipt p50", "ms", higher: false, t, final.hist.percentile(0.5).map { Double($0) / 1e6 })
        record(label, "publish->receipt p99", "ms", higher: false, t, final.hist.percentile(0.99).map { Double($0) / 1e6 })
        record(label, "publish ack p50", "ms", higher: false, t, ack.percentile(0.5).map { Double($0) / 1e6 }, table: false)
        record(label, "CPU dispatchd (all nodes)", "%", higher: false, t, cpuD / window * 100)
        record(label, "CPU postgres", "%", higher: false, t, cpuPG / window * 100)
        record(label, "CPU machine", "%", higher: false, t, cpuM / window * 100, table: false)
        // CPU per publish over the whole window (publishers stop inside it), each part alone.
        let publishedInWindow = max(1, published)
        record(label, "dispatchd CPU per publish", "us", higher: false, t, cpuD / publishedInWindow * 1e6)
        record(label, "PostgreSQL CPU per publish", "us", higher: false, t, cpuPG / publishedInWindow * 1e6)
        if nodeNATS != nil {
            record(label, "NATS messages/s", "1/s", higher: false, t, natsMessages / window)
            record(label, "CPU nats-server", "%", higher: false, t, cpuN / window * 100, table: false)
            if natsMessages > 0 { record(label, "NATS CPU per message", "us", higher: false, t, cpuN / natsMessages * 1e6) }
            record(label, "nats-server CPU per publish", "us", higher: false, t, cpuN / publishedInWindow * 1e6)
            record(label, "NATS messages per publish", "", higher: false, t, natsMessages / publishedInWindow)
            let passes = (sequencer1["dispatch_sequencer_passes_total"] ?? 0) - (sequencer0["dispatch_sequencer_passes_total"] ?? 0)
            let positions = (sequencer1["dispatch_sequencer_positions_total"] ?? 0) - (sequencer0["dispatch_sequencer_positions_total"] ?? 0)
            record(label, "sequencer passes/s", "1/s", higher: false, t, passes / window, table: false)
            if passes > 0 { record(label, "positions per sequencer pass", "", higher: true, t, positions / passes, table: false) }
        }
        var commitsPerSecond: Double?
        if let a = c0, let b = c1, c1At > c0At + 0.5 {
            commitsPerSecond = (b.commits - a.commits) / (c1At - c0At)
            record(label, "commits/s (xact_commit)", "1/s", higher: false, t, commitsPerSecond)
            record(label, "write transactions/s", "1/s", higher: false, t, (b.xid - a.xid) / (c1At - c0At), table: false)
            let writes = (b.xid - a.xid) / (c1At - c0At)
            if writes > 0 { record(label, "publishes per write transaction", "", higher: true, t, published / elapsed / writes) }
        }
        if listeners >= 0 {
            record(label, "LISTEN sessions", "", higher: false, t, listeners, table: false)
            // With NATS the listeners LISTEN only for key revocations: no notice per publish.
            if nodeNATS == nil {
                record(label, "notifications sent/s (by PG)", "1/s", higher: false, t, published / elapsed * listeners, table: false)
            }
        }
        if samples > 0 {
            // Publish commits are serialised twice, cluster-wide: the feed's position lock
            // (pg_advisory_xact_lock, held through the commit) and NOTIFY's lock on the database
            // (AccessExclusive on a shared object, from pre-commit to the end of the commit).
            let positionWaits = Double(waits["Lock:advisory"] ?? 0) / Double(samples)
            let notifyWaits = Double(waits["Lock:object"] ?? 0) / Double(samples)
            record(label, "waiting on position/NOTIFY lock", "sessions", higher: false, t, positionWaits + notifyWaits)
            record(label, "waiting on the position lock", "sessions", higher: false, t, positionWaits, table: false)
            record(label, "waiting on the NOTIFY lock", "sessions", higher: false, t, notifyWaits, table: false)
            record(label, "waiting on WAL flush", "sessions", higher: false, t,
                   Double((waits["IO:WALSync"] ?? 0) + (waits["LWLock:WALWrite"] ?? 0)) / Double(samples))
            let summary = waits.sorted { $0.value > $1.value }.map { "\($0.key) \(fmt(Double($0.value) / Double(samples)))" }.joined(separator: ", ")
            notes.append("\(label) rep \(rep + 1): active dispatchd sessions in PostgreSQL, mean of \(samples) samples: \(summary)")
        }
        log("bench: \(label) rep \(rep + 1): \(s.ready) streams, \(Int(published / elapsed)) publishes/s, "
            + "\(Int(Double(windowReport.deliveries) / elapsed)) deliveries/s, CPU dispatchd \(Int(cpuD / window * 100))% "
            + "postgres \(Int(cpuPG / window * 100))% machine \(Int(cpuM / window * 100))%, "
            + "commits/s \(commitsPerSecond.map { String(Int($0)) } ?? "-"), \(Int(listeners)) LISTEN sessions")
    }
}
