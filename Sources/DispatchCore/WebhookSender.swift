/// One claimed row of the webhook outbox: what to send, and how to mark it afterwards.
public struct WebhookDelivery: Equatable, Sendable {
    public let rowID: Int64
    /// Sent as `Dispatch-Delivery` on every attempt, so receivers can de-duplicate.
    public let deliveryID: String
    public let activityID: String
    public let url: String
    public let body: String
    /// This attempt's number (counted when claimed). Also the claim's fence: a mark applies
    /// only while the row's attempt count is still this one (nobody claimed it again since).
    public let attempt: Int
    /// Seconds from the claim until the outbox gives up on the row (24 h after it was queued).
    public let secondsLeft: Double
    /// The key that owns the activity (0: unknown, e.g. pruned): fairness is between keys.
    public let key: Int64
    /// The URL's host and port, lower-cased: fairness is between destinations too.
    public let host: String

    public init(rowID: Int64, deliveryID: String, activityID: String, url: String, body: String, attempt: Int, secondsLeft: Double,
                key: Int64 = 0, host: String = "") {
        self.rowID = rowID
        self.deliveryID = deliveryID
        self.activityID = activityID
        self.url = url
        self.body = body
        self.attempt = attempt
        self.secondsLeft = secondsLeft
        self.key = key
        self.host = host
    }
}

/// How one attempt ended, as the sender needs to know it.
public enum WebhookAnswer: Equatable, Sendable {
    /// The receiver answered with this HTTP status (its body is not read beyond 4 KiB).
    case status(Int)
    /// No answer: could not connect, timed out, the connection dropped, TLS failed. Retried.
    case transient(String)
    /// The URL resolved to a loopback, private or link-local address: refused, never sent.
    case refused(String)
    /// The URL cannot be requested at all (never sent).
    case invalid(String)
}

/// The webhook outbox's sender as a pure state machine (the `Hub` shape): each input returns
/// the actions the shell performs (claim rows, send, mark), and the shell answers with the
/// next input. At least once: a row is marked only after its attempt ended, and a row whose
/// claim was lost (a crash) comes due again when its claim expires. Any 2xx is delivered;
/// anything else is retried with `policy` (backoff with jitter) until the row's 24 hours are
/// up, then failed; a refused address fails at once.
///
/// Fair under abuse (issue 24): at most `perKey` deliveries in flight per owning key and
/// `perHost` per destination, so a key whose receivers accept and never answer (a tarpit)
/// holds a few slots, never all of them. The claim skips keys and hosts at their cap
/// (`busyKeys`, `busyHosts`) and takes rows round-robin between keys; rows a claim brings
/// past a cap anyway are given back at once.
public struct WebhookSender {
    public enum FailReason: String, Equatable, Sendable {
        /// Retried for as long as the outbox keeps a row.
        case gaveUp = "failed"
        /// The SSRF check refused the resolved address.
        case refused
        /// The URL cannot be requested.
        case invalid = "invalid"
    }

    public enum Action: Equatable, Sendable {
        /// Claim up to `limit` due rows (answer `claimed` or `claimFailed`).
        case claim(limit: Int)
        /// Sign now and POST (answer `answered`).
        case send(WebhookDelivery)
        case markDelivered(WebhookDelivery, status: String)
        /// Due again in `after` seconds (answer `marked`).
        case markRetry(WebhookDelivery, after: Double, status: String)
        /// Never tried again (answer `marked`).
        case markFailed(WebhookDelivery, status: String, reason: FailReason)
        /// Claims given back unsent or unanswered (the sender stops): due again at once.
        case release([WebhookDelivery])
    }

    public let policy: Backoff
    public let maxInFlight: Int
    public let perKey: Int
    public let perHost: Int
    private var claiming = false
    private var claimLimit = 0
    private var stopped = false
    /// Sent and waiting for an answer, with when the outbox gives up on each (monotonic seconds).
    private var sending: [Int64: (delivery: WebhookDelivery, giveUpAt: Double)] = [:]
    /// Answered and being marked.
    private var marking: Set<Int64> = []
    /// The last claim was full: more rows are probably due.
    private var moreDue = false

    public init(policy: Backoff = Backoff(initial: 2, maximum: 3600, jitter: .equal), maxInFlight: Int = 64, perKey: Int = 8, perHost: Int = 4) {
        self.policy = policy
        self.maxInFlight = maxInFlight
        self.perKey = max(1, perKey)
        self.perHost = max(1, perHost)
    }

    public var inFlight: Int { sending.count + marking.count }
    public var isClaiming: Bool { claiming }

    /// Deliveries waiting for an answer, per owning key (what the next claim must respect).
    public var busyKeys: [Int64: Int] {
        var out: [Int64: Int] = [:]
        for entry in sending.values { out[entry.delivery.key, default: 0] += 1 }
        return out
    }

    /// Deliveries waiting for an answer, per destination.
    public var busyHosts: [String: Int] {
        var out: [String: Int] = [:]
        for entry in sending.values { out[entry.delivery.host, default: 0] += 1 }
        return out
    }

    /// The poll timer, or a hint that a row may have been queued: claim if there is room.
    public mutating func tick() -> [Action] {
        guard !stopped, !claiming else { return [] }
        let room = maxInFlight - inFlight
        guard room > 0 else { return [] }
        claiming = true
        claimLimit = room
        return [.claim(limit: room)]
    }

    /// The claim's rows (answering `.claim`); `now` in monotonic seconds.
    public mutating func claimed(_ rows: [WebhookDelivery], now: Double) -> [Action] {
        claiming = false
        if stopped { return rows.isEmpty ? [] : [.release(rows)] }
        moreDue = rows.count >= claimLimit
        var actions: [Action] = []
        var keys = busyKeys, hosts = busyHosts
        var overCap: [WebhookDelivery] = []
        for d in WebhookSender.roundRobin(rows) where sending[d.rowID] == nil && !marking.contains(d.rowID) {
            guard keys[d.key, default: 0] < perKey, hosts[d.host, default: 0] < perHost else {
                overCap.append(d)
                continue
            }
            keys[d.key, default: 0] += 1
            hosts[d.host, default: 0] += 1
            sending[d.rowID] = (d, now + d.secondsLeft)
            actions.append(.send(d))
        }
        if !overCap.isEmpty { actions.append(.release(overCap)) }
        return actions
    }

    /// Rows interleaved between keys (each key's own in their order): the first of every key,
    /// then the second of every key, and so on; keys in the order they first appear.
    public static func roundRobin(_ rows: [WebhookDelivery]) -> [WebhookDelivery] {
        var order: [Int64] = []
        var byKey: [Int64: [WebhookDelivery]] = [:]
        for d in rows {
            if byKey[d.key] == nil { order.append(d.key) }
            byKey[d.key, default: []].append(d)
        }
        var out: [WebhookDelivery] = []
        out.reserveCapacity(rows.count)
        var round = 0
        while out.count < rows.count {
            for key in order where round < byKey[key]!.count { out.append(byKey[key]![round]) }
            round += 1
        }
        return out
    }

    public mutating func claimFailed() -> [Action] {
        claiming = false
        return []
    }

    /// The attempt for `rowID` ended. `random` in [0, 1) is the jitter.
    public mutating func answered(_ rowID: Int64, _ answer: WebhookAnswer, now: Double, random: Double) -> [Action] {
        guard let (d, giveUpAt) = sending.removeValue(forKey: rowID) else { return [] }
        marking.insert(rowID)
        return [WebhookSender.decide(d, answer, now: now, giveUpAt: giveUpAt, policy: policy, random: random)]
    }

    /// A mark (or its failure) came back; the row is out of our hands.
    public mutating func marked(_ rowID: Int64) -> [Action] {
        marking.remove(rowID)
        // Rows are waiting and half the room is free again: claim now rather than at the next tick.
        if moreDue && inFlight <= maxInFlight / 2 { return tick() }
        return []
    }

    /// No more claims; rows sent and not answered are given back (their answers are ignored).
    public mutating func stop() -> [Action] {
        stopped = true
        let unanswered = sending.values.map(\.delivery).sorted { $0.rowID < $1.rowID }
        sending.removeAll()
        return unanswered.isEmpty ? [] : [.release(unanswered)]
    }

    /// A mark's status as logs may carry it: its class (`HTTP 503`, `timeout`, `connect`), never
    /// the detail after it, which names hosts and addresses (docs/webhooks.md: URLs are not
    /// logged; `dispatchd webhooks status` shows the whole status to an operator).
    public static func loggable(_ status: String) -> String {
        let bytes = Array(status.utf8)
        for i in bytes.indices.dropLast() where bytes[i] == UInt8(ascii: ":") && bytes[i + 1] == UInt8(ascii: " ") {
            return String(decoding: bytes[..<i], as: UTF8.self)
        }
        return status
    }

    /// What one attempt's answer means for its row.
    public static func decide(_ d: WebhookDelivery, _ answer: WebhookAnswer, now: Double, giveUpAt: Double,
                              policy: Backoff, random: Double) -> Action {
        let status: String
        switch answer {
        case .status(let code) where (200...299).contains(code):
            return .markDelivered(d, status: "HTTP \(code)")
        case .status(let code):
            status = "HTTP \(code)"
        case .transient(let why):
            status = why
        case .refused(let why):
            return .markFailed(d, status: "refused: " + why, reason: .refused)
        case .invalid(let why):
            return .markFailed(d, status: "invalid: " + why, reason: .invalid)
        }
        let left = giveUpAt - now
        guard left > 0 else { return .markFailed(d, status: status, reason: .gaveUp) }
        // The last retry lands on the deadline rather than past it.
        return .markRetry(d, after: min(policy.delay(afterAttempt: d.attempt, random: random), left), status: status)
    }
}
