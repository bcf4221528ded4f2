import DispatchIO

/// A loop whose clock moves a little each time it is read (work takes time, so the pacer
/// rests), and whose deferred work runs by priority: `.background` only when nothing else
/// waits, as libevent runs it.
public final class SimulatedLoop: LoopScheduling {
    public init() {}
    private var clock = 1_000.0
    private var normal: [() -> Void] = []
    private var background: [() -> Void] = []
    private var timers = TimerQueue()

    public var now: Double {
        clock += 5e-6
        return clock
    }

    public func soon(_ body: @escaping () -> Void) { normal.append(body) }

    public func soon(_ priority: EventPriority, _ body: @escaping () -> Void) {
        if priority == .background { background.append(body) } else { normal.append(body) }
    }

    public func timer(after seconds: Double, repeating: Bool, _ body: @escaping () -> Void) -> Timer {
        timers.add(after: seconds, repeating: repeating, now: clock, body)
    }

    /// Runs one piece of deferred work; false when none waits.
    @discardableResult
    public func runOne() -> Bool {
        if !normal.isEmpty { normal.removeFirst()(); return true }
        if !background.isEmpty { background.removeFirst()(); return true }
        return false
    }

    /// Moves the clock on, firing the timers that come due (each followed by what it deferred).
    public func advance(by seconds: Double) {
        let end = clock + seconds
        while let (due, timer) = timers.next(dueBy: end) {
            clock = max(clock, due)
            timer.fire()
            while runOne() {}
        }
        clock = max(clock, end)
    }
}
