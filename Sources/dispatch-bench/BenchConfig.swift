import DispatchCore
import DispatchSystem
import DispatchBenchKit
#if canImport(Glibc)
import Glibc
#endif

/// The sizes of one run. `quick` fits in about 3 minutes, `full` in about 15, `smoke` in seconds.
struct BenchConfig {
    var mode = "quick"
    var idleCounts = [1000, 10000]
    var idleActivities = 1000
    var fanoutSubscribers = 10000
    var fanoutEvents = 10
    var throughputSubscribers = 10000
    var throughputActivities = 2000
    var throughputPublishers = 64
    var throughputSeconds = 4.0
    var terminalConnections = 128
    var terminalActivities = 1000
    var terminalSeconds = 2.0
    // Restart storm (RestartStorm.swift): EventSource-like streams through a server restart.
    var stormStreams = 2000
    var stormActivities = 200
    var stormRate = 400.0
    var stormPublishers = 16
    var stormWarmup = 2.0
    /// Every n-th stream's client is away from 1 s before the restart until 3 s after it.
    var stormAwayEvery = 20
    /// Longest wait after the restart for every stream to resume and catch up.
    var stormSettle = 45.0
    // Nodes (Nodes.swift): dispatchd supervisors on one PostgreSQL.
    var nodeCounts = [1, 2, 4]
    var nodeWorkers = 2
    var nodeSubscribers = 5000
    var nodeActivities = 1000
    var nodePublishers = 32
    var nodeSeconds = 4.0
    /// Weak scaling (the default): each node gets the streams, activities and publishers
    /// above, so N nodes carry N times the load, as a deployment grows. Off (`--node-load
    /// fixed`): that load in all, divided among the nodes.
    var nodeWeakScaling = true
    /// How nodes hear each other's changes: PostgreSQL's LISTEN/NOTIFY, then NATS (a cluster
    /// of one nats-server per node, started by the bench), which also runs the carrier outage.
    var nodeCarriers = ["notify", "nats"]
    /// The carrier outage: publishes/s (all publishers together) and longest catch-up wait.
    var outageRate = 1000.0
    var outageSettle = 30.0
    /// Loads pg_stat_statements into the nodes' PostgreSQL and notes each run's costliest statements.
    var pgStatStatements = false
    // Replay storm (ReplayStorm.swift): Last-Event-ID: 0 on long histories, half not reading.
    var replayStreams = 2000
    var replayActivities = 20
    var replayEvents = 1000
    var replayStalledMod = 2
    /// SO_RCVBUF of the streams that never read: backpressure reaches dispatchd after a few KB.
    var replayStalledRcvbuf = 4096
    // Feed (FeedBench.swift): live activities over several keys, readers until synced.
    var feedSizes = [(activities: 10_000, readers: 200), (activities: 100_000, readers: 10)]
    var feedKeys = 4
    var feedIdleSeconds = 5.0
    var feedTimeout = 300.0
    /// Repetitions of the three scenarios above (each restarts servers; they take longer).
    var stormRepeats = 1
    var scenarios: Set<String> = BenchConfig.allScenarios
    static let allScenarios: Set<String> = ["idle", "fanout", "throughput", "batch", "terminal", "restart", "nodes", "replay", "feed"]
    var repeats = 3
    var targets: [Target.Kind] = [.dispatch, .nchan]
    var serverWorkers = 2
    var addressCount = 8
    var externalDispatchPort: UInt16?
    var externalDispatchKey = ""
    var dispatchd = ""
    var template = "bench/nginx.conf.template"
    var resultsDir = "bench/results"
    var jsonOut: String?
    var deadlineSeconds: UInt32 = 720

    static func preset(_ mode: String) -> BenchConfig {
        var c = BenchConfig()
        c.mode = mode
        switch mode {
        case "full":
            c.idleCounts = [1000, 10000, 50000]
            c.fanoutEvents = 20
            c.throughputSeconds = 10
            c.terminalSeconds = 8
            c.repeats = 5
            c.serverWorkers = 3  // 50k streams need three processes of at most 20,000 files each
            c.stormStreams = 10000
            c.stormActivities = 1000
            c.stormRate = 1000
            c.stormPublishers = 32
            c.nodeSubscribers = 10000
            c.nodeActivities = 2000
            c.nodePublishers = 64
            c.nodeSeconds = 10
            c.replayActivities = 50
            c.stormRepeats = 3
            c.deadlineSeconds = 2700
        case "smoke":
            c.idleCounts = [300]
            c.idleActivities = 30
            c.fanoutSubscribers = 300
            c.fanoutEvents = 5
            c.throughputSubscribers = 300
            c.throughputActivities = 60
            c.throughputPublishers = 8
            c.throughputSeconds = 1.5
            c.terminalConnections = 8
            c.terminalActivities = 30
            c.terminalSeconds = 1
            c.stormStreams = 200
            c.stormActivities = 20
            c.stormRate = 40
            c.stormPublishers = 4
            c.stormWarmup = 2
            c.stormSettle = 20
            c.nodeCounts = [1, 2]
            c.nodeSubscribers = 200
            c.nodeActivities = 40
            c.nodePublishers = 4
            c.nodeSeconds = 1.5
            c.nodeCarriers = ["notify"]
            c.outageRate = 100
            c.outageSettle = 15
            c.replayStreams = 100
            c.replayActivities = 4
            c.replayEvents = 200
            c.feedSizes = [(activities: 1000, readers: 20)]
            c.feedIdleSeconds = 2
            c.repeats = 1
            c.deadlineSeconds = 240
        default:
            break
        }
        return c
    }
}
