/// One stream's outgoing bytes that the socket has not taken yet, and every decision about
/// them, with no socket in it. The shell reports how many bytes its connection still holds
/// (`socketBacklog`, libevent's output buffer) and performs what comes back.
///
/// Payloads are shared (one framing per event for every subscriber): the queue holds
/// references and counts their sizes. Live events count against `maxBacklog`: a reader that
/// stopped reading is cut off (it resumes with `Last-Event-ID`). A replay is paced instead: its
/// next page is asked for only once the queue has drained below `lowWater`, so a stalled
/// replay holds at most about one page.
public struct StreamOutbox<Payload> {
    public let maxBacklog: Int
    public let lowWater: Int
    /// How many bytes a replay page may bring (its first event always comes).
    public let pageBudget: Int

    public enum Offer {
        /// Nothing is waiting: write it straight to the socket.
        case writeNow(Payload)
        /// Queued behind earlier payloads; `pump` writes it when the socket drains.
        case queued
        /// Over the cap: disconnect as a slow client.
        case overCap
    }

    private var queue: [(payload: Payload, size: Int)] = []
    private var head = 0
    public private(set) var queuedBytes = 0
    /// The final event is queued: end the response once everything is written.
    public private(set) var endWhenDrained = false

    public init(maxBacklog: Int, lowWater: Int, pageBudget: Int) {
        precondition(lowWater <= maxBacklog && pageBudget > 0)
        self.maxBacklog = maxBacklog
        self.lowWater = lowWater
        self.pageBudget = pageBudget
    }

    public var isEmpty: Bool { head == queue.count }
    public var count: Int { queue.count - head }

    /// A live event or a heartbeat: straight out when nothing waits and the socket keeps up.
    public mutating func offer(_ payload: Payload, size: Int, socketBacklog: Int, live: Bool) -> Offer {
        if isEmpty && socketBacklog < lowWater { return .writeNow(payload) }
        if live && socketBacklog + queuedBytes + size > maxBacklog { return .overCap }
        append(payload, size: size)
        return .queued
    }

    /// A replay page: always queued (it was asked for when the queue was low).
    public mutating func enqueue(_ payloads: [(Payload, Int)]) {
        for (p, size) in payloads { append(p, size: size) }
    }

    /// The next payload to write while the socket holds less than `lowWater`; nil when the
    /// socket should drain first or nothing waits.
    public mutating func next(socketBacklog: Int) -> Payload? {
        guard !isEmpty, socketBacklog < lowWater else { return nil }
        let item = queue[head]
        head += 1
        queuedBytes -= item.size
        if isEmpty {
            queue.removeAll(keepingCapacity: false)
            head = 0
        }
        return item.payload
    }

    /// Whether a replaying stream may ask for its next page now.
    public func wantsMore(socketBacklog: Int) -> Bool {
        !endWhenDrained && socketBacklog + queuedBytes < lowWater
    }

    /// The stream is over once what is queued is written; returns whether that is now.
    public mutating func finishWhenDrained() -> Bool {
        endWhenDrained = true
        return isEmpty
    }

    /// Whether the stream ended and everything is written: close it.
    public var isFinished: Bool { endWhenDrained && isEmpty }

    private mutating func append(_ payload: Payload, size: Int) {
        queue.append((payload, size))
        queuedBytes += size
    }
}
