import DispatchCore
import DispatchHarness
import DispatchIO
import XCTest
@testable import DispatchServer

/// The shell status streams and feeds share (SSESessions and SSEConnection), on a manual loop
/// and scripted streams: no socket, no database, a clock that moves only when told.
final class SSESessionsTests: XCTestCase {
    final class Session: KeyedStream {
        let id: Int
        let keyID: Int64
        let connection: SSEConnection
        let stream: ScriptedStream
        var sessionHash: String?
        init(id: Int, keyID: Int64, connection: SSEConnection, stream: ScriptedStream) {
            self.id = id
            self.keyID = keyID
            self.connection = connection
            self.stream = stream
        }
    }

    var loop: ManualLoop!
    var shell: SSESessions<Session>!
    var delivered = 0
    /// Teardowns as the service sees them: "closing 1", "closed 1 terminal".
    var teardowns: [String] = []
    /// Kept past their teardown, to look at what they were sent.
    var streams: [Int: ScriptedStream] = [:]
    let maxBacklog = 64 * 1024

    override func setUp() {
        loop = ManualLoop()
        // Heartbeats after 4 s of silence, checked every second.
        shell = SSESessions(loop: loop, heartbeatSeconds: 4)
        delivered = 0
        teardowns = []
        streams = [:]
        shell.owner = self
    }

    @discardableResult
    func open(key: Int64 = 1, session hash: String? = nil, begin: Bool = true) -> Session {
        let session = shell.add { id in
            let stream = ScriptedStream()
            let s = Session(id: id, keyID: key,
                            connection: SSEConnection(stream, loop: loop, tag: id, delegate: shell, extraHeaders: [],
                                                      maxBacklog: maxBacklog, writeTimeout: 60, pageCap: 16 * 1024),
                            stream: stream)
            s.sessionHash = hash
            return s
        }
        streams[session.id] = session.stream
        if begin { session.connection.begin() }
        return session
    }

    func event(_ n: Int, bytes: Int = 10) -> StreamPayload {
        StreamPayload(SSE.encode(id: String(n), event: "e", data: String(repeating: "x", count: bytes)))
    }

    func events(of stream: ScriptedStream) -> [String] {
        stream.written.filter { $0.hasPrefix("id: ") }.map { String($0.dropFirst(4).prefix { $0 != "\n" }) }
    }

    // MARK: - Delivering

    func testALiveEventGoesOutAtOnceAndAPageAsTheSocketDrains() {
        let s = open()
        XCTAssertEqual(s.stream.headers.first?.1, "text/event-stream")
        XCTAssertTrue(s.stream.written.first?.hasPrefix("retry: 3000") == true, "the reconnect delay comes first")
        shell.send(s.id, [event(1)])
        XCTAssertEqual(events(of: s.stream), ["1"])
        XCTAssertEqual(delivered, 1)

        // A replay page bigger than the low-water mark, onto a socket that takes nothing now.
        s.stream.socketFull = true
        shell.send(s.id, (2...40).map { event($0, bytes: 1000) })
        XCTAssertEqual(delivered, 40)
        let before = events(of: s.stream).count
        XCTAssertLessThan(before, 40, "paced: the page waits in the outbox while the socket is full")
        while events(of: s.stream).count < 40 {
            let n = events(of: s.stream).count
            s.stream.drain()
            XCTAssertGreaterThan(events(of: s.stream).count, n, "each drain writes more")
        }
        XCTAssertEqual(events(of: s.stream), (1...40).map(String.init), "in order, once each")
        XCTAssertEqual(teardowns, [])
    }

    func testFinishingAfterWhatIsQueuedEndsTheStreamOnceDrained() {
        let s = open()
        s.stream.socketFull = true
        shell.send(s.id, (1...30).map { event($0, bytes: 1000) })
        shell.finishWhenDrained(s.id)
        XCTAssertEqual(teardowns, [], "not before the queue is written")
        while s.stream.isOpen { s.stream.drain() }
        XCTAssertEqual(events(of: s.stream).count, 30)
        XCTAssertEqual(teardowns, ["closing 1", "closed 1 terminal"])
        XCTAssertEqual(s.stream.ending, .ended)
    }

    /// A client that stops reading is cut off at the backlog cap, not buffered without bound.
    func testASlowClientIsCutOffAtTheBacklogCap() {
        let s = open()
        s.stream.socketFull = true
        for n in 1...200 where shell[s.id] != nil { shell.send(s.id, [event(n, bytes: 1000)]) }
        XCTAssertEqual(teardowns, ["closing 1", "closed 1 slow_client"])
        XCTAssertEqual(s.stream.ending, .aborted)
        XCTAssertLessThanOrEqual(s.stream.backlog, maxBacklog)
    }

    // MARK: - Teardown

    /// The peer leaves while a page waits for the socket, and events for it keep arriving:
    /// one teardown, nothing written after it, no callback reaches the service again.
    func testTeardownRacingAWrite() {
        let s = open()
        s.stream.socketFull = true
        shell.send(s.id, (1...30).map { event($0, bytes: 1000) })
        let written = s.stream.written.count
        s.stream.peerLeaves()
        XCTAssertEqual(teardowns, ["closing 1", "closed 1 client_closed"])
        shell.send(s.id, [event(31)])
        shell.send(s.id, (32...33).map { event($0) })
        shell.pump(s.id)
        shell.finishWhenDrained(s.id)
        // libevent's close callback already in flight when the service closed it.
        shell.streamPeerClosed(s.id)
        shell.streamDrained(s.id)
        XCTAssertEqual(s.stream.written.count, written)
        XCTAssertEqual(teardowns.count, 2, "torn down once")
        XCTAssertEqual(shell.count, 0)
    }

    /// A write that fails closes the stream; a close by the service is final too.
    func testAFailedWriteClosesOnceAndCloseIsIdempotent() {
        let a = open(), b = open()
        a.stream.failingWrites = 1
        shell.send(a.id, [event(1)])
        XCTAssertEqual(teardowns, ["closing 1", "closed 1 write_failed"])
        shell.close(b.id, reason: .terminal)
        shell.close(b.id, reason: .database)
        XCTAssertEqual(teardowns.suffix(2), ["closing 2", "closed 2 terminal"])
        XCTAssertEqual(b.stream.ending, .ended)
    }

    // MARK: - Heartbeats

    func testHeartbeatsGoToStartedStreamsSilentForTheirInterval() {
        let quiet = open(), busy = open(), waiting = open(begin: false)
        func beats(_ s: Session) -> Int { s.stream.written.filter { $0.hasPrefix(": heartbeat") }.count }
        loop.advance(by: 2)
        shell.send(busy.id, [event(1)])
        loop.advance(by: 0.5)
        XCTAssertEqual(beats(quiet), 0, "2.5 s of silence")
        loop.advance(by: 0.6)
        XCTAssertEqual(beats(quiet), 1, "at the first tick 3 s (the interval less one tick) after its last write")
        XCTAssertEqual(beats(busy), 0, "it wrote 1 s before")
        loop.advance(by: 2)
        XCTAssertEqual(beats(busy), 1)
        XCTAssertEqual(beats(quiet), 1, "its heartbeat was a write too")
        loop.advance(by: 1)
        XCTAssertEqual(beats(quiet), 2)
        XCTAssertEqual(beats(waiting), 0, "no headers yet: nothing to beat on")
        XCTAssertFalse(waiting.stream.started)
        XCTAssertEqual(delivered, 1, "heartbeats are not deliveries")
    }

    // MARK: - Revocation and shutdown

    func testRevokingAKeyClosesOnlyItsStreams() {
        open(key: 7)
        open(key: 8)
        open(key: 7)
        XCTAssertEqual(shell.streams(forKey: 7), 2)
        shell.closeStreams(ofKey: 7)
        XCTAssertEqual(teardowns.filter { $0.hasPrefix("closed") }.sorted(), ["closed 1 revoked", "closed 3 revoked"])
        XCTAssertEqual(shell.keys, [8])
        XCTAssertEqual(streams[1]?.ending, .aborted)
        XCTAssertEqual(streams[2]?.isOpen, true)
    }

    /// Signing out ends the streams that session opened, not the key's others (issue 36).
    func testEndingASessionClosesOnlyItsStreams() {
        open(key: 7, session: "a")
        open(key: 7)
        open(key: 7, session: "b")
        open(key: 7, session: "a")
        XCTAssertEqual(shell.sessionHashes.sorted(), ["a", "b"])
        shell.closeStreams(ofSession: "a")
        XCTAssertEqual(teardowns.filter { $0.hasPrefix("closed") }.sorted(), ["closed 1 revoked", "closed 4 revoked"])
        XCTAssertEqual(shell.sessionHashes, ["b"], "the table forgets a session with its last stream")
        XCTAssertEqual(shell.streams(forKey: 7), 2)
        XCTAssertEqual(streams[2]?.isOpen, true)
        shell.closeStreams(ofSession: "gone")
        XCTAssertEqual(shell.count, 2)
    }

    /// Shutdown tells each started stream when to come back, spread over the window, then
    /// ends it; heartbeats stop.
    func testShutdownSpreadsReconnectsAndEndsEveryStream() {
        for _ in 1...3 { open() }
        let unstarted = open(begin: false)
        shell.shutdown(alongside: 10_000)
        XCTAssertEqual(shell.count, 0)
        let window = SSESessions<Session>.reconnectWindow(streams: 14_000)
        XCTAssertEqual(window, 7)
        for id in 1...3 {
            let retry = streams[id]!.written.last!
            XCTAssertTrue(retry.hasPrefix("retry: "), retry)
            let ms = Int(retry.dropFirst(7).prefix { $0.isNumber })!
            XCTAssertTrue((500..<7500).contains(ms), "\(ms)")
            XCTAssertEqual(streams[id]!.ending, .ended)
        }
        XCTAssertFalse(unstarted.stream.started, "not started just to say goodbye")
        XCTAssertEqual(teardowns.filter { $0.hasSuffix("shutdown") }.count, 4)
        XCTAssertEqual(loop.pendingTimers, 0, "the heartbeat timer is gone")
        XCTAssertEqual(SSESessions<Session>.reconnectWindow(streams: 10), 2)
        XCTAssertEqual(SSESessions<Session>.reconnectWindow(streams: 1_000_000), 30)
    }

    // MARK: - The database retry

    /// A read failing while the database is away is retried 60 times, from 0.1 s doubling up
    /// to 2 s (113.1 s in all), then given up.
    func testTheDatabaseRetryBacksOffAndGivesUpAfterSixtyAttempts() {
        var attempts: [Double] = []
        var gaveUp: Double?
        let start = loop.now
        func read(_ attempt: Int) {
            attempts.append(loop.now - start)
            if !shell.retryLater(attempt: attempt, read) { gaveUp = loop.now - start }
        }
        read(0)
        loop.advance(by: 0.35)
        XCTAssertEqual(attempts.count, 3, "at 0, 0.1 and 0.3 s")
        loop.advance(by: 1.2)
        XCTAssertEqual(attempts.count, 5, "then 0.7 and 1.5 s")
        loop.advance(by: 111.5)
        XCTAssertEqual(attempts.count, 60)
        XCTAssertNil(gaveUp)
        loop.advance(by: 0.1)
        XCTAssertEqual(attempts.count, 61)
        XCTAssertEqual(gaveUp ?? 0, 113.1, accuracy: 0.001)
        XCTAssertEqual(attempts[59] - attempts[58], 2, accuracy: 0.001)
        XCTAssertEqual(loop.pendingTimers, 1, "only the heartbeat timer is left")
    }
}

extension SSESessionsTests: SSESessionsOwner {
    func sessionsDelivered(_ count: Int) { delivered += count }

    func sessionClosing(_ session: Session) { teardowns.append("closing \(session.id)") }

    func sessionClosed(_ session: Session, reason: StreamCloseReason) {
        teardowns.append("closed \(session.id) \(reason.rawValue)")
        // What the services do: end or abort the response.
        switch reason {
        case .terminal, .shutdown: session.connection.http.end()
        case .clientClosed: break
        default: session.connection.http.abort()
        }
    }
}
