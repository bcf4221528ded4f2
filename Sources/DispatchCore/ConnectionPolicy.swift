/// Which client connections to cut, decided from what each has done: the whole-request
/// deadline (headers and body, however slowly they trickle in) and a per-address cap on
/// connections that have not completed a request yet (slowloris, descriptor exhaustion).
/// A connection the server holds (a request being answered, a stream) is never cut here:
/// streams have their own write deadlines and heartbeats.
public struct ConnectionPolicy: Equatable, Sendable {
    /// Seconds a connection may take to deliver a complete request, counted from its accept
    /// or from its previous request.
    public var requestDeadline: Double
    /// Connections per client address that may wait for their first complete request.
    public var maxPendingPerClient: Int
    /// A connection younger than this is not counted against the cap (a connect burst).
    public var pendingGrace: Double

    public init(requestDeadline: Double = 30, maxPendingPerClient: Int = 32, pendingGrace: Double = 2) {
        self.requestDeadline = requestDeadline
        self.maxPendingPerClient = maxPendingPerClient
        self.pendingGrace = pendingGrace
    }

    public struct Connection: Equatable, Sendable {
        public var id: Int
        /// The client's address, when known.
        public var peer: String?
        /// When it was accepted, or when it was last answered (monotonic seconds).
        public var since: Double
        public var requestsCompleted: Int
        /// The server holds it: a request being answered, or a stream.
        public var held: Bool

        public init(id: Int, peer: String?, since: Double, requestsCompleted: Int, held: Bool) {
            self.id = id
            self.peer = peer
            self.since = since
            self.requestsCompleted = requestsCompleted
            self.held = held
        }
    }

    /// The ids to cut now.
    public func connectionsToCut(_ connections: [Connection], now: Double) -> [Int] {
        var cut: [Int] = []
        var pendingByPeer: [String: [Connection]] = [:]
        for c in connections where !c.held {
            if now - c.since > requestDeadline {
                cut.append(c.id)
            } else if c.requestsCompleted == 0, now - c.since >= pendingGrace, let peer = c.peer {
                pendingByPeer[peer, default: []].append(c)
            }
        }
        for (_, pending) in pendingByPeer where pending.count > maxPendingPerClient {
            // Keep the oldest: they were here first; the newest are the flood.
            let newestFirst = pending.sorted { ($0.since, $0.id) > ($1.since, $1.id) }
            cut.append(contentsOf: newestFirst.prefix(pending.count - maxPendingPerClient).map(\.id))
        }
        return cut.sorted()
    }
}
