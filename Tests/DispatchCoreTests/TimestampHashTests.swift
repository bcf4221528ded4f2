import XCTest
@testable import DispatchCore

/// Timestamps, SHA-256 against the FIPS 180-4 vectors, and random identifiers.
final class TimestampHashTests: XCTestCase {
    func testFormatAndParse() {
        let table: [(Int64, String)] = [
            (0, "1970-01-01T00:00:00.000Z"),
            (1, "1970-01-01T00:00:00.001Z"),
            (999, "1970-01-01T00:00:00.999Z"),
            (-1, "1969-12-31T23:59:59.999Z"),
            (-1000, "1969-12-31T23:59:59.000Z"),
            (-1001, "1969-12-31T23:59:58.999Z"),
            (-86_400_000, "1969-12-31T00:00:00.000Z"),
            (-14_182_940_000, "1969-07-20T20:17:40.000Z"),
            (-2_208_988_800_000, "1900-01-01T00:00:00.000Z"),
            (-11_670_955_200_000, "1600-02-29T12:00:00.000Z"),
            (951_782_400_000, "2000-02-29T00:00:00.000Z"),
            (1_709_251_199_999, "2024-02-29T23:59:59.999Z"),
            (4_107_542_400_000, "2100-03-01T00:00:00.000Z"),
            (1_795_992_806_123, "2026-11-29T22:53:26.123Z"),
            (253_402_300_799_999, "9999-12-31T23:59:59.999Z"),
        ]
        for (ms, s) in table {
            XCTAssertEqual(Timestamp.format(milliseconds: ms), s, "\(ms)")
            XCTAssertEqual(Timestamp.parse(s), ms, s)
        }
    }

    func testParseWithoutFractionAndRefusals() {
        XCTAssertEqual(Timestamp.parse("2026-11-29T22:53:26Z"), 1_795_992_806_000)
        XCTAssertEqual(Timestamp.parse("1970-01-01T00:00:00Z"), 0)
        let bad = [
            "", "2026-11-29", "2026-11-29T22:53:26", "2026-11-29T22:53:26.123", "2026-11-29 22:53:26.123Z",
            "2026-11-29T22:53:26.12Z", "2026-11-29T22:53:26.1234Z", "2026-11-29T22:53:26,123Z", "2026-13-01T00:00:00Z",
            "2026-00-01T00:00:00Z", "2026-01-00T00:00:00Z", "2026-01-32T00:00:00Z", "2026-01-01T24:00:00Z",
            "2026-01-01T00:60:00Z", "2026-01-01T00:00:61Z", "+026-01-01T00:00:00Z", "2026-1-01T00:00:00.000Z",
            "2026-11-29T22:53:26.123+01:00", "2026-11-29T22:53:26.a23Z", "2026-11-29T22:53:26.123z",
        ]
        for s in bad { XCTAssertNil(Timestamp.parse(s), s) }
    }

    func testRoundTripAcrossCenturies() {
        var g = SeededGenerator(seed: 42)
        for _ in 0..<2_000 {
            let ms = Int64.random(in: -62_135_596_800_000...253_402_300_799_999, using: &g)
            let s = Timestamp.format(milliseconds: ms)
            XCTAssertEqual(s.utf8.count, 24, s)
            XCTAssertEqual(Timestamp.parse(s), ms, s)
        }
        // Consecutive days across 1900 (not a leap year), 2000 (leap) and 2100 (not).
        for day in Array(-25_600 ... -25_400) + Array(10_900...11_100) + Array(47_400...47_600) {
            let day = Int64(day)
            let ms = day * 86_400_000
            XCTAssertEqual(Timestamp.parse(Timestamp.format(milliseconds: ms)), ms)
        }
    }

    func testHex() {
        XCTAssertEqual(RandomID.hex([]), "")
        XCTAssertEqual(RandomID.hex([0x00, 0x0F, 0xA5, 0xFF]), "000fa5ff")
    }

    func testUUIDFormat() {
        var g = SeededGenerator(seed: 7)
        var seen = Set<String>()
        let hex = Set("0123456789abcdef")
        for _ in 0..<1_000 {
            let u = Array(RandomID.uuid(using: &g))
            XCTAssertEqual(u.count, 36)
            for (i, c) in u.enumerated() {
                if [8, 13, 18, 23].contains(i) { XCTAssertEqual(c, "-") } else { XCTAssertTrue(hex.contains(c), String(u)) }
            }
            XCTAssertEqual(u[14], "4", "version 4: \(String(u))")
            XCTAssertTrue("89ab".contains(u[19]), "RFC 4122 variant: \(String(u))")
            XCTAssertTrue(Validation.isValidActivityID(String(u)), "a generated id is a valid activityId")
            seen.insert(String(u))
        }
        XCTAssertEqual(seen.count, 1_000)
        var a = SeededGenerator(seed: 1), b = SeededGenerator(seed: 1)
        XCTAssertEqual(RandomID.uuid(using: &a), RandomID.uuid(using: &b), "the generator is the only source")
    }

    func testSecretFormat() {
        var g = SeededGenerator(seed: 9)
        for _ in 0..<100 {
            let s = RandomID.secret(using: &g)
            XCTAssertTrue(s.hasPrefix("dsp_"))
            XCTAssertEqual(s.utf8.count, 4 + 48)
            XCTAssertTrue(s.dropFirst(4).allSatisfy { "0123456789abcdef".contains($0) })
        }
    }
}
