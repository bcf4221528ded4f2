import DispatchCore
import DispatchIO
import DispatchSystem
import Glibc

/// The carrier of one server: PostgreSQL's LISTEN/NOTIFY. A commit's own statement NOTIFYs
/// the change (its feed position, taken under the position lock, and its snapshot unless too
/// large) in the commit's transaction, so every worker's LISTEN session hears the changes in
/// commit order, which is feed position order. Nothing is announced after the commit.
///
/// A LISTEN session can stay connected and stop delivering (a stuck backend keeps its socket
/// open): a probe NOTIFYed through another session must come back on it, else the session is
/// reconnected, and what it missed is re-read when it listens again.
final class NotifyCarrier: Carrier {
    let loop: LoopScheduling
    let db: Database
    /// The worker's LISTEN session (it also carries key revocations, the worker's own).
    let listener: PGConnection
    let changes: HeardChanges
    let metrics: Metrics
    let log: Logger
    /// This process's probes carry its pid: the probe channel is shared by every worker.
    let pid: Int32
    private var probe = CarrierProbe()
    private var timer: Timer?

    init(loop: LoopScheduling, db: Database, listener: PGConnection, changes: HeardChanges, metrics: Metrics, log: Logger,
         pid: Int32 = getpid()) {
        self.loop = loop
        self.db = db
        self.listener = listener
        self.changes = changes
        self.metrics = metrics
        self.log = log
        self.pid = pid
    }

    var numbering: FeedNumbering { .atCommit }
    var channels: [String] { [Channel.events, Channel.probe] }
    var isHealthy: Bool { !probe.isStalled }

    func start() throws(SystemError) {
        timer = loop.timer(after: probe.settings.interval / 2, repeating: true) { [unowned self] in
            self.perform(self.probe.tick(now: self.loop.now))
        }
    }

    func close() {
        timer?.cancel()
        timer = nil
    }

    /// The commit NOTIFYed the change already; only this worker's own streams are told now.
    func committed(_ event: ActivityEvent, json: [UInt8]) {
        changes.committedHere(event, json: json)
    }

    func notified(channel: String, payload: String) {
        if channel == Channel.probe {
            let parts = payload.split(separator: ":")
            // Another worker's probe, or not a probe at all: not this one's business.
            guard parts.count == 2, Int32(parts[0]) == pid, let n = UInt64(parts[1]) else { return }
            return perform(probe.heard(n, now: loop.now))
        }
        guard channel == Channel.events else { return }
        guard let notice = ChangeNotice(payload: payload) else {
            return log.warning("notify.malformed", [("payload_bytes", payload.utf8.count)])
        }
        changes.notified(notice)
    }

    func listening(restored: Bool) {
        // NOTIFYs sent while the session was down are lost: streams catch up from history,
        // and feeds (which follow NOTIFY order) re-read what the lost session missed.
        if restored { changes.resync() }
        perform(probe.connected(now: loop.now))
    }

    func listenLost() { probe.disconnected() }

    private func perform(_ actions: [CarrierProbe.Action]) {
        for action in actions {
            switch action {
            case .send(let n):
                guard db.reader.isReady else { continue }
                db.read(PGQuery("SELECT pg_notify('\(Channel.probe)', $1)", ["\(pid):\(n)"], name: "carrier_probe")) { _ in }
            case .stalled:
                metrics.carrierStalled = true
                metrics.carrierStalls += 1
                log.warning("carrier.stalled", [("carrier", "listen"),
                                                ("effect", "the LISTEN session is reconnected, then streams and feeds re-read what it missed")])
                // Reconnecting re-LISTENs, and its ready handler re-reads what was missed.
                listener.reset("its notifications stopped arriving")
            case .recovered:
                metrics.carrierStalled = false
                log.info("carrier.recovered", [("carrier", "listen")])
            }
        }
    }
}
