/// When one HTTP/2 connection gets a PING, and when it is given up: a pure decision over
/// injected time, driven by the client's timer (`H2Client`).
///
/// A connection nobody uses can die without a FIN (a NAT or a load balancer forgot the flow,
/// the host went away); the next request would wait on it until its deadline. So a connection
/// with no stream open gets a PING after `pingInterval` seconds of quiet, and every
/// `pingInterval` after that; one that sends no PING ACK within `answerTimeout` is closed, so
/// the next request opens a new one instead of waiting on it. A connection that answers stays
/// open however long it idles. A request that timed out makes its connection suspect at once
/// (the stream timed out, maybe the connection under it died): it gets a PING then, busy or
/// not, and is closed if that goes unanswered.
public struct ConnectionUpkeep: Sendable, Equatable {
    public enum Action: Equatable, Sendable {
        case none
        /// Send a PING now.
        case ping
        /// Close the connection: its PING went unanswered.
        case close(Reason)
    }

    /// Why a connection was closed, as counted by `dispatch_apns_connections_replaced_total`.
    public enum Reason: String, Sendable, CaseIterable {
        /// The PING sent after `pingInterval` of quiet got no ACK.
        case unansweredPing = "unanswered_ping"
        /// The PING sent after a request timed out on it got no ACK.
        case timeout
    }

    /// Seconds of quiet before a PING, and between PINGs; 0: never PING an idle connection.
    public let pingInterval: Double
    /// Seconds a PING has to be acknowledged.
    public let answerTimeout: Double

    /// Since when no stream has been open; nil while one is.
    public private(set) var idleSince: Double?
    /// When the last PING was sent (acknowledged or not).
    public private(set) var lastPing: Double?
    /// The PING waiting for its ACK: when it was sent, and why.
    public private(set) var awaiting: (sentAt: Double, reason: Reason)?

    public init(pingInterval: Double, answerTimeout: Double, now: Double) {
        self.pingInterval = pingInterval
        self.answerTimeout = answerTimeout
        idleSince = now
    }

    /// How often the shell should call `tick`: a fraction of the shortest period, at most 1 s.
    public var tickInterval: Double {
        let periods = [pingInterval, answerTimeout].filter { $0 > 0 }
        return max(0.05, min(1, (periods.min() ?? 4) / 4))
    }

    /// A stream opened.
    public mutating func busy() {
        idleSince = nil
    }

    /// No stream open any more.
    public mutating func idle(now: Double) {
        if idleSince == nil { idleSince = now }
    }

    /// The PING's ACK arrived.
    public mutating func acknowledged() {
        awaiting = nil
    }

    /// A request on this connection timed out: PING it now, unless a PING is already out.
    public mutating func requestTimedOut(now: Double) -> Action {
        guard awaiting == nil else { return .none }
        lastPing = now
        awaiting = (now, .timeout)
        return .ping
    }

    /// What to do now.
    public mutating func tick(now: Double) -> Action {
        if let a = awaiting {
            return now - a.sentAt >= answerTimeout ? .close(a.reason) : .none
        }
        guard pingInterval > 0, let idleSince else { return .none }
        if now - max(idleSince, lastPing ?? idleSince) >= pingInterval {
            lastPing = now
            awaiting = (now, .unansweredPing)
            return .ping
        }
        return .none
    }

    public static func == (a: ConnectionUpkeep, b: ConnectionUpkeep) -> Bool {
        a.pingInterval == b.pingInterval && a.answerTimeout == b.answerTimeout && a.idleSince == b.idleSince
            && a.lastPing == b.lastPing && a.awaiting?.sentAt == b.awaiting?.sentAt && a.awaiting?.reason == b.awaiting?.reason
    }
}
