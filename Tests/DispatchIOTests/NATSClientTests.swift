import DispatchCore
@testable import DispatchIO
import DispatchSystem
import DispatchTestSupport
import Glibc
import XCTest

/// NATSClient against real nats-server processes on loopback ports (NATSCluster), each test
/// driving one EventLoop: every callback must arrive on it, whatever the library's threads do.
final class NATSClientTests: XCTestCase {
    private let log = Logger(level: .error)

    /// What one client saw, in order, on the loop (its delegate: the test keeps it alive).
    final class Seen: NATSClientDelegate {
        var messages: [(subject: String, payload: String)] = []
        var statuses: [NATSClient.Status] = []
        var drops: [String] = []
        /// A test's own handling, instead of recording.
        var onMessage: ((String, [UInt8]) -> Void)?
        var onStatus: ((NATSClient.Status) -> Void)?
        func count(_ subject: String) -> Int { messages.filter { $0.subject == subject }.count }

        func natsReceived(_ subject: String, _ payload: [UInt8]) {
            if let onMessage { return onMessage(subject, payload) }
            messages.append((subject, String(decoding: payload, as: UTF8.self)))
        }

        func natsStatusChanged(_ status: NATSClient.Status) {
            if let onStatus { return onStatus(status) }
            statuses.append(status)
        }

        func natsDropped(_ reason: String) { drops.append(reason) }
    }

    private func client(_ loop: EventLoop, _ urls: [String], _ name: String, options: NATSClient.Options = .init()) -> (NATSClient, Seen) {
        let c = NATSClient(loop: loop, servers: urls, name: name, log: log, options: options)
        let seen = Seen()
        c.delegate = seen
        return (c, seen)
    }

    private func subject(_ id: String) -> String { "test.activity." + CarrierSubjects.token(id) }

    func testSubjectTokensRoundTripAndStayOneToken() {
        let ids = ["a", "job.1", "tenant:job-7_x", "a.b:c-d_e", "..", ":", "-", "_", "ünïcødé", "*", ">", " spaced id ",
                   "x.y.z:1:2:3", String(repeating: "long.", count: 25)]
        var tokens = Set<String>()
        for id in ids {
            let token = CarrierSubjects.token(id)
            XCTAssertTrue(!token.isEmpty && token.utf8.allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) },
                          "token \(token) of \(id) has a character a subject cannot hold")
            XCTAssertEqual(CarrierSubjects.id(fromToken: Substring(token)), id)
            tokens.insert(token)
        }
        XCTAssertEqual(tokens.count, ids.count, "two ids share a token")
        for bad in ["a.b", "*", ">", "A", "abc", "", "zz", "ff"] {
            XCTAssertNil(CarrierSubjects.id(fromToken: Substring(bad)), bad)
        }
    }

    func testURLsAreCheckedAndPublishBeforeStartFails() {
        let loop = EventLoop()
        for bad in ["http://127.0.0.1:4222", "127.0.0.1", "nats://127.0.0.1:0", "nats://127.0.0.1:99999", "nats://:4222"] {
            let c = NATSClient(loop: loop, servers: [bad], name: "bad", log: log)
            XCTAssertThrowsError(try c.start(), bad)
            c.close()
        }
        XCTAssertThrowsError(try NATSClient(loop: loop, servers: [], name: "none", log: log).start())
        let c = NATSClient(loop: loop, servers: ["nats://127.0.0.1:4222"], name: "idle", log: log)
        XCTAssertFalse(c.publish("x", [1]))
        XCTAssertEqual(c.figures.publishFailed, 1)
        c.close()
        c.close()
        XCTAssertFalse(c.publish("x", [1]))
    }

    /// A publisher on server 0 and a subscriber on server 2 of a 3-server cluster: the messages
    /// cross a route, arrive in order, on the loop's thread.
    func testRoundTripBetweenClusteredServers() throws {
        let cluster = try NATSCluster(size: 3)
        let loop = EventLoop()
        let (pub, _) = client(loop, [cluster.urls[0]], "pub")
        let (sub, seen) = client(loop, [cluster.urls[2]], "sub")
        let loopThread = pthread_self()
        var offLoop = 0
        seen.onMessage = { s, p in
            if pthread_equal(pthread_self(), loopThread) == 0 { offLoop += 1 }
            seen.messages.append((s, String(decoding: p, as: UTF8.self)))
        }
        try pub.start()
        try sub.start()
        XCTAssertTrue(pub.isConnected)
        let topic = subject("tenant:job.42")
        sub.subscribe(topic)
        sub.subscribe(topic)
        XCTAssertEqual(sub.subjects, [topic])
        XCTAssertTrue(cluster.waitForInterest(0, topic), "the subscription did not reach server 0 over the route")
        for i in 0..<500 { XCTAssertTrue(pub.publish(topic, Array("m\(i)".utf8))) }
        XCTAssertTrue(runLoop(loop, timeout: 20) { seen.messages.count >= 500 }, "received \(seen.messages.count)")
        XCTAssertEqual(seen.messages.map(\.payload), (0..<500).map { "m\($0)" })
        XCTAssertEqual(Set(seen.messages.map(\.subject)), [topic])
        XCTAssertEqual(CarrierSubjects.id(fromToken: seen.messages[0].subject.split(separator: ".").last!), "tenant:job.42")
        XCTAssertEqual(offLoop, 0)
        XCTAssertEqual(seen.statuses.first, .connected)
        XCTAssertEqual(pub.figures.messagesOut, 500)
        XCTAssertEqual(sub.figures.messagesIn, 500)
        XCTAssertEqual(sub.figures.dropped, 0)
        pub.close()
        sub.close()
    }

    /// After unsubscribe, nothing more on that subject reaches onMessage: not what the server
    /// sends later, and not what was already received and waiting for the loop.
    func testUnsubscribeStopsDelivery() throws {
        let cluster = try NATSCluster(size: 1)
        let loop = EventLoop()
        let (pub, _) = client(loop, cluster.urls, "pub")
        let (sub, seen) = client(loop, cluster.urls, "sub")
        try pub.start()
        try sub.start()
        let gone = subject("gone"), kept = subject("kept")
        sub.subscribe(gone)
        sub.subscribe(kept)
        XCTAssertTrue(cluster.waitForInterest(0, gone) && cluster.waitForInterest(0, kept))
        pub.publish(gone, Array("1".utf8))
        pub.publish(kept, Array("1".utf8))
        XCTAssertTrue(runLoop(loop, timeout: 10) { seen.count(kept) == 1 })
        XCTAssertEqual(seen.count(gone), 1)

        // Received by the library (maybe already in the hand-off queue) while the loop is away.
        pub.publish(gone, Array("2".utf8))
        pub.publish(kept, Array("2".utf8))
        XCTAssertTrue(waitFor(10) { sub.figures.messagesIn >= 4 })
        sub.unsubscribe(gone)
        sub.unsubscribe(gone)
        XCTAssertEqual(sub.subjects, [kept])
        pub.publish(gone, Array("3".utf8))
        pub.publish(kept, Array("3".utf8))
        XCTAssertTrue(runLoop(loop, timeout: 10) { seen.count(kept) == 3 })
        XCTAssertEqual(seen.messages.filter { $0.subject == gone }.map(\.payload), ["1"])
        XCTAssertTrue(waitFor(10) { !cluster.hasInterest(0, gone) }, "the server still routes the unsubscribed subject")
        pub.close()
        sub.close()
    }

    /// The server killed and started again: disconnected, then reconnected, and the client's
    /// interest is back without being asked (messages published after the restart arrive).
    func testServerRestartReconnectsAndRestoresSubscriptions() throws {
        let cluster = try NATSCluster(size: 1)
        let loop = EventLoop()
        var options = NATSClient.Options()
        options.reconnectWait = 0.05
        options.reconnectJitter = 0.02
        let (pub, pubSeen) = client(loop, cluster.urls, "pub", options: options)
        let (sub, seen) = client(loop, cluster.urls, "sub", options: options)
        try pub.start()
        try sub.start()
        let topic = subject("restart")
        sub.subscribe(topic)
        XCTAssertTrue(cluster.waitForInterest(0, topic))
        pub.publish(topic, Array("before".utf8))
        XCTAssertTrue(runLoop(loop, timeout: 10) { seen.messages.count == 1 })

        cluster.stop(0)
        XCTAssertTrue(runLoop(loop, timeout: 10) { seen.statuses.contains(.disconnected) && pubSeen.statuses.contains(.disconnected) })
        XCTAssertFalse(sub.isConnected)
        try cluster.start(0)
        XCTAssertTrue(runLoop(loop, timeout: 20) { seen.statuses.contains(.reconnected) && pubSeen.statuses.contains(.reconnected) },
                      "statuses \(seen.statuses)")
        XCTAssertEqual(seen.statuses, [.connected, .disconnected, .reconnected])
        XCTAssertTrue(sub.isConnected)
        XCTAssertTrue(cluster.waitForInterest(0, topic), "the subscription was not restored")
        pub.publish(topic, Array("after".utf8))
        XCTAssertTrue(runLoop(loop, timeout: 10) { seen.messages.count == 2 })
        XCTAssertEqual(seen.messages.map(\.payload), ["before", "after"])
        XCTAssertGreaterThanOrEqual(sub.figures.reconnects, 1)
        pub.close()
        sub.close()
    }

    /// NATS down at start: start() returns, subscriptions are kept, and the client connects
    /// and subscribes when a server appears.
    func testStartWithoutServerConnectsWhenOneAppears() throws {
        let cluster = try NATSCluster(size: 2)
        cluster.stopAll()
        let loop = EventLoop()
        var options = NATSClient.Options()
        options.reconnectWait = 0.05
        let (sub, seen) = client(loop, cluster.urls, "early", options: options)
        let topic = subject("early")
        sub.subscribe(topic)
        try sub.start()
        XCTAssertFalse(sub.isConnected)
        sub.subscribe(subject("second"))
        // Buffered until connected.
        XCTAssertTrue(sub.publish(topic, Array("own".utf8)))
        spin(loop, 0.2)
        XCTAssertEqual(seen.statuses, [])
        try cluster.start(1)
        XCTAssertTrue(runLoop(loop, timeout: 20) { seen.statuses == [.connected] }, "statuses \(seen.statuses)")
        XCTAssertTrue(sub.isConnected)
        XCTAssertTrue(cluster.waitForInterest(1, topic))
        XCTAssertTrue(cluster.waitForInterest(1, subject("second")))
        let (pub, _) = client(loop, [cluster.urls[1]], "late")
        try pub.start()
        pub.publish(topic, Array("hello".utf8))
        XCTAssertTrue(runLoop(loop, timeout: 10) { seen.messages.contains { $0.payload == "hello" } })
        pub.close()
        sub.close()
    }

    /// close() from inside onMessage, while the library's thread is still delivering a flood:
    /// it returns, and no callback runs after it.
    func testCloseInsideOnMessage() throws {
        let cluster = try NATSCluster(size: 1)
        let loop = EventLoop()
        let (pub, _) = client(loop, cluster.urls, "pub")
        let (sub, seen) = client(loop, cluster.urls, "closer")
        let (witness, witnessSeen) = client(loop, cluster.urls, "witness")
        try pub.start()
        try sub.start()
        try witness.start()
        let topic = subject("flood")
        var after = 0
        var closedAt: Int?
        seen.onMessage = { _, _ in
            if closedAt != nil { after += 1; return }
            closedAt = seen.messages.count
            seen.messages.append(("", ""))
            sub.close()
            sub.close()
        }
        seen.onStatus = { _ in if closedAt != nil { after += 1 } }
        sub.subscribe(topic)
        witness.subscribe(topic)
        XCTAssertTrue(cluster.waitForInterest(0, topic, count: 2))
        for i in 0..<2000 { pub.publish(topic, Array("m\(i)".utf8)) }
        // Each client's library thread hands over on its own: under load the witness can hold
        // all 2000 before the closer's thread has run once, so wait for both.
        XCTAssertTrue(runLoop(loop, timeout: 20) { witnessSeen.messages.count == 2000 && closedAt != nil })
        XCTAssertEqual(closedAt, 0)
        XCTAssertEqual(seen.messages.count, 1)
        XCTAssertFalse(sub.isConnected)
        XCTAssertFalse(sub.publish(topic, [1]))
        cluster.stop(0)
        XCTAssertTrue(runLoop(loop, timeout: 10) { witnessSeen.statuses.contains(.disconnected) })
        XCTAssertEqual(after, 0, "a callback ran after close")
        pub.close()
        witness.close()
    }

    /// A consumer that cannot keep up (a tiny pending limit, a flood while its loop is busy):
    /// onDropped says so, and every message is either delivered or counted as dropped.
    func testSlowConsumerReportsDropped() throws {
        let cluster = try NATSCluster(size: 1)
        let loop = EventLoop()
        var options = NATSClient.Options()
        options.pendingMessages = 10
        let (pub, _) = client(loop, cluster.urls, "pub")
        let (sub, seen) = client(loop, cluster.urls, "slow", options: options)
        try pub.start()
        try sub.start()
        let topic = subject("slow")
        sub.subscribe(topic)
        XCTAssertTrue(cluster.waitForInterest(0, topic))
        let total = 1000
        for i in 0..<total { pub.publish(topic, Array("m\(i)".utf8)) }
        // The loop is busy (this thread): everything arrives while nothing is handed over.
        XCTAssertTrue(waitFor(20) { sub.figures.messagesIn == total })
        XCTAssertTrue(runLoop(loop, timeout: 20) { !seen.drops.isEmpty && seen.messages.count + sub.figures.dropped == total },
                      "delivered \(seen.messages.count), dropped \(sub.figures.dropped)")
        XCTAssertLessThanOrEqual(seen.messages.count, 2 * options.pendingMessages)
        XCTAssertGreaterThan(sub.figures.dropped, 0)
        XCTAssertTrue(seen.drops.allSatisfy { $0.hasPrefix("slow consumer") }, "\(seen.drops)")
        // Delivered in order, gaps where the drops were.
        let numbers = seen.messages.map { Int($0.payload.dropFirst())! }
        XCTAssertEqual(numbers, numbers.sorted())
        // And it recovers: with the loop running, the next message arrives.
        pub.publish(topic, Array("m\(total)".utf8))
        XCTAssertTrue(runLoop(loop, timeout: 10) { seen.messages.last?.payload == "m\(total)" })
        pub.close()
        sub.close()
    }
}

extension NATSClientTests {
    func testServerSettingIsSplitAndChecked() throws {
        XCTAssertEqual(try NATSClient.servers(fromSetting: "nats://127.0.0.1:4222, nats://10.0.0.2:4223 ,"),
                       ["nats://127.0.0.1:4222", "nats://10.0.0.2:4223"])
        XCTAssertThrowsError(try NATSClient.servers(fromSetting: " , "))
        XCTAssertThrowsError(try NATSClient.servers(fromSetting: "nats://127.0.0.1:4222,redis://x:1"))
    }

    /// The server a client uses is killed: it fails over to another server of the cluster,
    /// takes its subscriptions there, and a publisher on a third server reaches it again.
    func testFailoverToAnotherServerOfTheCluster() throws {
        let cluster = try NATSCluster(size: 3)
        let loop = EventLoop()
        var options = NATSClient.Options()
        options.reconnectWait = 0.05
        options.randomize = false
        let sub = NATSClient(loop: loop, servers: cluster.urls, name: "roaming", log: Logger(level: .error), options: options)
        var statuses: [NATSClient.Status] = []
        var payloads: [String] = []
        let events = Seen()
        sub.delegate = events
        events.onStatus = { statuses.append($0) }
        events.onMessage = { payloads.append(String(decoding: $1, as: UTF8.self)) }
        try sub.start()
        let topic = "test.failover." + CarrierSubjects.token("job:1")
        sub.subscribe(topic)
        XCTAssertTrue(runLoop(loop, timeout: 10) { statuses == [.connected] })
        let first = try XCTUnwrap(cluster.urls.firstIndex(of: sub.connectedServer ?? ""), "connected to \(sub.connectedServer ?? "nothing")")
        XCTAssertEqual(first, 0, "not randomized: the first server given")
        let other = (first + 1) % 3
        let pub = NATSClient(loop: loop, servers: [cluster.urls[other]], name: "pub", log: Logger(level: .error))
        try pub.start()
        XCTAssertTrue(cluster.waitForInterest(other, topic))
        pub.publish(topic, Array("one".utf8))
        XCTAssertTrue(runLoop(loop, timeout: 10) { payloads == ["one"] })

        cluster.stop(first)
        // The interest `other` had through its route to `first` must be gone before asking for
        // interest again, or the old route would answer.
        XCTAssertTrue(waitFor(10) { cluster.routes(other) == 1 })
        XCTAssertTrue(runLoop(loop, timeout: 20) { statuses == [.connected, .disconnected, .reconnected] }, "statuses \(statuses)")
        let second = try XCTUnwrap(cluster.urls.firstIndex(of: sub.connectedServer ?? ""))
        XCTAssertNotEqual(second, first)
        XCTAssertTrue(cluster.waitForInterest(other, topic), "interest did not come back after the failover")
        pub.publish(topic, Array("two".utf8))
        XCTAssertTrue(runLoop(loop, timeout: 10) { payloads == ["one", "two"] })
        pub.close()
        sub.close()
    }
}

extension NATSClientTests {
    /// The owner lets go of the client inside onMessage (its last reference): the client goes
    /// away after the batch, closing itself, and the loop goes on.
    func testReleasedInsideOnMessage() throws {
        let cluster = try NATSCluster(size: 1)
        let loop = EventLoop()
        let log = Logger(level: .error)
        let pub = NATSClient(loop: loop, servers: cluster.urls, name: "pub", log: log)
        let witness = NATSClient(loop: loop, servers: cluster.urls, name: "witness", log: log)
        var owner: NATSClient? = NATSClient(loop: loop, servers: cluster.urls, name: "dropped", log: log)
        weak let released = owner
        var received = 0, witnessed = 0
        let ownerEvents = Seen(), witnessEvents = Seen()
        owner!.delegate = ownerEvents
        witness.delegate = witnessEvents
        ownerEvents.onMessage = { _, _ in received += 1; owner = nil }
        witnessEvents.onMessage = { _, _ in witnessed += 1 }
        try pub.start()
        try witness.start()
        try owner!.start()
        let topic = subject("release")
        owner!.subscribe(topic)
        witness.subscribe(topic)
        XCTAssertTrue(cluster.waitForInterest(0, topic, count: 2))
        for i in 0..<300 { pub.publish(topic, Array("m\(i)".utf8)) }
        XCTAssertTrue(runLoop(loop, timeout: 20) { witnessed == 300 && released == nil })
        XCTAssertGreaterThanOrEqual(received, 1)
        pub.publish(topic, Array("more".utf8))
        XCTAssertTrue(runLoop(loop, timeout: 10) { witnessed == 301 })
        pub.close()
        witness.close()
    }
}
