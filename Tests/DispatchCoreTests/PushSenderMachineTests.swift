@testable import DispatchCore
import XCTest

/// The push sender's transitions, one input at a time, reading the actions like a table.
final class PushSenderMachineTests: XCTestCase {
    typealias Machine = PushSenderMachine<String>

    func job(_ id: Int64, attempts: Int = 1, pendingSinceMs: Int64? = 1_000_000) -> PushJob {
        PushJob(outboxID: id, leaseID: 7, kind: .update, activityID: "a\(id)", deviceID: 1, seq: 3, timestamp: 1000,
                attempts: attempts, pendingSinceMs: pendingSinceMs, claimedAtMs: 1_000_100)
    }

    /// Intervals 0 unless asked: most tests are about what happens, not when.
    func machine(batch: Int = 4, inFlight: Int = 8, claimInterval: Double = 0, markInterval: Double = 0) -> Machine {
        var s = Machine.Settings()
        s.claimBatch = batch
        s.maxInFlight = inFlight
        s.claimInterval = claimInterval
        s.markInterval = markInterval
        return Machine(settings: s)
    }

    /// A compact spelling of actions for assertions.
    func names(_ actions: [Machine.Action]) -> [String] {
        actions.map { a in
            switch a {
            case .claim(let n): return "claim \(n)"
            case .obtainProviderToken(let g, let renew): return "token \(g)\(renew ? " renew" : "")"
            case .send(let j, let p, let g): return "send \(j.outboxID) \(p) jwt\(g)"
            case .mark(let marks): return "mark " + marks.map(markName).joined(separator: ",")
            case .report(.answered(let j, let r, _, _)): return "report \(j.outboxID) \(r.rawValue)"
            case .report(.sendingStopped(let until, _)): return "report stopped until \(until)"
            case .report(.triedOtherEnvironment): return "report triedOtherEnvironment"
            case .report(let r): return "report \(r)"
            case .wake(let at): return "wake \(at)"
            }
        }
    }

    func markName(_ m: PushMark) -> String {
        switch m {
        case .delivered(let j): return "delivered \(j.outboxID)"
        case .skipped(let j): return "skipped \(j.outboxID)"
        case .retry(let j, let after, _, let counts): return "retry \(j.outboxID) +\(after)\(counts ? "" : " uncounted")"
        case .retire(let j, let since, _): return "retire \(j.outboxID) since \(since)"
        case .failed(let j, _): return "failed \(j.outboxID)"
        case .drop(let j): return "drop \(j.outboxID)"
        case .fannedOut(let e, let devices, let delivered): return "entry \(e.entryID) pushed \(delivered)/\(devices)"
        case .releaseEntry(let e, let after, let status): return "release entry \(e.entryID) +\(after) \(status.label)"
        case .dropEntry(let e): return "drop entry \(e.entryID)"
        }
    }

    func marks(_ actions: [Machine.Action]) -> [String] { names(actions).filter { $0.hasPrefix("mark") } }

    let ok = APNsAnswer.status(200, reason: nil, timestampMs: nil)

    func testFirstTickClaimsThenSendsWithOneTokenAndMarksTheAnswer() {
        var m = machine()
        XCTAssertEqual(names(m.tick(now: 10)), ["claim 4"])
        XCTAssertEqual(names(m.tick(now: 10.1)), [], "one claim at a time")
        XCTAssertEqual(names(m.claimed([.send(job(1), "p1"), .send(job(2), "p2")], requested: 4, now: 10.2)),
                       ["token 1", "send 1 p1 jwt1", "send 2 p2 jwt1"])
        XCTAssertEqual(m.inFlightCount, 2)
        XCTAssertEqual(names(m.answered(1, ok, now: 10.3, random: 0)), ["report 1 delivered", "mark delivered 1"])
        XCTAssertEqual(names(m.answered(2, ok, now: 10.4, random: 0)), ["report 2 delivered"], "waits for the mark in flight")
        XCTAssertEqual(names(m.marked(ok: true, now: 10.5)), ["mark delivered 2", "claim 4"],
                       "the next batch of marks; a delivered row may be due again")
    }

    func testLatencyIsFromTheOldestChangeToTheAnswer() {
        var m = machine()
        _ = m.tick(now: 0)
        _ = m.claimed([.send(job(1, pendingSinceMs: 1_000_000), "p")], requested: 4, now: 1000.001)
        let actions = m.answered(1, ok, now: 1000.015, random: 0)
        guard case .report(.answered(_, .delivered, _, let latency?))? = actions.first else { return XCTFail("\(actions)") }
        XCTAssertEqual(latency, 0.015, accuracy: 1e-6)
    }

    func testAFullBatchClaimsAgainAndAShortOneWaitsForAKick() {
        var m = machine(batch: 2, inFlight: 100)
        _ = m.tick(now: 0)
        XCTAssertEqual(names(m.claimed([.send(job(1), "a"), .send(job(2), "b")], requested: 2, now: 0)).last, "claim 2")
        XCTAssertEqual(names(m.claimed([.send(job(3), "c")], requested: 2, now: 0)), ["send 3 c jwt1"])
        XCTAssertEqual(names(m.kick(now: 0)), ["claim 2"])
    }

    func testAKickDuringAClaimClaimsAgainAfterIt() {
        var m = machine()
        _ = m.tick(now: 0)
        XCTAssertEqual(names(m.kick(now: 0)), [], "a claim is running")
        XCTAssertEqual(names(m.claimed([], requested: 4, now: 0)), ["claim 4"], "the change may have missed that claim")
        XCTAssertEqual(names(m.claimed([], requested: 4, now: 0)), [])
    }

    func testClaimsWaitForRoomInFlight() {
        var m = machine(batch: 4, inFlight: 4)
        _ = m.tick(now: 0)
        _ = m.claimed((1...4).map { .send(job($0), "p\($0)") }, requested: 4, now: 0)
        XCTAssertEqual(names(m.tick(now: 1)), [], "no room")
        XCTAssertEqual(names(m.answered(1, ok, now: 1, random: 0)).filter { $0.hasPrefix("claim") }, ["claim 1"],
                       "room for one: a quarter of the batch")
    }

    func testSettledRowsAreMarkedWithoutSending() {
        var m = machine()
        _ = m.tick(now: 0)
        XCTAssertEqual(names(m.claimed([.settle(.drop(job(1))), .settle(.skipped(job(2)))], requested: 4, now: 0)),
                       ["mark drop 1,skipped 2"])
    }

    func testRetirementUsesTheAnswersTimeOrTheClaimsTime() {
        var m = machine()
        _ = m.tick(now: 0)
        _ = m.claimed([.send(job(1), "a"), .send(job(2), "b")], requested: 4, now: 0)
        XCTAssertEqual(names(m.answered(1, .status(410, reason: "Unregistered", timestampMs: 555), now: 1, random: 0)),
                       ["report 1 retired", "mark retire 1 since 555"])
        _ = m.marked(ok: true, now: 1)
        let bad = APNsAnswer.status(400, reason: "BadDeviceToken", timestampMs: nil)
        XCTAssertEqual(names(m.answered(2, bad, now: 1, random: 0)), ["report triedOtherEnvironment", "send 2 b jwt1"],
                       "bad token or wrong environment: once in the other environment first")
        XCTAssertEqual(marks(m.answered(2, bad, now: 1, random: 0)), ["mark retire 2 since 1000100"], "bad there too: retired")
    }

    /// A device registered in the wrong environment: the retry in the other one works, and the
    /// delivered mark carries the environment to correct the device with.
    func testBadDeviceTokenIsTriedInTheOtherEnvironmentBeforeTheTokenGoes() {
        var m = machine()
        _ = m.tick(now: 0)
        _ = m.claimed([.send(job(1), "a")], requested: 4, now: 0)
        var sent: PushJob?
        for a in m.answered(1, .status(400, reason: "BadDeviceToken", timestampMs: nil), now: 1, random: 0) {
            if case .send(let j, _, _) = a { sent = j }
        }
        XCTAssertEqual(sent?.environment, .sandbox)
        XCTAssertEqual(sent?.switchedEnvironment, true)
        var marked: [PushMark] = []
        for a in m.answered(1, ok, now: 1, random: 0) { if case .mark(let ms) = a { marked = ms } }
        guard case .delivered(let j)? = marked.first else { return XCTFail("\(marked)") }
        XCTAssertEqual(j.environment, .sandbox)
        XCTAssertTrue(j.switchedEnvironment)
    }

    func testThrottlingAndServerErrorsBackOffAndALostConnectionRetriesAtOnce() {
        var m = machine()
        _ = m.tick(now: 0)
        _ = m.claimed([.send(job(1, attempts: 1), "a"), .send(job(2, attempts: 1), "b"), .send(job(3, attempts: 2), "c")],
                      requested: 4, now: 0)
        XCTAssertEqual(marks(m.answered(1, .status(429, reason: "TooManyRequests", timestampMs: nil), now: 0, random: 0)),
                       ["mark retry 1 +0.5"])
        _ = m.marked(ok: true, now: 0)
        XCTAssertEqual(marks(m.answered(2, .transport(.connectionLost), now: 0, random: 0)), ["mark retry 2 +0.0"])
        _ = m.marked(ok: true, now: 0)
        XCTAssertEqual(marks(m.answered(3, .status(503, reason: nil, timestampMs: nil), now: 0, random: 0)), ["mark retry 3 +1.0"],
                       "second try: backoff")
    }

    func testExpiredProviderTokenMintsOnceAndResendsWithoutTheDatabase() {
        var m = machine()
        _ = m.tick(now: 0)
        _ = m.claimed([.send(job(1), "a"), .send(job(2), "b")], requested: 4, now: 0)
        let expired = APNsAnswer.status(403, reason: "ExpiredProviderToken", timestampMs: nil)
        XCTAssertEqual(names(m.answered(1, expired, now: 100, random: 0)), ["token 2 renew", "send 1 a jwt2", "report 1 jwt_expired"])
        XCTAssertEqual(names(m.answered(2, expired, now: 100, random: 0)), ["send 2 b jwt2", "report 2 jwt_expired"],
                       "sent with the old token: resend with the new one, no second mint")
        XCTAssertEqual(names(m.answered(1, expired, now: 101, random: 0)),
                       ["report providerTokenStillExpired", "report 1 jwt_expired", "mark retry 1 +0.5"],
                       "expired again at once: back off, do not mint per request")
        XCTAssertEqual(m.tokenGeneration, 2)
    }

    /// One token per deployment: its age is the shared token's `iat`, not this process's
    /// start; `TooManyProviderTokenUpdates` pauses everything until a token may change again
    /// (20 minutes after that `iat`), and the pause read from the database pauses too.
    func testTooManyProviderTokenUpdatesPausesSendingUntilATokenMayBeMade() {
        var m = machine()
        _ = m.tick(now: 1000)
        XCTAssertEqual(names(m.claimed([.send(job(1), "a"), .send(job(2), "b")], requested: 4, now: 1000)),
                       ["token 1", "send 1 a jwt1", "send 2 b jwt1"])
        XCTAssertEqual(names(m.providerTokenReady(generation: 1, issuedAt: 700, pausedUntil: nil, now: 1000)), [])
        let tooMany = APNsAnswer.status(429, reason: "TooManyProviderTokenUpdates", timestampMs: nil)
        XCTAssertEqual(names(m.answered(1, tooMany, now: 1001, random: 0)),
                       ["report sendingPaused(until: 1900.0)", "report 1 jwt_throttled", "mark retry 1 +899.0 uncounted"],
                       "until iat 700 + 20 min, not counted against the push")
        _ = m.marked(ok: true, now: 1001)
        XCTAssertEqual(names(m.answered(2, tooMany, now: 1002, random: 0)), ["report 2 jwt_throttled", "mark retry 2 +898.0 uncounted"])
        _ = m.marked(ok: true, now: 1002)
        XCTAssertEqual(names(m.tick(now: 1500)), [], "paused: no claims")
        XCTAssertEqual(names(m.tick(now: 1900)), ["report sendingResumed", "claim 4"])
        XCTAssertEqual(names(m.claimed([.send(job(3), "c")], requested: 4, now: 1900)), ["token 2", "send 3 c jwt2"],
                       "the stored token again (not a renewal: that is what was refused)")
        XCTAssertEqual(names(m.providerTokenReady(generation: 2, issuedAt: 1890, pausedUntil: 2500, now: 1900)),
                       ["report sendingPaused(until: 2500.0)"], "another process was told to pause: so is this one")
        XCTAssertEqual(names(m.answered(3, ok, now: 1901, random: 0)).filter { $0.hasPrefix("claim") }, [])
        XCTAssertEqual(names(m.providerTokenReady(generation: 1, issuedAt: 1, pausedUntil: nil, now: 1901)), [], "a stale answer")
    }

    /// The broadcast sender's 429 TooManyProviderTokenUpdates pauses this process's token
    /// pushes too (issue 37: broadcasts and token pushes obey one pause).
    func testAPauseFromTheBroadcastSenderStopsClaims() {
        var m = machine()
        _ = m.tick(now: 1000)
        _ = m.claimed([], requested: 4, now: 1000)
        XCTAssertEqual(names(m.pausedByBroadcasts(until: 1600, now: 1001)), [])
        XCTAssertEqual(names(m.pausedByBroadcasts(until: 1200, now: 1001)), [], "a shorter pause changes nothing")
        _ = m.kick(now: 1002)
        XCTAssertEqual(names(m.tick(now: 1300)), [], "paused: no claims")
        XCTAssertEqual(names(m.tick(now: 1600)), ["report sendingResumed", "claim 4"])
        XCTAssertEqual(names(m.pausedByBroadcasts(until: 1500, now: 1601)), [], "a pause already over")
    }

    func testAProviderTokenThatCannotBeHadIsAskedForAgainAfterAPause() {
        var m = machine()
        _ = m.tick(now: 0)
        _ = m.claimed([.send(job(1), "a")], requested: 4, now: 0)
        XCTAssertEqual(names(m.providerTokenFailed(generation: 1, now: 0)), ["wake 1.0"])
        XCTAssertEqual(names(m.answered(1, .transport(.cancelled), now: 0, random: 0)).filter { $0.hasPrefix("mark") },
                       ["mark retry 1 +0.0 uncounted"])
        _ = m.marked(ok: true, now: 0)
        XCTAssertEqual(names(m.tick(now: 0.5)), [], "not before the database retry")
        XCTAssertEqual(names(m.tick(now: 1)), ["claim 4"])
        XCTAssertEqual(names(m.claimed([.send(job(1), "a")], requested: 4, now: 1)), ["token 2", "send 1 a jwt2"])
    }

    func testAnInvalidProviderTokenStopsSendingUntilThePauseEnds() {
        var m = machine()
        _ = m.tick(now: 0)
        _ = m.claimed([.send(job(1), "a"), .send(job(2), "b")], requested: 4, now: 0)
        let invalid = APNsAnswer.status(403, reason: "InvalidProviderToken", timestampMs: nil)
        XCTAssertEqual(names(m.answered(1, invalid, now: 10, random: 0)),
                       ["report stopped until 610.0", "report 1 jwt_rejected", "mark retry 1 +600.0 uncounted"])
        XCTAssertEqual(names(m.answered(2, invalid, now: 11, random: 0)), ["report 2 jwt_rejected"], "said once")
        XCTAssertEqual(names(m.marked(ok: true, now: 11)), ["mark retry 2 +599.0 uncounted"])
        XCTAssertEqual(names(m.marked(ok: true, now: 11)), [])
        XCTAssertEqual(names(m.tick(now: 12)), [], "stopped: no claims, no loop")
        XCTAssertEqual(names(m.tick(now: 611)), ["report sendingResumed", "claim 4"])
        XCTAssertEqual(names(m.claimed([.send(job(3), "c")], requested: 4, now: 611)), ["token 2 renew", "send 3 c jwt2"],
                       "a new token after the pause")
    }

    func testOtherRefusalsAreFailedNotRetried() {
        var m = machine()
        _ = m.tick(now: 0)
        _ = m.claimed([.send(job(1), "a")], requested: 4, now: 0)
        XCTAssertEqual(marks(m.answered(1, .status(400, reason: "BadPriority", timestampMs: nil), now: 0, random: 0)), ["mark failed 1"])
    }

    func testFailedMarksAreWrittenAgainLater() {
        var m = machine()
        _ = m.tick(now: 0)
        _ = m.claimed([.send(job(1), "a")], requested: 4, now: 0)
        _ = m.answered(1, ok, now: 0, random: 0)
        XCTAssertEqual(names(m.marked(ok: false, now: 5)), ["report markFailed(count: 1)"])
        XCTAssertEqual(marks(m.tick(now: 5.5)), [], "database retry pause")
        XCTAssertEqual(marks(m.tick(now: 6)), ["mark delivered 1"])
    }

    func testAFailedClaimPausesClaims() {
        var m = machine()
        _ = m.tick(now: 0)
        XCTAssertEqual(names(m.claimFailed(now: 0)), ["report claimFailed"])
        XCTAssertEqual(names(m.tick(now: 0.5)), [])
        XCTAssertEqual(names(m.tick(now: 1)), ["claim 4"])
    }

    func testShutdownStopsClaimingAndReleasesWhatComesBack() {
        var m = machine()
        _ = m.tick(now: 0)
        XCTAssertEqual(names(m.stop(now: 0)), [])
        XCTAssertEqual(names(m.claimed([.send(job(1), "a")], requested: 4, now: 0)), ["mark retry 1 +0.0 uncounted"],
                       "claimed as we stopped: released, not sent")
        XCTAssertEqual(names(m.kick(now: 0)), [])
        var n = machine()
        _ = n.tick(now: 0)
        _ = n.claimed([.send(job(2), "b")], requested: 4, now: 0)
        _ = n.stop(now: 0)
        XCTAssertEqual(marks(n.answered(2, .transport(.cancelled), now: 0, random: 0)), ["mark retry 2 +0.0 uncounted"])
    }

    /// Commits that mark the outbox come one after another: claims and marks are spaced by
    /// their intervals (the database's work follows the interval, not the push rate), but a
    /// full claim goes on at once and the first kick after a quiet spell is not delayed.
    func testClaimsAndMarksAreSpacedByTheirIntervals() {
        var m = machine(batch: 4, inFlight: 100, claimInterval: 0.01, markInterval: 0.01)
        XCTAssertEqual(names(m.kick(now: 1.0)), ["claim 4"], "quiet: at once")
        _ = m.claimed([.send(job(1), "a")], requested: 4, now: 1.001)
        XCTAssertEqual(names(m.kick(now: 1.002)), ["wake 1.01"], "another commit 2 ms later waits for the interval")
        XCTAssertEqual(names(m.kick(now: 1.004)), ["wake 1.01"])
        XCTAssertEqual(names(m.tick(now: 1.01)), ["claim 4"], "one claim for both")
        XCTAssertEqual(names(m.claimed((2...5).map { .send(job($0), "p") }, requested: 4, now: 1.011)).last, "claim 4",
                       "a full batch claims again at once")
        XCTAssertEqual(names(m.answered(1, ok, now: 1.012, random: 0)), ["report 1 delivered", "mark delivered 1"])
        _ = m.marked(ok: true, now: 1.013)
        XCTAssertEqual(names(m.answered(2, ok, now: 1.014, random: 0)), ["report 2 delivered", "wake 1.022"])
        XCTAssertEqual(names(m.answered(3, ok, now: 1.016, random: 0)), ["report 3 delivered", "wake 1.022"])
        XCTAssertEqual(marks(m.tick(now: 1.022)), ["mark delivered 2,delivered 3"], "one batch of marks")
    }

    func testAnswersForUnknownRowsAreIgnored() {
        var m = machine()
        XCTAssertEqual(names(m.answered(99, ok, now: 0, random: 0)), [])
    }

    /// A model check: random interleavings of claims, answers, kicks, ticks and mark results.
    /// Whatever happens, every claimed row ends in exactly one mark that was written, and no
    /// row is sent while it is already in flight.
    func testEveryClaimedRowIsMarkedExactlyOnce() {
        var rng = SeededGenerator(seed: 42)
        for _ in 0..<200 {
            var m = machine(batch: 3, inFlight: 5)
            var nextID: Int64 = 1
            var now = 0.0
            var pendingClaim: Int?
            var inFlight: Set<Int64> = []
            var markBatch: [PushMark]?
            var written: [Int64: Int] = [:]
            var claimedIDs: Set<Int64> = []
            func perform(_ actions: [Machine.Action]) {
                for a in actions {
                    switch a {
                    case .claim(let n): XCTAssertNil(pendingClaim); pendingClaim = n
                    case .send(let j, _, _): XCTAssertFalse(inFlight.contains(j.outboxID)); inFlight.insert(j.outboxID)
                    case .mark(let batch): XCTAssertNil(markBatch); markBatch = batch
                    case .obtainProviderToken, .report, .wake: break
                    }
                }
            }
            for _ in 0..<60 {
                now += Double.random(in: 0...2, using: &rng)
                switch Int.random(in: 0..<6, using: &rng) {
                case 0: perform(m.tick(now: now))
                case 1: perform(m.kick(now: now))
                case 2:
                    guard let n = pendingClaim else { continue }
                    pendingClaim = nil
                    let count = Int.random(in: 0...n, using: &rng)
                    var items: [Machine.Claimed] = []
                    for _ in 0..<count {
                        let id = nextID
                        nextID += 1
                        claimedIDs.insert(id)
                        items.append(Bool.random(using: &rng) ? .send(job(id), "p") : .settle(.drop(job(id))))
                    }
                    perform(m.claimed(items, requested: n, now: now))
                case 3:
                    guard let id = inFlight.randomElement(using: &rng) else { continue }
                    inFlight.remove(id)
                    let answers: [APNsAnswer] = [ok, .status(410, reason: nil, timestampMs: nil), .status(429, reason: nil, timestampMs: nil),
                                                 .transport(.connectionLost), .status(403, reason: "ExpiredProviderToken", timestampMs: nil)]
                    perform(m.answered(id, answers.randomElement(using: &rng)!, now: now, random: 0.5))
                case 4:
                    guard let batch = markBatch else { continue }
                    markBatch = nil
                    let ok = Int.random(in: 0..<4, using: &rng) > 0
                    if ok { for mark in batch { written[mark.job?.outboxID ?? -1, default: 0] += 1 } }
                    perform(m.marked(ok: ok, now: now))
                default:
                    if pendingClaim != nil && Bool.random(using: &rng) { pendingClaim = nil; perform(m.claimFailed(now: now)) }
                }
            }
            // Drain: answer everything, write every mark.
            var guardCount = 0
            while (!inFlight.isEmpty || markBatch != nil || !m.pendingMarks.isEmpty) && guardCount < 1000 {
                guardCount += 1
                now += 1
                if let id = inFlight.first {
                    inFlight.remove(id)
                    perform(m.answered(id, ok, now: now, random: 0.5))
                } else if let batch = markBatch {
                    markBatch = nil
                    for mark in batch { written[mark.job?.outboxID ?? -1, default: 0] += 1 }
                    perform(m.marked(ok: true, now: now))
                } else {
                    perform(m.tick(now: now))
                }
            }
            XCTAssertEqual(Set(written.keys), claimedIDs, "every claimed row marked")
            XCTAssertTrue(written.values.allSatisfy { $0 == 1 }, "and only once: \(written)")
        }
    }
}
