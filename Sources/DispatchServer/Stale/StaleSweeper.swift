import DispatchCore
import DispatchIO

/// Ends activities nobody updated or touched within their `staleAfter` (contract §5.4): state
/// `error`, `error: "stale: no update for <duration>"`, through the normal publish path, so
/// streams, history, the feed and pushes see an ordinary end.
///
/// Exactly one end, with any number of servers: a sweep claims due rows with `FOR UPDATE SKIP
/// LOCKED`, reschedules those updated or touched since (their real deadline is later) and
/// moves the really stale ones' look-again time to a fence a little ahead (so other servers'
/// sweeps pass them by); the end is a compare-and-set on `seq` that also requires the touch
/// time seen at the claim. A change or a touch after the claim changes one or the other, and
/// the sweeper lets the activity live; a sweeper that died after its claim leaves a row that
/// comes due again at the fence. Each tick is one index range scan (`activities_stale`).
final class StaleSweeper {
    /// How long a claim keeps other sweeps away (ms): the end normally commits within a round trip.
    static let claimMs: Int64 = 30_000
    static let batch = 100

    let loop: LoopScheduling
    let db: Database
    let publisher: Publisher
    let log: Logger
    let metrics: Metrics
    let now: () -> Int64
    private var timer: Timer?
    private var sweeping = false

    init(loop: LoopScheduling, db: Database, publisher: Publisher, log: Logger, metrics: Metrics, now: @escaping () -> Int64) {
        self.loop = loop
        self.db = db
        self.publisher = publisher
        self.log = log
        self.metrics = metrics
        self.now = now
    }

    /// Sweeps every `interval` seconds until `stop` (on `loop`'s timers: a test's manual loop).
    func start(interval: Double = 1) {
        timer = loop.timer(after: interval, repeating: true) { [weak self] in self?.sweep() }
    }

    func stop() {
        timer?.cancel()
        timer = nil
    }

    func sweep() {
        guard timer != nil, !sweeping, db.isReady else { return }
        sweeping = true
        let t = now()
        let fence = t + StaleSweeper.claimMs
        db.read(StaleSQL.claim(now: t, fence: fence, limit: StaleSweeper.batch)) { [weak self] result in
            guard let self else { return }
            self.sweeping = false
            // Stopped meanwhile (shutdown): the worker no longer waits for new publishes, so
            // the claimed rows are left to their fence (another sweep ends them).
            guard self.timer != nil else { return }
            switch result {
            case .failure(let e):
                self.log.warning("stale.claim_failed", [("error", e.message)])
            case .success(let r):
                for row in r.rows {
                    guard let id = row["activity_id"], let seq = row.int64("seq"), let after = row.int("stale_after_s"),
                          let touched = row.int64("touched_ms") else { continue }
                    self.end(id, seq: seq, staleAfter: after, touched: touched)
                }
                // A backlog (a server that was down for a while): go on at once.
                if r.rows.count == StaleSweeper.batch { self.loop.soon { [weak self] in self?.sweep() } }
            }
        }
    }

    private func end(_ id: String, seq: Int64, staleAfter: Int, touched: Int64) {
        // Planned on a fresh read (never the cache): anything since the claim means it lives.
        let op = PublishOp(activityID: id, kind: .end(StaleEnd.command(staleAfter: staleAfter)), ownerKeyID: nil,
                           access: .staleClaim(seq: seq, touchedMs: touched))
        publisher.submit(op) { [weak self] outcome in
            guard let self else { return }
            switch outcome {
            case .committed:
                self.metrics.staleEnded += 1
                self.log.info("stale.ended", [("activity", id), ("stale_after_s", staleAfter), ("seq", seq + 1)])
            case .failed(let e) where e.code == .conflict || e.code == .alreadyFinished || e.code == .notFound:
                self.log.debug("stale.spared", [("activity", id), ("why", e.message)])
            case .failed(let e):
                // The claim's fence brings it back in `claimMs`.
                self.log.warning("stale.end_failed", [("activity", id), ("error", e.message)])
            case .ok, .replay:
                break
            }
        }
    }
}
