import DispatchIO

/// A loop for unit tests of shells, in the spirit of swift-nio's EmbeddedEventLoop: nothing
/// runs by itself. `runSoon()` runs the work deferred with `soon`; `advance(by:)` moves the
/// clock and fires the timers that come due, in time order, running deferred work after each.
public final class ManualLoop: LoopScheduling {
    private struct Entry {
        let order: Int
        var due: Double
        let interval: Double?
        weak var timer: Timer?
    }

    public private(set) var now: Double
    private var deferred: [() -> Void] = []
    private var entries: [Entry] = []
    private var nextOrder = 0

    public init(now: Double = 1_000) { self.now = now }

    public func soon(_ body: @escaping () -> Void) { deferred.append(body) }

    public func timer(after seconds: Double, repeating: Bool, _ body: @escaping () -> Void) -> Timer {
        let t = Timer(interval: seconds, repeating: repeating, body: body)
        entries.append(Entry(order: nextOrder, due: now + seconds, interval: repeating ? seconds : nil, timer: t))
        nextOrder += 1
        return t
    }

    /// Timers neither fired (one-shot) nor cancelled nor released.
    public var pendingTimers: Int {
        entries.filter { $0.timer.map { !$0.isCancelled } ?? false }.count
    }

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
        while let i = nextDue(before: end) {
            let entry = entries[i]
            now = max(now, entry.due)
            if let interval = entry.interval {
                entries[i].due += max(interval, 1e-9)
            } else {
                entries.remove(at: i)
            }
            entry.timer?.fire()
            runSoon()
        }
        now = end
        entries.removeAll { $0.timer == nil || $0.timer!.isCancelled }
    }

    private func nextDue(before end: Double) -> Int? {
        var best: Int?
        for (i, e) in entries.enumerated() where e.due <= end {
            guard let t = e.timer, !t.isCancelled else { continue }
            if let b = best, (entries[b].due, entries[b].order) <= (e.due, e.order) { continue }
            best = i
        }
        return best
    }
}
