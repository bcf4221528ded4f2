import DispatchCore
import DispatchHarness
import DispatchIO
import XCTest
@testable import DispatchServer

/// FeedService in one process: its pages are answered on a scripted feed session, its
/// clients are scripted streams, its clock a manual loop.
final class FeedServiceShellTests: XCTestCase {
    var loop: ManualLoop!
    var scripted: ScriptedDatabase!
    var service: FeedService!
    var metrics: Metrics!
    var carrier: [String] = []

    override func setUp() {
        loop = ManualLoop()
        metrics = Metrics(worker: 0)
        scripted = ScriptedDatabase(loop: loop, metrics: metrics)
        service = FeedService(loop: loop, repository: FeedRepository(db: scripted.db), metrics: metrics, log: Logger(level: .error),
                              settings: .init(heartbeatSeconds: 4, maxBacklog: 64 * 1024, writeTimeout: 60))
        carrier = []
        service.interest = self
    }

    override func tearDown() {
        service.shutdown()
        scripted.db.close()
        loop.runSoon()
        XCTAssertEqual(scripted.violations, [])
    }

    /// One page of the initial set: `head`, then (position, event) rows.
    func initialPage(head: Int64, _ rows: [(Int64, String)]) -> PGResult {
        PGResult(columns: ["head", "position", "event", "data", "machine"],
                 rows: rows.isEmpty ? [[String(head), nil, nil, nil, nil]]
                     : rows.map { [String(head), String($0.0), $0.1, "{\"position\":\($0.0)}", nil] })
    }

    func open(_ client: ScriptedStream, invalidLastEventID: Bool = false, key: Int64 = 1) {
        service.open(client, filter: FeedFilter(), lastEventID: nil, invalidLastEventID: invalidLastEventID, keyID: key, extraHeaders: [])
    }

    /// Headers at once; the initial set; `synced` at the head the read saw; then changes as
    /// NOTIFY brings them, each framed once for every feed.
    func testAFeedSendsItsInitialSetThenSyncedThenLiveChanges() {
        let a = ScriptedStream(), b = ScriptedStream()
        open(a)
        open(b)
        XCTAssertTrue(a.started, "headers before the first read")
        XCTAssertEqual(a.priority, .background, "a feed's pages wait while requests are ready")
        XCTAssertEqual(carrier, ["first"])
        XCTAssertEqual(scripted.pending(on: scripted.feedReader), ["feed_initial_page"], "opened together: one read for both")
        scripted.answer(on: scripted.feedReader) { _ in self.initialPage(head: 12, [(10, "processing"), (12, "completed")]) }
        for client in [a, b] {
            XCTAssertEqual(eventIDs(client), ["10", "12", "12"])
            XCTAssertTrue(client.written.last?.contains("event: synced") == true, client.written.last ?? "")
        }
        XCTAssertEqual(metrics.feedInitialReads, 1)
        XCTAssertEqual(metrics.feedSharedPages, 1, "b got a's page")
        let framed = metrics.feedFramed
        service.notified(ChangeNotice(position: 13, activityID: "job", seq: 1, event: "queued", json: "{\"machine\":\"m1\"}"))
        XCTAssertEqual(eventIDs(a).last, "13")
        XCTAssertEqual(eventIDs(b).last, "13")
        XCTAssertEqual(metrics.feedFramed - framed, 1, "framed once for both")
        XCTAssertEqual(metrics.feedDeliveries, 6)
    }

    /// A page shared by many readers goes out in slices of `bytesPerTurn`, the rest on later
    /// turns, and the next page is not asked for until every slice went.
    func testASharedPageGoesOutInSlicesAndTheNextReadWaitsForThem() {
        service = FeedService(loop: loop, repository: FeedRepository(db: scripted.db), metrics: metrics, log: Logger(level: .error),
                              settings: .init(heartbeatSeconds: 4, maxBacklog: 1 << 20, writeTimeout: 60),
                              pacer: BulkPacer(bytesPerTurn: 64 * 1024, restPerBusy: 2, minimumRest: 0.002))
        let clients = (0..<3).map { _ in ScriptedStream() }
        for c in clients { open(c) }
        XCTAssertEqual(scripted.pending(on: scripted.feedReader), ["feed_initial_page"])
        // More than one page's 64 KB budget: the page keeps what fits and is not the last.
        let pad = String(repeating: "x", count: 12_000)
        scripted.answer(on: scripted.feedReader) { _ in
            PGResult(columns: ["head", "position", "event", "data", "machine"],
                     rows: (1...8).map { ["99", String($0), "processing", "{\"pad\":\"\(pad)\"}", nil] })
        }
        let page = eventIDs(clients[0])
        XCTAssertGreaterThanOrEqual(page.count, 5, "the first reader's copy of the page: \(page)")
        XCTAssertEqual(eventIDs(clients[1]), [], "its 64 KB spent the turn: the others' copies wait")
        XCTAssertEqual(eventIDs(clients[2]), [])
        XCTAssertEqual(scripted.pending(on: scripted.feedReader), [], "no next page while slices wait")
        loop.runSoon()
        for c in clients { XCTAssertEqual(eventIDs(c), page, "each reader gets the page once, in order") }
        XCTAssertEqual(scripted.pending(on: scripted.feedReader), ["feed_initial_page"], "then the next page")
    }

    /// Two walks answered in turn keep the action queue from ever emptying: the actions
    /// already performed, and the pages they hold, are let go all the same.
    func testPerformedActionsAreLetGoWhileTheQueueNeverEmpties() {
        service = FeedService(loop: loop, repository: FeedRepository(db: scripted.db), metrics: metrics, log: Logger(level: .error),
                              settings: .init(heartbeatSeconds: 4, maxBacklog: 1 << 20, writeTimeout: 60),
                              pacer: BulkPacer(bytesPerTurn: 1, restPerBusy: 0, minimumRest: 0.002))
        let clients = (0..<200).map { _ in ScriptedStream() }
        for (i, c) in clients.enumerated() {
            service.open(c, filter: FeedFilter(machine: i % 2 == 0 ? "a" : "b"), lastEventID: nil, invalidLastEventID: false, keyID: 1,
                         extraHeaders: [])
        }
        let pad = String(repeating: "x", count: 40_000)
        var position: Int64 = 0, pages = 0, mostRetained = 0
        while pages < 40 {
            if !scripted.pending(on: scripted.feedReader).isEmpty {
                // A page cut by its byte budget: not the last.
                scripted.answer(on: scripted.feedReader) { _ in
                    PGResult(columns: ["head", "position", "event", "data", "machine"],
                             rows: (1...3).map { ["100000", String(position + Int64($0)), "processing", "{\"pad\":\"\(pad)\"}", nil] })
                }
                position += 3
                pages += 1
            }
            mostRetained = max(mostRetained, service.retainedActions)
            guard loop.runOne() else { break }
        }
        XCTAssertEqual(pages, 40, "the walks went on")
        XCTAssertGreaterThan(metrics.feedSharedPages, 2_000)
        XCTAssertLessThan(mostRetained, 600, "performed actions let go (before: every action since the load began)")
    }

    /// A Last-Event-ID that is not a number: `reset`, then the initial set.
    func testAnUnreadableLastEventIDGetsResetThenTheInitialSet() {
        let client = ScriptedStream()
        open(client, invalidLastEventID: true)
        scripted.answer(on: scripted.feedReader) { _ in self.initialPage(head: 5, [(5, "processing")]) }
        let events = client.written.filter { $0.contains("event: ") }.map { String($0.split(separator: "\n").first { $0.hasPrefix("event: ") }!.dropFirst(7)) }
        XCTAssertEqual(events, ["reset", "processing", "synced"])
        XCTAssertEqual(metrics.feedResets, 1)
    }

    /// The last feed leaving tells the carrier; a revoked key's feeds are aborted; shutdown
    /// ends the rest with a reconnect delay.
    func testTeardownsTellTheCarrierOnceTheLastFeedIsGone() {
        let kept = ScriptedStream(), revoked = ScriptedStream(), leaving = ScriptedStream()
        open(kept, key: 1)
        open(revoked, key: 2)
        open(leaving, key: 1)
        scripted.answer(on: scripted.feedReader) { _ in self.initialPage(head: 0, []) }
        leaving.peerLeaves()
        service.closeStreams(ofKey: 2)
        XCTAssertEqual(revoked.ending, .aborted)
        XCTAssertEqual(service.openFeeds, 1)
        XCTAssertEqual(carrier, ["first"])
        service.shutdown()
        XCTAssertTrue(kept.written.last?.hasPrefix("retry: ") == true)
        XCTAssertEqual(kept.ending, .ended)
        XCTAssertEqual(carrier, ["first", "last"])
        XCTAssertEqual(metrics.feedCloses, [.clientClosed: 1, .revoked: 1, .shutdown: 1])
    }
}

/// What the feeds tell the carrier, as a journal.
extension FeedServiceShellTests: FeedInterest {
    func feedOpened() { carrier.append("first") }
    func feedsClosed() { carrier.append("last") }
    func awaitNumbering(_ done: @escaping () -> Void) { done() }
}
