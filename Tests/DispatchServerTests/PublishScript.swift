import DispatchCore
import DispatchIO
@testable import DispatchServer

/// What PostgreSQL returns to the publish path's statements, for the tests of its shells (the
/// publisher and the stale sweeper, which ends activities through it).
enum PublishScript {
    /// `read_for_publish`'s row: activity `id` at `seq`, started by key 1, last touched at
    /// `touchedMs`, with what the request's Idempotency-Key already applied (`replay`), if anything.
    static func stored(_ id: String, seq: Int64, state: ActivityState = .processing, touchedMs: Int64 = 0,
                       replay: PublishReplay? = nil) -> PGResult {
        let values: [String: String] = ["activity_id": id, "task_name": "build", "state": state.rawValue, "attempt": "1", "seq": String(seq),
                                        "created_ms": "1000", "updated_ms": "2000", "last_event": state.rawValue, "start_fingerprint": "fp",
                                        "owner_key_id": "1", "touched_ms": String(touchedMs), "stale_after_s": "60",
                                        "replay": replay?.json, "replay_event": replay?.event, "replay_seq": replay.map { String($0.seq) }]
            .compactMapValues { $0 }
        let columns = ActivityRepository.columns.split(separator: ",").map { String($0.split(separator: ".").last!) }
            + ["replay", "replay_event", "replay_seq"]
        return PGResult(columns: columns, rows: [columns.map { values[$0] }])
    }

    /// A batch that committed: its writes return `applied`, the finalize gives each applied
    /// change a position (from `firstPosition`; none when sequenced) and says `pushes` marked.
    static func commit(applied: [String], firstPosition: Int64 = 41, pushes: Int = 0) -> (String, [String?]) -> PGResult {
        { name, _ in
            switch name {
            case "publish_starts", "publish_updates":
                return PGResult(columns: ["activity_id"], rows: applied.map { [$0] })
            case "position_lock":
                return PGResult(columns: ["pg_advisory_xact_lock"], rows: [[""]])
            default:
                return PGResult(columns: ["notified", "activity_id", "seq", "position", "pushes"], rows: applied.enumerated().map {
                    ["", $1, "1", name.hasSuffix("_sequenced") ? nil : String(firstPosition + Int64($0)), String(pushes)]
                })
            }
        }
    }

    /// A batch whose writes the database rejected: the first failing statement, the rest aborted.
    static func rejected(_ message: String, sqlState: String) -> (String, [String?]) -> PGResult {
        { name, _ in name == "publish_starts" || name == "publish_updates" ? .failure(message, sqlState: sqlState) : .aborted }
    }
}
