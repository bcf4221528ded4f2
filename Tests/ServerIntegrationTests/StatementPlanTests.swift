import DispatchTestSupport
import XCTest
@testable import DispatchServer

/// The statements that look up many activities at once (a connect burst's snapshots, a
/// batch's reads, the NATS carrier's check) probe the primary key per id, however many ids
/// and rows. A plan that hashes the whole table cost a 1,000-stream burst 6–12 ms per
/// statement on a table of thousands (issue 34).
final class StatementPlanTests: XCTestCase {
    func testManyIdLookUpsProbeTheIndexWhateverTheTableSize() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        let pg = try TestPostgres.shared()
        _ = try pg.sql(s.conninfo, """
            INSERT INTO activities (activity_id, task_name, state, attempt, seq, last_event, created_ms, updated_ms, start_fingerprint)
            SELECT 'plan-' || i, 'job', 'processing', 1, 2, 'processing', 1, 1, 'fp' FROM generate_series(1, 3000) i
            """)
        _ = try pg.sql(s.conninfo, "ANALYZE activities")
        let ids = (1...500).map { "plan-\($0 * 5)" } + ["plan-missing"]

        let statements = [
            ActivityRepository.readManyStatement(ids),
            ActivityRepository.readManyForPublishStatement(ids.map { ($0, nil) }),
            CarrierSQL.newer(ids.map { ($0, 1) }, feed: false),
        ]
        for q in statements {
            let plan = try pg.sql(s.conninfo, "EXPLAIN " + q.sql, q.params).compactMap { $0.first ?? nil }.joined(separator: "\n")
            XCTAssertFalse(plan.contains("Seq Scan on activities"), "\(q.name ?? q.sql) scans the table:\n\(plan)")
            XCTAssertTrue(plan.contains("activities_pkey"), "\(q.name ?? q.sql) probes the primary key:\n\(plan)")
        }

        // And they answer what was asked: every id found once, the missing one not at all.
        let read = try pg.sql(s.conninfo, statements[0].sql, statements[0].params).compactMap { $0.first ?? nil }
        XCTAssertEqual(read.count, 500)
        XCTAssertEqual(Set(read), Set(ids.dropLast()))
        let forPublish = try pg.sql(s.conninfo, statements[1].sql, statements[1].params)
        XCTAssertEqual(forPublish.compactMap { $0.first ?? nil }.compactMap(Int.init).sorted(), Array(1...500), "one row per read found")
        let newer = try pg.sql(s.conninfo, statements[2].sql, statements[2].params).filter { $0.first == "activity" }
        XCTAssertEqual(newer.count, 500, "every row is at seq 2, past the seq 1 held")
    }
}
