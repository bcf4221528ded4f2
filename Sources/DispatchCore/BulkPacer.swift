/// Paces bulk sends (feeds' initial sets and replays) on a loop that also serves requests:
/// at most `bytesPerTurn` per turn, and after each `minimumRest` seconds of sending a rest
/// `restPerBusy` times as long, during which nothing bulk is sent or read. The rest leaves the
/// CPU, not just the loop, to point reads, commits and live changes on a machine whose cores
/// the bulk would otherwise fill; `minimumRest` keeps each rest longer than a timer's grain,
/// and `maximumRest` bounds how long a live change to a loading feed may wait behind one (a
/// turn's wall time includes any time the process waited for a CPU).
public struct BulkPacer: Sendable {
    public let bytesPerTurn: Int
    public let restPerBusy: Double
    public let minimumRest: Double
    public let maximumRest: Double
    /// Seconds of sending not yet rested for.
    public private(set) var busyUnrested = 0.0
    /// When the rest under way ends (monotonic seconds).
    public private(set) var restUntil = -Double.infinity

    /// A third of the time at most for feeds' bulk: measured in bench/README (feed), where two
    /// thirds left point reads within about 3x of their idle p99 while 200 feeds loaded.
    public static let feeds = BulkPacer(bytesPerTurn: 64 * 1024, restPerBusy: 2, minimumRest: 0.002, maximumRest: 0.05)

    public init(bytesPerTurn: Int, restPerBusy: Double, minimumRest: Double, maximumRest: Double = 0.05) {
        self.bytesPerTurn = max(1, bytesPerTurn)
        self.restPerBusy = max(0, restPerBusy)
        self.minimumRest = max(0, minimumRest)
        self.maximumRest = max(self.minimumRest, maximumRest)
    }

    public func isResting(now: Double) -> Bool { now < restUntil }

    /// A turn sent for `busy` seconds, ending `now`; past `minimumRest` of such time, a rest
    /// begins now.
    public mutating func sent(busy: Double, now: Double) {
        busyUnrested += max(0, busy)
        guard busyUnrested >= minimumRest, restPerBusy > 0 else { return }
        restUntil = now + min(busyUnrested * restPerBusy, maximumRest)
        busyUnrested = 0
    }
}
