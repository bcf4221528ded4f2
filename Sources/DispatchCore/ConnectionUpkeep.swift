/// When an HTTP client's idle connections get an HTTP/2 PING, and when they are replaced: a
/// pure decision over injected time, driven by a timer in the shell (`CurlClient`).
///
/// A connection nobody uses can die without a FIN (a NAT or a load balancer forgot the flow,
/// the host went away); the next request would wait on it until its deadline. So while no
/// request is in flight: after `pingInterval` seconds of quiet (and every `pingInterval`
/// after that) every connection is PINGed; one that received no byte `answerTimeout` seconds
/// later is given up and all connections are replaced before a request needs them (libcurl
/// sends the PING but never checks its ACK: an idle connection's bytes are read only when it
/// is next used). Independently, connections idle `maxIdle` seconds are replaced (the safety
/// net, and the only check when PING is not available).
public struct ConnectionUpkeep: Sendable, Equatable {
    public enum Action: Equatable, Sendable {
        case none
        /// Send a PING on every connection now.
        case ping
        /// Close every connection; the next request opens a new one.
        case replace(Reason)
    }

    public enum Reason: String, Sendable {
        /// A connection received nothing within `answerTimeout` of a PING.
        case unansweredPing = "unanswered_ping"
        /// Every connection sat idle `maxIdle` seconds.
        case idle
    }

    /// Seconds of quiet before a PING, and between PINGs; 0: never PING.
    public let pingInterval: Double
    /// Seconds a PING's connection has to send something back.
    public let answerTimeout: Double
    /// Seconds of quiet after which connections are replaced; 0: never.
    public let maxIdle: Double

    /// Since when no request has been in flight; nil while one is.
    public private(set) var idleSince: Double?
    public private(set) var lastPing: Double?
    /// The PING waiting for an answer: when it was sent, and the bytes each connection had
    /// waiting to be read just before (an idle connection's bytes stay unread, so an answer
    /// shows as more of them).
    public private(set) var awaiting: (sentAt: Double, before: [Int32: Int])?

    public init(pingInterval: Double, answerTimeout: Double, maxIdle: Double, now: Double) {
        self.pingInterval = pingInterval
        self.answerTimeout = answerTimeout
        self.maxIdle = maxIdle
        idleSince = now
    }

    /// How often the shell should call `tick`: a fraction of the shortest period, at most 1 s.
    public var tickInterval: Double {
        let periods = [pingInterval, answerTimeout, maxIdle].filter { $0 > 0 }
        return max(0.05, min(1, (periods.min() ?? 4) / 4))
    }

    /// A request is in flight: its connection's input is read by the client again, so a PING
    /// waiting for an answer is forgotten (a dead peer is then the request's deadline's to find).
    public mutating func busy() {
        idleSince = nil
        awaiting = nil
    }

    /// No request in flight any more.
    public mutating func idle(now: Double) {
        if idleSince == nil { idleSince = now }
    }

    /// The shell replaced every connection (for any reason): nothing to wait for.
    public mutating func replaced(now: Double) {
        awaiting = nil
        lastPing = nil
        if idleSince != nil { idleSince = now }
    }

    /// What to do now. `pending`: each open connection's socket and the bytes waiting to be
    /// read on it (empty: no connection open).
    public mutating func tick(now: Double, pending: [Int32: Int]) -> Action {
        guard let idleSince else { return .none }
        guard !pending.isEmpty else {
            awaiting = nil
            return .none
        }
        if let a = awaiting {
            // Connections closed since the PING are not waited for; new ones cannot appear
            // while idle.
            let silent = a.before.filter { fd, before in pending[fd].map { $0 <= before } ?? false }
            if silent.isEmpty {
                awaiting = nil
            } else if now - a.sentAt >= answerTimeout {
                replaced(now: now)
                return .replace(.unansweredPing)
            } else {
                return .none
            }
        }
        if maxIdle > 0 && now - idleSince >= maxIdle {
            replaced(now: now)
            return .replace(.idle)
        }
        if pingInterval > 0 && now - max(idleSince, lastPing ?? idleSince) >= pingInterval {
            lastPing = now
            awaiting = (now, pending)
            return .ping
        }
        return .none
    }

    public static func == (a: ConnectionUpkeep, b: ConnectionUpkeep) -> Bool {
        a.pingInterval == b.pingInterval && a.answerTimeout == b.answerTimeout && a.maxIdle == b.maxIdle
            && a.idleSince == b.idleSince && a.lastPing == b.lastPing
            && a.awaiting?.sentAt == b.awaiting?.sentAt && a.awaiting?.before == b.awaiting?.before
    }
}
