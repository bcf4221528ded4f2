import DispatchCore
import PGCore
import XCTest
@testable import DispatchServer

/// The shell's two translations around a batch: values to statements, results to what the
/// machine is told. A change applied iff a write returned its id; its position may be absent.
final class PublishStatementsTests: XCTestCase {
    func event(_ id: String, seq: Int64) -> ActivityEvent {
        ActivityEvent(name: .state(.processing), snapshot: Activity(activityId: id, taskName: "t", state: .processing, seq: seq, createdAt: 1, updatedAt: 1))
    }

    func change(_ id: String, seq: Int64) -> PublishBatch.Change {
        PublishBatch.Change(activityID: id, seq: seq, event: "processing", data: "{}", idempotencyKey: nil, createdMs: 1, pushPriority: 5)
    }

    func testABatchIsItsWritesThenTheLockAndTheFinalize() {
        let start = PublishBatch.Start(event: event("a", seq: 1), ownerKeyID: 1, fingerprint: "fp", staleAfter: 0)
        let update = PublishBatch.Update(event: event("b", seq: 3), expectedSeq: 2, endFingerprint: nil, cancelReason: nil, webhook: nil,
                                         idempotencyKey: nil, staleTouch: nil)
        let both = ActivityRepository.publishStatements(
            PublishBatch(starts: [start], updates: [update], changes: [change("a", seq: 1), change("b", seq: 3)], marksPushes: true, now: 5),
            maxLivePerKey: 10, numbering: .atCommit)
        XCTAssertEqual(both.queries.map(\.name), ["publish_updates", "publish_starts", "position_lock", "publish_finalize_push"])
        XCTAssertEqual(both.writes, 2)
        let updatesOnly = ActivityRepository.publishStatements(
            PublishBatch(updates: [update], changes: [change("b", seq: 3)], marksPushes: false, now: 5), maxLivePerKey: 10, numbering: .atCommit)
        XCTAssertEqual(updatesOnly.queries.map(\.name), ["publish_updates", "position_lock", "publish_finalize"])
        XCTAssertEqual(updatesOnly.writes, 1)
        // With the NATS carrier's sequencer: no position lock shared by every writer.
        let sequenced = ActivityRepository.publishStatements(
            PublishBatch(updates: [update], changes: [change("b", seq: 3)], marksPushes: false, now: 5), maxLivePerKey: 10, numbering: .bySequencer)
        XCTAssertEqual(sequenced.queries.map(\.name), ["publish_updates", "publish_finalize_sequenced"])
        XCTAssertFalse(sequenced.queries[1].sql.contains("pg_notify"), "and no NOTIFY")
        XCTAssertTrue(sequenced.queries[1].sql.contains("NULL::bigint"), "history rows wait for the sequencer")
    }

    func testAppliedIsWhatTheWritesReturnedWithOrWithoutAPosition() {
        let starts = PGResult(columns: ["activity_id"], rows: [["a"]])
        let updates = PGResult(columns: ["activity_id"], rows: [["b"], ["c"]])
        let lock = PGResult(columns: ["pg_advisory_xact_lock"], rows: [[""]])
        let finalize = PGResult(columns: ["notified", "activity_id", "seq", "position", "pushes"],
                                rows: [["", "a", "1", "41", "2"], ["", "b", "4", nil, "2"], ["", "c", "9", "42", "2"]])
        XCTAssertEqual(ActivityRepository.publishResult(.success([starts, updates, lock, finalize]), writes: 2),
                       .committed(applied: ["a", "b", "c"], pushesMarked: 2))
        let missed = PGResult(columns: ["activity_id"], rows: [])
        let nothing = PGResult(columns: ["notified", "activity_id", "seq", "position", "pushes"], rows: [])
        XCTAssertEqual(ActivityRepository.publishResult(.success([missed, lock, nothing]), writes: 1),
                       .committed(applied: [], pushesMarked: 0), "every compare-and-set missed")
        let refusedStart = PGResult(columns: ["activity_id", "over_limit_id"], rows: [[nil, "z"]])
        XCTAssertEqual(ActivityRepository.publishResult(.success([refusedStart, lock, nothing]), writes: 1),
                       .committed(applied: [], pushesMarked: 0, overLimit: ["z"]), "a start past its key's live limit")
        let finishedFull = PGResult(columns: ["activity_id", "over_limit_id", "over_finished_free_at"],
                                    rows: [["a", nil, nil], [nil, "y", nil], [nil, "x", "1700000000000"], [nil, "w", "0"]])
        XCTAssertEqual(ActivityRepository.publishResult(.success([finishedFull, lock, nothing]), writes: 1),
                       .committed(applied: ["a"], pushesMarked: 0, overLimit: ["y"],
                                  overFinished: ["x": 1_700_000_000_000, "w": 0]),
                       "starts past the live limit and past the finished limit are told apart")
    }

    /// The starts statement counts the finished since the batch's time less the feed's window.
    func testTheStartsStatementCarriesTheFinishedLimitAndItsWindow() {
        let start = PublishBatch.Start(event: event("a", seq: 1), ownerKeyID: 1, fingerprint: "fp", staleAfter: 0)
        let q = ActivityRepository.publishStatements(
            PublishBatch(starts: [start], changes: [change("a", seq: 1)], marksPushes: false, now: 100_000_000),
            maxLivePerKey: 10, maxFinishedPerKey: 7, numbering: .atCommit).queries[0]
        XCTAssertEqual(q.name, "publish_starts")
        XCTAssertTrue(q.sql.contains("dispatch_start_quota"))
        XCTAssertEqual(Array(q.params.suffix(3)), ["10", "7", String(100_000_000 - 24 * 3_600_000)])
    }

    func testFailuresAreToldApart() {
        let lock = PGResult(columns: ["x"], rows: [])
        XCTAssertEqual(ActivityRepository.publishResult(.success([.failure("read-only\n", sqlState: "25006"), .aborted, .aborted]), writes: 1),
                       .refused("read-only"))
        XCTAssertEqual(ActivityRepository.publishResult(.success([lock, lock, .failure("disk full", sqlState: "53100")]), writes: 1),
                       .refused("disk full"))
        XCTAssertEqual(ActivityRepository.publishResult(.success([lock, .failure("check violated", sqlState: "23514"), .aborted]), writes: 1),
                       .rolledBack("check violated"))
        XCTAssertEqual(ActivityRepository.publishResult(.failure(PGError("connection lost")), writes: 1), .connectionFailed)
    }
}
