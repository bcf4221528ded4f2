import DispatchBenchKit
import DispatchSystem
#if canImport(Glibc)
import Glibc
#endif

/// `runuser -u postgres -- pg_ctl -D <cluster> stop -m fast` per embedded cluster this run
/// started (the main target's, the nodes scenario's), ready for the signal handler.
nonisolated(unsafe) var emergencyPgStops: [UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>] = []
nonisolated(unsafe) var emergencyPgClusters: Set<String> = []

func prepareEmergencyPgStop(cluster: String) {
    guard !emergencyPgClusters.contains(cluster) else { return }
    emergencyPgClusters.insert(cluster)
    let args = ["/usr/sbin/runuser", "-u", "postgres", "--", "/usr/lib/postgresql/15/bin/pg_ctl", "-D", cluster, "stop", "-m", "fast"]
    let argv = UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>.allocate(capacity: args.count + 1)
    for (i, a) in args.enumerated() { argv[i] = strdup(a) }
    argv[args.count] = nil
    emergencyPgStops.append(argv)
}

enum BenchMain {
    static let usage = """
    usage: dispatch-bench run [--quick | --full | --smoke] [options]
      --only dispatch|nchan       run against one server only
      --repeats N                 repetitions (figures are medians)
      --storm-repeats N           repetitions of restart, replay and nodes (quick 1, full 3)
      --server-workers N          DISPATCH_WORKERS and nginx worker_processes (default 2; full: 3)
      --dispatchd PATH            dispatchd binary (default: next to dispatch-bench)
      --dispatch-port P --key K   use an already running Dispatch on 127.0.0.1:P instead
      --addresses N               spread connections over 127.0.0.1..N (default 8; 1 with --dispatch-port)
      --template PATH             nginx config template (default bench/nginx.conf.template)
      --results DIR               where results JSON goes (default bench/results)
      --json PATH                 write the results JSON to PATH instead
      --node-carriers LIST        nodes scenario carriers: notify, nats (default both; smoke: notify)
      --node-workers N            DISPATCH_WORKERS of each node in the nodes scenario (default 2)
      --node-load weak|fixed      nodes: each node gets the per-node load (weak, default), or the
                                  same total load is divided among the nodes (fixed)
      --node-counts LIST          nodes scenario sizes, e.g. 1,4 (default 1,2,4; 1 to 8 each)
      --pg-stat-statements        nodes: load pg_stat_statements, note each run's costliest statements
      --scenarios LIST            comma-separated subset of: idle, fanout, throughput, batch, terminal,
                                  restart, nodes, replay, feed (default all; restart needs a
                                  server this run starts, nodes, replay and feed need dispatchd)
      --idle-counts LIST          idle scenario steps in streams, e.g. 10000 or 1000,10000,100000
                                  (default 1000,10000; full: up to 50000)
      --idle-activities N         live activities the idle streams spread over (default 1000)
      --replay-streams N          streams of the replay storm, half never reading (default 2000)
      --replay-events N           events in each replayed history (default 1000)
      --feed-sizes AxR,...        feed runs: A live activities, R readers (default 10000x200,100000x10)
    """

    static func run(_ args: [String]) -> Int32 {
        var mode = "quick"
        for a in args {
            switch a {
            case "--quick": mode = "quick"
            case "--full": mode = "full"
            case "--smoke": mode = "smoke"
            default: break
            }
        }
        var c = BenchConfig.preset(mode)
        let dir = Subprocess.executablePath().split(separator: "/").dropLast().joined(separator: "/")
        c.dispatchd = "/" + dir + "/dispatchd"
        var i = 0
        func value() -> String? {
            i += 1
            return i < args.count ? args[i] : nil
        }
        while i < args.count {
            switch args[i] {
            case "--quick", "--full", "--smoke": break
            case "--only":
                guard let v = value(), let k = Target.Kind(rawValue: v) else { log(usage); return 64 }
                c.targets = [k]
            case "--repeats": c.repeats = max(1, Int(value() ?? "") ?? 1)
            case "--storm-repeats": c.stormRepeats = max(1, Int(value() ?? "") ?? 1)
            case "--server-workers": c.serverWorkers = max(1, Int(value() ?? "") ?? 2)
            case "--dispatchd": c.dispatchd = value() ?? c.dispatchd
            case "--dispatch-port":
                c.externalDispatchPort = UInt16(value() ?? "")
                c.addressCount = 1
            case "--key": c.externalDispatchKey = value() ?? ""
            case "--addresses": c.addressCount = min(8, max(1, Int(value() ?? "") ?? 8))
            case "--template": c.template = value() ?? c.template
            case "--results": c.resultsDir = value() ?? c.resultsDir
            case "--json": c.jsonOut = value()
            case "--scenarios":
                let list = Set((value() ?? "").split(separator: ",").map { String($0) })
                guard !list.isEmpty, list.isSubset(of: BenchConfig.allScenarios) else { log(usage); return 64 }
                c.scenarios = list
            case "--pg-stat-statements": c.pgStatStatements = true
            case "--node-load":
                switch value() {
                case "weak": c.nodeWeakScaling = true
                case "fixed": c.nodeWeakScaling = false
                default: log(usage); return 64
                }
            case "--node-workers": c.nodeWorkers = max(1, Int(value() ?? "") ?? 2)
            case "--node-counts":
                let counts = (value() ?? "").split(separator: ",").compactMap { Int($0) }.filter { (1...8).contains($0) }
                guard !counts.isEmpty else { log(usage); return 64 }
                c.nodeCounts = counts
            case "--node-carriers":
                let list = (value() ?? "").split(separator: ",").map { String($0) }
                guard !list.isEmpty, Set(list).isSubset(of: ["notify", "nats"]) else { log(usage); return 64 }
                c.nodeCarriers = list
            case "--throughput-seconds": c.throughputSeconds = max(1, Double(value() ?? "") ?? c.throughputSeconds)
            case "--idle-counts":
                let counts = (value() ?? "").split(separator: ",").compactMap { Int($0) }.filter { $0 >= 1 }
                guard !counts.isEmpty else { log(usage); return 64 }
                c.idleCounts = counts
            case "--idle-activities": c.idleActivities = max(1, Int(value() ?? "") ?? c.idleActivities)
            case "--replay-streams": c.replayStreams = max(2, Int(value() ?? "") ?? c.replayStreams)
            case "--replay-events": c.replayEvents = max(10, Int(value() ?? "") ?? c.replayEvents)
            case "--feed-sizes":
                // ACTIVITIESxREADERS,... e.g. 10000x200,100000x10
                let sizes = (value() ?? "").split(separator: ",").compactMap { p -> (activities: Int, readers: Int)? in
                    let f = p.split(separator: "x")
                    guard f.count == 2, let a = Int(f[0]), let r = Int(f[1]), a >= 4, r >= 1 else { return nil }
                    return (a, r)
                }
                guard !sizes.isEmpty else { log(usage); return 64 }
                c.feedSizes = sizes
            default:
                log("unknown option \(args[i])\n" + usage)
                return 64
            }
            i += 1
        }
        installSignalHandlers(deadline: c.deadlineSeconds)
        let o = Orchestrator(config: c)
        do {
            return try o.run()
        } catch {
            log("bench: \(error)")
            return 1
        }
    }

    /// Ctrl-C, SIGTERM or the run's deadline (SIGALRM) stop every process this run started.
    static func installSignalHandlers(deadline: UInt32) {
        signal(SIGPIPE, SIG_IGN)
        let handler: @convention(c) (Int32) -> Void = { sig in
            let msg = sig == SIGALRM ? "bench: deadline reached, stopping everything\n" : "bench: interrupted, stopping everything\n"
            _ = msg.withCString { write(2, $0, strlen($0)) }
            for pid in startedPids { kill(pid, SIGTERM) }
            sleep(3)
            for pid in startedPids { kill(pid, SIGKILL) }
            for group in startedGroups { kill(-group, SIGKILL) }
            // dispatchd's embedded PostgreSQL is not our child: stop it with pg_ctl (fork and
            // exec are safe in a signal handler; the argv was prepared beforehand).
            for argv in emergencyPgStops {
                let child = fork()
                if child == 0 { execv(argv[0]!, argv); _exit(127) }
                if child > 0 { var st: Int32 = 0; waitpid(child, &st, 0) }
            }
            _exit(130)
        }
        signal(SIGINT, handler)
        signal(SIGTERM, handler)
        signal(SIGALRM, handler)
        alarm(deadline)
    }
}
