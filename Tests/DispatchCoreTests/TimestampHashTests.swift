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

    func testSHA256Vectors() {
        let table: [([UInt8], String)] = [
            ([], "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
            (bytes("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
            (bytes("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
             "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"),
            (bytes("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu"),
             "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"),
            // Padding boundaries: 55 bytes fit one block, 56 need two.
            (Array(repeating: UInt8(ascii: "x"), count: 55), "d5e285683cd4efc02d021a5c62014694958901005d6f71e89e0989fac77e4072"),
            (Array(repeating: UInt8(ascii: "x"), count: 56), "04c26261370ee7541549d16dee320c723e3fd14671e66a099afe0a377c16888e"),
            (Array(repeating: UInt8(ascii: "x"), count: 63), "75220b47218278e656f2013bb8f0c455a25eaf01e86c64924e9d48d89776d6f2"),
            (Array(repeating: UInt8(ascii: "x"), count: 64), "7ce100971f64e7001e8fe5a51973ecdfe1ced42befe7ee8d5fd6219506b5393c"),
            (Array(repeating: UInt8(ascii: "x"), count: 65), "9537c5fdf120482f7d58d25e9ed583f52c02b4e304ea814db1633ad565aed7e9"),
            (Array(repeating: UInt8(ascii: "x"), count: 119), "000b48d4edf0fa7bee3c6236ecd2785baa5db4eeb8bb54341b029e0d9fa5fb0c"),
            (Array(repeating: UInt8(ascii: "x"), count: 120), "13f05a0b594787f5ecd315edc96141bd3243203d1b7d4f0836f37308b276ba98"),
        ]
        for (input, want) in table {
            XCTAssertEqual(SHA256.hex(input), want, "\(input.count) bytes")
            XCTAssertEqual(SHA256.hash(input).count, 32)
        }
    }

    func testSHA256OfAMillionA() {
        XCTAssertEqual(SHA256.hex(Array(repeating: UInt8(ascii: "a"), count: 1_000_000)),
                       "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0")
    }

    func testHex() {
        XCTAssertEqual(Hex.encode([]), "")
        XCTAssertEqual(Hex.encode([0x00, 0x0F, 0xA5, 0xFF]), "000fa5ff")
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
