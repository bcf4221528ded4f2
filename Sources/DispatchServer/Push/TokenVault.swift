import DispatchCore
import DispatchCrypto

/// Device tokens at rest (contract §5.1): sealed with AES-256-GCM, found by an HMAC-SHA256 of
/// the token, so a look-up never decrypts and a dump of the tables shows no token. Two keys
/// are derived from the configured one (one to seal, one to look up), and each sealed blob is
/// bound to its look-up MAC as associated data, so blobs cannot be swapped between rows.
final class TokenVault {
    private let sealKey: [UInt8]
    private let macKey: [UInt8]

    init(key: [UInt8]) {
        precondition(key.count == AESGCM.keyCount, "the token key is 32 bytes")
        sealKey = HMACSHA256.mac(key: key, message: Array("dispatch token seal v1".utf8))
        macKey = HMACSHA256.mac(key: key, message: Array("dispatch token lookup v1".utf8))
    }

    /// What a token (lower-case hex, validated) is stored as.
    struct Sealed {
        let mac: [UInt8]
        let sealed: [UInt8]
        let hint: String
    }

    func mac(_ token: String) -> [UInt8] { HMACSHA256.mac(key: macKey, message: Array(token.utf8)) }

    func seal(_ token: String) throws(CryptoError) -> Sealed {
        let mac = mac(token)
        let raw = Hex.decode(token) ?? Array(token.utf8)
        return Sealed(mac: mac, sealed: try AESGCM.seal(key: sealKey, plaintext: raw, aad: mac), hint: PushToken.hint(token))
    }

    /// Any other secret text (the shared provider token), sealed the same way.
    func sealText(_ text: String) throws(CryptoError) -> Sealed {
        let mac = mac(text)
        return Sealed(mac: mac, sealed: try AESGCM.seal(key: sealKey, plaintext: Array(text.utf8), aad: mac), hint: "")
    }

    func openText(_ sealed: [UInt8], mac: [UInt8]) -> String? {
        guard let raw = try? AESGCM.open(key: sealKey, sealed: sealed, aad: mac) else { return nil }
        return String(decoding: raw, as: UTF8.self)
    }

    /// The token in lower-case hex, or nil when the blob does not open under this key (the
    /// key changed, or the row was tampered with).
    func open(_ sealed: [UInt8], mac: [UInt8]) -> String? {
        guard let raw = try? AESGCM.open(key: sealKey, sealed: sealed, aad: mac) else { return nil }
        return Hex.encode(raw)
    }
}

/// bytea values as libpq's text format carries them (`\x` and hex), both ways.
enum Bytea {
    static func literal(_ bytes: [UInt8]) -> String { "\\x" + Hex.encode(bytes) }

    static func decode(_ text: String?) -> [UInt8]? {
        guard let text, text.hasPrefix("\\x") else { return nil }
        return Hex.decode(String(text.dropFirst(2)))
    }

    /// A `bytea[]` literal of hex values.
    static func array(_ values: [[UInt8]]) -> String {
        "{" + values.map { "\"\\\\x" + Hex.encode($0) + "\"" }.joined(separator: ",") + "}"
    }
}
