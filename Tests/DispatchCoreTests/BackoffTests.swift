import DispatchCore
import XCTest

final class BackoffTests: XCTestCase {
    func testStepsDoubleFromTheInitialWaitUpToTheCap() {
        // (initial, maximum, attempt, step): the bounds of every caller are among the rows.
        let table: [(Double, Double, Int, Double)] = [
            (0.1, 5, 1, 0.1), (0.1, 5, 2, 0.2), (0.1, 5, 6, 3.2), (0.1, 5, 7, 5), (0.1, 5, 10_000, 5),  // PostgreSQL reconnects
            (2, 3600, 1, 2), (2, 3600, 11, 2048), (2, 3600, 12, 3600),  // webhooks
            (1, 300, 9, 256), (1, 300, 10, 300),  // pushes, broadcasts
            (0.5, 5, 4, 4), (0.5, 5, 5, 5),  // `dispatch run`
            (3, 30, 4, 24), (3, 30, 5, 30), (1, 16, 50, 16),  // `dispatch run` reconnecting to its stream
            (0.1, 2, 0, 0.1), (0.1, 2, -3, 0.1), (0.1, 2, Int.max, 2),  // attempts out of range
            (0, 2, 8, 0), (7, 2, 1, 2),  // no wait at all; an initial wait above the cap
        ]
        for (initial, maximum, attempt, step) in table {
            let b = Backoff(initial: initial, maximum: maximum)
            XCTAssertEqual(b.step(afterAttempt: attempt), step, accuracy: 1e-9, "\(initial)…\(maximum) attempt \(attempt)")
            XCTAssertEqual(b.delay(afterAttempt: attempt, random: 0.7), step, accuracy: 1e-9, "no jitter")
        }
    }

    func testEqualJitterPicksInTheUpperHalfOfTheStep() {
        let b = Backoff(initial: 1, maximum: 60, jitter: .equal)
        // (attempt, random, delay)
        let table: [(Int, Double, Double)] = [
            (1, 0, 0.5), (1, 0.5, 0.75), (2, 0, 1), (3, 0, 2), (6, 0, 16), (7, 0, 30), (50, 0, 30),
            (3, -1, 2), (3, .nan, 2), (3, 1, 4 - 2e-6), (3, 7, 4 - 2e-6), (7, 0.999_999, 60 - 3e-5),
        ]
        for (attempt, random, delay) in table {
            XCTAssertEqual(b.delay(afterAttempt: attempt, random: random), delay, accuracy: 1e-9, "attempt \(attempt), random \(random)")
        }
    }

    func testASeededGeneratorReplaysTheSameJitterAndStaysInBounds() {
        let b = Backoff(initial: 2, maximum: 3600, jitter: .equal)
        var first = SeededGenerator(seed: 25)
        var second = SeededGenerator(seed: 25)
        var other = SeededGenerator(seed: 26)
        var differs = false
        for attempt in 1...40 {
            let d = b.delay(afterAttempt: attempt, using: &first)
            XCTAssertEqual(d, b.delay(afterAttempt: attempt, using: &second))
            let step = b.step(afterAttempt: attempt)
            XCTAssertTrue(d >= step / 2 && d < step, "attempt \(attempt): \(d)")
            if d != b.delay(afterAttempt: attempt, using: &other) { differs = true }
        }
        XCTAssertTrue(differs, "another seed, other draws")
    }

    func testTheSeededGeneratorIsSplitMix64() {
        var g = SeededGenerator(seed: 0)
        XCTAssertEqual(g.next(), 0xE220_A839_7B1D_CDAF)
        XCTAssertEqual(g.next(), 0x6E78_9E6A_A1B9_65F4)
    }
}
