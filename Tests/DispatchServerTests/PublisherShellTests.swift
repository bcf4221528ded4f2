import DispatchCore
import DispatchHarness
import DispatchIO
import XCTest
@testable import DispatchServer

/// The publish path's shell in one process: its three sessions on scripted libpq drivers, time
/// on a manual loop and an injected millisecond clock. What it reads and writes, what it
/// announces and in which order, and its failure paths: a writer lost mid-batch, a reader lost
/// mid-read, a batch refused or rolled back, a late answer after close, a completion that
/// submits again while actions run.
final class PublisherShellTests: XCTestCase {
    var loop: ManualLoop!
    var metrics: Metrics!
    var scripted: ScriptedDatabase!
    var publisher: Publisher!
    var clockMs: Int64 = 1_790_000_000_000
    /// What the shell did, in order: `announce id seq position` and `answer id outcome`.
    var journal: [String] = []
    var kicks = 0

    var writer: ScriptedSession { scripted.sessions[0] }
    var reader: ScriptedSession { scripted.sessions[1] }

    override func setUp() {
        loop = ManualLoop()
        metrics = Metrics(worker: 0)
        scripted = ScriptedDatabase(loop: loop, metrics: metrics)
        loop.runSoon()
        publisher = Publisher(loop: loop, db: scripted.db, log: Logger(level: .error), metrics: metrics, defaultStaleAfter: 0,
                              now: { [unowned self] in self.clockMs })
        // As the worker wires it.
        scripted.db.writer.onReady = { [unowned self] in self.publisher.writerReady() }
        scripted.db.writer.onLost = { [unowned self] _ in self.publisher.writerLost() }
        publisher.delegate = self
        XCTAssertTrue(scripted.db.writer.isReady)
        publisher.writerReady()
    }

    override func tearDown() {
        scripted.db.close()
        loop.runSoon()
        XCTAssertEqual(scripted.violations, [])
    }

    // MARK: - Ops and rows

    func start(_ id: String) -> PublishOp {
        PublishOp(activityID: id, kind: .start(StartCommand(taskName: "build \(id)", state: .processing)), ownerKeyID: 1,
                  access: .startedBy(keyID: 1))
    }

    func update(_ id: String, _ progress: Double) -> PublishOp {
        PublishOp(activityID: id, kind: .update(UpdateCommand(progress: .set(progress))), ownerKeyID: 1, access: .startedBy(keyID: 1))
    }

    /// Submits `op`; its outcome goes to the journal as `answer id outcome`.
    func submit(_ op: PublishOp, then: (() -> Void)? = nil) {
        publisher.submit(op) { [unowned self] outcome in
            self.journal.append("answer \(op.activityID) \(Self.describe(outcome))")
            then?()
        }
    }

    static func describe(_ outcome: PublishOp.Outcome) -> String {
        switch outcome {
        case .ok: return "ok"
        case .committed(_, let created): return created ? "created" : "committed"
        case .replay: return "replay"
        case .failed(let e): return e.code.rawValue
        }
    }

    /// Answers every read waiting on the reader (each its own round trip): each activity in
    /// `seqs` at its seq, the others absent.
    func answerReads(_ seqs: [String: Int64]) {
        XCTAssertTrue(reader.pending.first.map(PublishScript.isRead) ?? false, "a read was waiting")
        while let name = reader.pending.first, PublishScript.isRead(name) {
            reader.answerNext { name, params in
                PublishScript.answerRead(name, params) { id, _ in seqs[id].map { PublishScript.stored(id, seq: $0) } }
            }
        }
        loop.runSoon()
    }

    /// Answers the writer's oldest batch as a commit (see `PublishScript.commit`).
    func answerCommit(applied: [String], firstPosition: Int64 = 41, pushes: Int = 0) {
        XCTAssertTrue(writer.answerNext(PublishScript.commit(applied: applied, firstPosition: firstPosition, pushes: pushes)), "a batch was waiting")
        loop.runSoon()
    }

    /// Answers the writer's oldest batch as the database rejecting its writes.
    func answerRejected(_ message: String, sqlState: String) {
        XCTAssertTrue(writer.answerNext(PublishScript.rejected(message, sqlState: sqlState)), "a batch was waiting")
        loop.runSoon()
    }

    // MARK: - Happy paths

    func testAStartIsOneBatchAnnouncedBeforeItsPublisherIsAnswered() {
        submit(start("a"))
        XCTAssertEqual(reader.pending, [], "a start needs no read")
        XCTAssertEqual(writer.pending, ["publish_starts", "position_lock", "publish_finalize"])
        XCTAssertFalse(publisher.isIdle)
        answerCommit(applied: ["a"], firstPosition: 41)
        XCTAssertEqual(journal, ["announce a 1", "answer a created"])
        XCTAssertEqual(metrics.publishBatches, 1)
        XCTAssertEqual(metrics.eventsPublished, 1)
        XCTAssertTrue(publisher.isIdle)
    }

    func testChangesSubmittedWhileABatchIsInFlightGoTogetherInTheNext() {
        submit(start("a"))
        submit(start("b"))
        submit(start("c"))
        XCTAssertEqual(writer.pending.count, 3, "one batch in flight at a time")
        answerCommit(applied: ["a"], firstPosition: 1)
        XCTAssertEqual(writer.pending, ["publish_starts", "position_lock", "publish_finalize"], "b and c in one batch")
        answerCommit(applied: ["b", "c"], firstPosition: 2)
        XCTAssertEqual(journal, ["announce a 1", "answer a created", "announce b 1", "answer b created", "announce c 1", "answer c created"])
        XCTAssertEqual(metrics.publishBatches, 2)
    }

    func testAnUpdateIsPlannedOnAFreshReadOnceThenOnWhatThisWorkerCommitted() {
        submit(update("x", 0.5))
        XCTAssertEqual(reader.pending, ["read_for_publish"])
        XCTAssertEqual(writer.pending, [])
        answerReads(["x": 3])
        XCTAssertEqual(writer.pending, ["publish_updates", "position_lock", "publish_finalize"])
        answerCommit(applied: ["x"], firstPosition: 9)
        XCTAssertEqual(journal, ["announce x 4", "answer x committed"])
        submit(update("x", 0.6))
        XCTAssertEqual(reader.pending, [], "planned on the cache")
        XCTAssertEqual(writer.pending, ["publish_updates", "position_lock", "publish_finalize"])
        answerCommit(applied: ["x"], firstPosition: 10)
        XCTAssertEqual(journal.suffix(2), ["announce x 5", "answer x committed"])
    }

    func testAMissingActivityIsNotFoundAndNothingIsWritten() {
        submit(update("ghost", 0.5))
        answerReads([:])
        XCTAssertEqual(journal, ["answer ghost not_found"])
        XCTAssertEqual(writer.pending, [])
        XCTAssertTrue(publisher.isIdle)
    }

    func testAMissedCompareAndSetIsReadAgainAndPlannedOnTheNewerRow() {
        submit(update("x", 0.5))
        answerReads(["x": 3])
        answerCommit(applied: [], firstPosition: 9)
        XCTAssertEqual(journal, [], "nothing announced or answered yet")
        XCTAssertEqual(metrics.casRetries, 1)
        XCTAssertEqual(reader.pending, ["read_for_publish"], "read afresh: another process committed")
        answerReads(["x": 7])
        answerCommit(applied: ["x"], firstPosition: 12)
        XCTAssertEqual(journal, ["announce x 8", "answer x committed"])
    }

    func testARequestOfSeveralChangesIsOneBatchAndOneCompletionInTheOpsOrder() {
        var outcomes: [[String]] = []
        publisher.submitAll([update("x", 0.1), start("n"), update("ghost", 0.2)]) { outcomes.append($0.map(Self.describe)) }
        XCTAssertEqual(reader.pending, ["read_for_publish_many"], "both updates read afresh (this process may not have heard of another's commit yet), in one statement")
        XCTAssertEqual(reader.parameters(of: "read_for_publish_many"), [#"{"x","ghost"}"#, "{NULL,NULL}"])
        XCTAssertEqual(writer.pending, [], "the start waits for the request's reads")
        answerReads(["x": 3])
        XCTAssertEqual(writer.pending, ["publish_updates", "publish_starts", "position_lock", "publish_finalize"])
        XCTAssertEqual(outcomes, [])
        answerCommit(applied: ["x", "n"])
        XCTAssertEqual(outcomes, [["committed", "created", "not_found"]])
        XCTAssertEqual(metrics.publishBatches, 1)
    }

    func testABatchThatMarkedPushesWakesTheSenderOnceAndOneThatMarkedNoneDoesNot() {
        publisher.pushes = true
        submit(start("a"))
        XCTAssertEqual(writer.pending.last, "publish_finalize_push")
        answerCommit(applied: ["a"], pushes: 0)
        XCTAssertEqual(kicks, 0)
        submit(start("b"))
        answerCommit(applied: ["b"], pushes: 3)
        XCTAssertEqual(kicks, 1)
    }

    func testWithTheSequencerNoPositionLockIsTakenAndChangesAreAnnouncedWithoutAPosition() {
        publisher.numbering = .bySequencer
        submit(start("a"))
        XCTAssertEqual(writer.pending, ["publish_starts", "publish_finalize_sequenced"])
        answerCommit(applied: ["a"])
        XCTAssertEqual(journal, ["announce a 1", "answer a created"])
    }

    func testAChangeHeardFromAnotherProcessReplacesTheCacheAndOneWithoutASnapshotDropsIt() {
        submit(update("x", 0.5))
        answerReads(["x": 3])
        answerCommit(applied: ["x"])
        let newer = Activity(activityId: "x", taskName: "build", state: .processing, seq: 9, createdAt: 1000, updatedAt: 3000)
        publisher.heard(ChangeNotice(position: 50, activityID: "x", seq: 9, event: "processing", json: String(decoding: newer.json(), as: UTF8.self)))
        submit(update("x", 0.6))
        XCTAssertEqual(reader.pending, [], "planned on the heard snapshot")
        answerCommit(applied: ["x"])
        XCTAssertEqual(journal.suffix(2), ["announce x 10", "answer x committed"])
        publisher.heard(ChangeNotice(position: 51, activityID: "x", seq: 11, event: "processing", json: ""))
        submit(update("x", 0.7))
        XCTAssertEqual(reader.pending, ["read_for_publish"], "no snapshot came with it: read afresh")
        answerReads(["x": 11])
        answerCommit(applied: ["x"])
        XCTAssertEqual(journal.suffix(2), ["announce x 12", "answer x committed"])
    }

    func testARepeatedIdempotencyKeyIsAnsweredFromWhatItAppliedAndWritesNothing() {
        let key = "retry-1"
        let op = { (id: String) in
            PublishOp(activityID: id, kind: .update(UpdateCommand(progress: .set(0.5))), idempotencyKey: key, ownerKeyID: 1, access: .startedBy(keyID: 1))
        }
        submit(op("x"))
        submit(op("y"))
        XCTAssertEqual(reader.parameters(of: "read_for_publish"), ["y", key], "the read looks the key up")
        while reader.pending.first == "read_for_publish" {
            reader.answerNext { _, params in
                params[0] == "x"
                    ? PublishScript.stored("x", seq: 4, replay: PublishReplay(json: #"{"seq":4}"#, event: "processing", seq: 4))
                    : PublishScript.stored("y", seq: 5, replay: PublishReplay(json: #"{"seq":5}"#, event: "completed", seq: 5))
            }
        }
        loop.runSoon()
        XCTAssertEqual(journal, ["answer x replay", "answer y conflict"], "the same call gets its stored answer; another call a conflict")
        XCTAssertEqual(writer.pending, [])
    }

    func testAStartPastItsKeysLiveLimitIsRefusedAndAnnouncedToNoOne() {
        publisher.maxLivePerKey = 2
        submit(start("a"))
        XCTAssertTrue(writer.answerNext { name, _ in
            switch name {
            case "publish_starts": return PGResult(columns: ["activity_id", "over_limit_id"], rows: [[nil, "a"]])
            case "position_lock": return PGResult(columns: ["pg_advisory_xact_lock"], rows: [[""]])
            default: return PGResult(columns: ["notified", "activity_id", "seq", "position", "pushes"], rows: [])
            }
        })
        loop.runSoon()
        XCTAssertEqual(journal, ["answer a too_many_live_activities"])
        XCTAssertEqual(metrics.eventsPublished, 0)
    }

    // MARK: - The commit window

    /// The loop's timers besides the window's (the sessions' own).
    var timers = 0

    /// a goes alone; b and c (two publishers) go together behind it, and their commit opens
    /// a 4 ms window.
    func openTheWindow() {
        publisher.commitWindowMs = 4
        timers = loop.pendingTimers
        submit(start("a"))
        submit(start("b"))
        submit(start("c"))
        answerCommit(applied: ["a"], firstPosition: 1)
        XCTAssertEqual(writer.pending, ["publish_starts", "position_lock", "publish_finalize"], "a lone batch opens no window: b and c go at once")
        XCTAssertEqual(loop.pendingTimers, timers)
        answerCommit(applied: ["b", "c"], firstPosition: 2)
        XCTAssertEqual(loop.pendingTimers, timers + 1, "two publishers' batch: the window opened")
    }

    func testTheWindowOpensAfterABatchOfSeveralPublishersAndHoldsTheNextUntilItsTime() {
        openTheWindow()
        submit(start("d"))
        submit(start("e"))
        XCTAssertEqual(writer.pending, [], "held in the window")
        loop.advance(by: 0.003)
        XCTAssertEqual(writer.pending, [], "3 ms: still held")
        loop.advance(by: 0.0015)
        XCTAssertEqual(writer.pending, ["publish_starts", "position_lock", "publish_finalize"], "4 ms: d and e in one batch")
        answerCommit(applied: ["d", "e"], firstPosition: 4)
        XCTAssertEqual(journal.suffix(4), ["announce d 1", "answer d created", "announce e 1", "answer e created"])
        submit(start("f"))
        XCTAssertEqual(writer.pending, [], "d and e were two publishers too: another window")
        loop.advance(by: 0.005)
        answerCommit(applied: ["f"], firstPosition: 6)
        XCTAssertEqual(loop.pendingTimers, timers, "a lone change opens no window")
        submit(start("g"))
        XCTAssertEqual(writer.pending, ["publish_starts", "position_lock", "publish_finalize"], "the next lone publisher goes at once")
        answerCommit(applied: ["g"], firstPosition: 7)
        XCTAssertEqual(metrics.publishBatches, 5)
        XCTAssertTrue(publisher.isIdle)
    }

    func testAWindowTimerFiringAfterStopDoesNothing() {
        openTheWindow()
        submit(start("d"))
        publisher.stop()
        XCTAssertEqual(loop.pendingTimers, timers, "stop cancels the window's timer")
        loop.advance(by: 0.01)
        XCTAssertEqual(writer.pending, [], "nothing is sent after stop")
        XCTAssertEqual(metrics.publishBatches, 2)
    }

    // MARK: - Failure paths

    func testBeforeTheWriterIsReadyAChangeFailsAtOnceAndNothingIsSent() {
        let fresh = Publisher(loop: loop, db: scripted.db, log: Logger(level: .error), metrics: metrics, defaultStaleAfter: 0, now: { 1 })
        var outcome: String?
        fresh.submit(start("a")) { outcome = Self.describe($0) }
        XCTAssertEqual(outcome, "database_unavailable")
        XCTAssertEqual(writer.pending, [])
        XCTAssertTrue(fresh.isIdle)
    }

    func testAWriterLostMidBatchFailsItsChangesAnnouncesNothingAndPlansTheNextOnAFreshRead() {
        submit(update("x", 0.5))
        answerReads(["x": 3])
        answerCommit(applied: ["x"])
        journal = []
        submit(update("x", 0.6))
        submit(start("b"))
        XCTAssertEqual(writer.pending.count, 3)
        writer.connectionLost()
        loop.runSoon()
        XCTAssertEqual(journal, ["answer x database_unavailable", "answer b database_unavailable"],
                       "x may have committed: a 503, no announce; b, queued behind it, fails at once with the writer down")
        journal = []
        submit(start("c"))
        XCTAssertEqual(journal, ["answer c database_unavailable"], "while the writer is down, changes fail at once")
        XCTAssertEqual(writer.pending, [])
        XCTAssertTrue(publisher.isIdle)
        // Back: the next change of x is planned on a fresh read, not on what the lost batch wrote.
        loop.advance(by: 5)
        writer.driver.socketReady()
        loop.runSoon()
        journal = []
        submit(update("x", 0.7))
        XCTAssertEqual(reader.pending, ["read_for_publish"])
        answerReads(["x": 4])
        answerCommit(applied: ["x"], firstPosition: 60)
        XCTAssertEqual(journal, ["announce x 5", "answer x committed"])
    }

    func testAReaderLostMidReadFailsThatPublishAndWritesNothing() {
        submit(update("x", 0.5))
        XCTAssertEqual(reader.pending, ["read_for_publish"])
        reader.connectionLost()
        loop.runSoon()
        XCTAssertEqual(journal, ["answer x database_unavailable"])
        XCTAssertEqual(writer.pending, [])
        XCTAssertTrue(publisher.isIdle)
    }

    func testARefusedBatchAnswers503AndSaysWritesRefusedUntilABatchCommits() {
        submit(start("a"))
        answerRejected("cannot execute INSERT in a read-only transaction\n", sqlState: "25006")
        XCTAssertEqual(journal, ["answer a database_unavailable"])
        XCTAssertTrue(publisher.writesRefused)
        submit(start("b"))
        answerCommit(applied: ["b"])
        XCTAssertFalse(publisher.writesRefused)
        XCTAssertEqual(journal.suffix(2), ["announce b 1", "answer b created"])
    }

    func testABatchRolledBackIsRetriedChangeByChangeAndOnlyTheFaultyOneFails() {
        submit(start("a"))
        submit(start("good"))
        submit(start("bad"))
        answerCommit(applied: ["a"])
        XCTAssertEqual(writer.pending.count, 3, "good and bad in one batch")
        answerRejected("value too long", sqlState: "22001")
        XCTAssertEqual(journal.count, 2, "neither answered yet")
        // Each goes alone: good commits, bad fails alone.
        answerCommit(applied: ["good"])
        answerRejected("value too long", sqlState: "22001")
        XCTAssertEqual(journal.suffix(3), ["announce good 1", "answer good created", "answer bad internal"])
        XCTAssertTrue(publisher.isIdle)
    }

    func testACompletionThatSubmitsAgainRunsAfterTheRestOfItsBatchNotInsideIt() {
        var sentFromInsideB = -1
        submit(start("a"))
        answerCommit(applied: ["a"], firstPosition: 1)
        submit(start("x"))
        submit(start("b")) { [unowned self] in
            // b's completion publishes again: a is cached, so it is planned at once and, with
            // no batch in flight, is a batch of its own.
            self.submit(self.update("a", 0.5))
            sentFromInsideB = self.writer.pending.count
        }
        submit(start("c"))
        answerCommit(applied: ["x"], firstPosition: 2)
        journal = []
        answerCommit(applied: ["b", "c"], firstPosition: 3)
        XCTAssertEqual(sentFromInsideB, 0, "the change submitted from b's completion was not written inside it")
        XCTAssertEqual(journal, ["announce b 1", "answer b created", "announce c 1", "answer c created"],
                       "c's announce and answer come before anything b's completion set off")
        XCTAssertEqual(writer.pending, ["publish_updates", "position_lock", "publish_finalize"], "then a's change goes")
        answerCommit(applied: ["a"], firstPosition: 5)
        XCTAssertEqual(journal.suffix(2), ["announce a 2", "answer a committed"])
    }

    func testAnAnswerArrivingAfterTheDatabaseClosedCompletesEachPublisherOnceAndAnnouncesNothing() {
        submit(start("a"))
        XCTAssertEqual(writer.pending.count, 3)
        scripted.db.close()
        loop.runSoon()
        XCTAssertEqual(journal, ["answer a database_unavailable"])
        writer.answer { _ in PGResult(columns: ["activity_id"], rows: [["a"]]) }
        loop.runSoon()
        XCTAssertEqual(journal, ["answer a database_unavailable"], "the late answer announces nothing and answers no one twice")
        XCTAssertEqual(metrics.eventsPublished, 0)
    }

    func testAPublisherReleasedWithAReadInFlightIgnoresTheLateAnswer() {
        weak var released: Publisher?
        do {
            let p = Publisher(loop: loop, db: scripted.db, log: Logger(level: .error), metrics: metrics, defaultStaleAfter: 0, now: { 1 })
            p.writerReady()
            p.delegate = self
            p.submit(update("y", 0.5)) { [unowned self] _ in self.journal.append("answer") }
            released = p
        }
        XCTAssertNil(released)
        XCTAssertEqual(reader.pending, ["read_for_publish"])
        answerReads(["y": 1])
        XCTAssertEqual(journal, [])
        XCTAssertEqual(writer.pending, [], "nothing written for a publisher that is gone")
    }
}

extension PublisherShellTests: PublisherDelegate {
    func publisherCommitted(_ event: ActivityEvent, json: [UInt8]) {
        journal.append("announce \(event.snapshot.activityId) \(event.seq)")
    }

    func publisherMarkedPushes() { kicks += 1 }
}
