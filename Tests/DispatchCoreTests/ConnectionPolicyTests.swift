@testable import DispatchCore
import XCTest

final class ConnectionPolicyTests: XCTestCase {
    typealias C = ConnectionPolicy.Connection
    let policy = ConnectionPolicy(requestDeadline: 30, maxPendingPerClient: 2, pendingGrace: 2)

    func testTheWholeRequestDeadline() {
        let conns = [
            C(id: 1, peer: "a", since: 0, requestsCompleted: 0, held: false),     // trickling for 31 s
            C(id: 2, peer: "a", since: 5, requestsCompleted: 3, held: false),     // kept alive, 26 s since its last request
            C(id: 3, peer: "a", since: 0, requestsCompleted: 1, held: true),      // a stream (or a request being answered): never cut here
            C(id: 4, peer: "b", since: 0.5, requestsCompleted: 9, held: false),   // 30.5 s since its last request
        ]
        XCTAssertEqual(policy.connectionsToCut(conns, now: 31), [1, 4])
    }

    func testThePerClientCapCutsTheNewestPendingOnes() {
        let conns = [
            C(id: 1, peer: "a", since: 1, requestsCompleted: 0, held: false),
            C(id: 2, peer: "a", since: 2, requestsCompleted: 0, held: false),
            C(id: 3, peer: "a", since: 3, requestsCompleted: 0, held: false),
            C(id: 4, peer: "a", since: 4, requestsCompleted: 0, held: false),
            C(id: 5, peer: "a", since: 9.5, requestsCompleted: 0, held: false),   // within the grace: not counted
            C(id: 6, peer: "a", since: 1, requestsCompleted: 1, held: false),     // served a request: not pending
            C(id: 7, peer: "b", since: 1, requestsCompleted: 0, held: false),     // another client
            C(id: 8, peer: nil, since: 1, requestsCompleted: 0, held: false),     // address unknown yet
        ]
        XCTAssertEqual(policy.connectionsToCut(conns, now: 10), [3, 4])
    }

    func testNothingToCut() {
        XCTAssertEqual(policy.connectionsToCut([], now: 100), [])
        XCTAssertEqual(policy.connectionsToCut([C(id: 1, peer: "a", since: 99, requestsCompleted: 0, held: false)], now: 100), [])
    }
}
