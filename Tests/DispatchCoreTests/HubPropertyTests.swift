import Foundation
import XCTest
@testable import DispatchCore

/// Seeded random interleavings of the hub's inputs against a model database.
///
/// Knobs: `DISPATCH_PROPERTY_SEEDS` (how many seeds, default 200), `DISPATCH_PROPERTY_SEED`
/// (run only that one seed, to replay a failure reported as "seed N") and
/// `DISPATCH_PROPERTY_TRACE=1` (print that run's inputs and the hub's actions). Set
/// `SWIFT_DETERMINISTIC_HASHING=1` too when replaying: the hub iterates sets.
final class HubPropertyTests: XCTestCase {
    func testRandomInterleavingsKeepEveryStreamConsecutive() {
        let seeds: [UInt64]
        if let one = ProcessInfo.processInfo.environment["DISPATCH_PROPERTY_SEED"].flatMap(UInt64.init) {
            seeds = [one]
        } else {
            seeds = (0..<UInt64(environmentInt("DISPATCH_PROPERTY_SEEDS", default: 200))).map { $0 &* 7919 &+ 1 }
        }
        var failed = 0
        var delivered = 0
        for seed in seeds {
            var world = HubWorld(seed: seed)
            world.trace = ProcessInfo.processInfo.environment["DISPATCH_PROPERTY_TRACE"] == "1"
            world.run(steps: 300)
            delivered += world.deliveredCount
            if let failure = world.failure {
                failed += 1
                if failed <= 5 { XCTFail("seed \(seed): \(failure)") }
            }
        }
        XCTAssertEqual(failed, 0, "\(failed) of \(seeds.count) seeds failed")
        XCTAssertGreaterThan(delivered, seeds.count * 5, "the runs exercised delivery")
    }
}

struct PEv: HubEvent, Equatable {
    let topic: String
    let seq: Int64
    let isTerminal: Bool
}

/// One simulated process: a hub, the database it reads, the notifications it hears, and clients.
struct HubWorld {
    enum Read {
        // `lifetime` is the model's own count of the topic's lives, to check what a failure drops.
        case snapshot(String, generation: UInt64, lifetime: Int)
        case topicHistory(String, generation: UInt64, lifetime: Int, after: Int64)
        case history(Int, String, after: Int64)
    }

    enum Answer {
        case snapshot(PEv?)
        case events([PEv])
        case failed
    }

    enum Outcome { case finished, noContent, notFound, closed, gaveUp }

    struct Client {
        let topic: String
        var subscription: Int
        var lastEventID: Int64?
        var delivered: [Int64] = []
        var outcome: Outcome?
        var reconnects = 0
    }

    var rng: SeededGenerator
    var hub: Hub<Int, PEv>
    let topics: [String]
    var db: [String: [PEv]] = [:]
    var notifications: [PEv] = []
    var listenLost = false
    var reads: [(Read, Answer?)] = []
    var clients: [Client] = []
    var clientOf: [Int: Int] = [:]
    /// A topic's life on the hub runs from a subscribe to it while it has no subscribers until
    /// it has none again; a subscription belongs to the life it joined.
    var lifetime: [String: Int] = [:]
    var lifetimeOf: [Int: Int] = [:]
    var lifetimes = 0
    var nextSubscription = 1
    var failure: String?
    var deliveredCount = 0
    var trace = false

    func log(_ line: @autoclosure () -> String) { if trace { print(line()) } }

    init(seed: UInt64) {
        rng = SeededGenerator(seed: seed)
        hub = Hub(maxPendingEvents: [2, 4, 1024][Int(seed % 3)])
        topics = Array(["t0", "t1", "t2"].prefix(1 + Int(seed / 3 % 3)))
        for t in topics { db[t] = [] }
    }

    mutating func chance(_ p: Double) -> Bool { Double.random(in: 0..<1, using: &rng) < p }

    mutating func run(steps: Int) {
        for _ in 0..<steps where failure == nil { step() }
        if failure == nil { settle() }
    }

    mutating func step() {
        switch Int.random(in: 0..<100, using: &rng) {
        case 0..<20: commit()
        case 20..<45: deliverNotification()
        case 45..<57: subscribeNewClient()
        case 57..<61: closeRandomClient()
        case 61..<78: executeRead()
        case 78..<96: answerRead()
        default:
            if listenLost || chance(0.2) {
                listenLost = false
                log("listenRestored")
                perform(hub.listenRestored())
            }
        }
    }

    // MARK: - The database and its notifications

    mutating func commit(terminal forceTerminal: Bool = false, lossless: Bool = false) {
        let open = topics.filter { db[$0]?.last?.isTerminal != true }
        guard let topic = open.randomElement(using: &rng) else { return }
        let seq = Int64(db[topic]!.count + 1)
        let e = PEv(topic: topic, seq: seq, isTerminal: forceTerminal || (seq > 1 && chance(0.06)))
        db[topic]!.append(e)
        log("commit \(topic) \(seq)\(e.isTerminal ? "!" : "")")
        if !lossless && chance(0.04) {
            log("    (notification lost)")
            listenLost = true  // the LISTEN session missed it; a restore follows later
            return
        }
        notifications.append(e)
        if !lossless && chance(0.15) { notifications.append(e) }  // own publish and NOTIFY both arrive
    }

    mutating func deliverNotification() {
        guard !notifications.isEmpty else { return }
        // Reordered within a small window, as separate connections deliver them.
        let i = Int.random(in: 0..<min(4, notifications.count), using: &rng)
        let e = notifications.remove(at: i)
        log("published \(e.topic) \(e.seq)\(e.isTerminal ? "!" : "")")
        perform(hub.published(topic: e.topic, e))
    }

    mutating func executeRead() {
        let waiting = reads.indices.filter { reads[$0].1 == nil }
        guard let i = waiting.randomElement(using: &rng) else { return }
        // Any read may fail, including one whose topic is gone by the time it answers: its
        // generation keeps it from touching a newer topic (HubTests.testStaleTopicReadFailure).
        reads[i].1 = chance(0.02) ? .failed : answer(reads[i].0)
    }

    func answer(_ read: Read) -> Answer {
        switch read {
        case .snapshot(let t, _, _): return .snapshot(db[t]!.last)
        case .topicHistory(let t, _, _, let after), .history(_, let t, let after): return .events(db[t]!.filter { $0.seq > after })
        }
    }

    mutating func answerRead() {
        let ready = reads.indices.filter { reads[$0].1 != nil }
        guard let i = ready.randomElement(using: &rng) else { return }
        let (read, answer) = reads.remove(at: i)
        deliver(read, answer!)
    }

    mutating func deliver(_ read: Read, _ answer: Answer) {
        log("answer \(read) -> \(answer)")
        switch (read, answer) {
        case (.snapshot(let t, let g, let life), .failed), (.topicHistory(let t, let g, let life, _), .failed):
            let actions = hub.readFailed(topic: t, generation: g)
            for case .drop(let s, _) in actions where lifetimeOf[s] != life {
                return fail("a failed read of \(t)'s life \(life) dropped subscription \(s) of life \(String(describing: lifetimeOf[s]))")
            }
            perform(actions)
        case (.history(let s, _, _), .failed): perform(hub.readFailed(subscriber: s))
        case (.snapshot(let t, let g, _), .snapshot(let e)): perform(hub.snapshotLoaded(topic: t, generation: g, e))
        case (.topicHistory(let t, let g, _, _), .events(let es)): perform(hub.topicHistoryLoaded(topic: t, generation: g, es))
        case (.history(let s, _, _), .events(let es)): perform(hub.historyLoaded(subscriber: s, es))
        default: fail("a read answered with the wrong kind of answer")
        }
    }

    // MARK: - Clients

    mutating func subscribeNewClient() {
        let topic = topics.randomElement(using: &rng)!
        let count = Int64(db[topic]!.count)
        let after: Int64? = chance(0.5) ? nil : Int64.random(in: 0...count, using: &rng)
        clients.append(Client(topic: topic, subscription: 0, lastEventID: after))
        connect(clients.count - 1)
    }

    mutating func connect(_ c: Int) {
        let s = nextSubscription
        nextSubscription += 1
        clients[c].subscription = s
        clientOf[s] = c
        log("subscribe \(s) (client \(c)) \(clients[c].topic) after \(String(describing: clients[c].lastEventID))")
        let topic = clients[c].topic
        if hub.subscribers(of: topic).isEmpty {
            lifetimes += 1
            lifetime[topic] = lifetimes
        }
        lifetimeOf[s] = lifetime[topic]
        perform(hub.subscribe(s, topic: topic, lastEventID: clients[c].lastEventID))
    }

    mutating func closeRandomClient() {
        let open = clients.indices.filter { clients[$0].outcome == nil }
        guard let c = open.randomElement(using: &rng) else { return }
        clients[c].outcome = .closed
        log("unsubscribe \(clients[c].subscription)")
        hub.unsubscribe(clients[c].subscription)
        if chance(0.3) { hub.unsubscribe(clients[c].subscription) }  // two teardown paths at once
    }

    /// The client's current subscription, or nil (and a failure) when an action names an old one.
    mutating func client(for s: Int, _ what: String) -> Int? {
        guard let c = clientOf[s] else { fail("\(what) for unknown subscription \(s)"); return nil }
        guard clients[c].subscription == s, clients[c].outcome == nil else {
            fail("\(what) for subscription \(s) after it ended (\(String(describing: clients[c].outcome)))")
            return nil
        }
        return c
    }

    func terminalSeq(_ topic: String) -> Int64? {
        db[topic]!.last.flatMap { $0.isTerminal ? $0.seq : nil }
    }

    mutating func perform(_ actions: [Hub<Int, PEv>.Action]) {
        for action in actions { log("    \(action)") }
        for action in actions where failure == nil {
            switch action {
            case .readSnapshot(let t, let g): reads.append((.snapshot(t, generation: g, lifetime: lifetime[t] ?? 0), nil))
            case .readTopicHistory(let t, let g, let after):
                reads.append((.topicHistory(t, generation: g, lifetime: lifetime[t] ?? 0, after: after), nil))
            case .readHistory(let s, let t, let after):
                guard let c = client(for: s, "readHistory") else { return }
                if t != clients[c].topic { return fail("readHistory of \(t) for a client of \(clients[c].topic)") }
                reads.append((.history(s, t, after: after), nil))
            case .send(let s, let events):
                guard let c = client(for: s, "send") else { return }
                for e in events { receive(c, e) }
            case .finish(let s):
                guard let c = client(for: s, "finish") else { return }
                clients[c].outcome = .finished
                guard let final = terminalSeq(clients[c].topic) else { return fail("finish before the activity ended") }
                if let last = clients[c].delivered.last {
                    if last != final { fail("finish after \(last), but the final event is \(final)") }
                } else if (clients[c].lastEventID ?? 0) < final {
                    fail("finish without the final event \(final) (Last-Event-ID \(String(describing: clients[c].lastEventID)))")
                }
            case .noContent(let s):
                guard let c = client(for: s, "noContent") else { return }
                clients[c].outcome = .noContent
                let have = clients[c].delivered.last ?? clients[c].lastEventID ?? -1
                // Contract §9: a reconnect (Last-Event-ID) to an activity unknown when it was
                // read is answered 204 too; a client that got events never is, unless finished.
                if clients[c].delivered.isEmpty && clients[c].lastEventID != nil && terminalSeq(clients[c].topic) == nil { continue }
                guard let final = terminalSeq(clients[c].topic), have >= final else {
                    return fail("204 for a client at \(have) of \(clients[c].topic) (\(db[clients[c].topic]!.count) events)")
                }
            case .notFound(let s):
                guard let c = client(for: s, "notFound") else { return }
                clients[c].outcome = .notFound
                if !clients[c].delivered.isEmpty { fail("not_found after events were delivered") }
            case .drop(let s, _):
                guard let c = client(for: s, "drop") else { return }
                // The client reconnects with Last-Event-ID, like an EventSource.
                clients[c].reconnects += 1
                if clients[c].reconnects > 40 { clients[c].outcome = .gaveUp; continue }
                if let last = clients[c].delivered.last { clients[c].lastEventID = last }
                connect(c)
            }
        }
    }

    mutating func receive(_ c: Int, _ e: PEv) {
        let client = clients[c]
        deliveredCount += 1
        guard e.topic == client.topic, e.seq >= 1, e.seq <= Int64(db[e.topic]!.count), db[e.topic]![Int(e.seq) - 1] == e else {
            return fail("delivered \(e), which the database does not hold")
        }
        if let last = client.delivered.last {
            if e.seq != last + 1 { return fail("delivered \(e.seq) after \(last): \(client.delivered.suffix(5))") }
        } else if let after = client.lastEventID, e.seq != after + 1 {
            return fail("first event \(e.seq) after Last-Event-ID \(after)")
        }
        if client.delivered.last.map({ db[client.topic]![Int($0) - 1].isTerminal }) == true {
            return fail("delivered \(e.seq) after the final event")
        }
        clients[c].delivered.append(e.seq)
    }

    mutating func fail(_ message: String) {
        if failure == nil { failure = message }
    }

    // MARK: - Quiescence

    /// Every activity ends; every notification and read is delivered; LISTEN is restored. Then
    /// every client must have reached an end, and the hub must hold nothing.
    mutating func settle() {
        while topics.contains(where: { db[$0]?.last?.isTerminal != true }) { commit(terminal: true, lossless: true) }
        var rounds = 0
        while failure == nil {
            rounds += 1
            if rounds > 100_000 { return fail("no quiescence") }
            if !notifications.isEmpty {
                let e = notifications.removeFirst()
                perform(hub.published(topic: e.topic, e))
            } else if !reads.isEmpty {
                let (read, answer) = reads.removeFirst()
                deliver(read, answer ?? self.answer(read))
            } else if listenLost {
                listenLost = false
                log("listenRestored")
                perform(hub.listenRestored())
            } else {
                break
            }
        }
        guard failure == nil else { return }
        for (i, c) in clients.enumerated() where c.outcome == nil {
            return fail("client \(i) of \(c.topic) (Last-Event-ID \(String(describing: c.lastEventID))) is stuck after "
                        + "\(c.delivered.suffix(5)); the activity has \(db[c.topic]!.count) events")
        }
        if hub.subscriberCount != 0 || hub.topicCount != 0 {
            fail("the hub still holds \(hub.subscriberCount) subscribers and \(hub.topicCount) topics")
        }
    }
}
