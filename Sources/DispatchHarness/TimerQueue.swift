import DispatchIO

/// The timers of a test's loop (`ManualLoop`, `SimulatedLoop`): when each is due, in which
/// order timers due at the same moment fire (the order they were made), and a repeating one's
/// next due time. Held weakly, as libevent holds them: a timer its owner released (or cancelled)
/// never fires; a one-shot holds itself until it fired.
struct TimerQueue {
    private struct Entry {
        let order: Int
        var due: Double
        let interval: Double?
        weak var timer: Timer?

        var isLive: Bool { timer.map { !$0.isCancelled } ?? false }
    }

    private var entries: [Entry] = []
    private var nextOrder = 0

    /// A timer due `seconds` after `now` (then every `seconds` when repeating).
    mutating func add(after seconds: Double, repeating: Bool, now: Double, _ body: @escaping () -> Void) -> Timer {
        let t = Timer(interval: seconds, repeating: repeating, body: body)
        entries.append(Entry(order: nextOrder, due: now + max(seconds, 0), interval: repeating ? max(seconds, 1e-6) : nil, timer: t))
        nextOrder += 1
        return t
    }

    /// Timers neither fired (one-shot) nor cancelled nor released.
    var pending: Int { entries.filter(\.isLive).count }

    /// The first timer due at or before `end` and when it is due, taken off the queue (a
    /// repeating one is due again an interval later); nil when none is. The caller fires it.
    mutating func next(dueBy end: Double) -> (due: Double, timer: Timer)? {
        entries.removeAll { !$0.isLive }
        guard let i = entries.indices.filter({ entries[$0].due <= end })
            .min(by: { (entries[$0].due, entries[$0].order) < (entries[$1].due, entries[$1].order) }),
              let timer = entries[i].timer else { return nil }
        let due = entries[i].due
        if let interval = entries[i].interval { entries[i].due += interval } else { entries.remove(at: i) }
        return (due, timer)
    }
}
