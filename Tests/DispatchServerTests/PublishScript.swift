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

    /// Whether `name` is a read for publish: one activity (`read_for_publish`) or several in
    /// one statement (`read_for_publish_many`, what one turn of the publisher asks for).
    static func isRead(_ name: String) -> Bool { name == "read_for_publish" || name == "read_for_publish_many" }

    /// The activities a read for publish asks for, with each one's Idempotency-Key.
    static func readIDs(_ name: String, _ params: [String?]) -> [(id: String, key: String?)] {
        guard name == "read_for_publish_many" else { return [(params[0]!, params.count > 1 ? params[1] : nil)] }
        return zip(elements(params[0]!), elements(params[1]!)).map { ($0!, $1) }
    }

    /// The answer to a read for publish: `row(id, key)` for each activity it asks for (nil:
    /// no such activity), numbered by `ord` as the many form's rows are.
    static func answerRead(_ name: String, _ params: [String?], _ row: (String, String?) -> PGResult?) -> PGResult {
        let asked = readIDs(name, params)
        guard name == "read_for_publish_many" else { return row(asked[0].id, asked[0].key) ?? PGResult(columns: ["activity_id"], rows: []) }
        var columns: [String] = []
        var rows: [[String?]] = []
        for (index, read) in asked.enumerated() {
            guard let result = row(read.id, read.key), let first = result.first else { continue }
            columns = ["ord"] + result.columns.names
            rows.append([String(index + 1)] + result.columns.names.map { first[$0] })
        }
        return PGResult(columns: columns.isEmpty ? ["ord"] : columns, rows: rows)
    }

    /// The elements of a text array literal as `PGArray.text` writes it.
    static func elements(_ literal: String) -> [String?] {
        var out: [String?] = []
        var chars = Array(literal.dropFirst().dropLast())[...]
        while !chars.isEmpty {
            if chars.first == "\"" {
                chars.removeFirst()
                var value = ""
                while let c = chars.popFirst(), c != "\"" {
                    value.append(c == "\\" ? chars.removeFirst() : c)
                }
                out.append(value)
            } else {
                let raw = String(chars.prefix { $0 != "," })
                chars.removeFirst(raw.count)
                out.append(raw == "NULL" ? nil : raw)
            }
            if chars.first == "," { chars.removeFirst() }
        }
        return out
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
