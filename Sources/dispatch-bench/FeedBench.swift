import DispatchBlockingHTTP
import DispatchCore
import DispatchSystem
import DispatchBenchKit
#if canImport(Glibc)
import Glibc
#endif

/// **Feed** (Dispatch only; nchan has no equivalent): many live activities made by several
/// keys, then readers of `GET /v1/stream` connecting at once, each reading until `event:
/// synced`, while a prober makes point reads (`GET /v1/activities/{id}`) and the bench
/// samples dispatchd's memory. The same point reads on the same fresh server while idle come
/// first: the loaded p99 against the idle p99 is the figure (target: within 3x).
extension Orchestrator {
    func feedScenario(_ t: Target, rep: Int) throws {
        guard t.starter != nil, t.rootPid != nil else {
            log("bench: feed skipped: the bench did not start this dispatchd (its memory is a figure)")
            return
        }
        for (activities, readers) in config.feedSizes { try feedRun(t, activities: activities, readers: readers, rep: rep) }
    }

    private func feedRun(_ t: Target, activities: Int, readers: Int, rep: Int) throws {
        let scenario = "feed \(Self.count(activities))/\(readers)"
        let prefix = "b\(runTag)-fd\(rep)-\(Self.count(activities))"
        // Several keys make the activities (admin keys: the rate limit is not what is measured).
        let keys = try (0..<config.feedKeys).map { try FeedProbe.createKey(t, name: "\(prefix)-k\($0)") }
        let made = Clock.monotonicNanoseconds()
        var ids: [String] = []
        for (k, key) in keys.enumerated() {
            let mine = names("\(prefix)-k\(k)", activities / keys.count)
            ids += mine
            try batch(t, t.createRequests(mine), what: "creating feed activities", auth: key)
        }
        log("bench: \(scenario): \(ids.count) live activities over \(keys.count) keys made in "
            + "\(fmt(Double(Clock.monotonicNanoseconds() - made) / 1e9)) s")

        try t.restart()
        Control.sleep(1)
        var rng = SystemRandomNumberGenerator()
        let sample = (0..<500).map { _ in ids[Int.random(in: 0..<ids.count, using: &rng)] }
        // Warm the server the same way for both measurements, then measure idle.
        _ = FeedProbe.pointReads(t, sample, seconds: 1, stop: nil)
        let idle = FeedProbe.pointReads(t, sample, seconds: config.feedIdleSeconds, stop: nil)
        guard let before = t.memory() else { throw BenchError("feed: cannot read dispatchd's memory") }

        let stop = FeedProbe.Flag()
        var loaded: [Double] = []
        let prober = FeedProbe.thread { loaded = FeedProbe.pointReads(t, sample, seconds: 3600, stop: stop) }
        let results = FeedProbe.Results(count: readers)
        let start = Clock.monotonicNanoseconds()
        var threads: [pthread_t] = []
        let timeout = config.feedTimeout
        for i in 0..<readers {
            let addr = addrs[i % addrs.count], key = keys[i % keys.count]
            threads.append(FeedProbe.thread {
                FeedProbe.yieldToOthers()
                results.set(i, FeedProbe.readUntilSynced(t, addr: addr, key: key, timeout: timeout))
            })
        }
        var peak = before.rss
        while results.done < readers && Double(Clock.monotonicNanoseconds() - start) / 1e9 < config.feedTimeout + 5 {
            if let m = t.memory() { peak = max(peak, m.rss) }
            Control.sleep(0.1)
        }
        for th in threads { pthread_join(th, nil) }
        stop.set()
        pthread_join(prober, nil)

        let outcomes = results.all
        let synced = outcomes.compactMap { $0?.seconds }
        let mb = 1024.0 * 1024.0
        record(scenario, "all readers synced", "s", higher: false, t, synced.count == readers ? synced.max() : nil)
        record(scenario, "first reader synced", "s", higher: false, t, synced.min())
        record(scenario, "feed MB per reader", "MB", higher: false, t,
               outcomes.compactMap { $0.map { Double($0.bytes) / mb } }.max(), table: false)
        record(scenario, "point read p50 idle", "ms", higher: false, t, BenchStats.percentile(idle, 0.5))
        record(scenario, "point read p99 idle", "ms", higher: false, t, BenchStats.percentile(idle, 0.99))
        record(scenario, "point read p50 loaded", "ms", higher: false, t, BenchStats.percentile(loaded, 0.5))
        record(scenario, "point read p99 loaded", "ms", higher: false, t, BenchStats.percentile(loaded, 0.99))
        record(scenario, "RSS growth", "MB", higher: false, t, Double(peak - before.rss) / mb)
        check(t, "\(scenario): readers not synced", Int64(readers - synced.count))
        if let i = BenchStats.percentile(idle, 0.99), let l = BenchStats.percentile(loaded, 0.99), l > 3 * i {
            notes.append("\(scenario): point-read p99 while feeds load \(fmt(l)) ms is above 3x idle (\(fmt(i)) ms)")
        }
        log("bench: \(scenario) rep \(rep + 1): \(synced.count)/\(readers) synced, first \(fmt(synced.min() ?? -1)) s, "
            + "all \(fmt(synced.max() ?? -1)) s; point reads idle p50/p99 \(fmt(BenchStats.percentile(idle, 0.5) ?? -1))/"
            + "\(fmt(BenchStats.percentile(idle, 0.99) ?? -1)) ms (\(idle.count)), loaded \(fmt(BenchStats.percentile(loaded, 0.5) ?? -1))/"
            + "\(fmt(BenchStats.percentile(loaded, 0.99) ?? -1)) ms (\(loaded.count)); RSS \(before.rss >> 20) MB -> peak \(peak >> 20) MB"
            + (outcomes.compactMap { $0?.error }.first.map { "; first error: \($0)" } ?? ""))
    }
}

/// The feed scenario's clients: blocking sockets on threads of the orchestrator (at most a
/// few hundred), which keeps them apart from the subscriber processes' event loops.
enum FeedProbe {
    struct Outcome {
        var seconds: Double?
        var bytes = 0
        var error: String?
    }

    final class Results: @unchecked Sendable {
        private var lock = pthread_mutex_t()
        private var items: [Outcome?]
        private(set) var done = 0
        init(count: Int) {
            items = Array(repeating: nil, count: count)
            pthread_mutex_init(&lock, nil)
        }
        func set(_ i: Int, _ o: Outcome) {
            pthread_mutex_lock(&lock); items[i] = o; done += 1; pthread_mutex_unlock(&lock)
        }
        var all: [Outcome?] { pthread_mutex_lock(&lock); defer { pthread_mutex_unlock(&lock) }; return items }
    }

    final class Flag: @unchecked Sendable {
        private var lock = pthread_mutex_t()
        private var value = false
        init() { pthread_mutex_init(&lock, nil) }
        func set() { pthread_mutex_lock(&lock); value = true; pthread_mutex_unlock(&lock) }
        var isSet: Bool { pthread_mutex_lock(&lock); defer { pthread_mutex_unlock(&lock) }; return value }
    }

    final class Box { let body: () -> Void; init(_ b: @escaping () -> Void) { body = b } }

    static func thread(_ body: @escaping () -> Void) -> pthread_t {
        var th = pthread_t()
        let box = Unmanaged.passRetained(Box(body)).toOpaque()
        pthread_create(&th, nil, { arg in
            let b = Unmanaged<Box>.fromOpaque(arg!).takeRetainedValue()
            b.body()
            return nil
        }, box)
        return th
    }


    /// The calling thread runs under SCHED_IDLE. The readers stand for browsers on other
    /// machines: on these two shared cores, 200 threads parsing what the server sends would
    /// otherwise take the CPU from the server and from the point-read probe that measures it
    /// (nice 10 was not enough: 200 threads still outweigh two workers).
    static func yieldToOthers() {
        var param = sched_param()
        param.sched_priority = 0
        _ = pthread_setschedparam(pthread_self(), 5, &param)  // SCHED_IDLE (linux/sched.h), not exported to Swift
    }

    static func sendAll(_ fd: Int32, _ bytes: [UInt8]) -> Bool {
        var off = 0
        while off < bytes.count {
            let r = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + off, bytes.count - off, Int32(MSG_NOSIGNAL)) }
            guard r > 0 else { return false }
            off += r
        }
        return true
    }

    /// One request on a fresh connection (`Connection: close`); the status and body.
    static func request(_ t: Target, addr: String = "127.0.0.1", method: String, path: String, auth: String,
                        body: String = "") -> (status: Int, body: String)? {
        var headers = [("Authorization", "Bearer \(auth)")]
        if !body.isEmpty { headers.append(("Content-Type", "application/json")) }
        let request = HTTPRequestEncoder.encode(method: method, target: path, host: addr, headers: headers, body: body.isEmpty ? nil : body)
        guard let r = try? HTTP1Connection.exchange(host: addr, port: Int(t.port), request: request, timeout: 10, maxBody: .max) else {
            return nil
        }
        return (r.head.status, String(decoding: r.body, as: UTF8.self))
    }

    /// One figure of the server's `/metrics` (summed over its workers).
    static func metric(_ t: Target, _ name: String) -> Double? {
        guard let r = request(t, method: "GET", path: "/metrics", auth: t.key), r.status == 200 else { return nil }
        for line in r.body.split(separator: "\n") where line.hasPrefix(name + " ") || line.hasPrefix(name + "{") {
            if let v = line.split(separator: " ").last.flatMap({ Double($0) }) { return v }
        }
        return nil
    }

    static func createKey(_ t: Target, name: String) throws -> String {
        guard let r = request(t, method: "POST", path: "/v1/keys", auth: t.key, body: "{\"name\":\"\(name)\",\"scopes\":[\"admin\"]}"),
              r.status == 201, case .string(let secret)? = (try? JSONParser.parse(r.body))?["secret"] else {
            throw BenchError("feed: cannot create key \(name)")
        }
        return secret
    }

    /// Point reads of the sample, one after another (a fresh connection each, ~200 a second),
    /// for `seconds` or until `stop`; their latencies in ms.
    static func pointReads(_ t: Target, _ ids: [String], seconds: Double, stop: Flag?) -> [Double] {
        var out: [Double] = []
        let end = Clock.monotonicNanoseconds() + Int64(seconds * 1e9)
        var i = 0
        while Clock.monotonicNanoseconds() < end && !(stop?.isSet ?? false) {
            let id = ids[i % ids.count]
            i += 1
            let t0 = Clock.monotonicNanoseconds()
            if let r = request(t, method: "GET", path: "/v1/activities/\(id)", auth: t.key), r.status == 200 {
                out.append(Double(Clock.monotonicNanoseconds() - t0) / 1e6)
            }
            usleep(5000)
        }
        return out
    }

    /// Opens a feed and reads until `event: synced`.
    static func readUntilSynced(_ t: Target, addr: String, key: String, timeout: Double) -> Outcome {
        let t0 = Clock.monotonicNanoseconds()
        guard let fd = try? BlockingHTTP.connect(host: addr, port: t.port, timeout: 5) else { return Outcome(error: "connect failed") }
        defer { Glibc.close(fd) }
        let request = HTTPRequestEncoder.encode(method: "GET", target: "/v1/stream", host: addr,
                                                headers: [("Authorization", "Bearer \(key)"), ("Accept", "text/event-stream")], close: false)
        guard sendAll(fd, request) else {
            return Outcome(error: "send failed")
        }
        let marker = Array("\nevent: synced\n".utf8)
        var tail: [UInt8] = []
        var total = 0
        var buf = [UInt8](repeating: 0, count: 65536)
        while Double(Clock.monotonicNanoseconds() - t0) / 1e9 < timeout {
            let r = buf.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if r < 0 && errno == EAGAIN { continue }
            guard r > 0 else { return Outcome(bytes: total, error: "closed after \(total) bytes") }
            total += r
            let window = tail + buf[0..<r]
            if contains(window, marker) { return Outcome(seconds: Double(Clock.monotonicNanoseconds() - t0) / 1e9, bytes: total) }
            tail = Array(window.suffix(marker.count))
        }
        return Outcome(bytes: total, error: "not synced in \(timeout) s")
    }

    static func contains(_ hay: [UInt8], _ needle: [UInt8]) -> Bool {
        guard hay.count >= needle.count else { return false }
        var i = 0
        while i <= hay.count - needle.count {
            if hay[i] == needle[0] && hay[i..<(i + needle.count)].elementsEqual(needle) { return true }
            i += 1
        }
        return false
    }
}
