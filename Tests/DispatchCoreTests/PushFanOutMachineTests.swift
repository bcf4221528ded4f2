@testable import DispatchCore
import XCTest

/// The sender's fan-out of a claimed activity entry to its tokens, as tables: which pushes go,
/// what each answer writes (nothing for a delivery; a row of its own for a device that must
/// retry, a retirement, a failure), and the entry's one mark once every push is answered.
final class PushFanOutMachineTests: XCTestCase {
    typealias Machine = PushSenderMachine<String>

    let ok = APNsAnswer.status(200, reason: nil, timestampMs: nil)

    func machine() -> Machine {
        var s = Machine.Settings()
        s.claimBatch = 4
        s.maxInFlight = 16
        s.claimInterval = 0
        s.markInterval = 0
        return Machine(settings: s)
    }

    func entry(_ id: Int64, passedOver: [Int64] = []) -> PushEntry {
        PushEntry(entryID: id, leaseID: 9, activityID: "act\(id)", seq: 5, timestamp: 2000, attempts: 1, pendingSinceMs: 1_000_000,
                  claimedAtMs: 1_000_050, changedAtMs: 1_000_000, passedOver: passedOver)
    }

    /// The push of entry `entry` to device `device` (handle `entry * 10 + device`).
    func push(_ entry: Int64, device: Int64, failedRow: Bool = false) -> (PushJob, String) {
        var j = PushJob(outboxID: entry * 10 + device, leaseID: 9, kind: .update, activityID: "act\(entry)", deviceID: device, seq: 5,
                        timestamp: 2000, attempts: 1, pendingSinceMs: 1_000_000, claimedAtMs: 1_000_050)
        j.entryID = entry
        j.clearsFailedRow = failedRow
        return (j, "body\(entry)")
    }

    /// Actions spelled compactly; marks name the device (`d`) or the entry.
    func names(_ actions: [Machine.Action]) -> [String] {
        actions.map { a in
            switch a {
            case .claim(let n): return "claim \(n)"
            case .obtainProviderToken(let g, _): return "token \(g)"
            case .send(let j, let p, _): return "send d\(j.deviceID) \(p)"
            case .mark(let marks): return "mark " + marks.map(markName).joined(separator: ",")
            case .report(.answered(let j, let r, _, _)): return "report d\(j.deviceID) \(r.rawValue)"
            case .report(let r): return "report \(r)"
            case .wake(let at): return "wake \(at)"
            }
        }
    }

    func markName(_ m: PushMark) -> String {
        switch m {
        case .delivered(let j): return "delivered d\(j.deviceID)\(j.switchedEnvironment ? " " + j.environment.rawValue : "")\(j.clearsFailedRow ? " clear" : "")"
        case .skipped(let j): return "skipped d\(j.deviceID)"
        case .retry(let j, let after, let status, let counts): return "retry d\(j.deviceID) +\(after) \(status.label)\(counts ? "" : " uncounted")"
        case .retire(let j, _, let status): return "retire d\(j.deviceID) \(status.label)"
        case .failed(let j, let status): return "failed d\(j.deviceID) \(status.label)"
        case .drop(let j): return "drop d\(j.deviceID)"
        case .fannedOut(let e, let devices, let delivered): return "entry \(e.entryID) pushed \(delivered)/\(devices)"
        case .releaseEntry(let e, let after, let status): return "release entry \(e.entryID) +\(after) \(status.label)"
        case .dropEntry(let e): return "drop entry \(e.entryID)"
        }
    }

    func testAnEntryIsOneMarkOnceEveryPushOfItIsAnswered() {
        var m = machine()
        XCTAssertEqual(names(m.tick(now: 10)), ["claim 4"])
        XCTAssertEqual(names(m.claimed([.fanOut(entry(1), [push(1, device: 1), push(1, device: 2), push(1, device: 3)])], requested: 4, now: 10)),
                       ["token 1", "send d1 body1", "send d2 body1", "send d3 body1"], "one body for every token")
        XCTAssertEqual(m.entriesInFlight, 1)
        XCTAssertEqual(names(m.answered(11, ok, now: 10.1, random: 0)), ["report d1 delivered"], "a delivery writes nothing of its own")
        XCTAssertEqual(names(m.answered(12, ok, now: 10.2, random: 0)), ["report d2 delivered"])
        XCTAssertEqual(names(m.answered(13, ok, now: 10.3, random: 0)), ["report d3 delivered", "mark entry 1 pushed 3/3"],
                       "the last answer marks the entry")
        XCTAssertEqual(m.entriesInFlight, 0)
        XCTAssertEqual(names(m.marked(ok: true, now: 10.4)), ["claim 4"], "a newer change may wait: claim again")
    }

    func testOnePhoneRetryingHoldsBackNoOther() {
        var m = machine()
        _ = m.tick(now: 0)
        _ = m.claimed([.fanOut(entry(1), [push(1, device: 1), push(1, device: 2)])], requested: 4, now: 0)
        let rows: [(Int64, APNsAnswer, [String])] = [
            (11, .status(429, reason: "TooManyRequests", timestampMs: nil),
             ["report d1 throttled", "mark retry d1 +0.5 429 TooManyRequests"]),
            (12, ok, ["report d2 delivered"]),
        ]
        for (id, answer, expected) in rows { XCTAssertEqual(names(m.answered(id, answer, now: 1, random: 0)), expected) }
        XCTAssertEqual(names(m.marked(ok: true, now: 2)), ["mark entry 1 pushed 1/2"],
                       "the entry has pushed its seq; the throttled phone retries on its own row")
        XCTAssertEqual(names(m.marked(ok: true, now: 2)), ["claim 4"], "the entry may be due again")
    }

    /// Every answer class of a fanned-out push, as what it leaves the device.
    func testEachAnswerOfAFannedOutPush() {
        let rows: [(APNsAnswer, String)] = [
            (.status(500, reason: nil, timestampMs: nil), "retry d1 +0.5 500"),
            (.transport(.connectionLost), "retry d1 +0.0 connectionLost"),
            (.status(410, reason: "Unregistered", timestampMs: 777), "retire d1 410 Unregistered"),
            (.status(400, reason: "BadPriority", timestampMs: nil), "failed d1 400 BadPriority"),
        ]
        for (answer, expected) in rows {
            var m = machine()
            _ = m.tick(now: 0)
            _ = m.claimed([.fanOut(entry(1), [push(1, device: 1)])], requested: 4, now: 0)
            let marks = names(m.answered(11, answer, now: 1, random: 0)).filter { $0.hasPrefix("mark") }
            XCTAssertEqual(marks, ["mark \(expected),entry 1 pushed 0/1"], "\(answer)")
        }
    }

    func testBadDeviceTokenTriesTheOtherEnvironmentBeforeTheEntryIsDone() {
        var m = machine()
        _ = m.tick(now: 0)
        _ = m.claimed([.fanOut(entry(1), [push(1, device: 1), push(1, device: 2)])], requested: 4, now: 0)
        let bad = APNsAnswer.status(400, reason: "BadDeviceToken", timestampMs: nil)
        XCTAssertEqual(names(m.answered(11, bad, now: 1, random: 0)).map { String($0.prefix(29)) }, ["report triedOtherEnvironment(", "send d1 body1"])
        XCTAssertEqual(names(m.answered(12, ok, now: 1, random: 0)), ["report d2 delivered"], "the entry waits for the retry")
        XCTAssertEqual(names(m.answered(11, ok, now: 2, random: 0)),
                       ["report d1 delivered", "mark delivered d1 sandbox,entry 1 pushed 2/2"], "the device's environment is corrected")
    }

    func testADeliveryClearsAFailedRowAndPassedOverDevicesRideOnTheEntry() {
        var m = machine()
        _ = m.tick(now: 0)
        let e = entry(1, passedOver: [7])
        _ = m.claimed([.fanOut(e, [push(1, device: 1, failedRow: true)])], requested: 4, now: 0)
        let actions = m.answered(11, ok, now: 1, random: 0)
        XCTAssertEqual(names(actions).last, "mark delivered d1 clear,entry 1 pushed 1/1")
        guard case .mark(let marks)? = actions.last, case .fannedOut(let marked, _, _)? = marks.last else { return XCTFail("\(actions)") }
        XCTAssertEqual(marked.passedOver, [7], "the passed-over device's row learns the seq with the entry's mark")
    }

    func testEntriesWithoutPushesStoppingAndAFailedRead() {
        var m = machine()
        _ = m.tick(now: 0)
        XCTAssertEqual(names(m.claimed([.fanOut(entry(1), []), .settle(.dropEntry(entry(2)))], requested: 4, now: 0)),
                       ["mark entry 1 pushed 0/0,drop entry 2"], "no tokens left, or the activity gone: settled at once")
        _ = m.marked(ok: true, now: 1)
        _ = m.stop(now: 2)
        XCTAssertEqual(names(m.claimed([.fanOut(entry(3), [push(3, device: 1)])], requested: 4, now: 3)),
                       ["mark release entry 3 +0.0 not sent (shutdown)"], "claimed while stopping: given back whole, unsent")
        XCTAssertEqual(m.inFlightCount, 0)
    }

    func testAFailedMarkOfAnEntryIsWrittenAgain() {
        var m = machine()
        _ = m.tick(now: 0)
        _ = m.claimed([.fanOut(entry(1), [push(1, device: 1)])], requested: 4, now: 0)
        XCTAssertEqual(names(m.answered(11, ok, now: 1, random: 0)), ["report d1 delivered", "mark entry 1 pushed 1/1"])
        XCTAssertEqual(names(m.marked(ok: false, now: 1)), ["report markFailed(count: 1)"])
        XCTAssertEqual(names(m.tick(now: 1.5)), ["claim 4"], "not before the database retry")
        XCTAssertEqual(names(m.tick(now: 2.5)), ["mark entry 1 pushed 1/1"], "after it")
    }

    func testRowsAndEntriesInOneClaim() {
        var m = machine()
        _ = m.tick(now: 0)
        var row = push(9, device: 4).0
        row.entryID = nil
        XCTAssertEqual(names(m.claimed([.send(row, "own"), .fanOut(entry(1), [push(1, device: 1)])], requested: 4, now: 0)),
                       ["token 1", "send d4 own", "send d1 body1"])
        XCTAssertEqual(names(m.answered(94, ok, now: 1, random: 0)), ["report d4 delivered", "mark delivered d4"], "a row's delivery is written")
        XCTAssertEqual(names(m.answered(11, ok, now: 1, random: 0)), ["report d1 delivered"])
        XCTAssertEqual(names(m.marked(ok: true, now: 2)), ["mark entry 1 pushed 1/1", "claim 4"])
    }
}

extension PushFanOutMachineTests {
    /// A fan-out wider than `maxInFlight` waits in the machine and goes as answers make room;
    /// stopping gives what never went back to its devices' own rows.
    func testAWideFanOutWaitsForRoomAndStoppingGivesTheRestBack() {
        var s = Machine.Settings()
        s.claimBatch = 4
        s.maxInFlight = 2
        s.claimInterval = 0
        s.markInterval = 0
        var m = Machine(settings: s)
        _ = m.tick(now: 0)
        let jobs = (1...5).map { push(1, device: Int64($0)) }
        XCTAssertEqual(names(m.claimed([.fanOut(entry(1), jobs)], requested: 2, now: 0)), ["token 1", "send d1 body1", "send d2 body1"])
        XCTAssertEqual(m.inFlightCount, 2)
        XCTAssertEqual(names(m.tick(now: 0.5)), [], "no claim while pushes wait for room")
        XCTAssertEqual(names(m.answered(11, ok, now: 1, random: 0)), ["report d1 delivered", "send d3 body1"])
        XCTAssertEqual(names(m.stop(now: 2)), ["mark retry d4 +0.0 not sent (shutdown) uncounted,retry d5 +0.0 not sent (shutdown) uncounted"])
        XCTAssertEqual(names(m.answered(12, ok, now: 3, random: 0)), ["report d2 delivered"])
        XCTAssertEqual(names(m.answered(13, ok, now: 3, random: 0)), ["report d3 delivered"])
        XCTAssertEqual(names(m.marked(ok: true, now: 4)), ["mark entry 1 pushed 3/5"], "the entry is done when every push is settled")
    }
}
