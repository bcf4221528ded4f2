import DispatchIO

/// A loop for unit tests of shells, in the spirit of swift-nio's EmbeddedEventLoop: nothing
/// runs by itself. `runSoon()` runs the work deferred with `soon`; `advance(by:)` moves the
/// clock and fires the timers that come due, in time order, running deferred work after each.
public final class ManualLoop: LoopScheduling {
    public private(set) var now: Double
    private var deferred: [() -> Void] = []
    private var timers = TimerQueue()

    public init(now: Double = 1_000) { self.now = now }

    public func soon(_ body: @escaping () -> Void) { deferred.append(body) }

    public func timer(after seconds: Double, repeating: Bool, _ body: @escaping () -> Void) -> Timer {
        timers.add(after: seconds, repeating: repeating, now: now, body)
    }

    /// Timers neither fired (one-shot) nor cancelled nor released.
    public var pendingTimers: Int { timers.pending }

    /// Deferred work not yet run.
    public var pendingSoon: Int { deferred.count }

    /// Runs deferred work, including what it defers in turn, until none is left.
    public func runSoon() {
        while !deferred.isEmpty {
            let batch = deferred
            deferred = []
            for body in batch { body() }
        }
    }

    /// Runs the oldest piece of deferred work only; false when none was waiting.
    @discardableResult
    public func runOne() -> Bool {
        guard !deferred.isEmpty else { return false }
        deferred.removeFirst()()
        return true
    }

    /// Moves the clock forward, firing every timer that comes due on the way at its due time.
    public func advance(by seconds: Double) {
        let end = now + seconds
        runSoon()
        while let (due, timer) = timers.next(dueBy: end) {
            now = max(now, due)
            timer.fire()
            runSoon()
        }
        now = end
    }
}
