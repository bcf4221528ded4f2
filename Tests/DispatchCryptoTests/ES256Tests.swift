import Foundation
import Synchronization
import XCTest
import DispatchCrypto

/// ES256 signing and verification, checked against the openssl command line tool in both directions.
final class ES256Tests: XCTestCase {
    /// A fresh P-256 key as an APNs-style PKCS#8 `.p8` file, and its public key, made by the openssl tool.
    private func makeKey(in dir: TempDirectory) throws -> (p8: String, publicPEM: String) {
        try opensslOK(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", dir.path("key.pem")])
        try opensslOK(["pkcs8", "-topk8", "-nocrypt", "-in", dir.path("key.pem"), "-out", dir.path("AuthKey.p8")])
        try opensslOK(["pkey", "-in", dir.path("AuthKey.p8"), "-pubout", "-out", dir.path("pub.pem")])
        return (try dir.text("AuthKey.p8"), try dir.text("pub.pem"))
    }

    func testSignsAndVerifies2000MessagesInteroperably() throws {
        let dir = try TempDirectory()
        let key = try makeKey(in: dir)
        XCTAssertTrue(key.p8.hasPrefix("-----BEGIN PRIVATE KEY-----"))
        let signer = try ES256Signer(pem: key.p8)
        XCTAssertEqual(try signer.publicKeyPEM(), key.publicPEM)
        let verifiers = [ES256Verifier(signer: signer), try ES256Verifier(publicKeyPEM: key.publicPEM)]

        var leadingZero: [(message: [UInt8], signature: [UInt8])] = []
        var checkedByTool = 0
        for i in 0..<2000 {
            let message = SecureRandom.bytes(i % 300)
            let signature = try signer.sign(message)
            // BN_bn2bin instead of BN_bn2binpad would make about 1 in 128 of these 63 bytes or fewer.
            guard signature.count == 64 else { return XCTFail("signature \(i) is \(signature.count) bytes") }
            for verifier in verifiers {
                XCTAssertTrue(verifier.verify(signature64: signature, message: message), "signature \(i)")
            }
            if signature[0] == 0 || signature[32] == 0 { leadingZero.append((message, signature)) }
            if i < 3 {
                try checkWithTool(message, signature, in: dir, expectValid: true)
                checkedByTool += 1
            }
        }
        // The padded case must have been exercised, and the tool must agree on it too.
        XCTAssertGreaterThan(leadingZero.count, 0, "no r or s below 2^248 in 2000 signatures (chance about 1e-7)")
        for (message, signature) in leadingZero.prefix(3) {
            try checkWithTool(message, signature, in: dir, expectValid: true)
            checkedByTool += 1
        }
        // And the tool check is not vacuous: it refuses a signature of another message.
        try checkWithTool(bytes("another message"), try signer.sign(bytes("a message")), in: dir, expectValid: false)
        print("ES256: \(leadingZero.count) of 2000 signatures had a leading zero byte in r or s; \(checkedByTool) checked by openssl")
    }

    /// Verifies `signature` over `message` with `openssl dgst -verify`, after converting it to DER here.
    private func checkWithTool(_ message: [UInt8], _ signature: [UInt8], in dir: TempDirectory, expectValid: Bool,
                               file: StaticString = #filePath, line: UInt = #line) throws {
        try dir.write("message.bin", message)
        try dir.write("signature.der", derSignature(signature))
        let result = try openssl(["dgst", "-sha256", "-verify", dir.path("pub.pem"),
                                  "-signature", dir.path("signature.der"), dir.path("message.bin")])
        XCTAssertEqual(result.status == 0, expectValid, result.output, file: file, line: line)
        XCTAssertEqual(result.output.contains("Verified OK"), expectValid, result.output, file: file, line: line)
    }

    func testVerifiesSignaturesMadeByTheTool() throws {
        let dir = try TempDirectory()
        let key = try makeKey(in: dir)
        let verifier = try ES256Verifier(publicKeyPEM: key.publicPEM)
        for (i, text) in ["", "hello", String(repeating: "x", count: 1000)].enumerated() {
            try dir.write("message.bin", bytes(text))
            try opensslOK(["dgst", "-sha256", "-sign", dir.path("AuthKey.p8"), "-out", dir.path("signature.der"), dir.path("message.bin")])
            let raw = try XCTUnwrap(rawSignature(try dir.read("signature.der")), "case \(i)")
            XCTAssertTrue(verifier.verify(signature64: raw, message: bytes(text)), "case \(i)")
            XCTAssertFalse(verifier.verify(signature64: raw, message: bytes(text + "!")), "case \(i)")
        }
    }

    func testVerifierRejectsBadSignatures() throws {
        let dir = try TempDirectory()
        let signer = try ES256Signer(pem: try makeKey(in: dir).p8)
        let other = try ES256Signer(pem: try makeKey(in: dir).p8)
        let verifier = ES256Verifier(signer: signer)
        let message = bytes("message")
        let signature = try signer.sign(message)
        XCTAssertTrue(verifier.verify(signature64: signature, message: message))

        var table: [(String, [UInt8], [UInt8])] = [
            ("other message", signature, bytes("messagE")),
            ("other key", try other.sign(message), message),
            ("empty", [], message),
            ("63 bytes", Array(signature.dropLast()), message),
            ("65 bytes", signature + [0], message),
            ("DER instead of raw", derSignature(signature), message),
            ("all zero", [UInt8](repeating: 0, count: 64), message),
            ("all 0xFF (r and s above the group order)", [UInt8](repeating: 0xFF, count: 64), message),
            ("r and s swapped", Array(signature[32...] + signature[..<32]), message),
        ]
        for i in [0, 17, 31, 32, 50, 63] {
            var flipped = signature
            flipped[i] ^= 0x01
            table.append(("bit flipped in byte \(i)", flipped, message))
        }
        for (name, signature, message) in table {
            XCTAssertFalse(verifier.verify(signature64: signature, message: message), name)
        }
    }

    func testRefusesKeysThatAreNotP256() throws {
        let dir = try TempDirectory()
        let table: [(String, [String], String)] = [
            ("RSA", ["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:1024"], "not RSA"),
            ("Ed25519", ["-algorithm", "ED25519"], "not ED25519"),
            ("P-384", ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384"], "not an EC key on curve secp384r1"),
            // Same size as P-256, so a check on key bits alone would let it through.
            ("secp256k1", ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:secp256k1"], "not an EC key on curve secp256k1"),
        ]
        for (name, options, reason) in table {
            try opensslOK(["genpkey"] + options + ["-out", dir.path("\(name).pem")])
            try opensslOK(["pkey", "-in", dir.path("\(name).pem"), "-pubout", "-out", dir.path("\(name).pub")])
            for attempt in [{ _ = try ES256Signer(pem: try dir.text("\(name).pem")) },
                            { _ = try ES256Verifier(publicKeyPEM: try dir.text("\(name).pub")) }] {
                XCTAssertThrowsError(try attempt(), name) { error in
                    let error = error as? CryptoError
                    XCTAssertEqual(error?.code, .invalidKey, name)
                    XCTAssertTrue(error?.message.hasSuffix("ES256 needs an EC P-256 key, \(reason)") == true, "\(name): \(String(describing: error))")
                }
            }
        }
    }

    func testRefusesUnreadableKeys() throws {
        let dir = try TempDirectory()
        let key = try makeKey(in: dir)
        // An encrypted key must fail at once, not prompt for a passphrase on the server's terminal.
        try opensslOK(["pkcs8", "-topk8", "-v2", "aes-256-cbc", "-passout", "pass:secret",
                       "-in", dir.path("AuthKey.p8"), "-out", dir.path("encrypted.p8")])
        let truncated = String(key.p8.prefix(key.p8.count / 2))
        let signerTable: [(String, String)] = [
            ("empty", ""),
            ("garbage", "not a key"),
            ("truncated", truncated),
            ("public key", key.publicPEM),
            ("encrypted", try dir.text("encrypted.p8")),
            ("corrupted base64", key.p8.replacingOccurrences(of: "M", with: "*")),
        ]
        for (name, pem) in signerTable {
            XCTAssertThrowsError(try ES256Signer(pem: pem), name) { error in
                let error = error as? CryptoError
                XCTAssertEqual(error?.code, .invalidKey, name)
                // OpenSSL's own reason follows ours.
                XCTAssertTrue(error?.message.hasPrefix("could not read an unencrypted PEM private key: error:") == true,
                              "\(name): \(String(describing: error))")
            }
        }
        for (name, pem) in [("empty", ""), ("private key", key.p8), ("garbage", "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")] {
            XCTAssertThrowsError(try ES256Verifier(publicKeyPEM: pem), name) {
                XCTAssertEqual(($0 as? CryptoError)?.code, .invalidKey, name)
            }
        }
        // SEC1 (`BEGIN EC PRIVATE KEY`) is read too, so a key converted the old way still works.
        try opensslOK(["ec", "-in", dir.path("AuthKey.p8"), "-out", dir.path("sec1.pem")])
        let sec1 = try dir.text("sec1.pem")
        XCTAssertTrue(sec1.hasPrefix("-----BEGIN EC PRIVATE KEY-----"))
        let signature = try ES256Signer(pem: sec1).sign(bytes("m"))
        XCTAssertTrue(try ES256Verifier(publicKeyPEM: key.publicPEM).verify(signature64: signature, message: bytes("m")))
    }

    func testOneSignerIsSafeToShareAcrossThreads() throws {
        let dir = try TempDirectory()
        let signer = try ES256Signer(pem: try makeKey(in: dir).p8)
        let verifier = ES256Verifier(signer: signer)
        let failures = Mutex(0)
        DispatchQueue.concurrentPerform(iterations: 400) { i in
            let message = bytes("message \(i)")
            let ok = (try? signer.sign(message)).map { verifier.verify(signature64: $0, message: message) } ?? false
            if !ok { failures.withLock { $0 += 1 } }
        }
        XCTAssertEqual(failures.withLock { $0 }, 0)
    }

    func testVerifierOutlivesItsSigner() throws {
        let dir = try TempDirectory()
        var signer: ES256Signer? = try ES256Signer(pem: try makeKey(in: dir).p8)
        let signature = try signer!.sign(bytes("m"))
        let verifier = ES256Verifier(signer: signer!)
        signer = nil  // the verifier holds its own reference to the key
        XCTAssertTrue(verifier.verify(signature64: signature, message: bytes("m")))
    }
}
