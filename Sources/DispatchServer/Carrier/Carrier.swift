import DispatchCore
import DispatchIO
import DispatchSystem

/// How committed changes travel between the processes of one deployment (contract §10): what
/// a worker announces after its commit and what it hears of the others'. Two implementations,
/// chosen once when the worker starts: `NotifyCarrier` (PostgreSQL's LISTEN/NOTIFY, one
/// server) and `NATSCarrier` (NATS hints and the sequencer, several servers). The worker talks
/// to this protocol only; what a heard change reaches is `HeardChanges`, shared by both.
protocol Carrier: AnyObject {
    /// When a change gets its feed position, which decides the publish path's statements.
    var numbering: FeedNumbering { get }
    /// The channels this worker's LISTEN session listens to for the carrier (the worker's own,
    /// key revocations, come on top).
    var channels: [String] { get }
    /// What `/readyz` says of it: false when it is connected but does not deliver.
    var isHealthy: Bool { get }
    func start() throws(SystemError)
    func close()
    /// This worker committed `event` (its JSON `json`): delivered here, announced elsewhere.
    func committed(_ event: ActivityEvent, json: [UInt8])
    /// A notification on one of `channels`.
    func notified(channel: String, payload: String)
    /// The LISTEN session listens; `restored`: again, after it was lost (what it carried
    /// meanwhile is lost).
    func listening(restored: Bool)
    /// The LISTEN session was lost.
    func listenLost()
}

/// When a committed change gets its place in the feed.
enum FeedNumbering: Equatable {
    /// In the commit's own transaction, under the position lock (LISTEN/NOTIFY: NOTIFY order
    /// is commit order is position order).
    case atCommit
    /// After the commit, by the sequencer's numbering passes (NATS: no lock between writers).
    case bySequencer
}

/// What the carrier is asked by the status streams of this worker: which activities they
/// follow (NATS listens to those activities' subjects only).
protocol StreamInterest: AnyObject {
    /// A stream subscribed to `activityID`: once per stream.
    func watch(_ activityID: String)
    /// A stream that watched `activityID` ended: once per `watch`.
    func unwatch(_ activityID: String)
}

/// What the carrier is asked by the feeds of this worker.
protocol FeedInterest: AnyObject {
    /// The first feed opened here.
    func feedOpened()
    /// The last feed here ended.
    func feedsClosed()
    /// Calls `done` once the changes committed before now have their feed positions (or after
    /// a bound): a feed's first read waits for it, so that what was acknowledged before the
    /// feed opened is in its initial set.
    func awaitNumbering(_ done: @escaping () -> Void)
}

/// What the worker hears from its carrier beyond the changes themselves.
protocol CarrierDelegate: AnyObject {
    /// A change elsewhere requested a cancel: the webhook sender reads its outbox.
    func carrierHeardCancelRequest()
}

/// The fan-out of a change committed elsewhere, the same for both carriers: the publisher's
/// cache, the status streams, the feeds, and (a cancel request) the webhook sender.
final class HeardChanges {
    let publisher: Publisher
    let streams: StreamService
    let feeds: FeedService
    weak var delegate: CarrierDelegate?

    init(publisher: Publisher, streams: StreamService, feeds: FeedService) {
        self.publisher = publisher
        self.streams = streams
        self.feeds = feeds
    }

    /// This worker committed `event`: its own streams have it at once.
    func committedHere(_ event: ActivityEvent, json: [UInt8]) {
        streams.committed(activityID: event.snapshot.activityId, seq: event.seq, name: event.name.rawValue, json: String(decoding: json, as: UTF8.self))
    }

    /// A change itself (NOTIFY): its position, and its snapshot unless it was too large.
    func notified(_ notice: ChangeNotice) {
        if notice.event == EventName.cancelRequested.rawValue { delegate?.carrierHeardCancelRequest() }
        publisher.heard(notice)
        streams.notified(notice)
        feeds.notified(notice)
    }

    /// A hint (NATS) that `activityID` changed, its newest seq at least `seq`: a hint is not a
    /// snapshot, so what the publisher cached older than it is dropped and read again when needed.
    func hinted(_ activityID: String, seq: Int64, event: String) {
        if event == EventName.cancelRequested.rawValue { delegate?.carrierHeardCancelRequest() }
        if seq == 1 || publisher.isStale(activityID, seq: seq) { publisher.forget(activityID) }
        streams.hinted(activityID, seq: seq)
    }

    /// A hint (NATS) that an activity of this id was started: whatever was held of an older
    /// one of the same id (pruned since) is forgotten.
    func started(_ activityID: String) {
        streams.forgetFinished(activityID)
        publisher.forget(activityID)
    }

    /// A hint (NATS) that feed positions up to `through` exist.
    func positionsExist(through: Int64) { feeds.hinted(position: through) }

    /// What the carrier carried for a while is lost (its session or connection came back, it
    /// dropped messages, it stalled): every stream and feed re-reads from where it is.
    func resync() {
        streams.listenRestored()
        feeds.listenRestored()
    }
}
