import DispatchCore
import DispatchIO
import DispatchSystem

/// The shell of `SequencerMachine`: its own PostgreSQL session (the advisory lock that makes
/// it the leader lives and dies with it), the claim and numbering statements, and the
/// announcement of every pass on the carrier. One per server process is a candidate.
final class Sequencer {
    let loop: EventLoop
    let session: PGConnection
    let log: Logger
    let metrics: CarrierMetrics
    private var machine: SequencerMachine
    private var timer: Timer?
    /// The rows of the pass that just committed, waiting for `.announce`.
    private var numbered: [CarrierMessage.Change] = []
    /// Publishes one announcement (already encoded) on the feed subject.
    var announce: (([UInt8]) -> Void)?
    /// Leadership changed: the carrier listens for wake-ups only while leading.
    var onLeading: ((Bool) -> Void)?

    init(loop: EventLoop, conninfo: String, log: Logger, metrics: CarrierMetrics, settings: SequencerMachine.Settings = .init()) {
        self.loop = loop
        self.log = log
        self.metrics = metrics
        machine = SequencerMachine(settings: settings)
        session = PGConnection(loop: loop, conninfo: conninfo, name: "sequencer", log: log)
    }

    var isLeader: Bool { machine.isLeader }

    func start() {
        session.onReady = { [unowned self] in self.perform(self.machine.sessionReady(now: Clock.monotonic())) }
        session.onLost = { [unowned self] _ in self.perform(self.machine.sessionLost(now: Clock.monotonic())) }
        session.start()
        let tick = machine.settings.pollInterval / 2
        timer = loop.timer(after: tick, repeating: true) { [unowned self] in self.perform(self.machine.tick(now: Clock.monotonic())) }
    }

    /// A commit somewhere asks for a pass.
    func woken() { perform(machine.woken(now: Clock.monotonic())) }

    func stop() {
        timer?.cancel()
        timer = nil
        session.close()
    }

    private func perform(_ actions: [SequencerMachine.Action]) {
        for action in actions {
            switch action {
            case .claim(let generation):
                session.execute([SequencerSQL.claim, SequencerSQL.newest]) { [weak self] result in
                    guard let self else { return }
                    let now = Clock.monotonic()
                    switch result {
                    case .failure:
                        break // the session is lost: onLost tells the machine
                    case .success(let rs) where rs.allSatisfy(\.ok):
                        if rs[0].first?.bool("leader") == true {
                            self.perform(self.machine.claimed(newest: rs[1].first?.int64("newest") ?? 0, generation: generation, now: now))
                        } else {
                            self.perform(self.machine.claimRefused(generation: generation, now: now))
                        }
                    case .success(let rs):
                        self.log.warning("sequencer.claim_failed", [("error", (rs.first { !$0.ok }?.errorMessage ?? "").trimmingNewlines)])
                        self.perform(self.machine.claimFailed(generation: generation, now: now))
                    }
                }
            case .number(let limit, let generation):
                let started = Clock.monotonic()
                session.execute([SequencerSQL.number(limit: limit)]) { [weak self] result in
                    guard let self else { return }
                    let now = Clock.monotonic()
                    switch result {
                    case .failure:
                        break
                    case .success(let rs) where rs[0].ok:
                        var rows: [CarrierMessage.Change] = []
                        rows.reserveCapacity(rs[0].rows.count)
                        for row in rs[0].rows {
                            guard let position = row.int64("position"), let id = row["activity_id"], let seq = row.int64("seq"),
                                  let event = row["event"], let data = row["data"] else { continue }
                            rows.append(.init(position: position, activityID: id, seq: seq, event: event, json: data))
                        }
                        rows.sort { $0.position < $1.position }
                        self.numbered = rows
                        self.metrics.sequencerPasses += 1
                        self.metrics.positionsNumbered += rows.count
                        if !rows.isEmpty, self.log.enabled(.debug) {
                            self.log.debug("sequencer.pass", [("rows", rows.count), ("ms", Int((now - started) * 1000))])
                        }
                        self.perform(self.machine.numbered(count: rows.count, through: rows.last?.position, generation: generation, now: now))
                    case .success(let rs):
                        self.log.warning("sequencer.pass_failed", [("error", (rs[0].errorMessage ?? "").trimmingNewlines)])
                        self.perform(self.machine.passFailed(generation: generation, now: now))
                    }
                }
            case .announce(let after):
                let rows = numbered
                numbered = []
                for message in CarrierMessage.announcements(after: after, rows) { announce?(message) }
            case .leading(let leading):
                metrics.sequencerLeader = leading
                log.info(leading ? "sequencer.leading" : "sequencer.stepped_down")
                onLeading?(leading)
            }
        }
    }
}

/// The sequencer's statements (Migrations/0009_feed_sequencer.sql).
enum SequencerSQL {
    /// The lock that makes one session of the whole deployment the sequencer.
    static let claim = PGQuery("SELECT pg_try_advisory_lock(7345104) AS leader", name: "sequencer_claim")
    /// Read after the claim, in a statement of its own: its snapshot is taken once the lock is
    /// held, so it sees everything an earlier leader numbered.
    static let newest = PGQuery("SELECT coalesce(max(position), 0) AS newest FROM activity_events", name: "sequencer_newest")

    /// One pass: the committed rows without a position, numbered in one transaction. Within a
    /// pass (changes committed within the same few milliseconds) the order is the writers'
    /// time, made non-decreasing per activity so that an activity's changes keep their seq
    /// order whatever the clocks of the servers that wrote them; a cut pass takes whole
    /// prefixes of each activity's waiting rows.
    static func number(limit: Int) -> PGQuery {
        PGQuery("""
            WITH waiting AS (
              SELECT activity_id, seq, max(created_ms) OVER (PARTITION BY activity_id ORDER BY seq) AS t
              FROM activity_events WHERE position IS NULL
              ORDER BY activity_id, seq
              LIMIT $1::int
            ), numbered AS (
              SELECT o.activity_id, o.seq, nextval('feed_positions') AS position
              FROM (SELECT activity_id, seq FROM waiting ORDER BY t, activity_id, seq) o
            )
            UPDATE activity_events e SET position = n.position
            FROM numbered n
            WHERE e.activity_id = n.activity_id AND e.seq = n.seq
            RETURNING e.position, e.activity_id, e.seq, e.event, e.data
            """, [String(limit)], name: "sequencer_number")
    }
}
