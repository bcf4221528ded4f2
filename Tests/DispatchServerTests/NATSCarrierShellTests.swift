import DispatchCore
import DispatchHarness
import DispatchIO
import DispatchSystem
import XCTest
@testable import DispatchServer

/// The NATS carrier's shell in one process: a fake NATS client the test delivers messages
/// through (as an attacker on the network could), the streams and feeds over a scripted
/// database, time on a manual loop. Whatever a message says, only what the database returns
/// reaches a client.
final class NATSCarrierShellTests: XCTestCase {
    final class FakeClient: CarrierClient {
        weak var delegate: NATSClientDelegate?
        var isConnected = false
        var credentialsRefused = false
        var connectedServer: String? { "nats://127.0.0.1:4222" }
        var subscribed: Set<String> = []
        var published: [(subject: String, payload: String)] = []

        func start() throws(SystemError) {
            isConnected = true
            delegate?.natsStatusChanged(.connected)
        }
        func close() { isConnected = false }
        func publish(_ subject: String, _ payload: [UInt8]) -> Bool {
            published.append((subject, String(decoding: payload, as: UTF8.self)))
            return true
        }
        func subscribe(_ subject: String) { subscribed.insert(subject) }
        func unsubscribe(_ subject: String) { subscribed.remove(subject) }

        /// A message as NATS would deliver it.
        func deliver(_ subject: String, _ payload: String) { delegate?.natsReceived(subject, Array(payload.utf8)) }
    }

    var fx: CarrierFixture!
    var client: FakeClient!
    var carrier: NATSCarrier!
    let subjects = CarrierSubjects(prefix: "dispatch")
    var loop: ManualLoop { fx.loop }
    var scripted: ScriptedDatabase { fx.scripted }
    var streams: StreamService { fx.streams }
    var feeds: FeedService { fx.feeds }
    var metrics: Metrics { fx.metrics }
    var pendingReads: [String] { fx.pendingReads }

    override func setUp() {
        fx = CarrierFixture()
        client = FakeClient()
        carrier = NATSCarrier(loop: fx.loop, client: client, settings: CarrierSettings(servers: ["nats://127.0.0.1:4222"]), db: fx.scripted.db,
                              changes: fx.changes, sequencer: nil, metrics: CarrierMetrics(), server: "host:1", log: fx.log, name: "w0")
        XCTAssertNoThrow(try carrier.start())
    }

    override func tearDown() {
        carrier.close()
        fx.tearDown()
    }

    func history(_ rows: [(id: String, seq: Int64, event: String, data: String)]) -> PGResult { fx.history(rows) }

    /// A live status stream on `id` at `seq`, whose activity's subject is listened to.
    func liveStream(_ id: String, seq: Int64) -> ScriptedStream {
        let s = fx.liveStream(id, seq: seq)
        XCTAssertTrue(client.subscribed.contains(subjects.activity(id)), "listens to what its streams follow")
        return s
    }

    func testACommitIsAnnouncedAsAHintWithoutItsSnapshot() {
        carrier.announce(activityID: "job", seq: 1, event: "queued")
        carrier.announce(activityID: "job", seq: 2, event: "processing")
        loop.runSoon()
        let sent = client.published.filter { !$0.subject.contains(".probe.") }
        XCTAssertEqual(sent.map(\.subject), [subjects.activity("job"), subjects.starts, subjects.activity("job"),
                                             subjects.sequencer + "." + CarrierSubjects.token("host:1")])
        XCTAssertEqual(sent.map(\.payload), ["1\tqueued", "job", "2\tprocessing", ""], "one wake-up per turn, no snapshot anywhere")
    }

    func testAForgedHintIsReadFromTheDatabaseAndSendsNothingThatWasNotCommitted() {
        let s = liveStream("job", seq: 3)
        client.deliver(subjects.activity("job"), "9\tcompleted")
        loop.runSoon()
        XCTAssertEqual(pendingReads, ["read_history"], "the hint only says where to look")
        scripted.answer(on: scripted.reader) { _ in self.history([]) }
        XCTAssertEqual(eventIDs(s), ["3"], "nothing committed after 3: nothing sent")
        XCTAssertNil(s.ending, "a forged final state ends nothing")
        // The real change that follows is not taken for a duplicate.
        client.deliver(subjects.activity("job"), "4\tprocessing")
        loop.runSoon()
        scripted.answer(on: scripted.reader) { _ in self.history([("job", 4, "processing", #"{"seq":4,"status":"real"}"#)]) }
        XCTAssertEqual(eventIDs(s), ["3", "4"])
        XCTAssertTrue(s.written.last?.contains(#""status":"real""#) == true)
    }

    func testOldFormatMessagesWithASnapshotAreRefusedAndReadNothing() {
        let s = liveStream("job", seq: 3)
        client.deliver(subjects.activity("job"), #"job\t4\tcompleted\t{"activityId":"job","state":"completed","seq":4}"#)
        client.deliver(subjects.feed, "F\t3\n4\tjob\t4\tcompleted\t{}\n")
        client.deliver(subjects.starts, "not an id!")
        loop.runSoon()
        XCTAssertEqual(pendingReads, [])
        XCTAssertEqual(eventIDs(s), ["3"])
        XCTAssertEqual(carrier.metrics.malformed, 3)
    }

    func testAllTheHintsOfATurnAreReadInOneStatement() {
        let streamsHeld = (0..<5).map { liveStream("job-\($0)", seq: 1) }
        for i in 0..<5 { client.deliver(subjects.activity("job-\(i)"), "2\tprocessing") }
        loop.runSoon()
        XCTAssertEqual(pendingReads, ["read_histories"], "one statement for the turn, not one per activity")
        scripted.answer(on: scripted.reader) { _ in self.history((0..<5).map { ("job-\($0)", 2, "processing", "{\"seq\":2}") }) }
        for s in streamsHeld { XCTAssertEqual(eventIDs(s), ["1", "2"]) }
        XCTAssertEqual(metrics.resyncBatches, 1)
    }

    func testHintsThatArriveWhileAReadIsOutShareTheNextRead() {
        let streamsHeld = (0..<4).map { liveStream("job-\($0)", seq: 1) }
        client.deliver(subjects.activity("job-0"), "2\tprocessing")
        loop.runSoon()
        XCTAssertEqual(pendingReads, ["read_history"], "at light load a hint is read at once")
        for i in 1..<4 { client.deliver(subjects.activity("job-\(i)"), "2\tprocessing") }
        loop.runSoon()
        XCTAssertEqual(pendingReads, ["read_history"], "nothing more goes out while a read is out")
        scripted.answer(on: scripted.reader) { _ in self.history([("job-0", 2, "processing", "{\"seq\":2}")]) }
        loop.runSoon()
        XCTAssertEqual(pendingReads, ["read_histories"], "the answer sends what waited, as one statement")
        scripted.answer(on: scripted.reader) { _ in self.history((1..<4).map { ("job-\($0)", 2, "processing", "{\"seq\":2}") }) }
        for s in streamsHeld { XCTAssertEqual(eventIDs(s), ["1", "2"]) }
        XCTAssertEqual(metrics.resyncBatches, 1)
    }

    func testAStartHintMakesAFinishedActivityOfTheSameIdBeReadAgain() {
        let done = liveStream("reused", seq: 1)
        streams.committed(activityID: "reused", seq: 2, name: "completed", json: "{\"seq\":2}")
        XCTAssertEqual(done.ending, .ended)
        let fromMemory = ScriptedStream()
        streams.open(fromMemory, activityID: "reused", lastEventID: nil, keyID: 1)
        XCTAssertEqual(pendingReads, [], "the final event is answered from memory")
        client.deliver(subjects.starts, "reused")
        let again = ScriptedStream()
        streams.open(again, activityID: "reused", lastEventID: nil, keyID: 1)
        XCTAssertEqual(pendingReads, ["read_activity"], "an id started elsewhere is read from the database again")
        scripted.answer(on: scripted.reader) { _ in activityRow("reused", state: .queued, seq: 1) }
        XCTAssertEqual(eventIDs(again), ["1"])
        XCTAssertNil(again.ending)
    }

    func testAForgedFeedPositionCostsOneReadAndFreezesNoFeed() {
        let f = ScriptedStream()
        feeds.open(f, filter: FeedFilter(), lastEventID: nil, invalidLastEventID: false, keyID: 1, extraHeaders: [])
        XCTAssertTrue(client.subscribed.contains(subjects.feed))
        XCTAssertEqual(pendingReads, ["carrier_waiting"], "the first read waits for what is being numbered")
        scripted.answer(on: scripted.reader) { _ in PGResult(columns: ["activity_id", "seq"], rows: []) }
        loop.runSoon()
        XCTAssertEqual(scripted.pending(on: scripted.feedReader), ["feed_initial_page"])
        scripted.answer(on: scripted.feedReader) { _ in
            PGResult(columns: ["head", "position", "event", "data", "machine"], rows: [["10", "10", "processing", "{}", nil]])
        }
        XCTAssertEqual(eventIDs(f), ["10", "10"], "the initial set, then synced")
        client.deliver(subjects.feed, "F\t9223372036854775806")
        loop.runSoon()
        XCTAssertEqual(scripted.pending(on: scripted.feedReader), ["feed_changes"])
        scripted.answer(on: scripted.feedReader) { _ in PGResult(columns: ["position", "event", "data", "machine"], rows: []) }
        loop.runSoon()
        XCTAssertEqual(feeds.head, 10, "the feed's place did not move")
        client.deliver(subjects.feed, "F\t11")
        loop.runSoon()
        XCTAssertEqual(scripted.pending(on: scripted.feedReader), ["feed_changes"], "a real hint after the forged one is read")
        scripted.answer(on: scripted.feedReader) { _ in PGResult(columns: ["position", "event", "data", "machine"], rows: [["11", "processing", "{}", nil]]) }
        loop.runSoon()
        XCTAssertEqual(eventIDs(f), ["10", "10", "11"])
    }

    func testASilentCarrierIsReportedAndStreamsReadFromTheDatabase() {
        let s = liveStream("job", seq: 3)
        XCTAssertTrue(carrier.isHealthy)
        // Probes go out and never come back.
        loop.advance(by: 3.5)
        XCTAssertTrue(client.published.contains { $0.subject.contains(".probe.") })
        XCTAssertFalse(carrier.isHealthy, "/readyz says so")
        XCTAssertEqual(carrier.metrics.stalls, 1)
        XCTAssertTrue(pendingReads.contains("read_history"), "every stream re-reads from where it was: \(pendingReads)")
        scripted.answer(on: scripted.reader) { name in
            name == "read_history" ? self.history([("job", 4, "processing", "{\"seq\":4}")]) : PGResult()
        }
        XCTAssertEqual(eventIDs(s), ["3", "4"])
        // A probe that comes back (with the process's own nonce) ends the stall.
        let probe = client.published.last { $0.subject.contains(".probe.") }!
        client.deliver(probe.subject, probe.payload)
        XCTAssertTrue(carrier.isHealthy)
    }
}
