import XCTest
@testable import DispatchCore

/// Durations as the CLI reads them and the stale end writes them.
final class DurationTextTests: XCTestCase {
    func testReading() {
        let table: [(String, Double?)] = [
            ("10", 10), ("2.5", 2.5), ("10s", 10), ("10m", 600), ("2h", 7200), ("1d", 86_400), ("1h30m", 5400),
            ("1m30s", 90), ("500ms", 0.5), ("1.5s", 1.5), ("0", 0), ("0s", 0),
            ("", nil), ("s", nil), ("10x", nil), ("-5", nil), ("-5s", nil), ("1h 30m", nil), ("10 s", nil), ("1e3", nil),
            ("inf", nil), ("nan", nil), ("1..5s", nil), ("10M", nil),
        ]
        for (text, want) in table { XCTAssertEqual(DurationText.seconds(text), want, text) }
        XCTAssertEqual(DurationText.wholeSeconds("10m"), 600)
        XCTAssertNil(DurationText.wholeSeconds("1.5s"))
        XCTAssertNil(DurationText.wholeSeconds("100000000000d"))
    }

    func testWriting() {
        let table: [(Int, String)] = [(10, "10s"), (60, "1m"), (90, "1m30s"), (3600, "1h"), (5400, "1h30m"), (86_400, "1d"),
                                      (604_800, "7d"), (90_061, "1d1h1m1s"), (0, "0s")]
        for (seconds, want) in table {
            XCTAssertEqual(DurationText.format(seconds: seconds), want)
            if seconds > 0 { XCTAssertEqual(DurationText.wholeSeconds(want), seconds, "round trip") }
        }
        XCTAssertEqual(StaleEnd.command(staleAfter: 10), EndCommand(state: .error, error: "stale: no update for 10s"))
        XCTAssertEqual(StaleEnd.command(staleAfter: 86_400).error, "stale: no update for 1d")
    }
}
