import XCTest
@testable import DispatchCore

/// A minimal event for the generic hub: a seq, and whether it ends the activity.
struct Ev: HubEvent, Equatable {
    let seq: Int64
    let isTerminal: Bool
    init(_ seq: Int64, terminal: Bool = false) {
        self.seq = seq
        isTerminal = terminal
    }
}

typealias TestHub = Hub<String, Ev>

/// Actions as short text, so expectations read like a table.
func render(_ actions: [TestHub.Action]) -> [String] {
    actions.map { action in
        switch action {
        case .readSnapshot(let t, _): return "readSnapshot \(t)"
        case .readTopicHistory(let t, _, let after): return "readTopicHistory \(t) after \(after)"
        case .readHistory(let s, let t, let after): return "readHistory \(s) \(t) after \(after)"
        case .send(let s, let events): return "send \(s) " + events.map { "\($0.seq)\($0.isTerminal ? "!" : "")" }.joined(separator: ",")
        case .finish(let s): return "finish \(s)"
        case .noContent(let s): return "noContent \(s)"
        case .notFound(let s): return "notFound \(s)"
        case .drop(let s, let why): return "drop \(s) \(why == .tooFarBehind ? "behind" : "read")"
        }
    }
}

/// Several subscribers' actions come in set order: compare them sorted, each subscriber's own
/// actions keep their relative order in the rendering (send before finish) by a stable sort key.
func sortedRender(_ actions: [TestHub.Action]) -> [String] {
    let r = render(actions)
    return r.enumerated().sorted { a, b in
        let ka = subscriberKey(a.element), kb = subscriberKey(b.element)
        return ka == kb ? a.offset < b.offset : ka < kb
    }.map(\.element)
}

private func subscriberKey(_ line: String) -> String {
    let parts = line.split(separator: " ")
    return parts.count > 1 ? String(parts[1]) : ""
}

/// The generation carried by the first topic read among `actions`.
func token(_ actions: [TestHub.Action]) -> UInt64 {
    for action in actions {
        if case .readSnapshot(_, let generation) = action { return generation }
        if case .readTopicHistory(_, let generation, _) = action { return generation }
    }
    XCTFail("no topic read in \(render(actions))")
    return 0
}

/// The table tests answer the read of the topic as it is now; tests about stale answers pass
/// the generation of the read they answer explicitly.
extension Hub {
    mutating func snapshotLoaded(topic name: String, _ event: Event?) -> [Action] {
        snapshotLoaded(topic: name, generation: topics[name]?.generation ?? 0, event)
    }

    mutating func topicHistoryLoaded(topic name: String, _ events: [Event]) -> [Action] {
        topicHistoryLoaded(topic: name, generation: topics[name]?.generation ?? 0, events)
    }

    mutating func readFailed(topic name: String) -> [Action] {
        readFailed(topic: name, generation: topics[name]?.generation ?? 0)
    }
}

final class HubTests: XCTestCase {
    var hub = TestHub()

    override func setUp() {
        hub = TestHub()
    }

    func subscribe(_ s: String, _ topic: String = "A", after: Int64? = nil) -> [String] {
        render(hub.subscribe(s, topic: topic, lastEventID: after))
    }

    func publish(_ e: Ev, _ topic: String = "A") -> [String] { render(hub.published(topic: topic, e)) }
    func snapshot(_ e: Ev?, _ topic: String = "A") -> [String] { sortedRender(hub.snapshotLoaded(topic: topic, e)) }

    /// A live topic at `seq` with fresh subscribers `names`.
    func live(_ names: [String], at seq: Int64, topic: String = "A") {
        for n in names { _ = hub.subscribe(n, topic: topic, lastEventID: nil) }
        _ = hub.snapshotLoaded(topic: topic, Ev(seq))
    }

    func testSubscribeCoalescesSnapshotReads() {
        XCTAssertEqual(subscribe("a"), ["readSnapshot A"])
        XCTAssertEqual(hub.topicCount, 1)
        XCTAssertEqual(subscribe("b"), [], "a second subscriber while loading does not read again")
        XCTAssertEqual(subscribe("c", "B"), ["readSnapshot B"])
        XCTAssertEqual(hub.subscriberCount, 3)
        XCTAssertEqual(hub.topicCount, 2)
        XCTAssertEqual(snapshot(Ev(5)), ["send a 5", "send b 5"], "one read answers every waiter")
        XCTAssertEqual(hub.lastSent("a"), 5)
        XCTAssertEqual(subscribe("d"), ["send d 5"], "a synced topic answers from memory")
        XCTAssertEqual(hub.subscribers(of: "A"), ["a", "b", "d"])
    }

    func testUnknownActivity() {
        _ = subscribe("a")
        _ = subscribe("b", after: 3)
        // Contract §9: a request that carries Last-Event-ID (a browser reconnecting after
        // `not_found` with id 0) is answered 204, so an EventSource stops.
        XCTAssertEqual(snapshot(nil), ["notFound a", "noContent b"])
        XCTAssertEqual(hub.topicCount, 0)
        XCTAssertEqual(hub.subscriberCount, 0)
        XCTAssertFalse(hub.isSubscribed("a"))
        XCTAssertEqual(snapshot(Ev(1)), [], "a late answer for a topic that is gone does nothing")
    }

    /// A publish heard while the snapshot said "unknown": the activity was just created.
    /// Contract §9: `Last-Event-ID: 0` for an activity started meanwhile gets its whole history.
    func testReconnectWithZeroAfterNotFoundGetsTheWholeHistory() {
        _ = subscribe("b", after: 0)
        XCTAssertEqual(snapshot(Ev(2)), ["readHistory b A after 0"])
    }

    func testUnknownButJustCreated() {
        _ = subscribe("a")
        XCTAssertEqual(publish(Ev(2)), [])
        XCTAssertEqual(snapshot(nil), ["readTopicHistory A after 0"])
        XCTAssertEqual(render(hub.topicHistoryLoaded(topic: "A", [Ev(1), Ev(2)])), ["send a 1", "send a 2"])
        XCTAssertEqual(publish(Ev(3, terminal: true)), ["send a 3!", "finish a"])
        XCTAssertEqual(hub.topicCount, 0)
    }

    /// Unknown at the read, but an event was heard meanwhile: it stands in for the snapshot.
    func testUnknownWithEmptyHistoryUsesTheHeardEvent() {
        _ = subscribe("a")
        _ = publish(Ev(1))
        XCTAssertEqual(snapshot(nil), ["readTopicHistory A after 0"])
        XCTAssertEqual(render(hub.topicHistoryLoaded(topic: "A", [])), ["send a 1"])
        XCTAssertEqual(publish(Ev(2)), ["send a 2"])
    }

    func testTerminalSnapshot() {
        _ = subscribe("fresh")
        _ = subscribe("behind", after: 2)
        _ = subscribe("equal", after: 6)
        _ = subscribe("ahead", after: 9)
        XCTAssertEqual(snapshot(Ev(6, terminal: true)), [
            "noContent ahead", "readHistory behind A after 2", "noContent equal", "send fresh 6!", "finish fresh",
        ])
        XCTAssertEqual(render(hub.historyLoaded(subscriber: "behind", [Ev(3), Ev(4), Ev(5), Ev(6, terminal: true)])),
                       ["send behind 3,4,5,6!", "finish behind"])
        XCTAssertEqual(hub.subscriberCount, 0)
        XCTAssertEqual(hub.topicCount, 0)
    }

    func testLastEventIDCatchUpBuffersLiveEvents() {
        _ = subscribe("a", after: 2)
        XCTAssertEqual(snapshot(Ev(5)), ["readHistory a A after 2"])
        XCTAssertEqual(publish(Ev(6)), [], "buffered while the history read runs")
        XCTAssertEqual(publish(Ev(7)), [])
        // The history read saw 6 already: no duplicate, no gap.
        XCTAssertEqual(render(hub.historyLoaded(subscriber: "a", [Ev(3), Ev(4), Ev(5), Ev(6)])), ["send a 3,4,5,6,7"])
        XCTAssertEqual(publish(Ev(8)), ["send a 8"])
        XCTAssertEqual(render(hub.historyLoaded(subscriber: "a", [Ev(3)])), [], "a stray answer is ignored")
    }

    func testLastEventIDCaughtUpOrAhead() {
        live(["x"], at: 5)
        XCTAssertEqual(subscribe("same", after: 5), [], "nothing to replay; waits for the next event")
        // Above the newest seq here: stored history decides whether the id exists.
        XCTAssertEqual(subscribe("ahead", after: 6), ["readHistory ahead A after 5"], "heard 6 elsewhere before this server did")
        XCTAssertEqual(sortedRender(hub.published(topic: "A", Ev(6))), ["send same 6", "send x 6"])
        XCTAssertEqual(render(hub.historyLoaded(subscriber: "ahead", [Ev(6)])), [], "it has 6 already")
        XCTAssertEqual(sortedRender(hub.published(topic: "A", Ev(7))), ["send ahead 7", "send same 7", "send x 7"])
    }

    /// A client that saw the final event from another server reconnects here before this
    /// server heard it: once it arrives, the stream ends instead of idling forever.
    func testLastEventIDAtATerminalNotYetHeard() {
        live(["x"], at: 5)
        XCTAssertEqual(subscribe("r", after: 6), ["readHistory r A after 5"])
        XCTAssertEqual(sortedRender(hub.published(topic: "A", Ev(6, terminal: true))), ["send x 6!", "finish x"])
        XCTAssertEqual(render(hub.historyLoaded(subscriber: "r", [Ev(6, terminal: true)])), ["finish r"])
        XCTAssertEqual(hub.subscriberCount, 0)
        XCTAssertEqual(hub.topicCount, 0)
    }

    /// Contract §4 item 3 (issue 24 item 8): an id above the activity's seq (from before a
    /// restore, or an id used again after retention) is answered as if none was given: the
    /// current snapshot, then live. It used to receive nothing, ever.
    func testLastEventIDAboveTheStoredSeqGetsTheSnapshotThenLive() {
        live(["x"], at: 5)
        XCTAssertEqual(subscribe("restored", after: 40), ["readHistory restored A after 5"])
        XCTAssertEqual(render(hub.historyLoaded(subscriber: "restored", [])), ["send restored 5"])
        XCTAssertTrue(hub.isLive("restored"))
        XCTAssertEqual(sortedRender(hub.published(topic: "A", Ev(6))), ["send restored 6", "send x 6"])
        // History past what this process heard, but still below the id: the newest is the snapshot.
        XCTAssertEqual(subscribe("behind", after: 40), ["readHistory behind A after 6"])
        XCTAssertEqual(sortedRender(hub.published(topic: "A", Ev(7))), ["send restored 7", "send x 7"], "behind buffers it")
        XCTAssertEqual(render(hub.historyLoaded(subscriber: "behind", [Ev(7), Ev(8)])), ["send behind 8"])
        XCTAssertEqual(render(hub.historyLoaded(subscriber: "behind", [Ev(9)])), [], "answered once")
    }

    /// The first subscriber of a topic, above the seq the snapshot read finds.
    func testLastEventIDAboveTheSnapshotOfANewTopic() {
        XCTAssertEqual(subscribe("a", after: 9), ["readSnapshot A"])
        XCTAssertEqual(snapshot(Ev(3)), ["readHistory a A after 3"])
        XCTAssertEqual(render(hub.historyLoaded(subscriber: "a", [])), ["send a 3"])
        XCTAssertEqual(publish(Ev(4)), ["send a 4"])
        // A finished activity is still answered 204 (contract §4 item 1), whatever the id.
        XCTAssertEqual(subscribe("done", "B", after: 20), ["readSnapshot B"])
        XCTAssertEqual(render(hub.snapshotLoaded(topic: "B", Ev(7, terminal: true))), ["noContent done"])
    }

    func testDuplicatesAndStaleEventsAreDropped() {
        live(["a"], at: 5)
        let table: [(Int64, [String])] = [
            (5, []), (4, []), (1, []), (6, ["send a 6"]), (6, []), (7, ["send a 7"]), (5, []), (7, []), (8, ["send a 8"]),
        ]
        for (seq, want) in table { XCTAssertEqual(publish(Ev(seq)), want, "publish \(seq)") }
    }

    func testGapTriggersHistoryReadAndResumesInOrder() {
        live(["a"], at: 5)
        XCTAssertEqual(publish(Ev(8)), ["readTopicHistory A after 5"])
        XCTAssertEqual(publish(Ev(9)), [], "held while resyncing")
        XCTAssertEqual(publish(Ev(8)), [])
        XCTAssertEqual(render(hub.topicHistoryLoaded(topic: "A", [Ev(6), Ev(7), Ev(8)])),
                       ["send a 6", "send a 7", "send a 8", "send a 9"])
        XCTAssertEqual(publish(Ev(10)), ["send a 10"])
    }

    func testHistoryThatStillHasAHoleReadsAgain() {
        live(["a"], at: 5)
        XCTAssertEqual(publish(Ev(9)), ["readTopicHistory A after 5"])
        XCTAssertEqual(render(hub.topicHistoryLoaded(topic: "A", [Ev(6)])), ["send a 6", "readTopicHistory A after 6"])
        XCTAssertEqual(render(hub.topicHistoryLoaded(topic: "A", [Ev(7), Ev(8), Ev(9)])), ["send a 7", "send a 8", "send a 9"])
    }

    /// A subscriber that arrives while its topic re-reads history is answered once the topic is synced.
    func testSubscribeWhileResyncing() {
        live(["a"], at: 5)
        _ = publish(Ev(7))
        XCTAssertEqual(subscribe("late"), [])
        XCTAssertEqual(subscribe("replay", after: 3), [])
        XCTAssertEqual(sortedRender(hub.topicHistoryLoaded(topic: "A", [Ev(6), Ev(7)])),
                       ["send a 6", "send a 7", "send late 5", "send late 6", "send late 7", "readHistory replay A after 3"])
        XCTAssertEqual(render(hub.historyLoaded(subscriber: "replay", [Ev(4), Ev(5), Ev(6), Ev(7)])), ["send replay 4,5,6,7"])
        XCTAssertEqual(sortedRender(hub.published(topic: "A", Ev(8))), ["send a 8", "send late 8", "send replay 8"])
    }

    func testListenRestoredRereadsEveryTopic() {
        live(["a"], at: 5, topic: "A")
        live(["b"], at: 2, topic: "B")
        _ = subscribe("c", "C")
        XCTAssertEqual(render(hub.listenRestored()).sorted(), ["readTopicHistory A after 5", "readTopicHistory B after 2"])
        XCTAssertEqual(render(hub.topicHistoryLoaded(topic: "A", [Ev(6), Ev(7)])), ["send a 6", "send a 7"])
        XCTAssertEqual(render(hub.topicHistoryLoaded(topic: "B", [])), [])
        XCTAssertEqual(render(hub.published(topic: "B", Ev(3))), ["send b 3"])
        // The loading topic re-reads after its snapshot, then answers its waiter.
        XCTAssertEqual(snapshot(Ev(1), "C"), ["readTopicHistory C after 1"])
        XCTAssertEqual(render(hub.topicHistoryLoaded(topic: "C", [Ev(2)])), ["send c 1", "send c 2"])
    }

    func testUnsubscribeIsIdempotent() {
        let read = hub.subscribe("a", topic: "A", lastEventID: nil)
        _ = subscribe("b", "B")
        _ = hub.snapshotLoaded(topic: "B", Ev(1))
        hub.unsubscribe("a")
        hub.unsubscribe("a")
        hub.unsubscribe("never")
        XCTAssertEqual(hub.subscriberCount, 1)
        XCTAssertEqual(hub.topicCount, 1, "a loading topic goes with its last subscriber")
        XCTAssertEqual(render(hub.snapshotLoaded(topic: "A", generation: token(read), Ev(1))), [], "the read's answer finds nobody")
        XCTAssertEqual(hub.topicCount, 1)
        hub.unsubscribe("b")
        hub.unsubscribe("b")
        XCTAssertEqual(hub.subscriberCount, 0)
        XCTAssertEqual(hub.topicCount, 0)
        XCTAssertEqual(publish(Ev(2), "B"), [])
        XCTAssertEqual(subscribe("a"), ["readSnapshot A"], "the same subscriber may come back")
    }

    func testPendingOverflowDropsTheTopic() {
        hub = TestHub(maxPendingEvents: 2)
        let read = hub.subscribe("a", topic: "A", lastEventID: nil)
        _ = subscribe("b")
        XCTAssertEqual(publish(Ev(1)), [])
        XCTAssertEqual(publish(Ev(2)), [])
        XCTAssertEqual(render(hub.published(topic: "A", Ev(3))).sorted(), ["drop a behind", "drop b behind"])
        XCTAssertEqual(hub.subscriberCount, 0)
        XCTAssertEqual(hub.topicCount, 0)
        // The dropped clients reconnect before the old read answers: a new topic reads its own
        // snapshot, and the old answer (from before the events that topic never heard) is ignored.
        XCTAssertEqual(subscribe("a2", after: 1), ["readSnapshot A"])
        XCTAssertEqual(publish(Ev(4)), [])
        XCTAssertEqual(render(hub.snapshotLoaded(topic: "A", generation: token(read), Ev(1))), [])
        XCTAssertEqual(snapshot(Ev(4)), ["readHistory a2 A after 1"])
        XCTAssertEqual(render(hub.historyLoaded(subscriber: "a2", [Ev(2), Ev(3), Ev(4)])), ["send a2 2,3,4"])
    }

    /// A client that leaves while the snapshot read runs, and one that comes after an event
    /// nobody here heard: the older read, from before that event, does not answer the newer topic.
    func testLeavingWhileLoadingIgnoresTheOldRead() {
        let old = hub.subscribe("a", topic: "A", lastEventID: nil)
        XCTAssertEqual(render(old), ["readSnapshot A"])
        hub.unsubscribe("a")
        XCTAssertEqual(hub.topicCount, 0)
        XCTAssertEqual(publish(Ev(5, terminal: true)), [], "committed while no topic exists")
        let new = hub.subscribe("b", topic: "A", lastEventID: nil)
        XCTAssertEqual(render(new), ["readSnapshot A"])
        XCTAssertEqual(render(hub.snapshotLoaded(topic: "A", generation: token(old), Ev(4))), [], "read before 5")
        XCTAssertEqual(render(hub.snapshotLoaded(topic: "A", generation: token(new), Ev(5, terminal: true))), ["send b 5!", "finish b"])
        XCTAssertEqual(hub.topicCount, 0)
        XCTAssertEqual(hub.subscriberCount, 0)
    }

    func testCatchUpBufferOverflowDropsOnlyThatSubscriber() {
        hub = TestHub(maxPendingEvents: 2)
        live(["fast"], at: 5)
        _ = subscribe("slow", after: 1)
        XCTAssertEqual(publish(Ev(6)), ["send fast 6"])
        XCTAssertEqual(publish(Ev(7)), ["send fast 7"])
        XCTAssertEqual(sortedRender(hub.published(topic: "A", Ev(8))), ["send fast 8", "drop slow behind"])
        XCTAssertFalse(hub.isSubscribed("slow"))
        XCTAssertEqual(render(hub.historyLoaded(subscriber: "slow", [Ev(2)])), [])
        XCTAssertEqual(hub.subscriberCount, 1)
    }

    func testReadFailures() {
        _ = subscribe("a")
        _ = subscribe("b")
        XCTAssertEqual(render(hub.readFailed(topic: "A")).sorted(), ["drop a read", "drop b read"])
        XCTAssertEqual(render(hub.readFailed(topic: "A")), [])
        XCTAssertEqual(hub.topicCount, 0)
        live(["x"], at: 5)
        _ = subscribe("r", after: 1)
        XCTAssertEqual(render(hub.readFailed(subscriber: "r")), ["drop r read"])
        XCTAssertEqual(render(hub.readFailed(subscriber: "r")), [], "dropped once")
        XCTAssertEqual(hub.subscriberCount, 1)
    }

    /// A history page that ends before what the topic already holds reads on from there.
    func testShortHistoryReadsTheRest() {
        live(["x"], at: 9)
        _ = subscribe("r", after: 1)
        XCTAssertEqual(render(hub.historyLoaded(subscriber: "r", [Ev(2), Ev(3)])), ["send r 2,3", "readHistory r A after 3"])
        XCTAssertEqual(render(hub.historyLoaded(subscriber: "r", [Ev(4), Ev(5), Ev(6), Ev(7), Ev(8), Ev(9)])), ["send r 4,5,6,7,8,9"])
    }

    /// A topic-history read that fails after its topic was removed is not the failure of a newer
    /// topic for the same activity: that topic's waiters stay, and its own read answers them.
    func testStaleTopicReadFailure() {
        live(["a"], at: 5)
        let history = hub.published(topic: "A", Ev(7))
        XCTAssertEqual(render(history), ["readTopicHistory A after 5"])
        hub.unsubscribe("a")
        let snapshotRead = hub.subscribe("b", topic: "A", lastEventID: nil)
        XCTAssertEqual(render(snapshotRead), ["readSnapshot A"])
        XCTAssertNotEqual(token(history), token(snapshotRead), "a new topic, a new token")
        XCTAssertEqual(render(hub.readFailed(topic: "A", generation: token(history))), [], "the old history read fails")
        XCTAssertEqual(hub.subscribers(of: "A"), ["b"], "b is not dropped")
        XCTAssertEqual(subscribe("c"), [], "joins b's read")
        XCTAssertEqual(publish(Ev(8, terminal: true)), [], "committed after b's read ran: held until it answers")
        XCTAssertEqual(sortedRender(hub.snapshotLoaded(topic: "A", generation: token(snapshotRead), Ev(7))),
                       ["send b 7", "send b 8!", "finish b", "send c 7", "send c 8!", "finish c"])
        XCTAssertEqual(hub.subscriberCount, 0)
        XCTAssertEqual(hub.topicCount, 0)
    }

    func testTerminalEventEndsEveryLiveStream() {
        live(["a", "b"], at: 5)
        XCTAssertEqual(sortedRender(hub.published(topic: "A", Ev(6, terminal: true))), ["send a 6!", "finish a", "send b 6!", "finish b"])
        XCTAssertEqual(hub.subscriberCount, 0)
        XCTAssertEqual(hub.topicCount, 0)
    }
}
