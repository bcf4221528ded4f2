import XCTest
@testable import DispatchCore

/// Pure transitions of one activity: one line per case.
final class ActivityMachineTests: XCTestCase {
    static let t0: Int64 = 1_795_992_806_123

    static func activity(_ state: ActivityState, seq: Int64 = 4, attempt: Int64 = 1, progress: Double? = 0.25,
                         status: String? = "working") -> Activity {
        Activity(activityId: "TEST-1", taskName: "job", machine: "shodan", state: state, progress: progress, status: status,
                 attempt: attempt, seq: seq, createdAt: t0, updatedAt: t0 + 10,
                 endedAt: state.isTerminal ? t0 + 10 : nil)
    }

    enum Expect: Equatable {
        case moved(attempt: Int64)
        case refused(String)
    }

    /// Every live state to every state through `update`. Moves follow the contract's diagram:
    /// queued -> processing, processing <-> retrying, retrying -> queued (re-queued for another
    /// attempt), processing <-> idle (waiting), staying put is a progress/status update; terminal
    /// states are reached only by `end`.
    func testUpdateTransitionTable() {
        let table: [(ActivityState, ActivityState, Expect)] = [
            (.queued, .queued, .moved(attempt: 1)),
            (.queued, .processing, .moved(attempt: 1)),
            (.queued, .retrying, .refused("invalid_transition")),
            (.queued, .idle, .refused("invalid_transition")),
            (.queued, .completed, .refused("invalid_transition")),
            (.queued, .error, .refused("invalid_transition")),
            (.queued, .cancelled, .refused("invalid_transition")),
            (.queued, .rejected, .refused("invalid_transition")),
            (.processing, .queued, .refused("invalid_transition")),
            (.processing, .processing, .moved(attempt: 1)),
            (.processing, .retrying, .moved(attempt: 2)),
            (.processing, .idle, .moved(attempt: 1)),
            (.processing, .completed, .refused("invalid_transition")),
            (.processing, .error, .refused("invalid_transition")),
            (.processing, .cancelled, .refused("invalid_transition")),
            (.processing, .rejected, .refused("invalid_transition")),
            (.retrying, .queued, .moved(attempt: 1)),
            (.retrying, .processing, .moved(attempt: 1)),
            (.retrying, .retrying, .moved(attempt: 1)),
            (.retrying, .idle, .refused("invalid_transition")),
            (.retrying, .completed, .refused("invalid_transition")),
            (.retrying, .error, .refused("invalid_transition")),
            (.retrying, .cancelled, .refused("invalid_transition")),
            (.retrying, .rejected, .refused("invalid_transition")),
            (.idle, .queued, .refused("invalid_transition")),
            (.idle, .processing, .moved(attempt: 1)),
            (.idle, .retrying, .refused("invalid_transition")),
            (.idle, .idle, .moved(attempt: 1)),
            (.idle, .completed, .refused("invalid_transition")),
            (.idle, .error, .refused("invalid_transition")),
            (.idle, .cancelled, .refused("invalid_transition")),
            (.idle, .rejected, .refused("invalid_transition")),
        ]
        XCTAssertEqual(table.count, ActivityState.live.count * ActivityState.allCases.count, "every live state to every state")
        for (from, to, expect) in table {
            let current = Self.activity(from)
            let result = ActivityMachine.update(UpdateCommand(state: to), current: current, now: Self.t0 + 20)
            XCTAssertEqual(ActivityMachine.canMove(from: from, to: to), expect != .refused("invalid_transition"), "\(from) -> \(to)")
            switch (result, expect) {
            case (.success(let event), .moved(let attempt)):
                XCTAssertEqual(event.name, .state(to), "\(from) -> \(to)")
                XCTAssertEqual(event.snapshot.state, to, "\(from) -> \(to)")
                XCTAssertEqual(event.snapshot.attempt, attempt, "\(from) -> \(to)")
                XCTAssertEqual(event.seq, current.seq + 1, "\(from) -> \(to)")
                XCTAssertEqual(event.snapshot.updatedAt, Self.t0 + 20, "\(from) -> \(to)")
                XCTAssertNil(event.snapshot.endedAt, "\(from) -> \(to)")
                XCTAssertEqual(event.snapshot.progress, 0.25, "\(from) -> \(to): progress kept")
                XCTAssertEqual(event.snapshot.status, "working", "\(from) -> \(to): status kept")
            case (.failure(let error), .refused(let code)):
                XCTAssertEqual(error.code.rawValue, code, "\(from) -> \(to)")
                XCTAssertEqual(error.httpStatus, 409, "\(from) -> \(to)")
                XCTAssertEqual(error.snapshot, current, "\(from) -> \(to): carries what is stored")
            default:
                XCTFail("\(from) -> \(to): expected \(expect), got \(result)")
            }
        }
    }

    func testTerminalActivitiesRefuseEveryUpdate() {
        for from in ActivityState.allCases where from.isTerminal {
            for to in ActivityState.allCases {
                let current = Self.activity(from)
                guard case .failure(let error) = ActivityMachine.update(UpdateCommand(state: to), current: current, now: Self.t0 + 20)
                else { XCTFail("\(from) -> \(to) accepted"); continue }
                XCTAssertEqual(error.code, .alreadyFinished, "\(from) -> \(to)")
                XCTAssertEqual(error.httpStatus, 409, "\(from) -> \(to)")
                XCTAssertEqual(error.snapshot, current, "\(from) -> \(to)")
            }
        }
    }

    /// `attempt` counts moves into retrying, never a stay in it; seq counts every accepted change.
    func testAttemptAndSeqAlongAPath() {
        let path: [(ActivityState, Int64, Int64)] = [
            // (state asked, attempt after, seq after)
            (.processing, 1, 2),
            (.processing, 1, 3),
            (.retrying, 2, 4),
            (.retrying, 2, 5),
            (.processing, 2, 6),
            (.retrying, 3, 7),
            (.queued, 3, 8),
            (.processing, 3, 9),
        ]
        var current = ActivityMachine.start(StartCommand(taskName: "job"), id: "A", now: Self.t0).snapshot
        for (state, attempt, seq) in path {
            guard case .success(let e) = ActivityMachine.update(UpdateCommand(state: state), current: current, now: Self.t0)
            else { XCTFail("refused \(state)"); return }
            XCTAssertEqual(e.snapshot.attempt, attempt, "\(state) at seq \(seq)")
            XCTAssertEqual(e.seq, seq, "\(state)")
            current = e.snapshot
        }
    }

    func testUpdatePatches() {
        let table: [(Patch<Double>, Patch<String>, Double?, String?)] = [
            (.keep, .keep, 0.25, "working"),
            (.set(0.5), .keep, 0.5, "working"),
            (.set(nil), .keep, nil, "working"),
            (.keep, .set("Downloading"), 0.25, "Downloading"),
            (.keep, .set(nil), 0.25, nil),
            (.set(1), .set(""), 1, ""),
        ]
        for (progress, status, wantProgress, wantStatus) in table {
            let cmd = UpdateCommand(progress: progress, status: status)
            guard case .success(let e) = ActivityMachine.update(cmd, current: Self.activity(.processing), now: Self.t0 + 20)
            else { XCTFail("refused"); continue }
            XCTAssertEqual(e.snapshot.progress, wantProgress, "\(cmd)")
            XCTAssertEqual(e.snapshot.status, wantStatus, "\(cmd)")
        }
    }

    /// A clock that steps back never moves updatedAt backwards.
    func testUpdatedAtNeverGoesBack() {
        let current = Self.activity(.processing)
        guard case .success(let e) = ActivityMachine.update(UpdateCommand(), current: current, now: Self.t0 - 5_000)
        else { return XCTFail("refused") }
        XCTAssertEqual(e.snapshot.updatedAt, current.updatedAt)
        guard case .success(.ended(let end)) = ActivityMachine.end(EndCommand(), current: current, storedEndFingerprint: nil, now: 0)
        else { return XCTFail("refused") }
        XCTAssertEqual(end.snapshot.updatedAt, current.updatedAt)
        XCTAssertEqual(end.snapshot.endedAt, current.updatedAt)
    }

    func testStartCreatesSeqOne() {
        let cmd = StartCommand(activityId: "X", taskName: "Debian", systemImage: "arrow.down", machine: "shodan",
                               cancelURL: "https://c.example/x", initialProgress: 0.1, status: "s", state: .processing)
        let e = ActivityMachine.start(cmd, id: "X", now: Self.t0)
        XCTAssertEqual(e.name, .state(.processing))
        XCTAssertEqual(e.snapshot, Activity(activityId: "X", taskName: "Debian", systemImage: "arrow.down", machine: "shodan",
                                            cancelURL: "https://c.example/x", state: .processing, progress: 0.1, status: "s",
                                            attempt: 1, seq: 1, createdAt: Self.t0, updatedAt: Self.t0))
        let queued = ActivityMachine.start(StartCommand(taskName: "n"), id: "Y", now: Self.t0)
        XCTAssertEqual(queued.name, .state(.queued))
        XCTAssertEqual(queued.snapshot.state, .queued)
        XCTAssertNil(queued.snapshot.progress)
        XCTAssertNil(queued.snapshot.endedAt)
    }

    func testRestart() {
        let original = StartCommand(taskName: "job", machine: "shodan")
        let stored = original.fingerprint
        let table: [(ActivityState, StartCommand, String?)] = [
            (.queued, original, nil),
            (.processing, original, nil),
            (.retrying, original, nil),
            (.queued, StartCommand(taskName: "other", machine: "shodan"), "conflict"),
            (.processing, StartCommand(taskName: "job"), "conflict"),
            (.processing, StartCommand(taskName: "job", machine: "shodan", state: .processing), "conflict"),
            (.processing, StartCommand(taskName: "job", machine: "shodan", status: "x"), "conflict"),
            (.completed, original, "already_finished"),
            (.error, original, "already_finished"),
            (.cancelled, StartCommand(taskName: "other"), "already_finished"),
        ]
        for (state, cmd, code) in table {
            let existing = Self.activity(state)
            switch ActivityMachine.restart(cmd, existing: existing, storedFingerprint: stored) {
            case .success(let a):
                XCTAssertNil(code, "\(state) \(cmd)")
                XCTAssertEqual(a, existing, "answers what is stored")
            case .failure(let e):
                XCTAssertEqual(e.code.rawValue, code, "\(state) \(cmd)")
                XCTAssertEqual(e.httpStatus, 409)
                XCTAssertEqual(e.snapshot, existing)
            }
        }
    }

    func testFingerprintsDistinguishEveryField() {
        let starts = [
            StartCommand(taskName: "a"), StartCommand(taskName: "b"), StartCommand(taskName: "a", systemImage: "x"),
            StartCommand(taskName: "a", machine: "x"), StartCommand(taskName: "a", cancelURL: "http://x"),
            StartCommand(taskName: "a", initialProgress: 0), StartCommand(taskName: "a", status: "x"),
            StartCommand(taskName: "a", state: .processing), StartCommand(taskName: "a", status: ""),
        ]
        XCTAssertEqual(Set(starts.map(\.fingerprint)).count, starts.count)
        let ends = [
            EndCommand(), EndCommand(progress: .set(nil)), EndCommand(progress: .set(1)), EndCommand(status: .set(nil)),
            EndCommand(status: .set("keep")), EndCommand(state: .error), EndCommand(error: "x"), EndCommand(status: .set("x")),
        ]
        XCTAssertEqual(Set(ends.map(\.fingerprint)).count, ends.count)
    }

    /// End from each live state to each terminal state: progress, endedAt, error, seq.
    func testEndTable() {
        let table: [(ActivityState, EndCommand, Double?, String?)] = [
            // (from, command, progress after, status after)
            (.queued, EndCommand(), 1, "working"),
            (.processing, EndCommand(), 1, "working"),
            (.retrying, EndCommand(), 1, "working"),
            (.processing, EndCommand(progress: .set(0.5)), 0.5, "working"),
            (.processing, EndCommand(progress: .set(nil)), nil, "working"),
            (.processing, EndCommand(status: .set("Completed")), 1, "Completed"),
            (.processing, EndCommand(state: .error, error: "disk full"), 0.25, "working"),
            (.processing, EndCommand(status: .set(nil), state: .error), 0.25, nil),
            (.queued, EndCommand(state: .cancelled), 0.25, "working"),
            (.retrying, EndCommand(progress: .set(0.9), state: .cancelled), 0.9, "working"),
            (.idle, EndCommand(), 1, "working"),
            (.idle, EndCommand(state: .error, error: "stalled"), 0.25, "working"),
            (.idle, EndCommand(state: .cancelled), 0.25, "working"),
            (.queued, EndCommand(status: .set("Quota exceeded"), state: .rejected), 0.25, "Quota exceeded"),
        ]
        for (from, cmd, progress, status) in table {
            let current = Self.activity(from)
            guard case .success(.ended(let e)) = ActivityMachine.end(cmd, current: current, storedEndFingerprint: nil, now: Self.t0 + 99)
            else { XCTFail("\(from) \(cmd) refused"); continue }
            XCTAssertEqual(e.name, .state(cmd.state))
            XCTAssertEqual(e.snapshot.state, cmd.state)
            XCTAssertEqual(e.snapshot.progress, progress, "\(from) \(cmd)")
            XCTAssertEqual(e.snapshot.status, status, "\(from) \(cmd)")
            XCTAssertEqual(e.snapshot.error, cmd.error)
            XCTAssertEqual(e.seq, current.seq + 1)
            XCTAssertEqual(e.snapshot.attempt, current.attempt)
            XCTAssertEqual(e.snapshot.endedAt, Self.t0 + 99)
            XCTAssertEqual(e.snapshot.updatedAt, Self.t0 + 99)
        }
    }

    /// `rejected` means refused before it ran: only an end from `queued` reaches it.
    func testOnlyAQueuedActivityCanBeRejected() {
        for from in ActivityState.live {
            let current = Self.activity(from)
            let result = ActivityMachine.end(EndCommand(state: .rejected), current: current, storedEndFingerprint: nil, now: Self.t0 + 99)
            switch (from, result) {
            case (.queued, .success(.ended(let e))):
                XCTAssertEqual(e.name, .state(.rejected))
                XCTAssertEqual(e.snapshot.state, .rejected)
                XCTAssertEqual(e.snapshot.endedAt, Self.t0 + 99)
            case (.queued, _):
                XCTFail("queued -> rejected refused: \(result)")
            case (_, .failure(let e)):
                XCTAssertEqual(e.code, .invalidTransition, "\(from)")
                XCTAssertEqual(e.httpStatus, 409)
                XCTAssertEqual(e.snapshot, current, "nothing changes")
            case (_, .success):
                XCTFail("\(from) -> rejected accepted")
            }
        }
    }

    /// The exact same end repeated is idempotent for the new terminal state too.
    func testRepeatingTheSameRejectedEndIsIdempotent() {
        let cmd = EndCommand(status: .set("queue full"), state: .rejected)
        guard case .success(.ended(let e)) = ActivityMachine.end(cmd, current: Self.activity(.queued), storedEndFingerprint: nil, now: Self.t0)
        else { return XCTFail() }
        guard case .success(.alreadyEnded(let again)) = ActivityMachine.end(cmd, current: e.snapshot, storedEndFingerprint: cmd.fingerprint, now: Self.t0 + 5)
        else { return XCTFail("a repeat of the same end must be 200") }
        XCTAssertEqual(again, e.snapshot)
        guard case .failure(let other) = ActivityMachine.end(EndCommand(state: .error), current: e.snapshot, storedEndFingerprint: cmd.fingerprint, now: 0)
        else { return XCTFail() }
        XCTAssertEqual(other.code, .alreadyFinished)
    }

    func testEndOfAFinishedActivity() {
        let finishing = EndCommand(status: .set("Done"))
        let stored = finishing.fingerprint
        let table: [(ActivityState, EndCommand, String?)] = [
            (.completed, finishing, nil),
            (.completed, EndCommand(status: .set("Done")), nil),
            (.completed, EndCommand(), "already_finished"),
            (.completed, EndCommand(status: .set("Done"), state: .error), "already_finished"),
            (.completed, EndCommand(progress: .set(1), status: .set("Done")), "already_finished"),
            (.error, EndCommand(state: .error), "already_finished"),
            (.cancelled, EndCommand(status: .set("Done"), error: "x"), "already_finished"),
        ]
        for (state, cmd, code) in table {
            let current = Self.activity(state)
            switch ActivityMachine.end(cmd, current: current, storedEndFingerprint: stored, now: Self.t0 + 99) {
            case .success(.alreadyEnded(let a)):
                XCTAssertNil(code, "\(state) \(cmd)")
                XCTAssertEqual(a, current, "idempotent: nothing changes")
            case .success(.ended):
                XCTFail("\(state) \(cmd): a finished activity changed")
            case .failure(let e):
                XCTAssertEqual(e.code.rawValue, code, "\(state) \(cmd)")
                XCTAssertEqual(e.httpStatus, 409)
                XCTAssertEqual(e.snapshot, current)
            }
        }
        // Without a stored fingerprint (ended long ago), any end is a conflict.
        guard case .failure(let e) = ActivityMachine.end(finishing, current: Self.activity(.completed), storedEndFingerprint: nil, now: 0)
        else { return XCTFail("accepted") }
        XCTAssertEqual(e.code, .alreadyFinished)
    }

    func testErrorCodesMapToOneStatus() {
        let table: [(DispatchError.Code, Int)] = [
            (.invalidJSON, 400), (.invalidField, 400), (.unknownField, 400), (.missingField, 400), (.invalidQuery, 400),
            (.unauthorized, 401), (.forbidden, 403), (.notFound, 404), (.methodNotAllowed, 405),
            (.alreadyFinished, 409), (.conflict, 409), (.invalidTransition, 409), (.concurrentChanges, 409), (.bodyTooLarge, 413),
            (.unsupportedMediaType, 415), (.rateLimited, 429), (.tooManyStreams, 429), (.tooManyLiveActivities, 429), (.tooManyFinishedActivities, 429),
            (.tooManyDevices, 429), (.tooManySessions, 429), (.internalError, 500),
            (.databaseUnavailable, 503),
        ]
        XCTAssertEqual(table.count, DispatchError.Code.allCases.count)
        for (code, status) in table { XCTAssertEqual(DispatchError(code, "m").httpStatus, status, "\(code)") }
    }

    func testErrorBody() throws {
        let plain = DispatchError(.invalidField, "bad \"x\"")
        XCTAssertEqual(text(plain.jsonBody()), #"{"error":{"code":"invalid_field","message":"bad \"x\""}}"#)
        let conflict = DispatchError(.alreadyFinished, "done", snapshot: Self.activity(.completed))
        let parsed = try JSONParser.parse(conflict.jsonBody())
        XCTAssertEqual(parsed["error"]?["code"], .string("already_finished"))
        XCTAssertEqual(parsed["activity"].flatMap(Activity.decode), Self.activity(.completed))
    }
}
