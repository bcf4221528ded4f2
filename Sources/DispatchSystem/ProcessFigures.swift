#if canImport(Glibc)
import Glibc
#endif

/// What the kernel says about this process: memory, descriptors, CPU.
public struct ProcessFigures: Sendable {
    public var residentBytes: Int
    public var openFDs: Int
    public var cpuSeconds: Double

    public init(residentBytes: Int, openFDs: Int, cpuSeconds: Double) {
        self.residentBytes = residentBytes
        self.openFDs = openFDs
        self.cpuSeconds = cpuSeconds
    }

    public static func current() -> ProcessFigures {
        ProcessFigures(residentBytes: residentBytes(of: getpid()) ?? 0, openFDs: openFDs(), cpuSeconds: cpuSeconds())
    }

    /// Resident memory of any process, from /proc/PID/statm.
    public static func residentBytes(of pid: pid_t) -> Int? {
        guard let text = Files.read("/proc/\(pid)/statm") else { return nil }
        let fields = text.split(separator: " ")
        guard fields.count > 1, let pages = Int(fields[1]) else { return nil }
        return pages * Int(sysconf(Int32(_SC_PAGESIZE)))
    }

    static func openFDs() -> Int {
        guard let d = opendir("/proc/self/fd") else { return 0 }
        defer { closedir(d) }
        var n = 0
        while readdir(d) != nil { n += 1 }
        return max(0, n - 3)  // ".", "..", and the directory's own descriptor
    }

    static func cpuSeconds() -> Double {
        var usage = rusage()
        getrusage(RUSAGE_SELF.rawValue, &usage)
        return Double(usage.ru_utime.tv_sec) + Double(usage.ru_utime.tv_usec) / 1e6
            + Double(usage.ru_stime.tv_sec) + Double(usage.ru_stime.tv_usec) / 1e6
    }
}
