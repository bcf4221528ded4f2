import DispatchCore
import DispatchIO
import DispatchSystem

/// A stream the memory budget follows: a status stream or a feed, by its service's id.
struct BudgetedStream: Hashable {
    enum Kind: UInt8 { case status, feed }
    let kind: Kind
    let id: Int
}

/// The IO shell around `MemoryBudget`, one per worker, shared by status streams and feeds:
/// connections report what they hold and ask before reading a page; every second, and after
/// each report, the budget's decisions are performed on the next turn of the loop (never
/// inside the write that reported, whose stream may be the one disconnected).
final class ReplayMemory {
    private var budget: MemoryBudget<Int64, BudgetedStream>
    private let loop: LoopScheduling
    private let metrics: Metrics
    private var connections: [BudgetedStream: SSEConnection] = [:]
    /// How each kind of stream is ended (as a slow client) when the budget disconnects it.
    var disconnect: [BudgetedStream.Kind: (Int) -> Void] = [:]
    private var pendingDisconnect: [BudgetedStream] = []
    private var pendingWake: [BudgetedStream] = []
    private var scheduled = false
    private var timer: Timer?

    /// `limit`: this worker's share of the server's budget, in bytes.
    init(loop: LoopScheduling, limit: Int, metrics: Metrics) {
        self.loop = loop
        self.metrics = metrics
        budget = MemoryBudget(limit: max(limit, 64 * 1024))
        metrics.replayMemoryLimit = budget.limit
        timer = loop.timer(after: 1, repeating: true) { [weak self] in self?.tick() }
    }

    var limit: Int { budget.limit }
    var total: Int { budget.total }

    func open(_ s: BudgetedStream, key: Int64, connection: SSEConnection) {
        budget.open(s, key: key, now: loop.now)
        connections[s] = connection
    }

    /// What the stream holds now, queued and in its socket's buffer; `release`: bytes reserved
    /// for a page read that is over.
    func hold(_ s: BudgetedStream, bytes: Int, release: Int = 0) {
        perform(budget.hold(s, bytes: bytes, now: loop.now, release: release))
    }

    /// Whether a page of `bytes` may be read now; if not, the connection's deferred read runs
    /// once the budget grants it.
    func admit(_ s: BudgetedStream, bytes: Int) -> Bool {
        let r = budget.admit(s, bytes: bytes, now: loop.now)
        perform(r.decision)
        return r.granted
    }

    /// Forgets the stream; safe to call more than once.
    func close(_ s: BudgetedStream) {
        connections[s] = nil
        let r = budget.close(s)
        if r.closed { perform(r.decision) }
    }

    private func tick() {
        // Sockets drain without telling (only below their low-water mark): measure them all.
        let now = loop.now
        for (s, c) in connections where (budget.held(by: s) ?? 0) > 0 { perform(budget.hold(s, bytes: c.heldBytes, now: now)) }
        perform(budget.tick(now: now))
        metrics.replayMemoryHeld = budget.total
    }

    private func perform(_ d: MemoryBudget<Int64, BudgetedStream>.Decision) {
        metrics.replayMemoryHeld = budget.total
        guard !d.isEmpty else { return }
        pendingDisconnect += d.disconnect
        pendingWake += d.wake
        guard !scheduled else { return }
        scheduled = true
        loop.soon { [weak self] in self?.flush() }
    }

    private func flush() {
        scheduled = false
        let cut = pendingDisconnect, wake = pendingWake
        pendingDisconnect = []
        pendingWake = []
        for s in cut {
            metrics.replayMemoryDisconnects += 1
            if let end = disconnect[s.kind] { end(s.id) } else { close(s) }
            // The service's close normally calls ours; make sure the bytes are freed.
            close(s)
        }
        for s in wake { connections[s]?.granted() }
    }

    func shutdown() {
        timer?.cancel()
    }
}
