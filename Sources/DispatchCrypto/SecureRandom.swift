import CCrypto

/// Bytes from libcrypto's CSPRNG, for keys, IVs and secrets.
public enum SecureRandom {
    /// `count` unpredictable bytes (RAND_bytes).
    public static func bytes(_ count: Int) -> [UInt8] {
        precondition(count >= 0 && count <= Int(Int32.max), "SecureRandom.bytes(\(count))")
        return [UInt8](unsafeUninitializedCapacity: count) { out, initialized in
            // RAND_bytes fails only when the generator cannot be seeded; carrying on would hand out guessable secrets.
            if count > 0 { OpenSSL.check(RAND_bytes(out.baseAddress, Int32(count)) == 1, "RAND_bytes") }
            initialized = count
        }
    }
}
