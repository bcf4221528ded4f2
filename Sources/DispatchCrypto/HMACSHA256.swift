import CCrypto

/// HMAC-SHA256 (RFC 2104), as in the `Dispatch-Signature` header of cancel webhooks.
public enum HMACSHA256 {
    /// The MAC's length in bytes.
    public static let byteCount = 32

    /// The 32-byte MAC of `message` under `key` (any length; keys longer than 64 bytes are hashed first).
    public static func mac(key: [UInt8], message: some Collection<UInt8>) -> [UInt8] {
        [UInt8](unsafeUninitializedCapacity: byteCount) { out, count in
            var written: UInt32 = 0
            let ok = withContiguousBytes(message) { input in
                // `key` as an array is never a null pointer, even when empty, so an empty key means "all zeros".
                HMAC(OpenSSL.sha256, key, Int32(key.count), input.baseAddress, input.count, out.baseAddress, &written) != nil
            }
            OpenSSL.check(ok && written == byteCount, "HMAC(SHA256)")
            count = byteCount
        }
    }

    /// The MAC of `message` under `key` as 64 lowercase hex digits.
    public static func hex(key: [UInt8], message: some Collection<UInt8>) -> String {
        Hex.encode(mac(key: key, message: message))
    }
}

/// Whether `a` and `b` hold the same bytes, in time that depends only on their lengths (CRYPTO_memcmp),
/// so comparing a MAC or a secret's hash leaks nothing about where they first differ.
public func constantTimeEquals(_ a: some Collection<UInt8>, _ b: some Collection<UInt8>) -> Bool {
    let a = Array(a), b = Array(b)
    // The length is not secret: MACs and hashes have a fixed one.
    guard a.count == b.count else { return false }
    return a.isEmpty || CRYPTO_memcmp(a, b, a.count) == 0
}
