/// Sums the Prometheus text of several workers into one server's: every sample keyed by its
/// name and labels without `worker`. Counters, gauges and histogram series add up; a 0/1 state
/// (`dispatch_db_up`) takes the lowest, so one worker down shows; a figure of the whole
/// deployment that each worker counts (outbox depths, live activities) takes the highest; process
/// figures stay per worker, each series labelled `worker` and none unlabelled, so `sum()` over
/// the family is the server's total and counts nothing twice.
enum MetricsMerge {
    /// Families kept as one series per worker instead of summed.
    static let perWorker: Set<String> = ["process_resident_memory_bytes", "process_open_fds", "process_cpu_seconds_total"]
    /// Families whose samples take the lowest value instead of the sum (0/1 states, build info).
    static let lowest: Set<String> = ["dispatch_db_up", "dispatch_carrier_up", "dispatch_build_info"]
    /// Deployment-wide figures every worker reads for itself: the highest (the freshest count), not the sum.
    static let highest: Set<String> = ["dispatch_push_outbox_depth", "dispatch_webhook_outbox_pending", "dispatch_activities_live"]

    struct Family {
        var header: [String] = []
        var keys: [String] = []
        var values: [String: Double] = [:]
        var kept: [String] = []
    }

    static func merge(_ texts: [String]) -> String {
        var families: [String: Family] = [:]
        var order: [String] = []
        for text in texts {
            var current = ""
            for line in text.split(separator: "\n", omittingEmptySubsequences: true) {
                if line.hasPrefix("#") {
                    let parts = line.split(separator: " ", maxSplits: 3)
                    guard parts.count >= 3 else { continue }
                    current = String(parts[2])
                    if families[current] == nil { families[current] = Family(); order.append(current) }
                    if families[current]!.header.count < 2, !families[current]!.header.contains(String(line)) {
                        families[current]!.header.append(String(line))
                    }
                    continue
                }
                guard let (name, labels, value) = sample(line) else { continue }
                let family = name.hasPrefix(current) && !current.isEmpty ? current : name
                if families[family] == nil { families[family] = Family(); order.append(family) }
                if perWorker.contains(family) { families[family]!.kept.append(String(line)); continue }
                let key = labels.isEmpty ? name : "\(name){\(labels)}"
                if let old = families[family]!.values[key] {
                    families[family]!.values[key] = lowest.contains(family) ? min(old, value) : highest.contains(family) ? max(old, value) : old + value
                } else {
                    families[family]!.values[key] = value
                    families[family]!.keys.append(key)
                }
            }
        }
        var out = ""
        for name in order {
            guard let f = families[name] else { continue }
            for h in f.header { out += h + "\n" }
            for key in f.keys { out += key + " " + format(f.values[key]!) + "\n" }
            for line in f.kept { out += line + "\n" }
        }
        return out
    }

    /// `name{a="1",worker="0"} 12` -> ("name", `a="1"`, 12): the worker label dropped.
    static func sample(_ line: Substring) -> (String, String, Double)? {
        guard let space = line.lastIndex(of: " "), let value = Double(line[line.index(after: space)...]) else { return nil }
        let series = line[..<space]
        guard let open = series.firstIndex(of: "{") else { return (String(series), "", value) }
        let name = String(series[..<open])
        let inner = series[series.index(after: open)..<(series.lastIndex(of: "}") ?? series.endIndex)]
        let labels = inner.split(separator: ",").filter { !$0.hasPrefix("worker=") }.joined(separator: ",")
        return (name, labels, value)
    }

    static func format(_ v: Double) -> String {
        if v.rounded() == v && abs(v) < 1e15 { return String(Int64(v)) }
        return String(v)
    }
}
