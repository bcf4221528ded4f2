/// A change as the feed orders it: its feed position and what the filters look at.
public protocol FeedChange {
    /// Grows in commit order across the deployment (contract §8).
    var position: Int64 { get }
    var machine: String? { get }
    var isTerminal: Bool { get }
    /// About what the change holds in memory (its snapshot), for the byte bounds.
    var byteCount: Int { get }
}

/// The feed's query filters (`?machine=M&state=active|finished`).
///
/// `state=active` follows live activities: every change of an activity is a change of a live
/// one, its final event included (that is how a list learns the row left). `state=finished`
/// gets only final events. The initial set applies the filter to the current snapshot.
public struct FeedFilter: Hashable, Sendable {
    public enum State: String, Sendable { case active, finished }
    public var machine: String?
    public var state: State?

    public init(machine: String? = nil, state: State? = nil) {
        self.machine = machine
        self.state = state
    }

    public func matches(machine m: String?, terminal: Bool) -> Bool {
        if let machine, machine != m { return false }
        if state == .finished && !terminal { return false }
        return true
    }

    public func matches<C: FeedChange>(_ c: C) -> Bool { matches(machine: c.machine, terminal: c.isTerminal) }
}

/// The feed's fan-out for one server process, as a pure state machine (the shell is
/// `FeedService`).
///
/// Ordering. Positions are drawn under one advisory lock held through each publish batch's
/// commit, so position order is commit order is visibility order, and PostgreSQL delivers
/// NOTIFYs in commit order: the changes heard here arrive in increasing position order, with
/// holes only where a batch rolled back (never waited for). A reader that has seen position P
/// can therefore never later see a smaller one appear, and "every change after P" is one
/// range read. The rule that makes a connecting subscriber exact is the status streams' rule:
/// subscribe first (buffer what is heard), then read the database in one statement that also
/// returns the newest position P its snapshot saw, then deliver the buffered changes after P.
/// A change committed during the read is either ≤ P (in the read) or > P (heard, buffered).
///
/// The source side: changes are processed in position order exactly once (`head` is the last
/// one). A NOTIFY without the snapshot (too long for a payload), or a LISTEN session that came
/// back, switches the source to *resyncing*: stored changes after `head` are read page by page
/// and processed as if heard, while newer notices wait in `pending`; then those are applied.
///
/// Each subscriber has one phase: `initial` (reading the current snapshots page by page, then
/// `synced`), `replay` (reading the changes after its Last-Event-ID page by page, then
/// `synced`) or `live`.
/// While reading it buffers what the source processes (bounded); a change goes to a live
/// subscriber only when its position is above the last one it sent, so ids on every stream
/// strictly increase and nothing is sent twice.
///
/// Readers that connect together share their initial set's reads: a subscriber whose filter
/// equals that of one whose first page is still out follows it (a copy of its buffer makes
/// the follower's view exactly the leader's, which subscribed before its read), and every
/// page the leader reads goes to each follower. After each page, the members that keep up
/// (the shell's say) stay together, the first of them reading the next page; the others go
/// on reading alone from where they are. So a hundred browsers reconnecting after a restart
/// cost the database one walk of the initial set, not a hundred.
public struct FeedHub<Subscriber: Hashable, Change: FeedChange> {
    public enum Action {
        /// Read stored changes after `after`, oldest first, one page; answer `changesLoaded`
        /// or `changesReadFailed` with `generation`.
        case readChanges(after: Int64, generation: UInt64)
        /// Read a page of the current snapshots (ordered by the position of each activity's
        /// latest change, after `after`); `firstHead` is the newest position of the first
        /// page's read (nil on the first page). Answer `initialLoaded`.
        case readInitial(Subscriber, FeedFilter, after: Int64, firstHead: Int64?)
        /// Read a page of the changes after `after` matching the filter, or tell that
        /// `after` is too old or not ours; answer `replayLoaded`.
        case readReplay(Subscriber, FeedFilter, after: Int64)
        /// Write these changes, in order.
        case send(Subscriber, [Change])
        /// Write this initial-set page, read for another subscriber that this one follows.
        case sendShared(Subscriber, [Change])
        /// Write `event: synced` with this position: the initial set is complete, or a resumed
        /// feed has caught up; what follows is live. Once per stream.
        case synced(Subscriber, position: Int64)
        /// Write `event: reset`: the Last-Event-ID cannot be resumed; the initial set follows.
        case reset(Subscriber)
        /// Disconnect; the client resumes with Last-Event-ID.
        case drop(Subscriber, DropReason)
    }

    /// The answer to `readReplay`.
    public enum ReplayPage {
        /// The position is older than what the server keeps, or not one it issued.
        case reset
        /// Matching changes after the asked position; `through`: the newest position the
        /// read's snapshot saw; `complete`: nothing more matched (else the page was cut by its
        /// row or byte limit, and covers positions only up to its last change).
        case page([Change], through: Int64, complete: Bool)
    }

    enum Phase {
        case initial(after: Int64, firstHead: Int64?)
        case replay
        case live(last: Int64)
    }

    struct SubscriberState {
        let filter: FeedFilter
        var phase: Phase
        /// Changes processed while the subscriber reads (initial set or replay).
        var buffer: [Change] = []
        /// `synced` was sent (a catch-up after it, for the carrier's chain, says nothing more).
        var saidSynced = false
        var bufferBytes = 0
    }

    /// What a notice without its snapshot holds in the catch-up queue.
    static var missingBytes: Int { 16 }

    enum Pending {
        case change(Change)
        /// A notice without its snapshot: read it (and what follows) from the database.
        case missing(Int64)
    }

    enum SourcePhase {
        case synced
        case resyncing(generation: UInt64, pending: [Pending])
    }

    public let maxBuffered: Int
    public let maxPending: Int
    /// Bytes a reading subscriber may buffer, and the source's catch-up queue may hold; past
    /// either, the streams concerned reconnect (and resume with Last-Event-ID).
    public let maxBufferedBytes: Int
    public let maxPendingBytes: Int
    /// What the catch-up queue holds now.
    public private(set) var pendingBytes = 0
    /// The last position processed (nil: none yet in this process).
    public private(set) var head: Int64?
    /// The newest position a carrier hint named while the source was reading: checked once
    /// the read is done (NATS only).
    var hintedDuringRead: Int64 = 0
    /// A hint came while no subscriber was live yet: the first to go live reads on (NATS only).
    var hintedWhileNoneLive = false
    var source: SourcePhase = .synced
    var subscribers: [Subscriber: SubscriberState] = [:]
    /// Per filter, the subscriber whose first initial page is out and may still be joined.
    var joinable: [FeedFilter: Subscriber] = [:]
    /// Who receives each leader's pages besides it, in the order they joined.
    var followers: [Subscriber: [Subscriber]] = [:]
    var leaderOf: [Subscriber: Subscriber] = [:]
    var lastGeneration: UInt64 = 0

    public init(maxBuffered: Int = 4096, maxPending: Int = 100_000, maxBufferedBytes: Int = 4 << 20, maxPendingBytes: Int = 16 << 20) {
        self.maxBuffered = maxBuffered
        self.maxPending = maxPending
        self.maxBufferedBytes = maxBufferedBytes
        self.maxPendingBytes = maxPendingBytes
    }

    public var subscriberCount: Int { subscribers.count }
    /// Subscribers reading their initial set through another's reads.
    public var followerCount: Int { leaderOf.count }
    public func isSubscribed(_ s: Subscriber) -> Bool { subscribers[s] != nil }
    public var isResyncing: Bool {
        if case .resyncing = source { return true }
        return false
    }
    /// Whether the subscriber receives live changes (its initial set or replay is done).
    public func isLive(_ s: Subscriber) -> Bool {
        if case .live? = subscribers[s]?.phase { return true }
        return false
    }
    /// Where this process stands in the feed: the last position processed, or (none heard
    /// yet) the lowest position a live subscriber has; nil with nobody live.
    public var standing: Int64? {
        if let head { return head }
        var lowest: Int64?
        for state in subscribers.values {
            if case .live(let last) = state.phase { lowest = min(lowest ?? last, last) }
        }
        return lowest
    }

    /// What one subscriber waits for, for a state dump (`SIGUSR1`): its phase (`initial`,
    /// `replay`, `live`), the position it stands at, what it buffered, and whose reads it follows.
    public func describe(_ s: Subscriber) -> (phase: String, at: Int64?, buffered: Int, synced: Bool, follows: Subscriber?)? {
        guard let state = subscribers[s] else { return nil }
        switch state.phase {
        case .initial(let after, _): return ("initial", after, state.buffer.count, state.saidSynced, leaderOf[s])
        case .replay: return ("replay", nil, state.buffer.count, state.saidSynced, leaderOf[s])
        case .live(let last): return ("live", last, 0, state.saidSynced, nil)
        }
    }

    /// The source's side of a state dump: `synced` or `resyncing(generation)`, and what waits.
    public var sourceDescription: String {
        switch source {
        case .synced: return "synced"
        case .resyncing(let g, let pending): return "resyncing(generation: \(g), pending: \(pending.count))"
        }
    }

    /// Whether anyone here would receive anything: lets the shell skip building changes.
    public var hasSubscribers: Bool { !subscribers.isEmpty }

    // MARK: - Subscribers

    /// A new stream. `lastEventID` nil: the initial set; `reset`: the client's Last-Event-ID
    /// could not be used (not a number), so `event: reset` comes first.
    public mutating func subscribe(_ s: Subscriber, filter: FeedFilter, lastEventID: Int64?, reset: Bool = false) -> [Action] {
        precondition(subscribers[s] == nil, "subscriber registered twice")
        if let after = lastEventID, !reset {
            subscribers[s] = SubscriberState(filter: filter, phase: .replay)
            return [.readReplay(s, filter, after: after)]
        }
        let greeting: [Action] = reset ? [.reset(s)] : []
        if let leader = joinable[filter], let state = subscribers[leader] {
            subscribers[s] = SubscriberState(filter: filter, phase: .initial(after: 0, firstHead: nil),
                                             buffer: state.buffer, bufferBytes: state.bufferBytes)
            followers[leader, default: []].append(s)
            leaderOf[s] = leader
            return greeting
        }
        subscribers[s] = SubscriberState(filter: filter, phase: .initial(after: 0, firstHead: nil))
        joinable[filter] = s
        return greeting + [.readInitial(s, filter, after: 0, firstHead: nil)]
    }

    /// Removes a subscriber; safe to call more than once. Its reads still out are ignored; if
    /// others followed its reads, the first of them reads on from the same place.
    @discardableResult
    public mutating func unsubscribe(_ s: Subscriber) -> [Action] {
        let actions = leaveGroup(s)
        subscribers[s] = nil
        return actions
    }

    /// A page of the initial set, read for `s` and for those following its reads. `keepsUp`:
    /// whether a member of the group has taken its earlier pages well enough to stay in it (a
    /// member that does not reads on alone, paced by its own socket).
    public mutating func initialLoaded(_ s: Subscriber, _ rows: [Change], through: Int64, complete: Bool,
                                       keepsUp: (Subscriber) -> Bool = { _ in true }) -> [Action] {
        guard leaderOf[s] == nil, let state = subscribers[s], case .initial(let after, let firstHead) = state.phase else { return [] }
        if joinable[state.filter] == s { joinable[state.filter] = nil }
        let group = [s] + (followers.removeValue(forKey: s) ?? [])
        for f in group.dropFirst() { leaderOf[f] = nil }
        var actions: [Action] = []
        let last = rows.last?.position ?? after
        if complete {
            let p = max(through, last)
            for m in group {
                if !rows.isEmpty { actions.append(m == s ? .send(m, rows) : .sendShared(m, rows)) }
                synced(m, at: p, into: &actions)
                goLive(m, after: p, into: &actions)
            }
            return actions
        }
        let head = firstHead ?? through
        var staying: [Subscriber] = []
        for m in group {
            if !rows.isEmpty { actions.append(m == s ? .send(m, rows) : .sendShared(m, rows)) }
            subscribers[m]?.phase = .initial(after: last, firstHead: head)
            if keepsUp(m) {
                staying.append(m)
            } else {
                actions.append(.readInitial(m, state.filter, after: last, firstHead: head))
            }
        }
        if let leader = staying.first {
            actions.append(.readInitial(leader, state.filter, after: last, firstHead: head))
            if staying.count > 1 {
                followers[leader] = Array(staying.dropFirst())
                for f in staying.dropFirst() { leaderOf[f] = leader }
            }
        }
        return actions
    }

    public mutating func replayLoaded(_ s: Subscriber, _ page: ReplayPage) -> [Action] {
        guard let state = subscribers[s], case .replay = state.phase else { return [] }
        switch page {
        case .reset:
            // The buffer stays: it holds what was heard since the subscription.
            subscribers[s]?.phase = .initial(after: 0, firstHead: nil)
            return [.reset(s), .readInitial(s, state.filter, after: 0, firstHead: nil)]
        case .page(let changes, let through, let complete):
            var actions: [Action] = []
            if !changes.isEmpty { actions.append(.send(s, changes)) }
            // A cut page covers only up to its last change, whatever the snapshot's newest.
            let p = complete ? max(through, changes.last?.position ?? through) : (changes.last?.position ?? through)
            if !complete {
                // Live changes stay buffered; those up to p are dropped when it goes live.
                actions.append(.readReplay(s, state.filter, after: p))
                return actions
            }
            synced(s, at: p, into: &actions)
            goLive(s, after: p, into: &actions)
            return actions
        }
    }

    /// A read this subscriber needed failed: it reconnects later.
    public mutating func readFailed(_ s: Subscriber) -> [Action] {
        guard subscribers[s] != nil else { return [] }
        return [.drop(s, .readFailed)] + unsubscribe(s)
    }

    // MARK: - The source

    /// A committed change heard through NOTIFY, with its snapshot.
    public mutating func notified(_ change: Change) -> [Action] {
        switch source {
        case .resyncing(let generation, var pending):
            // `source` lets go of the queue first, so the append is in place (a copy per NOTIFY
            // of a queue of up to `maxPending` was quadratic).
            source = .synced
            pending.append(.change(change))
            source = .resyncing(generation: generation, pending: pending)
            pendingBytes += change.byteCount
            return pending.count > maxPending || pendingBytes > maxPendingBytes ? giveUp(.tooFarBehind) : []
        case .synced:
            var actions: [Action] = []
            process(change, into: &actions)
            return actions
        }
    }

    /// A NOTIFY whose snapshot did not fit the payload: the change is read from the database,
    /// and later ones wait for it.
    public mutating func notifiedWithoutData(position: Int64) -> [Action] {
        switch source {
        case .resyncing(let generation, var pending):
            source = .synced
            pending.append(.missing(position))
            source = .resyncing(generation: generation, pending: pending)
            pendingBytes += Self.missingBytes
            return pending.count > maxPending || pendingBytes > maxPendingBytes ? giveUp(.tooFarBehind) : []
        case .synced:
            if let head, position <= head { return [] }
            // Nobody here to send it to: remember where the stream is, read nothing.
            if subscribers.isEmpty { head = position; return [] }
            if head == nil { head = position - 1 }
            return [startResync(pending: [])]
        }
    }

    /// A hint from the NATS carrier that positions up to `position` were numbered (or, from
    /// the carrier's check, the newest position PostgreSQL holds): read the stored changes
    /// after `head`. The hint is never taken as a position: `head` only moves to positions a
    /// read returned, so a forged, repeated or far-ahead hint costs at most one read and
    /// neither hides a change nor stalls the stream.
    public mutating func hinted(position: Int64) -> [Action] {
        guard !subscribers.isEmpty else {
            // Nobody reads here: the next subscriber's own read is its start.
            head = nil
            return []
        }
        switch source {
        case .resyncing:
            hintedDuringRead = max(hintedDuringRead, position)
            return []
        case .synced:
            if let head, position <= head { return [] }
            guard let from = head ?? lowestLive else {
                // Everyone still reads its start: the first to go live reads on from there.
                hintedWhileNoneLive = true
                return []
            }
            head = from
            return [startResync(pending: [])]
        }
    }

    /// The lowest position a live subscriber has sent.
    private var lowestLive: Int64? {
        var lowest: Int64?
        for state in subscribers.values {
            if case .live(let last) = state.phase { lowest = min(lowest ?? last, last) }
        }
        return lowest
    }

    /// The shell stopped listening to the feed (nobody here reads it): the chain is broken,
    /// the next subscriber starts a new one.
    public mutating func sourceDetached() {
        head = nil
        hintedDuringRead = 0
        hintedWhileNoneLive = false
        source = .synced
    }

    /// The LISTEN session came back: notices sent while it was down are lost. Re-read what
    /// followed the last processed position. Without one (nothing heard yet), live streams
    /// say where they are; a stream still reading has nothing to anchor it and reconnects.
    public mutating func listenRestored() -> [Action] {
        var actions: [Action] = []
        if subscribers.isEmpty {
            // Nothing to catch up for: the next subscriber reads its own start.
            head = nil
            source = .synced
            return []
        }
        if head == nil {
            var lasts: [Int64] = []
            for (s, state) in subscribers {
                if case .live(let last) = state.phase {
                    lasts.append(last)
                } else {
                    subscribers[s] = nil
                    actions.append(.drop(s, .readFailed))
                }
            }
            // Only live subscribers remain: no group is left.
            forgetGroups()
            guard let from = lasts.min() else { source = .synced; return actions }
            head = from
        }
        actions.append(startResync(pending: []))
        return actions
    }

    public mutating func changesLoaded(generation: UInt64, _ changes: [Change], complete: Bool) -> [Action] {
        guard case .resyncing(let current, let pending) = source, current == generation else { return [] }
        var actions: [Action] = []
        for c in changes { process(c, into: &actions) }
        if !complete {
            actions.append(.readChanges(after: head ?? 0, generation: generation))
            return actions
        }
        source = .synced
        pendingBytes = 0
        for (i, p) in pending.enumerated() {
            switch p {
            case .change(let c):
                process(c, into: &actions)
            case .missing(let position):
                if let head, position <= head { continue }
                actions.append(startResync(pending: Array(pending[(i + 1)...])))
                return actions
            }
        }
        let hinted = hintedDuringRead
        hintedDuringRead = 0
        if hinted > (head ?? 0) { actions.append(startResync(pending: [])) }
        return actions
    }

    /// The shell gave up re-reading (the database stayed down): every stream reconnects later.
    public mutating func changesReadFailed(generation: UInt64) -> [Action] {
        guard case .resyncing(let current, _) = source, current == generation else { return [] }
        return giveUp(.readFailed)
    }

    // MARK: - Internals

    private mutating func startResync(pending: [Pending]) -> Action {
        pendingBytes = pending.reduce(0) { n, p in
            switch p {
            case .change(let c): return n + c.byteCount
            case .missing: return n + Self.missingBytes
            }
        }
        lastGeneration += 1
        source = .resyncing(generation: lastGeneration, pending: pending)
        return .readChanges(after: head ?? 0, generation: lastGeneration)
    }

    private mutating func giveUp(_ reason: DropReason) -> [Action] {
        let all = subscribers.keys
        subscribers = [:]
        forgetGroups()
        source = .synced
        pendingBytes = 0
        head = nil
        hintedDuringRead = 0
        return all.map { .drop($0, reason) }
    }

    private mutating func forgetGroups() {
        joinable = [:]
        followers = [:]
        leaderOf = [:]
    }

    /// Takes `s` out of its group. A follower just leaves; a leader hands its reads to its
    /// first follower, which reads the page the leader was waiting for (that read's answer
    /// is ignored, since it names the leader).
    private mutating func leaveGroup(_ s: Subscriber) -> [Action] {
        if let leader = leaderOf.removeValue(forKey: s) {
            followers[leader]?.removeAll { $0 == s }
            return []
        }
        guard let state = subscribers[s] else { return [] }
        let group = followers.removeValue(forKey: s) ?? []
        let wasJoinable = joinable[state.filter] == s
        if wasJoinable { joinable[state.filter] = nil }
        guard let next = group.first, case .initial(let after, let firstHead) = state.phase else { return [] }
        leaderOf[next] = nil
        if group.count > 1 {
            followers[next] = Array(group.dropFirst())
            for f in group.dropFirst() { leaderOf[f] = next }
        }
        if wasJoinable { joinable[state.filter] = next }
        return [.readInitial(next, state.filter, after: after, firstHead: firstHead)]
    }

    private mutating func synced(_ s: Subscriber, at p: Int64, into actions: inout [Action]) {
        guard subscribers[s]?.saidSynced == false else { return }
        subscribers[s]?.saidSynced = true
        actions.append(.synced(s, position: p))
    }

    private mutating func goLive(_ s: Subscriber, after p: Int64, into actions: inout [Action]) {
        var last = p
        var out: [Change] = []
        for c in subscribers[s]?.buffer ?? [] where c.position > last {
            out.append(c)
            last = c.position
        }
        if !out.isEmpty { actions.append(.send(s, out)) }
        subscribers[s]?.phase = .live(last: last)
        subscribers[s]?.buffer = []
        subscribers[s]?.bufferBytes = 0
        if hintedWhileNoneLive, head == nil, case .synced = source {
            // A hint came while it read: what was numbered since its read is read now.
            hintedWhileNoneLive = false
            head = last
            actions.append(startResync(pending: []))
        }
    }

    /// One change, in position order: to every live subscriber whose filter it matches, into
    /// the buffer of every reading one.
    private mutating func process(_ c: Change, into actions: inout [Action]) {
        if let head, c.position <= head { return }
        head = c.position
        guard !subscribers.isEmpty else { return }
        // One array shared by every subscriber's send (copy-on-write): no allocation each.
        let single = [c]
        var dropped: [Subscriber] = []
        // Values are mutated in place through their index: no copy of the table per change.
        var i = subscribers.startIndex
        while i != subscribers.endIndex {
            defer { subscribers.formIndex(after: &i) }
            guard subscribers.values[i].filter.matches(c) else { continue }
            switch subscribers.values[i].phase {
            case .live(let last):
                guard c.position > last else { continue }
                subscribers.values[i].phase = .live(last: c.position)
                actions.append(.send(subscribers.keys[i], single))
            case .initial, .replay:
                subscribers.values[i].buffer.append(c)
                subscribers.values[i].bufferBytes += c.byteCount
                if subscribers.values[i].buffer.count > maxBuffered || subscribers.values[i].bufferBytes > maxBufferedBytes {
                    dropped.append(subscribers.keys[i])
                }
            }
        }
        // Followers first: a leader dropped with its group hands its reads to nobody.
        for s in dropped.filter({ leaderOf[$0] != nil }) + dropped.filter({ leaderOf[$0] == nil }) {
            actions.append(.drop(s, .tooFarBehind))
            actions += unsubscribe(s)
        }
    }
}

/// Whether a feed's Last-Event-ID can be resumed (contract §8): a position at or above the
/// retention horizon (the newest position pruned) and not beyond the newest position issued,
/// and not so far behind that replaying costs more than starting over.
public enum FeedResume {
    /// Below this many changes behind, a replay is always cheaper than an initial set worth
    /// counting; above it the replay is compared with the initial set's size.
    public static let replayFloor: Int64 = 10_000

    public static func canResume(after position: Int64, horizon: Int64, newest: Int64) -> Bool {
        position >= horizon && position <= newest
    }

    /// `activities`: how many activities the initial set walks (nil: not counted, because the
    /// resume is within `replayFloor`). Positions are drawn from one sequence, so `newest -
    /// position` bounds the changes a replay reads; it is too far behind when that is above
    /// the floor and above the initial set it would replace.
    public static func tooFarBehind(after position: Int64, newest: Int64, activities: Int64?) -> Bool {
        let behind = newest - position
        guard behind > replayFloor, let activities else { return false }
        return behind > activities
    }
}
