import DispatchCore
import DispatchHarness
import DispatchIO
import XCTest
@testable import DispatchServer

/// The stale sweeper in one process, over a real `Publisher`: the sessions on scripted libpq
/// drivers, its ticks on a manual loop, the Unix clock injected. What a tick claims, how a
/// claimed row is ended (or spared) through the publish path, and its failure paths: a claim
/// lost mid-round-trip, an end whose batch is lost, a claim answered after `stop`, a backlog
/// sweep or a tick due after `stop`.
final class StaleSweeperShellTests: XCTestCase {
    var loop: ManualLoop!
    var metrics: Metrics!
    var scripted: ScriptedDatabase!
    var publisher: Publisher!
    var sweeper: StaleSweeper!
    var clockMs: Int64 = 1_790_000_000_000
    var announced: [String] = []

    var writer: ScriptedSession { scripted.sessions[0] }
    var reader: ScriptedSession { scripted.sessions[1] }

    override func setUp() {
        loop = ManualLoop()
        metrics = Metrics(worker: 0)
        scripted = ScriptedDatabase(loop: loop, metrics: metrics)
        loop.runSoon()
        let log = Logger(level: .error)
        publisher = Publisher(loop: loop, db: scripted.db, log: log, metrics: metrics, defaultStaleAfter: 0, now: { [unowned self] in self.clockMs })
        scripted.db.writer.onReady = { [unowned self] in self.publisher.writerReady() }
        scripted.db.writer.onLost = { [unowned self] _ in self.publisher.writerLost() }
        publisher.writerReady()
        publisher.delegate = self
        sweeper = StaleSweeper(loop: loop, db: scripted.db, publisher: publisher, log: log, metrics: metrics, now: { [unowned self] in self.clockMs })
        sweeper.start(interval: 1)
    }

    override func tearDown() {
        sweeper.stop()
        scripted.db.close()
        loop.runSoon()
        XCTAssertEqual(scripted.violations, [])
    }

    /// `claim_stale`'s rows: each id claimed at `seq`, stale after 60 s, touched at `touched`.
    static func claimed(_ ids: [String], seq: Int64 = 3, touched: Int64 = 0) -> PGResult {
        PGResult(columns: ["activity_id", "seq", "stale_after_s", "touched_ms"], rows: ids.map { [$0, String(seq), "60", String(touched)] })
    }

    /// Moves the clocks on by one tick; the claim it sends is pending on the reader.
    func tick() {
        clockMs += 1000
        loop.advance(by: 1)
    }

    func answerClaim(_ result: PGResult) {
        XCTAssertTrue(reader.answerNext { name, _ in
            XCTAssertEqual(name, "claim_stale")
            return result
        }, "a claim was waiting")
        loop.runSoon()
    }

    /// Answers every read for publish waiting on the reader (each its own round trip): each
    /// activity at `seq`, touched at `touched`, unless `rows` says otherwise.
    func answerReads(seq: Int64 = 3, touched: Int64 = 0, _ rows: ((String) -> PGResult)? = nil) {
        XCTAssertTrue(reader.pending.first.map(PublishScript.isRead) ?? false, "a read was waiting")
        while let name = reader.pending.first, PublishScript.isRead(name) {
            reader.answerNext { name, params in
                PublishScript.answerRead(name, params) { id, _ in rows?(id) ?? PublishScript.stored(id, seq: seq, touchedMs: touched) }
            }
        }
        loop.runSoon()
    }

    func answerCommit(_ applied: [String]) {
        XCTAssertTrue(writer.answerNext(PublishScript.commit(applied: applied)), "a batch was waiting")
        loop.runSoon()
    }

    // MARK: - Happy paths

    func testEachTickClaimsWhatIsDueWithAFenceAheadAndNothingBeforeTheFirstTick() {
        XCTAssertEqual(reader.pending, [])
        tick()
        XCTAssertEqual(reader.pending, ["claim_stale"])
        XCTAssertEqual(reader.parameters(of: "claim_stale"), [String(clockMs), String(clockMs + StaleSweeper.claimMs), "100"])
        answerClaim(Self.claimed([]))
        XCTAssertEqual(reader.pending, [], "nothing due: nothing more until the next tick")
        tick()
        XCTAssertEqual(reader.pending, ["claim_stale"])
    }

    func testAClaimedRowIsEndedAsStaleThroughThePublishPathOnAFreshRead() {
        tick()
        answerClaim(Self.claimed(["x"], seq: 3, touched: 500))
        XCTAssertEqual(reader.pending, ["read_for_publish"], "planned on a fresh read, never the cache")
        answerReads(seq: 3, touched: 500)
        XCTAssertEqual(writer.pending, ["publish_updates", "position_lock", "publish_finalize"])
        answerCommit(["x"])
        XCTAssertEqual(announced, ["x error stale: no update for 1m"])
        XCTAssertEqual(metrics.staleEnded, 1)
    }

    func testARowChangedOrTouchedSinceTheClaimIsSparedAndNothingIsWritten() {
        tick()
        answerClaim(Self.claimed(["changed", "touched"], seq: 3, touched: 500))
        answerReads { id in
            id == "changed" ? PublishScript.stored(id, seq: 4, touchedMs: 500) : PublishScript.stored(id, seq: 3, touchedMs: 900)
        }
        XCTAssertEqual(writer.pending, [])
        XCTAssertEqual(announced, [])
        XCTAssertEqual(metrics.staleEnded, 0)
    }

    func testAFullBatchIsFollowedByAnotherClaimAtOnceAndAShortOneIsNot() {
        tick()
        answerClaim(Self.claimed((0..<StaleSweeper.batch).map { "a\($0)" }))
        XCTAssertEqual(reader.pending.filter { $0 == "claim_stale" }.count, 1, "a backlog: the next claim without waiting for a tick")
        XCTAssertEqual(reader.pending.filter { $0 == "read_for_publish" }.count, StaleSweeper.batch)
        answerReads(seq: 99)  // every end spared: the rows changed since
        answerClaim(Self.claimed(["b"]))
        XCTAssertEqual(reader.pending, ["read_for_publish"], "a short batch: the backlog is done")
    }

    func testOneClaimAtATimeWhateverTheTicks() {
        tick()
        tick()
        tick()
        XCTAssertEqual(reader.pending, ["claim_stale"])
        answerClaim(Self.claimed([]))
        tick()
        XCTAssertEqual(reader.pending, ["claim_stale"])
    }

    // MARK: - Failure paths

    func testAClaimLostMidRoundTripClaimsAgainOnceTheSessionIsBack() {
        tick()
        reader.connectionLost()
        loop.runSoon()
        tick()
        XCTAssertEqual(reader.pending, [], "no claim while a session is down")
        loop.advance(by: 5)
        reader.driver.socketReady()
        loop.runSoon()
        tick()
        XCTAssertEqual(reader.pending, ["claim_stale"], "the lost claim did not leave the sweeper stuck")
        answerClaim(Self.claimed(["x"]))
        answerReads(seq: 3)
        answerCommit(["x"])
        XCTAssertEqual(metrics.staleEnded, 1)
    }

    func testARefusedClaimEndsNothingAndTheNextTickClaimsAgain() {
        tick()
        answerClaim(.failure("canceling statement due to statement timeout", sqlState: "57014"))
        XCTAssertEqual(reader.pending, [])
        tick()
        XCTAssertEqual(reader.pending, ["claim_stale"])
    }

    func testAnEndWhoseBatchIsLostCountsNothingAndTheRowIsLeftToItsFence() {
        tick()
        answerClaim(Self.claimed(["x"]))
        answerReads(seq: 3)
        XCTAssertEqual(writer.pending.count, 3)
        writer.connectionLost()
        loop.runSoon()
        XCTAssertEqual(metrics.staleEnded, 0)
        XCTAssertEqual(announced, [])
        XCTAssertTrue(publisher.isIdle)
        tick()
        XCTAssertEqual(reader.pending, [], "no claim while the writer is down: its ends would fail")
        loop.advance(by: 5)
        writer.driver.socketReady()
        loop.runSoon()
        tick()
        XCTAssertEqual(reader.pending, ["claim_stale"], "sweeping goes on once it is back")
    }

    func testAClaimAnsweredAfterStopEndsNothing() {
        tick()
        sweeper.stop()
        answerClaim(Self.claimed(["x"]))
        XCTAssertEqual(reader.pending, [], "no end started after stop: the row waits for its fence")
        XCTAssertTrue(publisher.isIdle)
    }

    func testABacklogSweepDueAfterStopAndTheTicksAfterItClaimNothing() {
        tick()
        XCTAssertTrue(reader.answerNext { name, _ in
            name == "claim_stale" ? Self.claimed((0..<StaleSweeper.batch).map { "a\($0)" }) : PGResult()
        })
        // The backlog's next sweep is deferred; the worker stops before it runs.
        sweeper.stop()
        loop.runSoon()
        XCTAssertEqual(reader.pending.filter { $0 == "claim_stale" }, [], "the deferred sweep claims nothing after stop")
        answerReads(seq: 99)
        loop.advance(by: 10)
        XCTAssertEqual(reader.pending, [], "no tick after stop")
    }
}

extension StaleSweeperShellTests: PublisherDelegate {
    func publisherCommitted(_ event: ActivityEvent, json: [UInt8]) {
        announced.append("\(event.snapshot.activityId) \(event.snapshot.state.rawValue) \(event.snapshot.error ?? "")")
    }

    func publisherMarkedPushes() {}
}
