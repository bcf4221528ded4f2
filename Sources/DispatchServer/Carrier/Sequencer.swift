import DispatchCore
import DispatchIO
import DispatchSystem

/// The shell of `SequencerMachine`: its own PostgreSQL session, the numbering pass, the hint
/// that positions exist, and the age of the oldest change not yet numbered. Worker 0 of every
/// server runs one; none leads.
/// Who hears of the sequencer's passes.
protocol SequencerDelegate: AnyObject {
    /// A pass gave feed positions up to `through`.
    func positionsNumbered(through: Int64)
}

final class Sequencer {
    let loop: LoopScheduling
    let session: PGConnection
    let log: Logger
    let metrics: CarrierMetrics
    private var machine: SequencerMachine
    private var timer: Timer?
    private var ageTimer: Timer?
    /// Whether the cluster records commit times (`track_commit_timestamp`): passes order by
    /// them; else by the writers' clocks.
    private(set) var commitOrdered = false
    /// Publishes the hint that positions up to a number exist (the NATS carrier).
    weak var delegate: SequencerDelegate?

    init(loop: LoopScheduling, session: PGConnection, log: Logger, metrics: CarrierMetrics, settings: SequencerMachine.Settings = .init()) {
        self.loop = loop
        self.log = log
        self.metrics = metrics
        self.session = session
        machine = SequencerMachine(settings: settings)
    }

    func start() {
        session.onReady = { [unowned self] in self.sessionReady() }
        session.onLost = { [unowned self] _ in self.machine.sessionLost(now: self.loop.now) }
        session.start()
        timer = loop.timer(after: machine.settings.busyRetry, repeating: true) { [unowned self] in
            self.perform(self.machine.tick(now: self.loop.now))
        }
        ageTimer = loop.timer(after: 1, repeating: true) { [unowned self] in self.measureBacklog() }
    }

    /// A commit somewhere asks for a pass.
    func woken() { perform(machine.woken(now: loop.now)) }

    func stop() {
        timer?.cancel()
        timer = nil
        ageTimer?.cancel()
        ageTimer = nil
        session.close()
    }

    private func sessionReady() {
        // A hung client must not keep the position lock: PostgreSQL ends its transaction.
        session.execute(SequencerSQL.sessionSetup) { [weak self] result in
            guard let self else { return }
            if case .success(let rs) = result, rs.allSatisfy(\.ok) {
                self.commitOrdered = rs.last?.first?.bool("ordered") ?? false
                if !self.commitOrdered {
                    self.log.info("sequencer.order", [("by", "write time"),
                                                      ("why", "track_commit_timestamp is off: passes order changes committed within the same pass by the writers' clocks")])
                }
            }
            self.perform(self.machine.sessionReady(now: self.loop.now))
        }
    }

    private func perform(_ actions: [SequencerMachine.Action]) {
        for action in actions {
            switch action {
            case .number(let limit, let generation):
                let started = loop.now
                session.execute(SequencerSQL.pass(limit: limit, commitOrdered: commitOrdered)) { [weak self] result in
                    guard let self else { return }
                    let now = self.loop.now
                    switch result {
                    case .failure:
                        break // the session is lost: onLost tells the machine
                    case .success(let rs) where rs.count == 2 && rs.allSatisfy(\.ok):
                        guard rs[0].first?.bool("got") == true || rs[1].first?.bool("got") == true else {
                            self.metrics.sequencerBusy += 1
                            return self.perform(self.machine.busy(generation: generation, now: now))
                        }
                        let count = rs[1].first?.int("n") ?? 0, through = rs[1].first?.int64("through")
                        self.metrics.sequencerPasses += 1
                        self.metrics.positionsNumbered += count
                        if count > 0, self.log.enabled(.debug) {
                            self.log.debug("sequencer.pass", [("rows", count), ("through", through ?? 0), ("ms", Int((now - started) * 1000))])
                        }
                        self.perform(self.machine.numbered(count: count, through: through, generation: generation, now: now))
                    case .success(let rs):
                        self.log.warning("sequencer.pass_failed", [("error", (rs.first { !$0.ok }?.errorMessage ?? "").trimmingNewlines)])
                        self.perform(self.machine.passFailed(generation: generation, now: now))
                    }
                }
            case .announce(let through):
                delegate?.positionsNumbered(through: through)
            }
        }
    }

    /// `dispatch_feed_unnumbered_oldest_seconds`: how long the oldest committed change has
    /// waited for its position (0 when none waits).
    private func measureBacklog() {
        guard session.isReady else { return }
        session.execute([SequencerSQL.oldestWaiting]) { [weak self] result in
            guard let self, case .success(let rs) = result, rs.first?.ok == true else { return }
            self.metrics.unnumberedOldestSeconds = Double(rs[0].first?.int64("age_ms") ?? 0) / 1000
            self.metrics.unnumbered = rs[0].first?.int("n") ?? 0
        }
    }
}

extension Sequencer {
    /// At start-up, before serving: a deployment moved between carriers keeps every change in
    /// the feed. With LISTEN/NOTIFY, positions are drawn at commit, so what the NATS carrier
    /// committed but had not numbered yet is numbered now (else a fresh feed would show an
    /// activity's last numbered change, not its latest); with NATS, the passes number it.
    static func carrierSwitch(toNATS: Bool, conninfo: String, log: Logger) throws {
        let db = try BlockingPG(conninfo)
        if toNATS {
            let waiting = try db.query("SELECT count(*) AS n FROM activity_events WHERE position IS NULL").first?.int("n") ?? 0
            if waiting > 0 { log.info("carrier.switch", [("carrier", "nats"), ("unnumbered", waiting), ("effect", "the numbering passes number them")]) }
            return
        }
        let r = try db.query(SequencerSQL.numberLeftovers)
        if let error = r.errorMessage { throw SystemError("numbering changes left without a feed position: \(error)") }
        let n = r.first?.int("n") ?? 0
        if n > 0 {
            log.info("carrier.switch", [("carrier", "listen"), ("numbered", n),
                                        ("why", "committed under the NATS carrier without a feed position yet")])
        }
    }
}

/// The numbering statements (Migrations/0009_feed_sequencer.sql's index walks the waiting rows).
enum SequencerSQL {
    /// The feed's position lock (`AdvisoryLock.feedPositions`): NOTIFY-mode publish batches
    /// hold it from their positions to their commit, numbering passes take it with a try.
    static let positionLock = AdvisoryLock.feedPositions

    /// Run once per session: a client that stops mid-transaction (SIGSTOP, a frozen VM) loses
    /// it, and its lock, after 2 s; a pass may take 2 s at most; a vanished host's session is
    /// ended by TCP keepalives within about 10 s.
    static let sessionSetup = [
        PGQuery("SET idle_in_transaction_session_timeout = '2s'"),
        PGQuery("SET statement_timeout = '2s'"),
        // A host gone without closing its socket (power, network) is noticed in seconds.
        PGQuery("SET tcp_keepalives_idle = 5"),
        PGQuery("SET tcp_keepalives_interval = 2"),
        PGQuery("SET tcp_keepalives_count = 2"),
        PGQuery("SET tcp_user_timeout = 10000"),
        PGQuery("SELECT current_setting('track_commit_timestamp') = 'on' AS ordered", name: "sequencer_order"),
    ]

    /// One pass, one transaction (one pipeline batch): take the lock if free, then number the
    /// committed rows still without a position. The first statement takes the lock so the
    /// UPDATE's snapshot is taken after it; the UPDATE asks again (an advisory lock is
    /// re-entrant) and numbers nothing without it. It checks `position IS NULL` on the row it
    /// updates, so rows another pass numbered meanwhile are skipped, never renumbered.
    ///
    /// Order within a pass: commit time when the cluster records it, else the writer's time,
    /// made non-decreasing per activity so an activity's changes keep their seq order; the cut
    /// is taken in the same order, so a cut pass takes whole prefixes of each activity's rows.
    static func pass(limit: Int, commitOrdered: Bool) -> [PGQuery] {
        let time = commitOrdered
            ? "coalesce((extract(epoch FROM pg_xact_commit_timestamp(xmin)) * 1000000)::bigint, created_ms * 1000)"
            : "created_ms * 1000"
        return [
            PGQuery("SELECT \(positionLock.tryXactLock) AS got", name: "sequencer_lock"),
            PGQuery(numbering(lock: positionLock.tryXactLock, time: time, limit: "$1::int",
                              result: "count(*) AS n, max(position) AS through, (SELECT got FROM lock) AS got"),
                    [String(limit)], name: commitOrdered ? "sequencer_pass_commit_order" : "sequencer_pass"),
        ]
    }

    /// One numbering statement: `lock` (a boolean: whether to number), the rows still without a
    /// position in the order of `time`, made non-decreasing per activity, at most `limit`
    /// (SQL), cut in that same order; the UPDATE checks `position IS NULL` on each row.
    static func numbering(lock: String, time: String, limit: String, result: String) -> String {
        """
        WITH lock AS (SELECT \(lock) AS got),
        waiting AS (
          SELECT activity_id, seq, max(t) OVER (PARTITION BY activity_id ORDER BY seq) AS t
          FROM (SELECT activity_id, seq, \(time) AS t FROM activity_events
                WHERE position IS NULL AND (SELECT got FROM lock)) w
        ), cut AS (
          SELECT activity_id, seq, t FROM waiting ORDER BY t, activity_id, seq LIMIT \(limit)
        ), numbered AS (
          SELECT o.activity_id, o.seq, nextval('feed_positions') AS position
          FROM (SELECT activity_id, seq FROM cut ORDER BY t, activity_id, seq) o
        ), done AS (
          UPDATE activity_events e SET position = n.position
          FROM numbered n
          WHERE e.activity_id = n.activity_id AND e.seq = n.seq AND e.position IS NULL
          RETURNING e.position
        )
        SELECT \(result) FROM done
        """
    }

    static let oldestWaiting = PGQuery("""
        SELECT count(*) AS n,
               coalesce((extract(epoch FROM clock_timestamp()) * 1000)::bigint - min(created_ms), 0) AS age_ms
        FROM activity_events WHERE position IS NULL
        """, name: "sequencer_oldest_waiting")

    /// What a server started with LISTEN/NOTIFY numbers before it serves: the changes that a
    /// deployment running the NATS carrier committed but had not numbered yet. Under the
    /// position lock (waited for, as NOTIFY-mode writers do), in the passes' order.
    static let numberLeftovers = numbering(lock: "\(positionLock.xactLock)::text = ''",
                                           time: "created_ms * 1000", limit: "ALL", result: "count(*) AS n")
}
