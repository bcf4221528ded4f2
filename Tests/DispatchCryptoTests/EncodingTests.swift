import Foundation
import XCTest
import DispatchCrypto

/// Base64 (standard and base64url) and hex: RFC 4648 vectors, round trips against Foundation, strict decoding.
final class EncodingTests: XCTestCase {
    func testBase64RFC4648Vectors() {
        let table: [(String, String, String)] = [
            ("", "", ""),
            ("f", "Zg==", "Zg"),
            ("fo", "Zm8=", "Zm8"),
            ("foo", "Zm9v", "Zm9v"),
            ("foob", "Zm9vYg==", "Zm9vYg"),
            ("fooba", "Zm9vYmE=", "Zm9vYmE"),
            ("foobar", "Zm9vYmFy", "Zm9vYmFy"),
        ]
        for (plain, standard, url) in table {
            XCTAssertEqual(Base64.encode(bytes(plain)), standard, plain)
            XCTAssertEqual(Base64.urlEncode(bytes(plain)), url, plain)
            XCTAssertEqual(Base64.decode(standard), bytes(plain), plain)
            XCTAssertEqual(Base64.urlDecode(url), bytes(plain), plain)
        }
        // The two alphabets differ only in the last two characters.
        XCTAssertEqual(Base64.encode([0xFB, 0xFF, 0xBF]), "+/+/")
        XCTAssertEqual(Base64.urlEncode([0xFB, 0xFF, 0xBF]), "-_-_")
        XCTAssertEqual(Base64.urlDecode("-_-_"), [0xFB, 0xFF, 0xBF])
        XCTAssertNil(Base64.urlDecode("+/+/"))
        XCTAssertNil(Base64.decode("-_-_"))
    }

    func testBase64RoundTripsAgainstFoundation() {
        for count in 0..<200 {
            let data = SecureRandom.bytes(count)
            let foundation = Data(data).base64EncodedString()
            let foundationURL = foundation.replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
                .replacingOccurrences(of: "=", with: "")
            XCTAssertEqual(Base64.encode(data), foundation)
            XCTAssertEqual(Base64.urlEncode(data), foundationURL)
            XCTAssertEqual(Base64.decode(foundation), data)
            XCTAssertEqual(Base64.urlDecode(foundationURL), data)
        }
    }

    func testBase64RejectsGarbage() {
        let standard: [(String, String)] = [
            ("missing padding", "Zg"),
            ("short padding", "Zg="),
            ("three pads", "Z==="),
            ("only padding", "===="),
            ("extra padding", "Zm9v===="),
            ("padding inside", "Zg==Zg=="),
            ("padding first", "=Zg="),
            ("padding then data", "Zg=a"),
            ("newline", "Zm9v\n"),
            ("space", " Zm9v"),
            ("non-ASCII", "Zm9vä="),
            ("url alphabet", "Zm-_"),
            ("non-zero trailing bits, one byte", "Zh=="),
            ("non-zero trailing bits, two bytes", "Zm9="),
            ("NUL", "Zm9v\u{0}AAA"),
        ]
        for (name, text) in standard { XCTAssertNil(Base64.decode(text), name) }

        let url: [(String, String)] = [
            ("padded", "Zg=="),
            ("one leftover character", "Z"),
            ("five characters", "Zm9vY"),
            ("standard alphabet", "Zm9v+/"),
            ("non-zero trailing bits, one byte", "Zh"),
            ("non-zero trailing bits, two bytes", "Zm9"),
            ("space", "Zm9v "),
            ("dot", "Zm9v.Zm9v"),
        ]
        for (name, text) in url { XCTAssertNil(Base64.urlDecode(text), name) }
    }

    func testHex() {
        XCTAssertEqual(Hex.encode([]), "")
        XCTAssertEqual(Hex.encode([0x00, 0x01, 0x7F, 0x80, 0xAB, 0xFF]), "00017f80abff")
        XCTAssertEqual(Hex.decode(""), [])
        XCTAssertEqual(Hex.decode("00017f80abff"), [0x00, 0x01, 0x7F, 0x80, 0xAB, 0xFF])
        XCTAssertEqual(Hex.decode("00017F80ABFF"), [0x00, 0x01, 0x7F, 0x80, 0xAB, 0xFF])
        for count in 0..<64 {
            let data = SecureRandom.bytes(count)
            XCTAssertEqual(Hex.decode(Hex.encode(data)), data)
        }
        let rejected: [(String, String)] = [
            ("odd length", "abc"),
            ("one digit", "0"),
            ("non-hex letter", "0g"),
            ("0x prefix", "0x00"),
            ("space", "00 11"),
            ("sign", "-1"),
            ("non-ASCII with an even byte count", "é"),
            ("colon separated", "00:11"),
        ]
        for (name, text) in rejected { XCTAssertNil(Hex.decode(text), name) }
    }
}
