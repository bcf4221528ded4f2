import DispatchCore
import XCTest

/// The log's throttle (issue 36), one line per step: what is written, what is counted, and
/// when the count is told.
final class LogThrottleTests: XCTestCase {
    func testAWindowWritesItsLinesThenCountsAndTellsTheCountNextWindow() {
        var t = LogThrottle()
        let rule = LogThrottle.Rule(lines: 2, window: 1)
        let steps: [(String, Double, LogThrottle.Decision)] = [
            ("a", 0.0, .write(suppressedBefore: 0)),
            ("a", 0.1, .write(suppressedBefore: 0)),
            ("a", 0.2, .suppress),
            ("b", 0.3, .write(suppressedBefore: 0)),  // kinds apart
            ("a", 0.9, .suppress),
            ("a", 1.0, .write(suppressedBefore: 2)),  // a new window tells the two left out
            ("a", 1.5, .write(suppressedBefore: 0)),
            ("a", 5.0, .write(suppressedBefore: 0)),
        ]
        for (i, (kind, now, want)) in steps.enumerated() { XCTAssertEqual(t.admit(kind, rule: rule, now: now), want, "step \(i)") }
    }

    func testZeroLinesWritesNothing() {
        var t = LogThrottle()
        for i in 0..<10 { XCTAssertEqual(t.admit("a", rule: .init(lines: 0, window: 1), now: Double(i)), .suppress) }
    }

    func testAccessLogSetting() {
        let cases: [(String, AccessLogSetting?)] = [("all", .all), ("ALL", .all), ("off", .off), ("0", .off), ("50", .perSecond(50)),
                                                    ("-1", nil), ("lots", nil), ("", nil)]
        for (text, want) in cases { XCTAssertEqual(AccessLogSetting.parse(text), want, text) }
        XCTAssertNil(AccessLogSetting.all.rule)
        XCTAssertEqual(AccessLogSetting.default.rule, LogThrottle.Rule(lines: 100, window: 1))
    }
}
