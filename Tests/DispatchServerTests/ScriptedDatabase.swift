import DispatchCore
import DispatchHarness
import DispatchIO
@testable import DispatchServer

/// A `Database` whose three sessions run on scripted libpq drivers and a manual loop: a test
/// answers each statement the repositories send with rows, as PostgreSQL would.
final class ScriptedDatabase {
    let sessions = (0..<3).map { _ in ScriptedSession() }
    let db: Database

    var drivers: [ScriptedPGDriver] { sessions.map(\.driver) }
    var reader: ScriptedPGDriver { drivers[1] }
    var feedReader: ScriptedPGDriver { drivers[2] }

    init(loop: LoopScheduling, metrics: Metrics) {
        let log = Logger(level: .error)
        let connections = zip(["writer", "reader", "feed_reader"], sessions).map {
            PGConnection(loop: loop, driver: $1.driver, conninfo: "scripted", name: $0, log: log)
        }
        db = Database(writer: connections[0], reader: connections[1], feedReader: connections[2], metrics: metrics)
        db.start()
        for s in sessions { s.driver.socketReady() }
    }

    private func session(_ driver: ScriptedPGDriver) -> ScriptedSession { sessions.first { $0.driver === driver }! }

    /// Statements sent on `driver` and not answered yet, by prepared name.
    func pending(on driver: ScriptedPGDriver) -> [String] { session(driver).pending }

    /// Answers every statement sent on `driver` so far, each with `rows(name)`.
    func answer(on driver: ScriptedPGDriver, _ rows: (String) -> PGResult) { session(driver).answer(rows) }

    var violations: [String] { drivers.flatMap(\.violations) }
}

/// One database session's scripted driver, and which of the commands sent on it the test has
/// answered: a shell that owns its own PGConnection (the push sender) runs on one of these.
final class ScriptedSession {
    let driver = ScriptedPGDriver()
    private var answered = 0

    /// Statements sent and not answered yet, by prepared name.
    var pending: [String] {
        driver.sent[answered...].compactMap {
            if case .executePrepared(let name, _) = $0 { return name }
            return nil
        }
    }

    /// The parameters of the last statement named `name` sent (answered or not).
    func parameters(of name: String) -> [String?]? {
        for command in driver.sent.reversed() {
            if case .executePrepared(name, let params) = command { return params }
        }
        return nil
    }

    /// Answers every statement sent so far, each with `rows(name)`.
    func answer(_ rows: (String) -> PGResult) {
        let wire = Self.wire(for: driver.sent[answered...]) { name, _ in rows(name) }
        answered = driver.sent.count
        driver.arrive(wire)
    }

    /// Answers the oldest batch not answered yet (its statements up to its sync), each
    /// statement with `rows(name, parameters)`; false when none waits.
    @discardableResult
    func answerNext(_ rows: (String, [String?]) -> PGResult) -> Bool {
        guard let end = driver.sent[answered...].firstIndex(of: .sync) else { return false }
        let wire = Self.wire(for: driver.sent[answered...end], rows)
        answered = end + 1
        driver.arrive(wire)
        return true
    }

    /// What the server sends for these commands: an empty result for a prepare or a plain
    /// statement, `rows` for a prepared one, and the sync's answer.
    private static func wire(for commands: ArraySlice<PGCommand>, _ rows: (String, [String?]) -> PGResult) -> [ScriptedPGDriver.Wire] {
        commands.flatMap { command -> [ScriptedPGDriver.Wire] in
            switch command {
            case .prepare, .execute: return [.input(.result(PGResult())), .input(.endOfQuery)]
            case .executePrepared(let name, let params): return [.input(.result(rows(name, params))), .input(.endOfQuery)]
            case .sync: return [.input(.sync)]
            }
        }
    }

    /// The connection broke: what was sent on it will never be answered.
    func connectionLost(_ reason: String = "server closed the connection unexpectedly") {
        answered = driver.sent.count
        driver.breakConnection(reason)
    }
}

/// A row of every column `ActivityRepository.columns` reads, as `read_activity` returns it.
func activityRow(_ id: String, state: ActivityState, seq: Int64) -> PGResult {
    let columns = ActivityRepository.columns.split(separator: ",").map { String($0.split(separator: ".").last!) }
    let values: [String: String] = ["activity_id": id, "task_name": "build", "state": state.rawValue, "attempt": "1",
                                    "seq": String(seq), "created_ms": "1000", "updated_ms": "2000", "last_event": state.rawValue,
                                    "start_fingerprint": "fp"]
    return PGResult(columns: columns, rows: [columns.map { values[$0] }])
}

/// Several activities' rows as one answer (`read_activities`).
func activityRows(_ parts: PGResult...) -> PGResult {
    PGResult(rows: parts.flatMap(\.rows), columns: parts[0].columns)
}

/// The event ids a scripted client was sent, in order.
func eventIDs(_ s: ScriptedStream) -> [String] {
    s.written.filter { $0.hasPrefix("id: ") }.map { String($0.dropFirst(4).prefix { $0 != "\n" }) }
}
