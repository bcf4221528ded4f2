import XCTest
import DispatchCrypto

/// AES-256-GCM sealing: round trips, fresh IVs, and refusal of every kind of tampering.
final class AESGCMTests: XCTestCase {
    let key = Array(0..<32) as [UInt8]

    func testRoundTrip() throws {
        for count in [0, 1, 15, 16, 17, 100, 4096] {
            for aad in [[], bytes("stream:42")] as [[UInt8]] {
                let plaintext = SecureRandom.bytes(count)
                let sealed = try AESGCM.seal(key: key, plaintext: plaintext, aad: aad)
                XCTAssertEqual(sealed.count, count + AESGCM.overhead)
                XCTAssertEqual(sealed.first, AESGCM.version)
                XCTAssertEqual(try AESGCM.open(key: key, sealed: sealed, aad: aad), plaintext, "\(count) bytes, aad \(aad)")
            }
        }
    }

    func testKnownAnswer() throws {
        // NIST GCM test case 16 (AES-256, 96-bit IV, with AAD), put into our blob layout: proves the layout
        // is version ‖ iv ‖ ciphertext ‖ tag and that open is real AES-256-GCM, not just self-consistent.
        let key = Hex.decode("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308")!
        let iv = Hex.decode("cafebabefacedbaddecaf888")!
        let aad = Hex.decode("feedfacedeadbeeffeedfacedeadbeefabaddad2")!
        let plaintext = Hex.decode("d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a721c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39")!
        let ciphertext = Hex.decode("522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662")!
        let tag = Hex.decode("76fc6ece0f4e1768cddf8853bb2d551b")!
        XCTAssertEqual(try AESGCM.open(key: key, sealed: [AESGCM.version] + iv + ciphertext + tag, aad: aad), plaintext)
    }

    func testEachSealDrawsAFreshIV() throws {
        let plaintext = bytes("the same message")
        let sealed = try (0..<1000).map { _ in try AESGCM.seal(key: key, plaintext: plaintext) }
        XCTAssertEqual(Set(sealed).count, 1000)
        XCTAssertEqual(Set(sealed.map { $0[1..<13] }).count, 1000, "an IV repeated")
    }

    func testEveryFlippedByteIsRejected() throws {
        let aad = bytes("aad")
        let sealed = try AESGCM.seal(key: key, plaintext: SecureRandom.bytes(100), aad: aad)
        for i in sealed.indices {
            for flip: UInt8 in [0x01, 0x80, 0xFF] {
                var tampered = sealed
                tampered[i] ^= flip
                let expected: CryptoError.Code = i == 0 ? .malformed : .authenticationFailed
                XCTAssertThrowsError(try AESGCM.open(key: key, sealed: tampered, aad: aad), "byte \(i) ^ \(flip)") {
                    XCTAssertEqual(($0 as? CryptoError)?.code, expected, "byte \(i) ^ \(flip)")
                }
            }
        }
    }

    func testTruncatedOrExtendedIsRejected() throws {
        let sealed = try AESGCM.seal(key: key, plaintext: bytes("hello"))
        for count in 0..<sealed.count {
            XCTAssertThrowsError(try AESGCM.open(key: key, sealed: Array(sealed.prefix(count))), "first \(count) bytes")
        }
        XCTAssertThrowsError(try AESGCM.open(key: key, sealed: sealed + [0]))
        XCTAssertThrowsError(try AESGCM.open(key: key, sealed: [AESGCM.version] + sealed.dropFirst(2)), "one IV byte dropped")
    }

    func testWrongKeyAADOrVersionIsRejected() throws {
        let sealed = try AESGCM.seal(key: key, plaintext: bytes("hello"), aad: bytes("a"))
        let cases: [(String, [UInt8], [UInt8], [UInt8], CryptoError.Code)] = [
            ("wrong key", SecureRandom.bytes(32), sealed, bytes("a"), .authenticationFailed),
            ("key off by one bit", [key[0] ^ 1] + key.dropFirst(), sealed, bytes("a"), .authenticationFailed),
            ("wrong aad", key, sealed, bytes("b"), .authenticationFailed),
            ("missing aad", key, sealed, [], .authenticationFailed),
            ("extra aad", key, sealed, bytes("aa"), .authenticationFailed),
            ("version 2", key, [2] + sealed.dropFirst(), bytes("a"), .malformed),
            ("version 0", key, [0] + sealed.dropFirst(), bytes("a"), .malformed),
            ("short key", Array(key.prefix(16)), sealed, bytes("a"), .invalidKey),
            ("long key", key + [0], sealed, bytes("a"), .invalidKey),
        ]
        for (name, key, sealed, aad, code) in cases {
            XCTAssertThrowsError(try AESGCM.open(key: key, sealed: sealed, aad: aad), name) {
                XCTAssertEqual(($0 as? CryptoError)?.code, code, name)
            }
        }
        XCTAssertEqual(try AESGCM.open(key: key, sealed: sealed, aad: bytes("a")), bytes("hello"))
    }

    func testSealRefusesABadKey() {
        for count in [0, 16, 31, 33] {
            XCTAssertThrowsError(try AESGCM.seal(key: [UInt8](repeating: 1, count: count), plaintext: bytes("x"))) {
                XCTAssertEqual(($0 as? CryptoError)?.code, .invalidKey)
            }
        }
    }
}
