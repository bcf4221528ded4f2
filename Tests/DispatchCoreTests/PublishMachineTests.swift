@testable import DispatchCore
import XCTest

/// The write path as a table: each input and the actions it must produce, rendered as short
/// lines (`write 2: start b, update a@1` is a batch creating b and changing a planned at seq 1).
final class PublishMachineTests: XCTestCase {
    typealias Machine = PublishMachine
    let now: Int64 = 1_000_000

    // MARK: - Requests and rows

    func start(_ id: String, key: Int64 = 1) -> PublishOp {
        PublishOp(activityID: id, kind: .start(StartCommand(taskName: "build \(id)", state: .processing)), ownerKeyID: key,
                  access: .startedBy(keyID: key))
    }

    func update(_ id: String, _ progress: Double, key: Int64 = 1, idempotencyKey: String? = nil) -> PublishOp {
        PublishOp(activityID: id, kind: .update(UpdateCommand(progress: .set(progress))), idempotencyKey: idempotencyKey,
                  ownerKeyID: key, access: .startedBy(keyID: key))
    }

    func end(_ id: String, key: Int64 = 1, idempotencyKey: String? = nil) -> PublishOp {
        PublishOp(activityID: id, kind: .end(EndCommand()), idempotencyKey: idempotencyKey, ownerKeyID: key, access: .startedBy(keyID: key))
    }

    func stored(_ id: String, seq: Int64, state: ActivityState = .processing, owner: Int64 = 1, touched: Int64 = 0,
                endFingerprint: String? = nil) -> StoredActivity {
        let a = Activity(activityId: id, taskName: "build \(id)", state: state, seq: seq, createdAt: 1, updatedAt: 1,
                         endedAt: state.isTerminal ? 1 : nil)
        return StoredActivity(activity: a, lastEvent: state.rawValue, ownerKeyID: owner, startFingerprint: "fp",
                              endFingerprint: endFingerprint, staleAfter: 0, touchedMs: touched)
    }

    func read(_ s: StoredActivity, replay: PublishReplay? = nil) -> Result<PublishRead?, DispatchError> {
        .success(PublishRead(stored: s, replay: replay))
    }

    func committed(_ applied: Set<String>, pushes: Int64 = 0) -> PublishBatchResult {
        .committed(applied: applied, pushesMarked: pushes)
    }

    /// A machine whose writer is up, with `cached` live rows learnt by a read each.
    func machine(cached: [StoredActivity] = [], maxBatch: Int = Machine.maxBatch) -> Machine {
        var m = Machine(defaultStaleAfter: 0, maxBatch: maxBatch)
        _ = m.writerReady(now: now)
        for s in cached {
            let (id, _) = m.submitted(PublishOp(activityID: s.activity.activityId, kind: .update(UpdateCommand()), ownerKeyID: 99,
                                                access: .startedBy(keyID: 99)), now: now)
            _ = m.readLoaded(id, read(s), now: now)  // denied (not the owner): answered, but the row is cached
        }
        return m
    }

    // MARK: - Rendering

    func render(_ actions: [Machine.Action]) -> [String] {
        actions.map { a in
            switch a {
            case .read(let op, let id, let key): return "read \(op) \(id)" + (key.map { " key \($0)" } ?? "")
            case .write(let b, let batch):
                let starts = batch.starts.map { "start \($0.event.snapshot.activityId)" }
                let updates = batch.updates.map { "update \($0.event.snapshot.activityId)@\($0.expectedSeq)" }
                return "write \(b): " + (starts + updates).joined(separator: ", ")
            case .announce(let e, _):
                return "announce \(e.snapshot.activityId) \(e.seq) \(e.name)"
            case .answer(let op, let outcome): return "answer \(op) " + render(outcome)
            case .wake(let w, let ms): return "wake \(w) after \(ms) ms"
            case .kickPushes: return "kick pushes"
            case .casMissed(let id): return "cas missed \(id)"
            case .log(.writesRefused): return "log writes refused"
            case .log(.batchRolledBack(_, let n)): return "log batch of \(n) rolled back"
            case .log(.changeFailed(let id, _)): return "log \(id) failed"
            }
        }
    }

    func render(_ o: PublishOp.Outcome) -> String {
        switch o {
        case .ok(let a): return "ok \(a.seq)"
        case .committed(let json, let created):
            let seq = (try? JSONParser.parse(text(json))).flatMap(Activity.decode)?.seq ?? -1
            return (created ? "created " : "committed ") + "\(seq)"
        case .replay(let json): return "replay \(json)"
        case .failed(let e): return "failed \(e.code.rawValue)"
        }
    }

    func outcome(_ actions: [Machine.Action], _ op: Machine.OpID) -> PublishOp.Outcome? {
        for a in actions { if case .answer(op, let o) = a { return o } }
        return nil
    }

    func batch(_ actions: [Machine.Action]) -> PublishBatch? {
        for a in actions { if case .write(_, let b) = a { return b } }
        return nil
    }

    // MARK: - Batching and order

    func testAStartAndAnUpdateQueuedBehindABatchGoInTheNextOne() {
        var m = machine()
        let (s1, a1) = m.submitted(start("a"), now: now)
        XCTAssertEqual(render(a1), ["write 1: start a"])
        let (s2, a2) = m.submitted(start("b"), now: now)
        XCTAssertEqual(render(a2), [], "one batch in flight: b waits in the queue")
        let (u1, a3) = m.submitted(update("a", 0.5), now: now)
        XCTAssertEqual(render(a3), [], "a is busy: the update waits for its start")
        XCTAssertEqual(render(m.batchFinished(1, committed(["a"]), now: now)),
                       ["announce a 1 processing", "answer \(s1) created 1", "write 2: start b, update a@1"],
                       "the update is planned on the committed start (no read) and batched with b")
        XCTAssertEqual(render(m.batchFinished(2, committed(["a", "b"]), now: now)),
                       ["announce b 1 processing", "answer \(s2) created 1", "announce a 2 processing", "answer \(u1) committed 2"])
        XCTAssertTrue(m.isIdle)
    }

    func testTwoUpdatesToOneActivityAreSerialisedTheSecondPlannedOnTheFirst() {
        var m = machine(cached: [stored("a", seq: 4)])
        let (u1, a1) = m.submitted(update("a", 0.1), now: now)
        XCTAssertEqual(render(a1), ["write 1: update a@4"], "planned on the cached row: no read")
        let (u2, a2) = m.submitted(update("a", 0.2), now: now)
        XCTAssertEqual(render(a2), [])
        XCTAssertEqual(render(m.batchFinished(1, committed(["a"]), now: now)),
                       ["announce a 5 processing", "answer \(u1) committed 5", "write 2: update a@5"])
        let done = m.batchFinished(2, committed(["a"]), now: now)
        XCTAssertEqual(render(done), ["announce a 6 processing", "answer \(u2) committed 6"])
        XCTAssertEqual(m.cached("a")?.activity.progress, 0.2, "the cache follows this worker's commits")
    }

    func testTheBatchIsCappedAndTheRestGoesNext() {
        var m = machine()
        _ = m.submitted(start("first"), now: now)
        for i in 0..<600 { _ = m.submitted(start("s\(i)"), now: now) }
        let next = m.batchFinished(1, committed(["first"]), now: now)
        XCTAssertEqual(batch(next)?.starts.count, 512)
        XCTAssertEqual(batch(next)?.changes.count, 512)
        let last = m.batchFinished(2, committed(Set((0..<512).map { "s\($0)" })), now: now)
        XCTAssertEqual(batch(last)?.starts.count, 88)
        XCTAssertEqual(batch(last)?.starts.first?.event.snapshot.activityId, "s512", "in submission order")
    }

    // MARK: - Many changes in one request (POST /v1/changes)

    func testARequestsChangesWaitForItsReadsThenGoInOneBatch() {
        var m = machine(cached: [stored("c", seq: 4)])
        let (ids, a1) = m.submittedAll([start("a"), update("x", 0.5), update("c", 0.1)], now: now)
        XCTAssertEqual(render(a1), ["read \(ids[1]) x"], "a and c are planned, but wait for x's read")
        let (z, a2) = m.submitted(start("z"), now: now)
        XCTAssertEqual(render(a2), ["write 1: start z"], "another publisher's change does not wait for the request")
        XCTAssertEqual(render(m.readLoaded(ids[1], read(stored("x", seq: 2)), now: now)), [], "one batch in flight")
        XCTAssertEqual(render(m.batchFinished(1, committed(["z"]), now: now)),
                       ["announce z 1 processing", "answer \(z) created 1", "write 2: start a, update c@4, update x@2"])
        XCTAssertEqual(render(m.batchFinished(2, committed(["a", "c", "x"]), now: now)),
                       ["announce a 1 processing", "answer \(ids[0]) created 1", "announce c 5 processing",
                        "answer \(ids[2]) committed 5", "announce x 3 processing", "answer \(ids[1]) committed 3"])
        XCTAssertTrue(m.isIdle)
    }

    func testARequestsChangesOfOneActivityApplyInItsOrder() {
        var m = machine()
        let (ids, a1) = m.submittedAll([start("a"), update("a", 0.5), end("a")], now: now)
        XCTAssertEqual(render(a1), ["write 1: start a"])
        XCTAssertEqual(render(m.batchFinished(1, committed(["a"]), now: now)),
                       ["announce a 1 processing", "answer \(ids[0]) created 1", "write 2: update a@1"],
                       "the update sees the start")
        XCTAssertEqual(render(m.batchFinished(2, committed(["a"]), now: now)),
                       ["announce a 2 processing", "answer \(ids[1]) committed 2", "write 3: update a@2"])
        XCTAssertEqual(render(m.batchFinished(3, committed(["a"]), now: now)), ["announce a 3 completed", "answer \(ids[2]) committed 3"])
        XCTAssertTrue(m.isIdle)
    }

    func testARequestIsKeptWholePastMaxBatchAndRefusedChangesDoNotStopIt() {
        var m = machine(cached: [stored("done", seq: 3, state: .completed)], maxBatch: 4)
        _ = m.submitted(start("first"), now: now)
        for i in 0..<3 { _ = m.submitted(start("s\(i)"), now: now) }
        let (ids, a1) = m.submittedAll((0..<6).map { start("g\($0)") } + [update("unknown", 0.1)], now: now)
        XCTAssertEqual(render(a1), ["read \(ids[6]) unknown"])
        XCTAssertEqual(render(m.readLoaded(ids[6], .success(nil), now: now)), ["answer \(ids[6]) failed not_found"])
        let next = m.batchFinished(1, committed(["first"]), now: now)
        XCTAssertEqual(batch(next)?.starts.map(\.event.snapshot.activityId), ["s0", "s1", "s2", "g0", "g1", "g2", "g3", "g4", "g5"])
    }

    func testIsIdleOnlyWhenEveryPublisherHasItsAnswer() {
        var m = machine()
        XCTAssertTrue(m.isIdle)
        let (u, actions) = m.submitted(update("a", 0.5), now: now)
        XCTAssertEqual(render(actions), ["read \(u) a"])
        XCTAssertFalse(m.isIdle, "reading")
        _ = m.readLoaded(u, read(stored("a", seq: 1)), now: now)
        XCTAssertFalse(m.isIdle, "writing")
        _ = m.batchFinished(1, committed(["a"]), now: now)
        XCTAssertTrue(m.isIdle)
    }

    // MARK: - Planning

    func testACacheHitAvoidsAReadAndObserveKeepsItCurrent() {
        var m = machine()
        let (u1, a1) = m.submitted(update("a", 0.1), now: now)
        XCTAssertEqual(render(a1), ["read \(u1) a"])
        XCTAssertEqual(render(m.readLoaded(u1, read(stored("a", seq: 2)), now: now)), ["write 1: update a@2"])
        _ = m.batchFinished(1, committed(["a"]), now: now)
        XCTAssertEqual(render(m.submitted(update("a", 0.2), now: now).actions), ["write 2: update a@3"], "cached: no read")
        _ = m.batchFinished(2, committed(["a"]), now: now)

        // Another worker's change, heard of: the cache is behind until observed.
        var other = stored("a", seq: 9).activity
        other.progress = 0.9
        XCTAssertTrue(m.isStale("a", seq: 9))
        m.observe(ActivityEvent(name: .state(.processing), snapshot: other))
        XCTAssertFalse(m.isStale("a", seq: 9))
        XCTAssertEqual(render(m.submitted(update("a", 0.95), now: now).actions), ["write 3: update a@9"])
        _ = m.batchFinished(3, committed(["a"]), now: now)

        m.forget("a")
        XCTAssertFalse(m.isStale("a", seq: 99), "not cached: never stale")
        let (u4, a4) = m.submitted(update("a", 1), now: now)
        XCTAssertEqual(render(a4), ["read \(u4) a"])
    }

    func testAHeardChangeIsDecodedOnlyWhenAChangeOfItIsPlanned() {
        var m = machine(cached: [stored("a", seq: 2), stored("b", seq: 2), stored("c", seq: 2), stored("d", seq: 2)])
        var other = stored("a", seq: 9).activity
        other.progress = 0.9
        m.heard("a", seq: 9, event: "processing", json: String(decoding: other.json(), as: UTF8.self))
        XCTAssertFalse(m.isStale("a", seq: 9), "the heard change is the newest known")
        XCTAssertTrue(m.isStale("a", seq: 10))
        m.heard("a", seq: 5, event: "processing", json: "not even JSON")
        XCTAssertFalse(m.isStale("a", seq: 9), "an older notice changes nothing")
        XCTAssertEqual(render(m.submitted(update("a", 0.95), now: now).actions), ["write 1: update a@9"],
                       "planned on the heard snapshot, which an older undecodable notice did not replace")
        _ = m.batchFinished(1, committed(["a"]), now: now)

        // What cannot be planned on is dropped, and the next change reads.
        m.heard("b", seq: 3, event: "processing", json: "")
        m.heard("c", seq: 3, event: "processing", json: "{\"activityId\":")
        var done = stored("d", seq: 3, state: .completed).activity
        done.progress = 1
        m.heard("d", seq: 3, event: "completed", json: String(decoding: done.json(), as: UTF8.self))
        for id in ["b", "c", "d"] {
            let (u, actions) = m.submitted(update(id, 0.5), now: now)
            XCTAssertEqual(render(actions), ["read \(u) \(id)"], id)
        }
    }

    func testAStaleSweeperEndAlwaysReadsAndAppliesOnlyToTheClaimedRow() {
        var m = machine(cached: [stored("a", seq: 3, touched: 50), stored("b", seq: 3, touched: 50)])
        let staleEnd = { (id: String) in
            PublishOp(activityID: id, kind: .end(EndCommand(state: .error, error: "stale")), ownerKeyID: nil,
                      access: .staleClaim(seq: 3, touchedMs: 50))
        }
        let (ea, aa) = m.submitted(staleEnd("a"), now: now)
        XCTAssertEqual(render(aa), ["read \(ea) a"], "never the cache")
        let write = m.readLoaded(ea, read(stored("a", seq: 3, touched: 50)), now: now)
        XCTAssertEqual(render(write), ["write 1: update a@3"])
        XCTAssertEqual(batch(write)?.updates.first?.staleTouch, 50, "written only if nobody touched it since")
        _ = m.batchFinished(1, committed(["a"]), now: now)

        let (eb, _) = m.submitted(staleEnd("b"), now: now)
        XCTAssertEqual(render(m.readLoaded(eb, read(stored("b", seq: 3, touched: 70)), now: now)), ["answer \(eb) failed conflict"],
                       "touched after the claim: it lives")
    }

    func testAnOwnerMismatchIsForbidden() {
        var m = machine(cached: [stored("a", seq: 1, owner: 7)])
        let (u, actions) = m.submitted(update("a", 0.5, key: 8), now: now)
        XCTAssertEqual(render(actions), ["answer \(u) failed forbidden"])
        let admin = PublishOp(activityID: "a", kind: .update(UpdateCommand(progress: .set(0.5))), ownerKeyID: 8, access: .anyActivity)
        XCTAssertEqual(render(m.submitted(admin, now: now).actions), ["write 1: update a@1"])
    }

    func testARepeatedIdenticalEndIsAnsweredWithoutAWrite() {
        var m = machine()
        let e = end("a")
        let fingerprint = EndCommand().fingerprint
        let (id, actions) = m.submitted(e, now: now)
        XCTAssertEqual(render(actions), ["read \(id) a"])
        XCTAssertEqual(render(m.readLoaded(id, read(stored("a", seq: 5, state: .completed, endFingerprint: fingerprint)), now: now)),
                       ["answer \(id) ok 5"])
        XCTAssertNil(m.cached("a"), "finished activities are not cached")
        let (other, _) = m.submitted(end("a"), now: now)
        XCTAssertEqual(render(m.readLoaded(other, read(stored("a", seq: 5, state: .completed, endFingerprint: "else")), now: now)),
                       ["answer \(other) failed already_finished"])
    }

    func testAnUnknownActivityAndAFailedReadAreAnswered() {
        var m = machine()
        let (u1, _) = m.submitted(update("nope", 0.5), now: now)
        XCTAssertEqual(render(m.readLoaded(u1, .success(nil), now: now)), ["answer \(u1) failed not_found"])
        let (u2, _) = m.submitted(update("a", 0.5), now: now)
        let (u3, waiting) = m.submitted(update("a", 0.6), now: now)
        XCTAssertEqual(render(waiting), [])
        XCTAssertEqual(render(m.readLoaded(u2, .failure(.unavailable), now: now)),
                       ["answer \(u2) failed database_unavailable", "read \(u3) a"], "the next one gets its own read")
        XCTAssertEqual(render(m.readLoaded(u2, .failure(.unavailable), now: now)), [], "a late duplicate is ignored")
    }

    func testACancelCarriesItsWebhookAndARepeatWritesNothing() {
        var m = machine(cached: [stored("a", seq: 2)])
        let cancel = PublishOp(activityID: "a", kind: .cancel(reason: "user", deliveryID: "d-1"), ownerKeyID: 1, access: .anyActivity)
        let (c1, actions) = m.submitted(cancel, now: now)
        XCTAssertEqual(render(actions), ["write 1: update a@2"])
        let update = batch(actions)?.updates.first
        XCTAssertEqual(update?.webhook?.deliveryID, "d-1")
        XCTAssertEqual(update?.cancelReason, "user")
        XCTAssertTrue(update?.webhook?.body.contains("\"reason\":\"user\"") == true, update?.webhook?.body ?? "")
        XCTAssertEqual(render(m.batchFinished(1, committed(["a"]), now: now)),
                       ["announce a 3 cancel_requested", "answer \(c1) committed 3"])
        let (c2, again) = m.submitted(cancel, now: now)
        XCTAssertEqual(render(again), ["answer \(c2) ok 3"], "already requested (the cache saw the commit)")
    }

    // MARK: - Compare-and-set misses

    func testACASMissRereadsAndReplans() {
        var m = machine(cached: [stored("a", seq: 1)])
        let (u, a1) = m.submitted(update("a", 0.5), now: now)
        XCTAssertEqual(render(a1), ["write 1: update a@1"])
        XCTAssertEqual(render(m.batchFinished(1, committed([]), now: now)), ["cas missed a", "read \(u) a"],
                       "someone else changed it first: a fresh read, never the cache")
        XCTAssertEqual(render(m.readLoaded(u, read(stored("a", seq: 3)), now: now)), ["write 2: update a@3"])
        XCTAssertEqual(render(m.batchFinished(2, committed(["a"]), now: now)), ["announce a 4 processing", "answer \(u) committed 4"])
    }

    func testTwentyOneMissesAnswerConcurrentChanges() {
        var m = machine(cached: [stored("a", seq: 1)])
        let (u, _) = m.submitted(update("a", 0.5), now: now)
        var batchID: Machine.BatchID = 1
        for attempt in 1...20 {
            XCTAssertEqual(render(m.batchFinished(batchID, committed([]), now: now)), ["cas missed a", "read \(u) a"], "attempt \(attempt)")
            batchID += 1
            XCTAssertEqual(render(m.readLoaded(u, read(stored("a", seq: Int64(1 + attempt))), now: now)),
                           ["write \(batchID): update a@\(1 + attempt)"])
        }
        let last = m.batchFinished(batchID, committed([]), now: now)
        XCTAssertEqual(render(last), ["cas missed a", "answer \(u) failed concurrent_changes"])
        guard case .failed(let e)? = outcome(last, u) else { return XCTFail() }
        XCTAssertEqual(e.retryAfterSeconds, 1)
        XCTAssertTrue(m.isIdle)
    }

    /// A start whose id exists already inserted nothing: re-planned as a restart on a read.
    func testAStartThatFindsTheIdTakenIsARestart() {
        var m = machine()
        let (s, _) = m.submitted(start("a"), now: now)
        XCTAssertEqual(render(m.batchFinished(1, committed([]), now: now)), ["cas missed a", "read \(s) a"])
        XCTAssertEqual(render(m.readLoaded(s, read(stored("a", seq: 2)), now: now)), ["answer \(s) failed conflict"],
                       "a different start of a live id")
    }

    // MARK: - Idempotency

    func testAnIdempotencyReplayForTheSameCallAndAConflictForAnother() {
        var m = machine()
        let replay = PublishReplay(json: #"{"seq":2}"#, event: "processing", seq: 2)
        let (u, a1) = m.submitted(update("a", 0.5, idempotencyKey: "k1"), now: now)
        XCTAssertEqual(render(a1), ["read \(u) a key k1"])
        XCTAssertEqual(render(m.readLoaded(u, read(stored("a", seq: 3), replay: replay), now: now)), [#"answer \#(u) replay {"seq":2}"#])

        m.forget("a")  // with the row cached, the write's own check finds the key (a CAS miss), then this read
        let (e, _) = m.submitted(end("a", idempotencyKey: "k1"), now: now)
        XCTAssertEqual(render(m.readLoaded(e, read(stored("a", seq: 3), replay: replay), now: now)), ["answer \(e) failed conflict"],
                       "the key was used for an update")

        m.forget("a")
        let (other, _) = m.submitted(update("a", 0.5, key: 2, idempotencyKey: "k1"), now: now)
        XCTAssertEqual(render(m.readLoaded(other, read(stored("a", seq: 3), replay: replay), now: now)), ["answer \(other) failed forbidden"],
                       "a stored answer goes only to the activity's owner")
    }

    // MARK: - Failures

    func testARolledBackBatchRetriesEachChangeAloneAndOnlyTheFaultyOneFails() {
        var m = machine(cached: [stored("a", seq: 1), stored("b", seq: 1), stored("c", seq: 1)])
        let (x, _) = m.submitted(start("x"), now: now)
        let (ua, _) = m.submitted(update("a", 0.5), now: now)
        let (ub, _) = m.submitted(update("b", 0.5), now: now)
        let (uc, _) = m.submitted(update("c", 0.5), now: now)
        XCTAssertEqual(render(m.batchFinished(1, committed(["x"]), now: now)),
                       ["announce x 1 processing", "answer \(x) created 1", "write 2: update a@1, update b@1, update c@1"])
        XCTAssertEqual(render(m.batchFinished(2, .rolledBack("b broke it"), now: now)),
                       ["log batch of 3 rolled back", "write 3: update a@1"])
        XCTAssertEqual(render(m.batchFinished(3, committed(["a"]), now: now)),
                       ["announce a 2 processing", "answer \(ua) committed 2", "write 4: update b@1"])
        XCTAssertEqual(render(m.batchFinished(4, .rolledBack("b broke it"), now: now)),
                       ["log b failed", "answer \(ub) failed internal", "write 5: update c@1"])
        XCTAssertEqual(render(m.batchFinished(5, committed(["c"]), now: now)), ["announce c 2 processing", "answer \(uc) committed 2"])
    }

    func testWithTheWriterDownEverythingQueuedFailsUnavailable() {
        var m = Machine(defaultStaleAfter: 0)
        let (s, actions) = m.submitted(start("a"), now: now)
        XCTAssertEqual(render(actions), ["answer \(s) failed database_unavailable"], "not connected yet")

        _ = m.writerReady(now: now)
        let (x, _) = m.submitted(start("x"), now: now)
        let (a1, _) = m.submitted(start("a"), now: now)
        let (a2, _) = m.submitted(update("a", 0.5), now: now)
        let (b, _) = m.submitted(start("b"), now: now)
        m.writerLost()
        XCTAssertEqual(render(m.batchFinished(1, .connectionFailed, now: now)),
                       ["answer \(x) failed database_unavailable", "answer \(a1) failed database_unavailable",
                        "read \(a2) a", "answer \(b) failed database_unavailable"],
                       "the update waiting behind a's start reads (nothing cached), then finds the writer down")
        XCTAssertEqual(render(m.readLoaded(a2, read(stored("a", seq: 1)), now: now)), ["answer \(a2) failed database_unavailable"])
        XCTAssertTrue(m.isIdle)
        _ = m.writerReady(now: now)
        XCTAssertEqual(render(m.submitted(update("a", 0.6), now: now).actions), ["write 2: update a@1"], "back")
    }

    func testALostConnectionForgetsTheCachedRows() {
        var m = machine(cached: [stored("a", seq: 1)])
        let (u, _) = m.submitted(update("a", 0.5), now: now)
        XCTAssertEqual(render(m.batchFinished(1, .connectionFailed, now: now)), ["answer \(u) failed database_unavailable"])
        XCTAssertNil(m.cached("a"), "it may have committed: the next change reads")
    }

    func testRefusedWritesFailWithRefusesWritesUntilABatchCommits() {
        var m = machine(cached: [stored("a", seq: 1), stored("b", seq: 1)])
        let (x, _) = m.submitted(start("x"), now: now)
        let (ua, _) = m.submitted(update("a", 0.5), now: now)
        let (ub, _) = m.submitted(update("b", 0.5), now: now)
        XCTAssertEqual(render(m.batchFinished(1, .refused("read-only"), now: now)),
                       ["log writes refused", "answer \(x) failed database_unavailable", "write 2: update a@1, update b@1"])
        XCTAssertTrue(m.writesRefused)
        guard case .failed(let e)? = outcome(m.batchFinished(2, .refused("read-only"), now: now), ua) else { return XCTFail() }
        XCTAssertEqual(e, .refusesWrites)
        _ = ub
        XCTAssertTrue(m.writesRefused)
        _ = m.submitted(update("a", 0.6), now: now)
        _ = m.batchFinished(3, committed(["a"]), now: now)
        XCTAssertFalse(m.writesRefused, "a commit clears it")
    }

    // MARK: - What a commit announces

    func testPushesAreKickedOnlyWhenTheFinalizeMarkedSome() {
        var m = machine()
        m.marksPushes = true
        _ = m.submitted(start("a"), now: now)
        XCTAssertFalse(render(m.batchFinished(1, committed(["a"], pushes: 0), now: now)).contains("kick pushes"))
        let (_, actions) = m.submitted(start("b"), now: now + 5)
        XCTAssertEqual(batch(actions)?.marksPushes, true)
        XCTAssertEqual(batch(actions)?.now, now + 5)
        XCTAssertEqual(render(m.batchFinished(2, committed(["b"], pushes: 2), now: now)).last, "kick pushes")

        var quiet = machine()
        _ = quiet.submitted(start("a"), now: now)
        XCTAssertFalse(render(quiet.batchFinished(1, committed(["a"], pushes: 3), now: now)).contains("kick pushes"),
                       "without APNs nothing is woken")
    }

    /// Starts the statement refused, one for each per-key limit: each answered with its own
    /// code, the finished one with Retry-After until its oldest counted end leaves the window;
    /// nothing announced.
    func testStartsPastTheLiveOrTheFinishedLimitAreRefusedWithTheirOwnAnswers() {
        var m = machine()
        m.maxFinishedPerKey = 5
        let (a, _) = m.submitted(start("a"), now: now)
        let (b, _) = m.submitted(start("b", key: 2), now: now)
        let (c, _) = m.submitted(start("c", key: 3), now: now)
        let (d, _) = m.submitted(start("d", key: 4), now: now)
        XCTAssertEqual(render(m.batchFinished(1, committed(["a"]), now: now)),
                       ["announce a 1 processing", "answer \(a) created 1", "write 2: start b, start c, start d"])
        let freeAt = now - KeyRules.finishedWindowMs + 90_500  // leaves the window in 90.5 s
        let actions = m.batchFinished(2, .committed(applied: [], pushesMarked: 0, overLimit: ["b"],
                                                    overFinished: ["c": freeAt, "d": 0]), now: now)
        XCTAssertEqual(render(actions), ["answer \(b) failed too_many_live_activities",
                                         "answer \(c) failed too_many_finished_activities", "answer \(d) failed too_many_finished_activities"])
        guard case .failed(let e)? = outcome(actions, c), case .failed(let unknown)? = outcome(actions, d) else { return XCTFail("refused") }
        XCTAssertEqual(e.httpStatus, 429)
        XCTAssertEqual(e.retryAfterSeconds, 91)
        XCTAssertTrue(e.message.contains("5 activities"), e.message)
        XCTAssertEqual(unknown.retryAfterSeconds, 1, "no end to wait for: try again at once")
    }

    /// After the database refused a key's start for its finished limit, its next new starts are
    /// refused after a primary-key read (no count), the same start of an existing activity is
    /// still answered from the read, other keys write as before, and after a minute (or when
    /// the oldest end leaves the window, if sooner) the database is asked again.
    func testAKeyAtItsFinishedLimitIsRefusedWithoutCountingAgainForAMinute() {
        var m = machine()
        let (first, _) = m.submitted(start("a", key: 3), now: now)
        let freeAt = now - KeyRules.finishedWindowMs + 600_000  // ten minutes until a start passes
        XCTAssertEqual(render(m.batchFinished(1, .committed(applied: [], pushesMarked: 0, overFinished: ["a": freeAt]), now: now)),
                       ["answer \(first) failed too_many_finished_activities"])

        let (again, reading) = m.submitted(start("b", key: 3), now: now + 1_000)
        XCTAssertEqual(render(reading), ["read \(again) b"], "a read, not a write with a count")
        let refused = m.readLoaded(again, .success(nil), now: now + 1_000)
        XCTAssertEqual(render(refused), ["answer \(again) failed too_many_finished_activities"])
        guard case .failed(let e)? = outcome(refused, again) else { return XCTFail("refused") }
        XCTAssertEqual(e.retryAfterSeconds, 599)

        let (same, _) = m.submitted(start("live", key: 3), now: now + 2_000)
        var existing = stored("live", seq: 1, owner: 3)
        existing.startFingerprint = StartCommand(taskName: "build live", state: .processing).fingerprint
        XCTAssertEqual(render(m.readLoaded(same, read(existing), now: now + 2_000)), ["answer \(same) ok 1"],
                       "the same start of an existing activity: answered as always")
        let (other, otherActions) = m.submitted(start("c", key: 4), now: now + 2_000)
        XCTAssertEqual(render(otherActions), ["write 2: start c"], "another key writes as before")
        _ = m.batchFinished(2, committed(["c"]), now: now + 2_000)
        _ = other

        let (later, laterActions) = m.submitted(start("d", key: 3), now: now + PublishMachine.finishedRecheckMs)
        XCTAssertEqual(render(laterActions), ["write 3: start d"], "a minute later the database counts again")

        // A refusal whose end leaves the window within the minute is rechecked then.
        _ = m.batchFinished(3, .committed(applied: [], pushesMarked: 0,
                                          overFinished: ["d": now + PublishMachine.finishedRecheckMs - KeyRules.finishedWindowMs + 5_000]),
                            now: now + PublishMachine.finishedRecheckMs)
        _ = later
        let (soon, soonActions) = m.submitted(start("e", key: 3), now: now + PublishMachine.finishedRecheckMs + 5_000)
        XCTAssertEqual(render(soonActions), ["write 4: start e"])
        _ = soon
    }

    func testTheBatchCarriesWhatTheStatementsNeed() {
        var m = machine(cached: [stored("a", seq: 1)])
        let (_, actions) = m.submitted(end("a", idempotencyKey: "k"), now: now)
        guard let b = batch(actions), let u = b.updates.first, let c = b.changes.first else { return XCTFail() }
        XCTAssertEqual(u.expectedSeq, 1)
        XCTAssertEqual(u.endFingerprint, EndCommand().fingerprint)
        XCTAssertEqual(u.idempotencyKey, "k")
        XCTAssertNil(u.staleTouch)
        XCTAssertEqual(c.seq, 2)
        XCTAssertEqual(c.event, "completed")
        XCTAssertEqual(c.pushPriority, 10)
        XCTAssertEqual(c.createdMs, now)
        XCTAssertEqual(c.data, text(u.event.snapshot.json()))
    }

    // MARK: - The commit window

    /// A machine with a 4 ms window whose first batch (a, lone) is in flight and b and c are
    /// queued behind it: the lone batch opens no window, the batch of b and c (two publishers) does.
    func loaded() -> Machine {
        var m = machine()
        m.commitWindowMs = 4
        _ = m.submitted(start("a"), now: now)
        _ = m.submitted(start("b"), now: now)
        _ = m.submitted(start("c"), now: now)
        return m
    }

    func testTheWindowOpensAfterABatchOfSeveralPublishersAndNotAfterALoneOne() {
        var m = loaded()
        XCTAssertEqual(m.queuedChanges, 2, "b and c wait behind a (dispatch_publish_queued)")
        XCTAssertEqual(render(m.batchFinished(1, committed(["a"]), now: now)),
                       ["announce a 1 processing", "answer 1 created 1", "write 2: start b, start c"],
                       "a lone publisher's batch opens no window: what waited goes at once")
        XCTAssertFalse(m.isWindowOpen)
        XCTAssertEqual(render(m.batchFinished(2, committed(["b", "c"]), now: now + 1)),
                       ["announce b 1 processing", "answer 2 created 1", "announce c 1 processing", "answer 3 created 1",
                        "wake 1 after 4 ms"], "two publishers in one batch: load; the next batch waits")
        XCTAssertTrue(m.isWindowOpen)
        XCTAssertEqual(render(m.submitted(start("d"), now: now + 2).actions), [], "held in the window")
        XCTAssertEqual(render(m.submitted(start("e"), now: now + 3).actions), [])
        XCTAssertFalse(m.isIdle)
        XCTAssertEqual(m.queuedChanges, 2, "d and e wait in the window")
        XCTAssertEqual(render(m.windowElapsed(1, now: now + 5)), ["write 3: start d, start e"])
        XCTAssertEqual(m.queuedChanges, 0, "in flight is not queued")
        XCTAssertFalse(m.isWindowOpen)
        XCTAssertEqual(render(m.windowElapsed(1, now: now + 6)), [], "the window is closed: a late wake does nothing")
    }

    func testAWindowThatGatheredNothingClosesAndTheNextLonePublisherGoesAtOnce() {
        var m = loaded()
        _ = m.batchFinished(1, committed(["a"]), now: now)
        XCTAssertEqual(render(m.batchFinished(2, committed(["b", "c"]), now: now)).last, "wake 1 after 4 ms")
        XCTAssertEqual(render(m.windowElapsed(1, now: now + 4)), [], "nothing gathered: nothing to write")
        XCTAssertTrue(m.isIdle)
        XCTAssertEqual(render(m.submitted(start("d"), now: now + 100).actions), ["write 3: start d"], "not held")
        XCTAssertEqual(render(m.batchFinished(3, committed(["d"]), now: now + 101)), ["announce d 1 processing", "answer 4 created 1"],
                       "a lone change opens no window")
        XCTAssertFalse(m.isWindowOpen)
    }

    func testAFullWindowGoesAtOnceAndItsLateWakeDoesNothing() {
        var m = loaded()
        _ = m.batchFinished(1, committed(["a"]), now: now)
        _ = m.batchFinished(2, committed(["b", "c"]), now: now)
        for i in 0..<(Machine.windowFull - 1) {
            XCTAssertEqual(render(m.submitted(start("f\(i)"), now: now).actions), [], "change \(i + 1) of \(Machine.windowFull) waits")
        }
        let (_, full) = m.submitted(start("last"), now: now)
        XCTAssertEqual(batch(full)?.starts.count, Machine.windowFull, "the window is full: the batch goes without waiting")
        XCTAssertFalse(m.isWindowOpen)
        XCTAssertEqual(render(m.windowElapsed(1, now: now + 4)), [], "the full batch closed the window")
        let applied = Set((0..<(Machine.windowFull - 1)).map { "f\($0)" } + ["last"])
        let done = render(m.batchFinished(3, committed(applied), now: now + 5))
        XCTAssertFalse(done.contains { $0.hasPrefix("wake") }, "a batch of \(Machine.windowFull) opens no window")
        XCTAssertTrue(m.isIdle)
    }

    func testARequestOfManyChangesIsOnePublisherAndOpensNoWindow() {
        var m = machine()
        m.commitWindowMs = 4
        let (ids, a1) = m.submittedAll([start("a"), start("b"), start("c")], now: now)
        XCTAssertEqual(render(a1), ["write 1: start a, start b, start c"])
        let done = render(m.batchFinished(1, committed(["a", "b", "c"]), now: now))
        XCTAssertEqual(done.count, 6, "announced and answered, no wake")
        XCTAssertEqual(render(m.submittedAll([start("d")], now: now + 1).actions), ["write 2: start d"],
                       "the same publisher's next request goes at once")
        _ = ids
    }

    func testWithTheWindowOffEveryBatchGoesAsSoonAsTheLastCommitted() {
        var m = loaded()
        m.commitWindowMs = 0
        _ = m.batchFinished(1, committed(["a"]), now: now)
        XCTAssertEqual(render(m.batchFinished(2, committed(["b", "c"]), now: now)).filter { $0.hasPrefix("wake") }, [])
        XCTAssertEqual(render(m.submitted(start("d"), now: now).actions), ["write 3: start d"])
    }

    func testLosingTheWriterInAnOpenWindowFailsWhatWaitsAtOnce() {
        var m = loaded()
        _ = m.batchFinished(1, committed(["a"]), now: now)
        _ = m.batchFinished(2, committed(["b", "c"]), now: now)
        let (d, held) = m.submitted(start("d"), now: now)
        XCTAssertEqual(render(held), [])
        m.writerLost()
        XCTAssertFalse(m.isWindowOpen)
        XCTAssertEqual(render(m.submitted(start("e"), now: now).actions), ["answer \(d) failed database_unavailable", "answer 5 failed database_unavailable"])
        XCTAssertEqual(render(m.windowElapsed(1, now: now + 4)), [])
        XCTAssertTrue(m.isIdle)
    }
}
