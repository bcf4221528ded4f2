import DispatchBuildInfo
import DispatchCore

/// The figures about the jobs themselves and the requests that carry them: live activities by
/// state (one periodic database count), endings by final state with their durations, cancel
/// requests, request durations by route, the build, and the carrier. Label values come only
/// from closed sets (states, route patterns, status classes) and, when the operator opts in,
/// machine names capped by `MachineLabels`: never an activity id or a raw path.
struct JobMetrics {
    /// Live activities by (state, machine label), as the last count read them; nil until this
    /// worker counts (one worker per server does).
    var live: [LabelPair: Int]?
    var ended: [LabelPair: Int] = [:]
    var durations: [ActivityState: Histogram] = [:]
    var cancelRequests = 0
    var requests: [LabelPair: Histogram] = [:]
    /// Changes this worker handed to the carrier (one NOTIFY per committed change).
    var carrierOut = 0
    var machines: MachineLabels

    init(machines: MachineLabels) {
        self.machines = machines
    }

    /// Two label values: (state, machine) or (route, status class).
    struct LabelPair: Hashable, Comparable {
        var a: String
        var b: String
        static func < (l: LabelPair, r: LabelPair) -> Bool { (l.a, l.b) < (r.a, r.b) }
    }

    /// Seconds an activity lived, start to end: from seconds to a week.
    static let durationBounds: [Double] = [1, 5, 15, 30, 60, 300, 900, 1800, 3600, 7200, 14_400, 43_200, 86_400, 259_200, 604_800]
    static let requestBounds: [Double] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10]

    struct Histogram {
        var counts: [Int]
        var sum = 0.0
        var count = 0

        init(bounds: Int) { counts = Array(repeating: 0, count: bounds) }

        mutating func observe(_ value: Double, bounds: [Double]) {
            for (i, b) in bounds.enumerated() where value <= b { counts[i] += 1 }
            sum += value
            count += 1
        }

        func render(_ name: String, labels: String, bounds: [Double]) -> String {
            var s = ""
            for (i, b) in bounds.enumerated() { s += "\(name)_bucket{\(labels),le=\"\(b)\"} \(counts[i])\n" }
            s += "\(name)_bucket{\(labels),le=\"+Inf\"} \(count)\n"
            return s + "\(name)_sum{\(labels)} \(sum)\n\(name)_count{\(labels)} \(count)\n"
        }
    }

    /// A change this worker committed: an ending (with its duration), or a cancel request.
    mutating func committed(_ event: ActivityEvent) {
        carrierOut += 1
        if event.name == .cancelRequested { cancelRequests += 1; return }
        let a = event.snapshot
        guard a.state.isTerminal, let endedAt = a.endedAt else { return }
        ended[LabelPair(a: a.state.rawValue, b: machines.label(for: a.machine)), default: 0] += 1
        let seconds = max(0, Double(endedAt - a.createdAt) / 1000)
        durations[a.state, default: Histogram(bounds: Self.durationBounds.count)].observe(seconds, bounds: Self.durationBounds)
    }

    /// One answer: its route's pattern ("unmatched" when none), its status class, its time.
    mutating func answered(route: String?, status: Int, seconds: Double) {
        let key = LabelPair(a: route ?? "unmatched", b: Self.statusClass(status))
        requests[key, default: Histogram(bounds: Self.requestBounds.count)].observe(seconds, bounds: Self.requestBounds)
    }

    static func statusClass(_ status: Int) -> String {
        (100...599).contains(status) ? "\(status / 100)xx" : "other"
    }

    /// The live count's rows `(state, machine or nil, count)`, folded into capped labels.
    mutating func counted(_ rows: [(state: String, machine: String?, count: Int)]) {
        var out: [LabelPair: Int] = [:]
        for row in rows { out[LabelPair(a: row.state, b: machines.label(for: row.machine)), default: 0] += row.count }
        live = out
    }

    /// The live count: one grouped query over the partial index of live activities; by machine
    /// only when the operator asked for that label (the rows are bounded either way).
    var liveQuery: String {
        machines.enabled
            ? "SELECT state, machine, count(*)::bigint AS n FROM activities WHERE ended_ms IS NULL GROUP BY state, machine ORDER BY n DESC LIMIT 10000"
            : "SELECT state, NULL::text AS machine, count(*)::bigint AS n FROM activities WHERE ended_ms IS NULL GROUP BY state"
    }

    func render(worker w: String, carrierUp: Bool?, carrierIn: Int) -> String {
        var s = ""
        func header(_ name: String, _ type: String, _ help: String) { s += "# HELP \(name) \(help)\n# TYPE \(name) \(type)\n" }
        func stateLabels(_ p: LabelPair) -> String {
            machines.enabled ? "\(w),state=\"\(p.a)\",machine=\"\(p.b)\"" : "\(w),state=\"\(p.a)\""
        }
        if let live {
            header("dispatch_activities_live", "gauge", "Live activities in the database, by state (deployment-wide, counted every few seconds).")
            var rows = live
            for state in ActivityState.live where !rows.keys.contains(where: { $0.a == state.rawValue }) {
                rows[LabelPair(a: state.rawValue, b: "")] = 0
            }
            for key in rows.keys.sorted() { s += "dispatch_activities_live{\(stateLabels(key))} \(rows[key]!)\n" }
        }
        header("dispatch_activities_ended_total", "counter", "Activities ended, by final state.")
        var ends = ended
        for state in ActivityState.terminal where !ends.keys.contains(where: { $0.a == state.rawValue }) {
            ends[LabelPair(a: state.rawValue, b: "")] = 0
        }
        for key in ends.keys.sorted() { s += "dispatch_activities_ended_total{\(stateLabels(key))} \(ends[key]!)\n" }
        header("dispatch_activity_duration_seconds", "histogram", "Activity lifetimes, start to end, by final state.")
        for state in ActivityState.terminal {
            s += (durations[state] ?? Histogram(bounds: Self.durationBounds.count))
                .render("dispatch_activity_duration_seconds", labels: "\(w),state=\"\(state.rawValue)\"", bounds: Self.durationBounds)
        }
        header("dispatch_cancel_requests_total", "counter", "Remote cancel requests recorded (contract 5.3).")
        s += "dispatch_cancel_requests_total{\(w)} \(cancelRequests)\n"
        header("dispatch_http_request_duration_seconds", "histogram", "HTTP answers by route pattern and status class, received to answered.")
        for key in requests.keys.sorted() {
            s += requests[key]!.render("dispatch_http_request_duration_seconds", labels: "\(w),route=\"\(key.a)\",code=\"\(key.b)\"",
                                       bounds: Self.requestBounds)
        }
        header("dispatch_build_info", "gauge", "1, labelled with the release and the commit this server was built from.")
        s += "dispatch_build_info{\(w),version=\"\(Version.release)\",commit=\"\(String(Version.commit.prefix(12)))\"} 1\n"
        // LISTEN/NOTIFY as the carrier (nil: NATS, whose figures CarrierMetrics renders).
        guard let carrierUp else { return s }
        header("dispatch_carrier_up", "gauge", "1 when this server hears the changes other servers commit (its carrier session is up).")
        s += "dispatch_carrier_up{\(w)} \(carrierUp ? 1 : 0)\n"
        header("dispatch_carrier_messages_total", "counter", "Change notices through the carrier: out (sent with each commit) and in (heard).")
        s += "dispatch_carrier_messages_total{\(w),direction=\"in\"} \(carrierIn)\n"
        s += "dispatch_carrier_messages_total{\(w),direction=\"out\"} \(carrierOut)\n"
        return s
    }
}

/// Which machine names become label values: none unless the operator opts in, then the first
/// `limit` names seen by this process; every later one is counted as `other`. An activity
/// without a machine has the empty value.
struct MachineLabels: Equatable {
    let enabled: Bool
    let limit: Int
    private(set) var known: Set<String> = []

    init(enabled: Bool, limit: Int) {
        self.enabled = enabled
        self.limit = limit
    }

    mutating func label(for machine: String?) -> String {
        guard enabled, let machine, !machine.isEmpty else { return "" }
        if known.contains(machine) { return machine }
        guard known.count < limit else { return "other" }
        known.insert(machine)
        return machine
    }
}

/// `DISPATCH_METRICS_MACHINE_LABEL` and `DISPATCH_METRICS_MACHINES`: the opt-in `machine` label.
enum MetricsSettings {
    static let settings: [ServerConfig.Setting] = [
        ServerConfig.Setting(env: "DISPATCH_METRICS_MACHINE_LABEL", flag: "--metrics-machine-label",
                             help: "1: label activity metrics with the machine (capped by DISPATCH_METRICS_MACHINES); default 0"),
        ServerConfig.Setting(env: "DISPATCH_METRICS_MACHINES", flag: "--metrics-machines",
                             help: "with the machine label, at most this many machine names per process, the rest as machine=\"other\" (default 50)"),
    ]

    static func parse(_ values: [String: String], into c: inout ServerConfig) throws(ConfigError) {
        if let v = values["DISPATCH_METRICS_MACHINE_LABEL"] {
            switch v.lowercased() {
            case "1", "true", "yes": c.metricsMachineLabel = true
            case "0", "false", "no", "": c.metricsMachineLabel = false
            default: throw ConfigError("DISPATCH_METRICS_MACHINE_LABEL must be 1 or 0, not \(v)")
            }
        }
        if let v = values["DISPATCH_METRICS_MACHINES"] {
            guard let n = Int(v), (1...1000).contains(n) else { throw ConfigError("DISPATCH_METRICS_MACHINES must be from 1 to 1000, not \(v)") }
            c.metricsMachineLimit = n
        }
    }
}
