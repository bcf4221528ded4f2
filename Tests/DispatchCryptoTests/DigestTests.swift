import XCTest
import DispatchCrypto

/// SHA-256 (FIPS 180-4 examples), HMAC-SHA256 (RFC 4231), constant-time comparison and the CSPRNG.
final class DigestTests: XCTestCase {
    func testSHA256Vectors() {
        let table: [(String, [UInt8], String)] = [
            ("empty", [], "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
            ("abc", bytes("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
            ("448 bits", bytes("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
             "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"),
            ("a million a", [UInt8](repeating: UInt8(ascii: "a"), count: 1_000_000),
             "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"),
        ]
        for (name, input, expected) in table {
            XCTAssertEqual(SHA256.hex(input), expected, name)
            XCTAssertEqual(SHA256.hash(input), Hex.decode(expected), name)
        }
    }

    func testSHA256TakesAnyByteCollection() {
        let expected = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        // The call shape the server uses today, then a contiguous view, then a non-contiguous collection.
        XCTAssertEqual(SHA256.hex(Array("abc".utf8)), expected)
        XCTAssertEqual(SHA256.hex("abc".utf8), expected)
        XCTAssertEqual(SHA256.hex(bytes("xabcx").dropFirst().dropLast()), expected)
        XCTAssertEqual(SHA256.hex(bytes("cba").reversed()), expected)
    }

    func testHMACSHA256RFC4231() {
        let aa131 = [UInt8](repeating: 0xaa, count: 131)
        let table: [(String, [UInt8], [UInt8], String)] = [
            ("case 1", [UInt8](repeating: 0x0b, count: 20), bytes("Hi There"),
             "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"),
            ("case 2", bytes("Jefe"), bytes("what do ya want for nothing?"),
             "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"),
            ("case 3", [UInt8](repeating: 0xaa, count: 20), [UInt8](repeating: 0xdd, count: 50),
             "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"),
            ("case 4", Array(1...25), [UInt8](repeating: 0xcd, count: 50),
             "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"),
            ("case 6", aa131, bytes("Test Using Larger Than Block-Size Key - Hash Key First"),
             "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"),
            ("case 7", aa131, bytes("This is a test using a larger than block-size key and a larger than block-size data. The key needs to be hashed before being used by the HMAC algorithm."),
             "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"),
            // Not in RFC 4231; checked against Python's hmac module. An empty key must mean all zeros, not "no key".
            ("empty key and message", [], [],
             "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad"),
        ]
        for (name, key, message, expected) in table {
            XCTAssertEqual(HMACSHA256.hex(key: key, message: message), expected, name)
            XCTAssertEqual(HMACSHA256.mac(key: key, message: message), Hex.decode(expected), name)
        }
    }

    func testConstantTimeEquals() {
        let mac = HMACSHA256.mac(key: bytes("k"), message: bytes("m"))
        XCTAssertTrue(constantTimeEquals(mac, HMACSHA256.mac(key: bytes("k"), message: bytes("m"))))
        XCTAssertTrue(constantTimeEquals([UInt8](), [UInt8]()))
        XCTAssertTrue(constantTimeEquals("abc".utf8, bytes("abc")))
        for i in mac.indices {
            var other = mac
            other[i] ^= 0x80
            XCTAssertFalse(constantTimeEquals(mac, other), "differs at \(i)")
        }
        XCTAssertFalse(constantTimeEquals(mac, mac.dropLast()))
        XCTAssertFalse(constantTimeEquals(mac, mac + [0]))
        XCTAssertFalse(constantTimeEquals(mac, [UInt8]()))
    }

    func testSecureRandom() {
        XCTAssertEqual(SecureRandom.bytes(0), [])
        XCTAssertEqual(SecureRandom.bytes(1).count, 1)
        let draws = (0..<100).map { _ in SecureRandom.bytes(32) }
        XCTAssertEqual(Set(draws).count, 100, "32 random bytes repeated")
        // Every byte value turns up in 64 KiB (a stuck or biased generator would miss some).
        XCTAssertEqual(Set(SecureRandom.bytes(65_536)).count, 256)
    }
}
