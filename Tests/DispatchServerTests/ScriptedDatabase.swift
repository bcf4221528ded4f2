import DispatchCore
import DispatchHarness
import DispatchIO
@testable import DispatchServer

/// A `Database` whose three sessions run on scripted libpq drivers and a manual loop: a test
/// answers each statement the repositories send with rows, as PostgreSQL would.
final class ScriptedDatabase {
    let drivers = (0..<3).map { _ in ScriptedPGDriver() }
    let db: Database
    /// Commands of each driver already answered.
    private var answered = [0, 0, 0]

    var reader: ScriptedPGDriver { drivers[1] }
    var feedReader: ScriptedPGDriver { drivers[2] }

    init(loop: ManualLoop, metrics: Metrics) {
        let log = Logger(level: .error)
        let sessions = zip(["writer", "reader", "feed_reader"], drivers).map {
            PGConnection(loop: loop, driver: $1, conninfo: "scripted", name: $0, log: log)
        }
        db = Database(writer: sessions[0], reader: sessions[1], feedReader: sessions[2], metrics: metrics)
        db.start()
        for d in drivers { d.socketReady() }
    }

    /// Statements sent on `driver` and not answered yet, by prepared name.
    func pending(on driver: ScriptedPGDriver) -> [String] {
        let i = drivers.firstIndex { $0 === driver }!
        return driver.sent[answered[i]...].compactMap {
            if case .executePrepared(let name, _) = $0 { return name }
            return nil
        }
    }

    /// Answers every statement sent on `driver` so far, each with `rows(name)`.
    func answer(on driver: ScriptedPGDriver, _ rows: (String) -> PGResult) {
        let i = drivers.firstIndex { $0 === driver }!
        var wire: [ScriptedPGDriver.Wire] = []
        for command in driver.sent[answered[i]...] {
            switch command {
            case .prepare, .execute: wire += [.input(.result(PGResult())), .input(.endOfQuery)]
            case .executePrepared(let name, _): wire += [.input(.result(rows(name))), .input(.endOfQuery)]
            case .sync: wire.append(.input(.sync))
            }
        }
        answered[i] = driver.sent.count
        driver.arrive(wire)
    }

    var violations: [String] { drivers.flatMap(\.violations) }
}

/// The event ids a scripted client was sent, in order.
func eventIDs(_ s: ScriptedStream) -> [String] {
    s.written.filter { $0.hasPrefix("id: ") }.map { String($0.dropFirst(4).prefix { $0 != "\n" }) }
}
