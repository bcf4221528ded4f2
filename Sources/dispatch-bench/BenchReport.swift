import DispatchCore
import DispatchSystem
#if canImport(Glibc)
import Glibc
#endif

/// How every bench run ends, the comparison and the push bench alike: the table on stdout,
/// the JSON saved, its path printed, then the problems (exit 2) or none (exit 0).
enum BenchReport {
    /// Where the JSON goes: `explicit` (--json), or `resultsDir` as `<stamp>-<tag>.json` and
    /// `latest-<tag>.json`.
    struct Destination {
        var explicit: String?
        var resultsDir: String
        var tag: String
    }

    static func finish(table: String, json: JSONWriter, to destination: Destination, problems: [String]) throws -> Int32 {
        print(table)
        let path = try save(json, to: destination)
        print("results: \(path)")
        guard problems.isEmpty else {
            print("PROBLEMS:")
            for p in problems { print("  " + p) }
            return 2
        }
        return 0
    }

    static func save(_ json: JSONWriter, to d: Destination) throws -> String {
        let text = json.string + "\n"
        if let path = d.explicit {
            try Files.write(path, text)
            return path
        }
        let dir = Files.absolutePath(d.resultsDir)
        try? Files.makeDirectory(dir)
        let path = "\(dir)/\(stamp(time_t(Clock.nowMilliseconds() / 1000)))-\(d.tag).json"
        try Files.write(path, text)
        try Files.write("\(dir)/latest-\(d.tag).json", text)
        return path
    }

    /// `YYYYMMDD-hhmmss` in UTC.
    static func stamp(_ t: time_t) -> String {
        var now = t
        var tm = tm()
        gmtime_r(&now, &tm)
        func two(_ v: Int32) -> String { v < 10 ? "0\(v)" : String(v) }
        return String(tm.tm_year + 1900) + two(tm.tm_mon + 1) + two(tm.tm_mday) + "-" + two(tm.tm_hour) + two(tm.tm_min) + two(tm.tm_sec)
    }

    /// The machine the figures were measured on, for the table's second line and the JSON.
    static func machine() -> [(String, String)] {
        var model = ""
        for line in (Files.read("/proc/cpuinfo") ?? "").split(separator: "\n") where line.hasPrefix("model name") {
            model = String(line.split(separator: ":", maxSplits: 1).last ?? "").trimmingCharacters(in: "\t")
            break
        }
        let mem = Proc.kbField(Files.read("/proc/meminfo") ?? "", "MemTotal:")
        var u = utsname()
        uname(&u)
        let kernel = withUnsafeBytes(of: u.release) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        return [("cpu", model), ("cores", String(sysconf(Int32(_SC_NPROCESSORS_ONLN)))),
                ("memory", "\(mem / 1024 / 1024) MiB"), ("kernel", kernel)]
    }

    static func writeMachine(_ w: inout JSONWriter) {
        w.key("machine"); w.beginObject(); for (k, v) in machine() { w.field(k, v) }; w.endObject()
    }

    /// A table cell `n` wide; a value as wide as its column gets one space, so it never runs
    /// into the next.
    static func pad(_ s: String, _ n: Int, right: Bool = false) -> String {
        s.count >= n ? (right ? " " + s : s + " ")
            : (right ? String(repeating: " ", count: n - s.count) + s : s + String(repeating: " ", count: n - s.count))
    }
}
