/// An event the hub can order: its per-activity seq and whether it ends the activity.
public protocol HubEvent {
    var seq: Int64 { get }
    var isTerminal: Bool { get }
}

/// Fan-out bookkeeping for one server process, as a pure state machine.
///
/// Topics are activities with at least one subscriber here. A topic is *synced* when it
/// holds the newest committed event and has seen every later one; only then can a new
/// subscriber be answered from memory. Every input returns the actions the IO shell
/// performs. Ids on every subscriber's stream are consecutive: events are delivered only
/// in seq order, duplicates are dropped, and a gap triggers a read of stored history.
///
/// A topic's reads carry its `generation`, and their answers bring it back: a read issued
/// for a topic that is gone never answers a newer topic for the same activity (it predates
/// events that topic never heard, and its failure is not that topic's failure).
public struct Hub<Subscriber: Hashable, Event: HubEvent> {
    public enum Action {
        /// Read the activity's current snapshot (nil result: unknown activity); answer with
        /// `snapshotLoaded` or `readFailed(topic:generation:)`, passing `generation` back.
        case readSnapshot(topic: String, generation: UInt64)
        /// Read stored history after `after` for the whole topic (gap or lost LISTEN session);
        /// answer with `topicHistoryLoaded` or `readFailed(topic:generation:)`, passing `generation` back.
        case readTopicHistory(topic: String, generation: UInt64, after: Int64)
        /// Read stored history after `after` for one subscriber's replay (`Last-Event-ID`).
        case readHistory(subscriber: Subscriber, topic: String, after: Int64)
        /// Write these events, in order, to the subscriber.
        case send(Subscriber, [Event])
        /// The stream is over: its terminal event was sent, or there is nothing more.
        case finish(Subscriber)
        /// Answer `204 No Content`: the client already has the final event.
        case noContent(Subscriber)
        /// Answer the `not_found` event (id 0) and end; a subscriber that came with
        /// Last-Event-ID gets `noContent` instead.
        case notFound(Subscriber)
        /// Disconnect; the client resumes with `Last-Event-ID`.
        case drop(Subscriber, DropReason)
    }

    enum TopicPhase: Equatable {
        case loading
        case synced
        case resyncing
    }

    struct Topic {
        /// Unique per topic created: tells this topic's read answers from an earlier topic's.
        let generation: UInt64
        var subscribers: Set<Subscriber> = []
        var phase: TopicPhase = .loading
        var latest: Event?
        /// Events received while loading or resyncing, applied in seq order afterwards.
        var pending: [Event] = []
        var needsResyncAfterLoad = false
        /// The newest seq a carrier hint named while the topic was loading or re-reading: if
        /// what was read ends below it, read again (once: a hint is never taken as the truth).
        var hintedSeq: Int64 = 0
    }

    enum SubscriberPhase {
        case waitingForTopic
        case catchingUp(buffer: [Event])
        case live
    }

    struct SubscriberState {
        let topic: String
        var lastSent: Int64?
        var phase: SubscriberPhase
        /// A `Last-Event-ID` above the topic's newest seq, being checked against stored history.
        var claimedAhead: Int64? = nil
    }

    public let maxPendingEvents: Int
    var topics: [String: Topic] = [:]
    var subscribers: [Subscriber: SubscriberState] = [:]
    var lastGeneration: UInt64 = 0

    public init(maxPendingEvents: Int = 1024) {
        self.maxPendingEvents = maxPendingEvents
    }

    public var subscriberCount: Int { subscribers.count }
    public var topicCount: Int { topics.count }
    public func isSubscribed(_ s: Subscriber) -> Bool { subscribers[s] != nil }
    public func lastSent(_ s: Subscriber) -> Int64? { subscribers[s]?.lastSent }
    public func subscribers(of topic: String) -> Set<Subscriber> { topics[topic]?.subscribers ?? [] }

    /// Whether the subscriber is receiving live events (its first answer is decided).
    public func isLive(_ s: Subscriber) -> Bool {
        if case .live? = subscribers[s]?.phase { return true }
        return false
    }
    /// Whether a read issued with `generation` still belongs to a live topic (worth retrying).
    public func isCurrent(topic: String, generation: UInt64) -> Bool { topics[topic]?.generation == generation }

    /// Whether an event would change anything here: lets the shell skip framing events
    /// nobody on this process is waiting for (most NOTIFYs on a busy server).
    public func wants(topic name: String, seq: Int64) -> Bool {
        guard let topic = topics[name] else { return false }
        if topic.phase == .synced, let latest = topic.latest, seq <= latest.seq { return false }
        return true
    }

    // MARK: - Inputs

    public mutating func subscribe(_ s: Subscriber, topic name: String, lastEventID: Int64?) -> [Action] {
        precondition(subscribers[s] == nil, "subscriber registered twice")
        var actions: [Action] = []
        let isNew = topics[name] == nil
        if isNew { topics[name] = newTopic() }
        // In place: a copy of the topic taken out and stored back copied its whole subscriber
        // set on every subscribe (quadratic in a topic's subscribers).
        topics[name]!.subscribers.insert(s)
        subscribers[s] = SubscriberState(topic: name, lastSent: lastEventID, phase: .waitingForTopic)
        let topic = topics[name]!
        if isNew { actions.append(.readSnapshot(topic: name, generation: topic.generation)) }
        if topic.phase == .synced, let latest = topic.latest {
            resolve(s, latest: latest, into: &actions)
        }
        return actions
    }

    /// Removes a subscriber; safe to call more than once.
    public mutating func unsubscribe(_ s: Subscriber) {
        guard let state = subscribers.removeValue(forKey: s) else { return }
        topics[state.topic]?.subscribers.remove(s)
        // Its reads still out are ignored when they answer: they carry this topic's generation.
        if topics[state.topic]?.subscribers.isEmpty == true { topics[state.topic] = nil }
    }

    public mutating func snapshotLoaded(topic name: String, generation: UInt64, _ event: Event?) -> [Action] {
        guard var topic = topics[name], topic.generation == generation, topic.phase == .loading else { return [] }
        var actions: [Action] = []
        guard let event else {
            // Unknown activity: an event we heard meanwhile means it was just created.
            if topic.pending.isEmpty {
                for s in topic.subscribers { actions.append(unknown(s)) }
                topics[name] = nil
                return actions
            }
            topic.phase = .resyncing
            topics[name] = topic
            return [.readTopicHistory(topic: name, generation: generation, after: 0)]
        }
        topic.latest = event
        topic.phase = .synced
        topics[name] = topic
        if topic.needsResyncAfterLoad {
            topics[name]?.needsResyncAfterLoad = false
            topics[name]?.phase = .resyncing
            actions.append(.readTopicHistory(topic: name, generation: generation, after: event.seq))
            return actions
        }
        for s in topic.subscribers { resolve(s, latest: event, into: &actions) }
        applyPending(name, into: &actions)
        rereadIfHintedBeyond(name, into: &actions)
        return actions
    }

    /// A committed event, from this process's own publish or from NOTIFY.
    public mutating func published(topic name: String, _ event: Event) -> [Action] {
        // Changed in place (no copy of the topic alive): its pending events are not copied per event.
        guard let phase = topics[name]?.phase else { return [] }
        switch phase {
        case .loading, .resyncing:
            topics[name]!.pending.append(event)
            if topics[name]!.pending.count > maxPendingEvents { return dropTopic(name, .tooFarBehind) }
            return []
        case .synced:
            guard let latest = topics[name]!.latest else { return [] }
            if event.seq <= latest.seq { return [] }
            if event.seq > latest.seq + 1 {
                topics[name]!.pending.append(event)
                topics[name]!.phase = .resyncing
                return [.readTopicHistory(topic: name, generation: topics[name]!.generation, after: latest.seq)]
            }
            var actions: [Action] = []
            advance(name, to: event, into: &actions)
            return actions
        }
    }

    public mutating func topicHistoryLoaded(topic name: String, generation: UInt64, _ events: [Event]) -> [Action] {
        guard var topic = topics[name], topic.generation == generation, topic.phase != .loading else { return [] }
        topic.pending.append(contentsOf: events)
        topic.phase = .synced
        topics[name] = topic
        var actions: [Action] = []
        if topic.latest == nil {
            // Started from "unknown": the first stored event stands in for the snapshot.
            let sorted = topic.pending.sorted { $0.seq < $1.seq }
            guard let first = sorted.first else {
                for s in topic.subscribers { actions.append(unknown(s)) }
                topics[name] = nil
                return actions
            }
            topics[name]?.latest = first
        }
        // Subscribers that arrived while the topic was re-reading are answered now that it is synced.
        if let latest = topics[name]?.latest {
            for s in topic.subscribers { resolve(s, latest: latest, into: &actions) }
        }
        applyPending(name, into: &actions)
        rereadIfHintedBeyond(name, into: &actions)
        return actions
    }

    public mutating func historyLoaded(subscriber s: Subscriber, _ events: [Event]) -> [Action] {
        guard var state = subscribers[s], case .catchingUp(let buffer) = state.phase else { return [] }
        var actions: [Action] = []
        if let claimed = state.claimedAhead {
            state.claimedAhead = nil
            let newest = (events + buffer).max { $0.seq < $1.seq }
            if newest.map({ $0.seq >= claimed }) != true {
                // The stored history never reached the client's id (a restore, an id used
                // again after retention): as if it came without one, the current snapshot.
                guard let current = newest ?? topics[state.topic]?.latest else { return readFailed(subscriber: s) }
                state.lastSent = current.seq
                state.phase = .live
                subscribers[s] = state
                actions.append(.send(s, [current]))
                if current.isTerminal { finish(s, into: &actions) }
                return actions
            }
            // This process had not heard of the client's id yet (another server's commit):
            // carry on after it.
            state.lastSent = claimed
            if let reached = (events + buffer).first(where: { $0.seq == claimed }), reached.isTerminal {
                finish(s, into: &actions)
                return actions
            }
        }
        var out: [Event] = []
        var last = state.lastSent ?? 0
        for e in (events + buffer).sorted(by: { $0.seq < $1.seq }) where e.seq == last + 1 {
            out.append(e)
            last = e.seq
        }
        state.lastSent = last
        state.phase = .live
        subscribers[s] = state
        if !out.isEmpty { actions.append(.send(s, out)) }
        if out.last?.isTerminal == true {
            finish(s, into: &actions)
        } else if let latest = topics[state.topic]?.latest, topics[state.topic]?.phase == .synced, latest.seq > last {
            // The stored history ended before what the topic already holds: read the rest.
            state.phase = .catchingUp(buffer: [])
            subscribers[s] = state
            actions.append(.readHistory(subscriber: s, topic: state.topic, after: last))
        }
        return actions
    }

    /// The database holds `seq` for this topic, newer than what it has: a change whose message
    /// the carrier lost with nothing after it to reveal the gap. Re-read from the topic's newest.
    /// Also what a carrier hint ("this activity changed, seq ≥ N") does: the hint only says
    /// where to look; what is sent is what the read returns. A hint that arrives while the topic
    /// is loading or re-reading is remembered and checked once that read is done.
    public mutating func behind(topic name: String, seq: Int64) -> [Action] {
        guard let topic = topics[name] else { return [] }
        guard topic.phase == .synced else {
            topics[name]?.hintedSeq = max(topic.hintedSeq, seq)
            return []
        }
        guard let latest = topic.latest, seq > latest.seq else { return [] }
        topics[name]?.phase = .resyncing
        return [.readTopicHistory(topic: name, generation: topic.generation, after: latest.seq)]
    }

    private mutating func rereadIfHintedBeyond(_ name: String, into actions: inout [Action]) {
        guard let topic = topics[name], topic.hintedSeq > 0, topic.phase == .synced else { return }
        topics[name]?.hintedSeq = 0
        guard let latest = topic.latest, topic.hintedSeq > latest.seq else { return }
        topics[name]?.phase = .resyncing
        actions.append(.readTopicHistory(topic: name, generation: topic.generation, after: latest.seq))
    }

    /// Every synced topic with the seq it holds (what the shell checks against the database).
    public var syncedTopics: [(topic: String, seq: Int64)] {
        var out: [(topic: String, seq: Int64)] = []
        out.reserveCapacity(topics.count)
        for (name, topic) in topics where topic.phase == .synced {
            if let latest = topic.latest, !latest.isTerminal { out.append((name, latest.seq)) }
        }
        return out
    }

    /// The LISTEN session is back: every topic may have missed events while it was down.
    public mutating func listenRestored() -> [Action] {
        var actions: [Action] = []
        for (name, topic) in topics {
            switch topic.phase {
            case .loading:
                topics[name]?.needsResyncAfterLoad = true
            case .synced, .resyncing:
                topics[name]?.phase = .resyncing
                actions.append(.readTopicHistory(topic: name, generation: topic.generation, after: topic.latest?.seq ?? 0))
            }
        }
        return actions
    }

    /// A read failed (database down): its waiters are dropped and reconnect later. A failed
    /// read of an earlier topic for the same activity concerns nobody here.
    public mutating func readFailed(topic name: String, generation: UInt64) -> [Action] {
        guard topics[name]?.generation == generation else { return [] }
        return dropTopic(name, .readFailed)
    }

    public mutating func readFailed(subscriber s: Subscriber) -> [Action] {
        guard subscribers[s] != nil else { return [] }
        unsubscribe(s)
        return [.drop(s, .readFailed)]
    }

    // MARK: - Internals

    private mutating func newTopic() -> Topic {
        lastGeneration += 1
        return Topic(generation: lastGeneration)
    }

    private mutating func dropTopic(_ name: String, _ reason: DropReason) -> [Action] {
        guard let topic = topics.removeValue(forKey: name) else { return [] }
        var actions: [Action] = []
        for s in topic.subscribers { subscribers[s] = nil; actions.append(.drop(s, reason)) }
        return actions
    }

    /// Decides a subscriber's first answer once the topic's newest event is known.
    private mutating func resolve(_ s: Subscriber, latest: Event, into actions: inout [Action]) {
        guard var state = subscribers[s], case .waitingForTopic = state.phase else { return }
        guard let after = state.lastSent else {
            state.lastSent = latest.seq
            state.phase = .live
            subscribers[s] = state
            actions.append(.send(s, [latest]))
            if latest.isTerminal { finish(s, into: &actions) }
            return
        }
        if after >= latest.seq && latest.isTerminal {
            unsubscribe(s)
            actions.append(.noContent(s))
            return
        }
        if after == latest.seq {
            state.phase = .live
            subscribers[s] = state
            return
        }
        if after > latest.seq {
            // Contract §4 item 3: an id above the activity's seq is answered as if none was
            // given, unless stored history has it (this process has not heard of it yet).
            state.claimedAhead = after
            state.lastSent = latest.seq
            state.phase = .catchingUp(buffer: [])
            subscribers[s] = state
            actions.append(.readHistory(subscriber: s, topic: state.topic, after: latest.seq))
            return
        }
        state.phase = .catchingUp(buffer: [])
        subscribers[s] = state
        actions.append(.readHistory(subscriber: s, topic: state.topic, after: after))
    }

    private mutating func applyPending(_ name: String, into actions: inout [Action]) {
        guard let topic = topics[name] else { return }
        let pending = topic.pending.sorted { $0.seq < $1.seq }
        topics[name]?.pending = []
        for e in pending {
            guard let t = topics[name], let latest = t.latest else { return }
            if e.seq <= latest.seq { continue }
            if e.seq > latest.seq + 1 {
                // Still a hole: keep the rest and read the history in between.
                topics[name]?.pending = pending.filter { $0.seq > latest.seq }
                topics[name]?.phase = .resyncing
                actions.append(.readTopicHistory(topic: name, generation: t.generation, after: latest.seq))
                return
            }
            advance(name, to: e, into: &actions)
        }
    }

    private mutating func advance(_ name: String, to event: Event, into actions: inout [Action]) {
        guard let topic = topics[name] else { return }
        topics[name]?.latest = event
        // One array shared by every subscriber's send (copy-on-write): no allocation each.
        let single = [event]
        actions.reserveCapacity(actions.count + topic.subscribers.count)
        for s in topic.subscribers {
            guard var state = subscribers[s] else { continue }
            switch state.phase {
            case .waitingForTopic:
                continue
            case .catchingUp(var buffer):
                // The buffer's other owners (the table and `state`) let go first, so the append
                // is in place: a copy per event per catching-up stream was quadratic.
                state.phase = .waitingForTopic
                subscribers[s]?.phase = .waitingForTopic
                buffer.append(event)
                if buffer.count > maxPendingEvents {
                    unsubscribe(s)
                    actions.append(.drop(s, .tooFarBehind))
                    continue
                }
                state.phase = .catchingUp(buffer: buffer)
                subscribers[s] = state
            case .live:
                let last = state.lastSent ?? 0
                if event.seq <= last {
                    // Its Last-Event-ID was ahead of this process (heard from another server):
                    // when the final event arrives, there is nothing more to wait for.
                    if event.isTerminal { finish(s, into: &actions) }
                    continue
                }
                guard event.seq == last + 1 else { continue }
                state.lastSent = event.seq
                subscribers[s] = state
                actions.append(.send(s, single))
                if event.isTerminal { finish(s, into: &actions) }
            }
        }
    }

    /// The answer for an unknown activity: `not_found` (with id 0, so a browser reconnects
    /// once), or `204` for a reconnect that carries Last-Event-ID (it stops there).
    private mutating func unknown(_ s: Subscriber) -> Action {
        let hadID = subscribers.removeValue(forKey: s)?.lastSent != nil
        return hadID ? .noContent(s) : .notFound(s)
    }

    private mutating func finish(_ s: Subscriber, into actions: inout [Action]) {
        unsubscribe(s)
        actions.append(.finish(s))
    }
}
