import CLibevent
import DispatchCore
import DispatchHarness
import XCTest
@testable import DispatchIO

/// ConnectionGuard's bookkeeping with no socket: bufferevents without a descriptor on a real
/// event base, the sweep on a manual loop. The test plays evhttp's part: it holds its own
/// reference on each connection, and dropping one means clearing its callbacks and freeing it.
final class ConnectionGuardTests: XCTestCase {
    var base: EventLoop!
    var loop: ManualLoop!
    var guardian: ConnectionGuard!

    override func setUp() {
        base = EventLoop()
        loop = ManualLoop()
        guardian = ConnectionGuard(loop: loop, policy: ConnectionPolicy(requestDeadline: 4.8, maxPendingPerClient: 32, pendingGrace: 2))
    }

    override func tearDown() {
        guardian.close()
        guardian = nil
    }

    /// A connection as evhttp sets it up: its read callback set.
    func accept() -> OpaquePointer {
        let bev = guardian.newConnection(base: base.base)!
        bufferevent_setcb(bev, { _, _ in }, nil, nil, nil)
        return bev
    }

    /// evhttp dropping a connection that never completed a request: callbacks cleared, its
    /// reference given back; the guard's is the last.
    func evhttpDrops(_ bev: OpaquePointer) {
        bufferevent_setcb(bev, nil, nil, nil, nil)
        bufferevent_free(bev)
    }

    func testADroppedConnectionIsReleasedAtTheNextSweepAndOnlyOnce() {
        let kept = accept(), dropped = accept()
        XCTAssertEqual(guardian.count, 2)
        evhttpDrops(dropped)
        loop.advance(by: 0.4)
        XCTAssertEqual(guardian.count, 2, "nothing before the sweep")
        loop.advance(by: 0.2)
        XCTAssertEqual(guardian.count, 1, "released by the sweep")
        loop.advance(by: 2)
        XCTAssertEqual(guardian.count, 1, "and not again")
        XCTAssertEqual(guardian.cut, 0)
        guardian.close()
        XCTAssertEqual(guardian.count, 0)
        bufferevent_free(kept)
    }

    /// A connection that has not completed a request by the deadline is cut.
    func testTheRequestDeadlineCutsASlowConnection() {
        let slow = accept()
        loop.advance(by: 4.9)
        XCTAssertEqual(guardian.cut, 0)
        loop.advance(by: 0.3)
        XCTAssertEqual(guardian.cut, 1, "cut at the first sweep past its deadline (4.8 s), at 5 s")
        guardian.close()
        bufferevent_free(slow)
    }
}
