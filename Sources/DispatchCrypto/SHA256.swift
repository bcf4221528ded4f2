import CCrypto

/// SHA-256 (FIPS 180-4) by libcrypto, for hashing API key secrets before they are stored or compared.
public enum SHA256 {
    /// The digest's length in bytes.
    public static let byteCount = 32

    /// The 32-byte digest of `bytes`.
    public static func hash(_ bytes: some Collection<UInt8>) -> [UInt8] {
        [UInt8](unsafeUninitializedCapacity: byteCount) { out, count in
            var written: UInt32 = 0
            let ok = withContiguousBytes(bytes) { input in
                EVP_Digest(input.baseAddress, input.count, out.baseAddress, &written, OpenSSL.sha256, nil) == 1
            }
            OpenSSL.check(ok && written == byteCount, "EVP_Digest(SHA256)")
            count = byteCount
        }
    }

    /// The digest of `bytes` as 64 lowercase hex digits.
    public static func hex(_ bytes: some Collection<UInt8>) -> String {
        Hex.encode(hash(bytes))
    }
}
