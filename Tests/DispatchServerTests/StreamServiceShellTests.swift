import DispatchCore
import DispatchHarness
import DispatchIO
import XCTest
@testable import DispatchServer

/// StreamService end to end inside one process with nothing real under it: its repository's
/// SQL goes to PGConnections on scripted libpq drivers (the test answers each statement with
/// rows), its clients are scripted streams, its clock a manual loop.
final class StreamServiceShellTests: XCTestCase {
    var loop: ManualLoop!
    var scripted: ScriptedDatabase!
    var service: StreamService!
    var metrics: Metrics!

    override func setUp() {
        loop = ManualLoop()
        metrics = Metrics(worker: 0)
        scripted = ScriptedDatabase(loop: loop, metrics: metrics)
        XCTAssertTrue(scripted.db.isReady)
        service = StreamService(loop: loop, activities: ActivityRepository(db: scripted.db), metrics: metrics, log: Logger(level: .error),
                                settings: .init(heartbeatSeconds: 4, maxBacklog: 64 * 1024, writeTimeout: 60))
    }

    override func tearDown() {
        service.shutdown()
        scripted.db.close()
        loop.runSoon()
        XCTAssertEqual(scripted.violations, [])
    }

    var reader: ScriptedPGDriver { scripted.reader }
    /// Statements sent so far, once the loop turn's deferred work ran (snapshots are read at
    /// the end of the turn their streams connected in).
    var pendingStatements: [String] {
        loop.runSoon()
        return scripted.pending(on: reader)
    }
    func answerReader(_ rows: (String) -> PGResult) {
        loop.runSoon()
        scripted.answer(on: reader, rows)
    }

    func ids(_ s: ScriptedStream) -> [String] { eventIDs(s) }

    /// Subscribe, read the snapshot, go live, deliver what commits, end at the final event;
    /// a later client of the finished activity is answered from memory, with no read.
    func testAStreamReadsItsSnapshotGoesLiveAndEndsAtTheFinalEvent() {
        let client = ScriptedStream()
        service.open(client, activityID: "job-1", lastEventID: nil, keyID: 1)
        XCTAssertEqual(pendingStatements, ["read_activity"])
        XCTAssertFalse(client.started, "headers wait for the snapshot")
        answerReader { _ in activityRow("job-1", state: .processing, seq: 3) }
        XCTAssertEqual(ids(client), ["3"])
        XCTAssertEqual(service.openStreams, 1)
        XCTAssertEqual(client.priority, .normal, "live changes are not bulk: a status stream keeps the loop's normal priority")

        service.committed(activityID: "job-1", seq: 4, name: "processing", json: "{\"seq\":4}")
        XCTAssertEqual(ids(client), ["3", "4"])
        service.committed(activityID: "job-1", seq: 4, name: "processing", json: "{\"seq\":4}")
        XCTAssertEqual(ids(client), ["3", "4"], "a change heard twice is sent once")
        service.committed(activityID: "job-1", seq: 5, name: "completed", json: "{\"seq\":5}")
        XCTAssertEqual(ids(client), ["3", "4", "5"])
        XCTAssertEqual(client.ending, .ended)
        XCTAssertEqual(service.openStreams, 0)
        XCTAssertEqual(metrics.streamCloses[.terminal], 1)

        let late = ScriptedStream()
        service.open(late, activityID: "job-1", lastEventID: nil, keyID: 1)
        XCTAssertEqual(pendingStatements, [], "the final event is in memory")
        XCTAssertEqual(ids(late), ["5"])
        XCTAssertEqual(late.ending, .ended)
        let caughtUp = ScriptedStream()
        service.open(caughtUp, activityID: "job-1", lastEventID: 5, keyID: 1)
        XCTAssertEqual(caughtUp.ending, .responded(204))
    }

    /// Streams that connect in one loop turn for live activities are checked against the
    /// database in one statement (`read_activities`, the ids as one array), one read per
    /// activity however many streams follow it; each is answered as a read of its own would
    /// be (snapshot, final event, not found). A stream of a later turn alone reads alone.
    func testSnapshotsOfOneTurnAreReadInOneStatement() {
        let a1 = ScriptedStream(), a2 = ScriptedStream(), b = ScriptedStream(), c = ScriptedStream()
        service.open(a1, activityID: "job-a", lastEventID: nil, keyID: 1)
        service.open(b, activityID: "job-b", lastEventID: nil, keyID: 1)
        service.open(a2, activityID: "job-a", lastEventID: nil, keyID: 1)
        service.open(c, activityID: "job-c", lastEventID: nil, keyID: 1)
        XCTAssertEqual(scripted.pending(on: reader), [], "nothing is read before the turn ends")
        XCTAssertEqual(pendingStatements, ["read_activities"])
        XCTAssertEqual(scripted.sessions[1].parameters(of: "read_activities"), ["{\"job-a\",\"job-b\",\"job-c\"}"])
        answerReader { _ in activityRows(activityRow("job-a", state: .processing, seq: 2), activityRow("job-c", state: .completed, seq: 4)) }
        XCTAssertEqual(ids(a1), ["2"])
        XCTAssertEqual(ids(a2), ["2"])
        XCTAssertTrue(a1.isOpen && a2.isOpen)
        XCTAssertEqual(ids(b), ["0"], "job-b has no row: not found")
        XCTAssertTrue(b.written.contains { $0.contains("event: not_found") }, "\(b.written)")
        XCTAssertFalse(b.isOpen)
        XCTAssertEqual(ids(c), ["4"])
        XCTAssertEqual(c.ending, .ended, "a finished activity's stream ends at its final event")
        XCTAssertEqual(service.openStreams, 2)

        let d = ScriptedStream()
        service.open(d, activityID: "job-d", lastEventID: nil, keyID: 1)
        XCTAssertEqual(pendingStatements, ["read_activity"], "one stream in a turn: the one-row statement")
        answerReader { _ in activityRow("job-d", state: .processing, seq: 7) }
        XCTAssertEqual(ids(d), ["7"])
    }

    /// A resuming client gets the history after its Last-Event-ID, then live changes, with
    /// no gap and no duplicate even when a change commits while the history is read.
    func testAResumeReadsTheHistoryThenGoesLiveWithoutAGap() {
        let client = ScriptedStream()
        service.open(client, activityID: "job-2", lastEventID: 1, keyID: 1)
        answerReader { _ in activityRow("job-2", state: .processing, seq: 3) }
        XCTAssertEqual(pendingStatements, ["read_history"])
        service.committed(activityID: "job-2", seq: 4, name: "processing", json: "{}")
        answerReader { _ in
            PGResult(columns: ["seq", "event", "data", "created_ms"], rows: [["2", "processing", "{}", "1"], ["3", "processing", "{}", "2"]])
        }
        XCTAssertEqual(ids(client), ["2", "3", "4"])
        service.committed(activityID: "job-2", seq: 5, name: "processing", json: "{}")
        XCTAssertEqual(ids(client), ["2", "3", "4", "5"])
    }

    /// The database goes away while a stream waits for its snapshot: the client gets 503
    /// (nothing was sent yet) and the stream is gone.
    func testTheDatabaseLostBeforeTheSnapshotAnswers503() {
        let client = ScriptedStream()
        service.open(client, activityID: "job-3", lastEventID: nil, keyID: 1)
        loop.runSoon()
        reader.breakConnection()
        loop.runSoon()
        XCTAssertEqual(client.ending, .responded(503))
        XCTAssertEqual(service.openStreams, 0)
        XCTAssertEqual(metrics.streamCloses[.database], 1)
    }

    /// A client that leaves while its snapshot is read: the late answer reaches nobody.
    func testAClientLeavingBeforeItsSnapshotIsForgotten() {
        let client = ScriptedStream()
        service.open(client, activityID: "job-4", lastEventID: nil, keyID: 1)
        client.peerLeaves()
        XCTAssertEqual(service.openStreams, 0)
        answerReader { _ in activityRow("job-4", state: .processing, seq: 1) }
        XCTAssertEqual(client.written, [])
        XCTAssertEqual(metrics.streamCloses[.clientClosed], 1)
    }

    /// While a snapshot read is out, the streams of later turns wait for its answer and then
    /// share one statement: a connect burst costs a few round trips, not one per turn.
    func testSnapshotsWaitWhileAReadIsOutThenGoAsOneStatement() {
        let first = ScriptedStream()
        service.open(first, activityID: "job-a", lastEventID: nil, keyID: 1)
        XCTAssertEqual(pendingStatements, ["read_activity"])
        let b = ScriptedStream(), c = ScriptedStream()
        service.open(b, activityID: "job-b", lastEventID: nil, keyID: 1)
        XCTAssertEqual(pendingStatements, ["read_activity"], "a later turn's snapshot waits for the read that is out")
        service.open(c, activityID: "job-c", lastEventID: nil, keyID: 1)
        XCTAssertEqual(pendingStatements, ["read_activity"])
        answerReader { _ in activityRow("job-a", state: .processing, seq: 2) }
        XCTAssertEqual(ids(first), ["2"])
        XCTAssertEqual(pendingStatements, ["read_activities"], "the answer sends what waited, as one statement")
        XCTAssertEqual(scripted.sessions[1].parameters(of: "read_activities"), ["{\"job-b\",\"job-c\"}"])
        answerReader { _ in activityRows(activityRow("job-b", state: .processing, seq: 3), activityRow("job-c", state: .processing, seq: 4)) }
        XCTAssertEqual(ids(b), ["3"])
        XCTAssertEqual(ids(c), ["4"])
        XCTAssertEqual(pendingStatements, [])

        // A failed read lets the next go too.
        let d = ScriptedStream(), e = ScriptedStream()
        service.open(d, activityID: "job-d", lastEventID: nil, keyID: 1)
        XCTAssertEqual(pendingStatements, ["read_activity"])
        service.open(e, activityID: "job-e", lastEventID: nil, keyID: 1)
        answerReader { _ in PGResult(errorMessage: "canceling statement due to statement timeout", sqlState: "57014") }
        XCTAssertEqual(d.ending, .responded(503))
        XCTAssertEqual(pendingStatements, ["read_activity"], "the waiting snapshot is read once the failed one answered")
        answerReader { _ in activityRow("job-e", state: .processing, seq: 1) }
        XCTAssertEqual(ids(e), ["1"])
    }

    /// The service goes away (a worker's shutdown) while snapshot reads are out, batched or
    /// alone: their late answers reach nothing and crash nothing.
    func testSnapshotAnswersAfterTheServiceIsGoneAreDropped() {
        let a = ScriptedStream(), b = ScriptedStream()
        service.open(a, activityID: "job-a", lastEventID: nil, keyID: 1)
        service.open(b, activityID: "job-b", lastEventID: nil, keyID: 1)
        XCTAssertEqual(pendingStatements, ["read_activities"])
        let waiting = ScriptedStream()
        service.open(waiting, activityID: "job-c", lastEventID: nil, keyID: 1)
        XCTAssertEqual(pendingStatements, ["read_activities"], "job-c waits for the read that is out")
        service.shutdown()
        weak var gone = service
        service = StreamService(loop: loop, activities: ActivityRepository(db: scripted.db), metrics: metrics, log: Logger(level: .error),
                                settings: .init(heartbeatSeconds: 4, maxBacklog: 64 * 1024, writeTimeout: 60))
        XCTAssertNil(gone, "nothing but its owner holds the service")
        answerReader { _ in activityRow("job-a", state: .processing, seq: 2) }
        XCTAssertEqual(ids(a) + ids(b) + ids(waiting), [])
        XCTAssertEqual(pendingStatements, [], "what waited went with the service")

        let lone = ScriptedStream()
        service.open(lone, activityID: "job-d", lastEventID: nil, keyID: 1)
        XCTAssertEqual(pendingStatements, ["read_activity"])
        service.shutdown()
        weak var alsoGone = service
        service = StreamService(loop: loop, activities: ActivityRepository(db: scripted.db), metrics: metrics, log: Logger(level: .error),
                                settings: .init(heartbeatSeconds: 4, maxBacklog: 64 * 1024, writeTimeout: 60))
        XCTAssertNil(alsoGone)
        answerReader { _ in activityRow("job-d", state: .processing, seq: 5) }
        XCTAssertEqual(ids(lone), [])
    }

    /// The reader session is lost with a snapshot read out and another waiting: both streams
    /// get 503, and once the session is back the next stream is read (no read stays "out").
    func testASessionLostWithAReadOutAndOneWaitingAnswersBothAndReadsAgain() {
        let out = ScriptedStream(), waiting = ScriptedStream()
        service.open(out, activityID: "job-a", lastEventID: nil, keyID: 1)
        XCTAssertEqual(pendingStatements, ["read_activity"])
        service.open(waiting, activityID: "job-b", lastEventID: nil, keyID: 1)
        XCTAssertEqual(pendingStatements, ["read_activity"])
        scripted.sessions[1].connectionLost()
        loop.runSoon()
        loop.runSoon()
        XCTAssertEqual(out.ending, .responded(503))
        XCTAssertEqual(waiting.ending, .responded(503), "its read failed on the lost session too")

        loop.advance(by: 5)  // the session reconnects
        reader.socketReady()
        loop.runSoon()
        let later = ScriptedStream()
        service.open(later, activityID: "job-c", lastEventID: nil, keyID: 1)
        XCTAssertEqual(pendingStatements, ["read_activity"])
        answerReader { _ in activityRow("job-c", state: .processing, seq: 2) }
        XCTAssertEqual(ids(later), ["2"])
    }

    /// A connect storm larger than one statement's ids goes out in statements of at most
    /// `maxSnapshotBatch` ids, one after the other.
    func testAStormIsReadInBoundedStatements() {
        let first = ScriptedStream()
        service.open(first, activityID: "job-0", lastEventID: nil, keyID: 1)
        XCTAssertEqual(pendingStatements, ["read_activity"])
        let n = StreamService.maxSnapshotBatch + 5
        let storm = (1...n).map { _ in ScriptedStream() }
        for (i, s) in storm.enumerated() { service.open(s, activityID: "job-\(i + 1)", lastEventID: nil, keyID: 1) }
        answerReader { _ in activityRow("job-0", state: .processing, seq: 1) }
        XCTAssertEqual(pendingStatements, ["read_activities"])
        XCTAssertEqual(scripted.sessions[1].parameters(of: "read_activities")?.first??.split(separator: ",").count,
                       StreamService.maxSnapshotBatch)
        answerReader { _ in activityRow("job-1", state: .processing, seq: 3) }
        XCTAssertEqual(ids(storm[0]), ["3"])
        XCTAssertEqual(pendingStatements, ["read_activities"], "the rest, once the first answered")
        XCTAssertEqual(scripted.sessions[1].parameters(of: "read_activities")?.first??.split(separator: ",").count, 5)
    }

    /// Idle streams get heartbeats on the stepped clock; revoking the key aborts them.
    func testHeartbeatsThenRevocation() {
        let client = ScriptedStream()
        service.open(client, activityID: "job-5", lastEventID: nil, keyID: 9)
        answerReader { _ in activityRow("job-5", state: .processing, seq: 1) }
        loop.advance(by: 3.5)
        XCTAssertEqual(client.written.filter { $0.hasPrefix(": heartbeat") }.count, 1)
        service.closeStreams(ofKey: 9)
        XCTAssertEqual(client.ending, .aborted)
        XCTAssertEqual(service.keysWithStreams, [])
    }
}
