#if canImport(Glibc)
import Glibc
#endif

/// The one place that reads the system clocks. Pure code never calls it: it takes times as
/// arguments, and the shells pass `Clock` readings in.
public enum Clock {
    /// Monotonic seconds: timeouts, heartbeats, latency.
    public static func monotonic() -> Double {
        let ts = read(CLOCK_MONOTONIC)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }

    /// Monotonic nanoseconds, for tight measuring loops.
    public static func monotonicNanoseconds() -> Int64 {
        let ts = read(CLOCK_MONOTONIC)
        return Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
    }

    /// Wall-clock milliseconds since the epoch: timestamps shown to users and stored.
    public static func nowMilliseconds() -> Int64 {
        let ts = read(CLOCK_REALTIME)
        return Int64(ts.tv_sec) * 1000 + Int64(ts.tv_nsec) / 1_000_000
    }

    /// Wall-clock nanoseconds: comparable across processes on one machine (benchmark stamps).
    public static func wallNanoseconds() -> Int64 {
        let ts = read(CLOCK_REALTIME)
        return Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
    }

    /// Wall-clock seconds since the epoch.
    public static func wallSeconds() -> Double {
        let ts = read(CLOCK_REALTIME)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }

    /// Sleeps for `seconds`, resuming after signals unless `interrupted` says to stop.
    public static func sleep(seconds: Double, interrupted: () -> Bool = { false }) {
        guard seconds > 0 else { return }
        var req = timespec(tv_sec: Int(seconds), tv_nsec: Int((seconds - Double(Int(seconds))) * 1e9))
        var rem = timespec()
        while nanosleep(&req, &rem) != 0 && errno == EINTR {
            if interrupted() { return }
            req = rem
        }
    }

    private static func read(_ clock: clockid_t) -> timespec {
        var ts = timespec()
        clock_gettime(clock, &ts)
        return ts
    }
}
