import DispatchCore
import DispatchHarness
import DispatchIO
import XCTest
@testable import DispatchServer

/// What a carrier's shell test stands on, for either carrier: time on a manual loop, a
/// scripted database, and the streams, feeds and publisher a heard change reaches.
final class CarrierFixture {
    let loop = ManualLoop()
    let metrics = Metrics(worker: 0)
    let log = Logger(level: .error)
    let scripted: ScriptedDatabase
    let streams: StreamService
    let feeds: FeedService
    let changes: HeardChanges

    init() {
        scripted = ScriptedDatabase(loop: loop, metrics: metrics)
        let settings = StreamService.Settings(heartbeatSeconds: 4, maxBacklog: 64 * 1024, writeTimeout: 60)
        streams = StreamService(loop: loop, activities: ActivityRepository(db: scripted.db), metrics: metrics, log: log, settings: settings)
        feeds = FeedService(loop: loop, repository: FeedRepository(db: scripted.db), metrics: metrics, log: log, settings: settings)
        let publisher = Publisher(loop: loop, db: scripted.db, log: log, metrics: metrics, defaultStaleAfter: 0, now: { 1 })
        changes = HeardChanges(publisher: publisher, streams: streams, feeds: feeds)
    }

    /// Ends every stream and feed, answers what they still wait for, closes the database;
    /// the scripted drivers must have seen no misuse.
    func tearDown(file: StaticString = #filePath, line: UInt = #line) {
        streams.shutdown()
        feeds.shutdown()
        scripted.answer(on: scripted.reader) { _ in PGResult() }
        scripted.answer(on: scripted.feedReader) { _ in PGResult() }
        scripted.db.close()
        loop.runSoon()
        XCTAssertEqual(scripted.violations, [], file: file, line: line)
    }

    /// Statements sent on the reader, once the turn's deferred work ran (a status stream's
    /// snapshot is read at the end of the turn it connected in).
    var pendingReads: [String] {
        loop.runSoon()
        return scripted.pending(on: scripted.reader)
    }

    /// Rows of `read_history`.
    func history(_ rows: [(id: String, seq: Int64, event: String, data: String)]) -> PGResult {
        PGResult(columns: ["activity_id", "seq", "event", "data", "created_ms"],
                 rows: rows.map { [$0.id, String($0.seq), $0.event, $0.data, "5000"] })
    }

    /// A live status stream on `id` at `seq`.
    func liveStream(_ id: String, seq: Int64, file: StaticString = #filePath, line: UInt = #line) -> ScriptedStream {
        let s = ScriptedStream()
        streams.open(s, activityID: id, lastEventID: nil, keyID: 1)
        XCTAssertEqual(pendingReads, ["read_activity"], file: file, line: line)
        scripted.answer(on: scripted.reader) { _ in activityRow(id, state: .processing, seq: seq) }
        XCTAssertEqual(eventIDs(s), [String(seq)], file: file, line: line)
        return s
    }
}
