import DispatchSystem
import Glibc

/// What each worker of one server tells its siblings, so that whichever worker takes a
/// `/metrics` or `/readyz` request answers for the whole server: a small file per worker in a
/// private directory the supervisor makes (tmpfs when there is one), rewritten every second.
struct WorkerState: Equatable {
    var index: Int
    var pid: pid_t
    var readiness: Readiness
    /// Wall-clock milliseconds when written.
    var at: Int64
    /// The worker's own metrics, Prometheus text.
    var metrics: String

    func encode() -> String {
        "index=\(index)\npid=\(pid)\nreadiness=\(readiness.rawValue)\nat=\(at)\n--\n" + metrics
    }

    static func decode(_ text: String) -> WorkerState? {
        var fields: [String: String] = [:]
        var rest = Substring(text)
        while let newline = rest.firstIndex(of: "\n") {
            let line = rest[..<newline]
            rest = rest[rest.index(after: newline)...]
            if line == "--" { break }
            let kv = line.split(separator: "=", maxSplits: 1)
            if kv.count == 2 { fields[String(kv[0])] = String(kv[1]) }
        }
        guard let index = fields["index"].flatMap({ Int($0) }), let pid = fields["pid"].flatMap({ pid_t($0) }),
              let readiness = fields["readiness"].flatMap(Readiness.init(rawValue:)), let at = fields["at"].flatMap({ Int64($0) })
        else { return nil }
        return WorkerState(index: index, pid: pid, readiness: readiness, at: at, metrics: String(rest))
    }

    /// A private directory for one server's worker states.
    static func makeDirectory() -> String? {
        let base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp"
        let dir = "\(base)/dispatchd-\(getpid())"
        guard (try? Files.makeDirectory(dir, mode: 0o700)) != nil else { return nil }
        return dir
    }

    static func path(_ dir: String, _ index: Int) -> String { "\(dir)/worker-\(index)" }

    func write(to dir: String) {
        try? Files.write(WorkerState.path(dir, index), encode(), mode: 0o600)
    }

    /// The states of workers `0..<count` that were written in the last `freshness` seconds.
    static func read(_ dir: String, count: Int, now: Int64, freshness: Double) -> [Int: WorkerState] {
        var out: [Int: WorkerState] = [:]
        for i in 0..<count {
            guard let text = Files.read(path(dir, i)), let state = decode(text),
                  Double(now - state.at) / 1000 <= freshness else { continue }
            out[i] = state
        }
        return out
    }
}
