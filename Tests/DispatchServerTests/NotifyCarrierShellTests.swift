import DispatchCore
import DispatchHarness
import DispatchIO
import XCTest
@testable import DispatchServer

/// The LISTEN/NOTIFY carrier's shell in one process: the notifications the worker routes to
/// it, its probe sent through a scripted reader, its LISTEN session on a scripted driver,
/// streams and feeds over a scripted database, time on a manual loop. Its failure paths: a
/// malformed or forged notification, a session that stays connected but goes silent, a
/// session lost, a timer after close.
final class NotifyCarrierShellTests: XCTestCase {
    var fx: CarrierFixture!
    var listenSession: ScriptedSession!
    var listener: PGConnection!
    var carrier: NotifyCarrier!
    var cancels = 0
    let pid: Int32 = 4242
    var loop: ManualLoop { fx.loop }
    var scripted: ScriptedDatabase { fx.scripted }
    var metrics: Metrics { fx.metrics }
    var pendingReads: [String] { fx.pendingReads }

    override func setUp() {
        fx = CarrierFixture()
        listenSession = ScriptedSession()
        listener = PGConnection(loop: fx.loop, driver: listenSession.driver, conninfo: "scripted", name: "listener", log: fx.log)
        listener.start()
        listenSession.driver.socketReady()
        fx.changes.delegate = self
        carrier = NotifyCarrier(loop: fx.loop, db: fx.scripted.db, listener: listener, changes: fx.changes, metrics: fx.metrics, log: fx.log, pid: pid)
        XCTAssertNoThrow(try carrier.start())
        loop.runSoon()
        XCTAssertTrue(listener.isReady)
    }

    override func tearDown() {
        carrier.close()
        listener.close()
        fx.tearDown()
        XCTAssertEqual(listenSession.driver.violations, [])
    }

    func liveStream(_ id: String, seq: Int64) -> ScriptedStream { fx.liveStream(id, seq: seq) }

    func notice(_ position: Int64, _ id: String, _ seq: Int64, _ event: String, _ json: String) -> String {
        "\(position)\n\(id)\n\(seq)\n\(event)\n\(json)"
    }

    /// The probes sent so far and not answered: their numbers (this process's pid checked).
    func probesSent() -> [String] {
        let sent = scripted.sessions[1].parameters(of: "carrier_probe").flatMap { $0.first ?? nil }
        return sent.map { [$0] } ?? []
    }

    func testAChangeIsDeliveredFromItsNoticeWithoutARead() {
        let s = liveStream("job", seq: 3)
        carrier.notified(channel: Channel.events, payload: notice(12, "job", 4, "processing", #"{"seq":4,"status":"noticed"}"#))
        XCTAssertEqual(eventIDs(s), ["3", "4"])
        XCTAssertTrue(s.written.last?.contains(#""status":"noticed""#) == true)
        XCTAssertEqual(pendingReads, [], "the notice carried the snapshot")
        XCTAssertEqual(cancels, 0)
        carrier.notified(channel: Channel.events, payload: notice(13, "job", 5, EventName.cancelRequested.rawValue, #"{"seq":5}"#))
        XCTAssertEqual(cancels, 1, "a cancel request elsewhere wakes the webhook sender")
        XCTAssertEqual(eventIDs(s), ["3", "4", "5"])
    }

    func testAnOversizedChangeArrivesWithoutItsSnapshotAndIsRead() {
        let s = liveStream("job", seq: 3)
        carrier.notified(channel: Channel.events, payload: notice(12, "job", 4, "processing", ""))
        XCTAssertEqual(pendingReads, ["read_history"])
        scripted.answer(on: scripted.reader) { _ in
            fx.history([("job", 4, "processing", #"{"seq":4}"#)])
        }
        XCTAssertEqual(eventIDs(s), ["3", "4"])
    }

    func testMalformedNotificationsChangeNothing() {
        let s = liveStream("job", seq: 3)
        for payload in ["", "garbage", "x\njob\n4\nprocessing\n{}", "12\njob\nfour\nprocessing\n{}", "12\njob\n4"] {
            carrier.notified(channel: Channel.events, payload: payload)
        }
        carrier.notified(channel: "dispatch_other", payload: notice(12, "job", 4, "processing", "{}"))
        loop.runSoon()
        XCTAssertEqual(eventIDs(s), ["3"])
        XCTAssertEqual(pendingReads, [])
        XCTAssertNil(s.ending)
        // A good one after them is delivered.
        carrier.notified(channel: Channel.events, payload: notice(12, "job", 4, "processing", #"{"seq":4}"#))
        XCTAssertEqual(eventIDs(s), ["3", "4"])
    }

    func testProbesGoThroughTheReaderAndOnlyThisProcesssOwnCountsAsHeard() {
        carrier.listening(restored: false)
        XCTAssertEqual(pendingReads, ["carrier_probe"])
        XCTAssertEqual(probesSent(), ["\(pid):1"])
        scripted.answer(on: scripted.reader) { _ in PGResult() }
        // Another worker's probe, a forged number, a garbled one: none is this probe.
        for payload in ["\(pid + 1):1", "\(pid):99", "\(pid)", "\(pid):1:2", "x:y"] {
            carrier.notified(channel: Channel.probe, payload: payload)
        }
        loop.advance(by: 3.5)
        XCTAssertFalse(carrier.isHealthy, "nothing of this process came back within the deadline")
        XCTAssertEqual(metrics.carrierStalls, 1)
    }

    func testASilentSessionIsReconnectedThenReReadsWhatItMissed() {
        let s = liveStream("job", seq: 3)
        carrier.listening(restored: false)
        let finishes = listenSession.driver.finishes
        // Probes go out (answered by the reader) and never come back on the LISTEN session.
        for _ in 0..<7 {
            loop.advance(by: 0.5)
            scripted.answer(on: scripted.reader) { _ in PGResult() }
        }
        XCTAssertFalse(carrier.isHealthy, "/readyz says so")
        XCTAssertTrue(metrics.carrierStalled)
        XCTAssertEqual(metrics.carrierStalls, 1)
        XCTAssertFalse(listener.isReady, "the session is dropped, to be reconnected")
        XCTAssertEqual(listenSession.driver.finishes, finishes + 1)
        // It listens again: what it carried meanwhile is lost, so streams re-read.
        carrier.listening(restored: true)
        loop.runSoon()
        XCTAssertEqual(pendingReads.filter { $0 != "carrier_probe" }, ["read_history"])
        scripted.answer(on: scripted.reader) { name in
            name == "read_history"
                ? fx.history([("job", 4, "processing", #"{"seq":4}"#)])
                : PGResult()
        }
        XCTAssertEqual(eventIDs(s), ["3", "4"])
        // Its first probe comes back: recovered.
        let last = probesSent().first!
        carrier.notified(channel: Channel.probe, payload: last)
        XCTAssertTrue(carrier.isHealthy)
        XCTAssertFalse(metrics.carrierStalled)
    }

    func testALostSessionIsNotAStallAndNoProbeGoesWhileTheReaderIsDown() {
        carrier.listening(restored: false)
        scripted.answer(on: scripted.reader) { _ in PGResult() }
        carrier.listenLost()
        loop.advance(by: 10)
        XCTAssertTrue(carrier.isHealthy, "a lost session is the session's own fault to report, not a silent carrier")
        XCTAssertEqual(pendingReads, [], "no probe while the session is down")
        scripted.sessions[1].connectionLost()
        loop.runSoon()
        carrier.listening(restored: true)
        XCTAssertEqual(pendingReads, [], "the reader is down: the probe waits for it")
    }

    func testNoTimerFiresAfterClose() {
        carrier.listening(restored: false)
        scripted.answer(on: scripted.reader) { _ in PGResult() }
        carrier.close()
        loop.advance(by: 10)
        XCTAssertEqual(pendingReads, [], "no probe after close")
        XCTAssertTrue(carrier.isHealthy)
        XCTAssertTrue(listener.isReady, "nothing reset after close")
    }
}

extension NotifyCarrierShellTests: CarrierDelegate {
    func carrierHeardCancelRequest() { cancels += 1 }
}
