import PGCore
import XCTest
@testable import DispatchServer

/// The advisory lock ids are in `AdvisoryLock` only: the statements that must share a lock
/// take the same one, and the id an applied migration holds as a literal is the one listed.
final class AdvisoryLockTests: XCTestCase {
    func testTheStatementsTakeTheirLock() {
        let feed = AdvisoryLock.feedPositions.rawValue
        let table: [(what: String, sql: String, takes: String)] = [
            ("a NOTIFY-mode publish batch", ActivityRepository.positionLock.sql, "pg_advisory_xact_lock(\(feed))"),
            ("a numbering pass's first statement", SequencerSQL.pass(limit: 10, commitOrdered: true)[0].sql, "pg_try_advisory_xact_lock(\(feed))"),
            ("a numbering pass's update", SequencerSQL.pass(limit: 10, commitOrdered: false)[1].sql, "pg_try_advisory_xact_lock(\(feed))"),
            ("the leftovers' numbering", SequencerSQL.numberLeftovers, "pg_advisory_xact_lock(\(feed))"),
            ("a device registration", AdvisoryLock.deviceKey.xactLock(perKey: "$1"),
             "pg_advisory_xact_lock(\(AdvisoryLock.deviceKey.rawValue), ($1::bigint % 2147483647)::integer)"),
            ("the APNs token renewal", AdvisoryLock.apnsProviderToken.sessionLock, "pg_advisory_lock(\(ProviderTokenStore.lockKey))"),
        ]
        for row in table {
            XCTAssertTrue(row.sql.contains(row.takes), "\(row.what) takes \(row.takes): \(row.sql)")
        }
    }

    func testTheKeyLimitMigrationHoldsTheListedId() throws {
        let migration = try XCTUnwrap(Migrations.embedded.first { $0.version.hasPrefix("0010_") })
        XCTAssertTrue(migration.sql.contains("pg_advisory_xact_lock(\(AdvisoryLock.keyLiveQuota.rawValue), "), "dispatch_live_quota's lock")
    }
}
