import CCrypto

/// AES-256-GCM sealing (device tokens at rest) into one self-contained blob: `version(1) ‖ iv(12) ‖ ciphertext ‖ tag(16)`.
///
/// Every seal draws a fresh random IV, so the same key can seal many messages (stay well below 2^32 per key,
/// where random 96-bit IVs start to risk a repeat).
public enum AESGCM {
    /// The blob format's first byte; a different value is refused rather than guessed at.
    public static let version: UInt8 = 1
    /// The key's length in bytes.
    public static let keyCount = 32
    static let ivCount = 12
    static let tagCount = 16
    /// Bytes a sealed blob adds to its plaintext.
    public static let overhead = 1 + ivCount + tagCount

    /// Encrypts and authenticates `plaintext`, and authenticates `aad` (which is not included in the blob).
    public static func seal(key: [UInt8], plaintext: some Collection<UInt8>, aad: [UInt8] = []) throws(CryptoError) -> [UInt8] {
        try checkKey(key)
        let plaintext = Array(plaintext)
        guard plaintext.count <= Int(Int32.max) - overhead, aad.count <= Int(Int32.max) else {
            throw CryptoError(.library, "AES-GCM input over 2 GiB")
        }
        guard let context = EVP_CIPHER_CTX_new() else { throw .openSSL(.library, "EVP_CIPHER_CTX_new") }
        defer { EVP_CIPHER_CTX_free(context) }

        let iv = SecureRandom.bytes(ivCount)
        var sealed = [UInt8](repeating: 0, count: overhead + plaintext.count)
        let failed: String? = sealed.withUnsafeMutableBufferPointer { out in
            out[0] = version
            out.baseAddress!.advanced(by: 1).update(from: iv, count: ivCount)
            let ciphertext = out.baseAddress!.advanced(by: 1 + ivCount)
            var written: Int32 = 0
            guard EVP_EncryptInit_ex(context, OpenSSL.aes256GCM, nil, key, iv) == 1 else { return "EVP_EncryptInit_ex" }
            if !aad.isEmpty {
                guard EVP_EncryptUpdate(context, nil, &written, aad, Int32(aad.count)) == 1 else { return "EVP_EncryptUpdate(aad)" }
            }
            if !plaintext.isEmpty {
                guard EVP_EncryptUpdate(context, ciphertext, &written, plaintext, Int32(plaintext.count)) == 1,
                      written == plaintext.count else { return "EVP_EncryptUpdate" }
            }
            let tag = ciphertext + plaintext.count
            // GCM is a stream mode: Final writes nothing, it only completes the tag.
            guard EVP_EncryptFinal_ex(context, tag, &written) == 1, written == 0 else { return "EVP_EncryptFinal_ex" }
            guard EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_GCM_GET_TAG, Int32(tagCount), tag) == 1 else { return "get GCM tag" }
            return nil
        }
        if let failed { throw .openSSL(.library, failed) }
        return sealed
    }

    /// The plaintext of a blob made by `seal` with the same `key` and `aad`; throws if anything about it is off.
    public static func open(key: [UInt8], sealed: [UInt8], aad: [UInt8] = []) throws(CryptoError) -> [UInt8] {
        try checkKey(key)
        guard sealed.count >= overhead else {
            throw CryptoError(.malformed, "sealed blob is \(sealed.count) bytes, shorter than the \(overhead) of an empty one")
        }
        guard sealed[0] == version else { throw CryptoError(.malformed, "sealed blob has version \(sealed[0]), expected \(version)") }
        guard sealed.count <= Int(Int32.max), aad.count <= Int(Int32.max) else { throw CryptoError(.malformed, "sealed blob over 2 GiB") }
        guard let context = EVP_CIPHER_CTX_new() else { throw .openSSL(.library, "EVP_CIPHER_CTX_new") }
        defer { EVP_CIPHER_CTX_free(context) }

        let ciphertextCount = sealed.count - overhead
        var plaintext = [UInt8](repeating: 0, count: ciphertextCount)
        var tag = Array(sealed.suffix(tagCount))  // a mutable copy: the SET_TAG ctrl takes a non-const pointer
        let outcome: Result<Void, CryptoError> = sealed.withUnsafeBufferPointer { input in
            plaintext.withUnsafeMutableBufferPointer { out in
                let iv = input.baseAddress! + 1
                let ciphertext = iv + ivCount
                var written: Int32 = 0
                guard EVP_DecryptInit_ex(context, OpenSSL.aes256GCM, nil, key, iv) == 1 else {
                    return .failure(.openSSL(.library, "EVP_DecryptInit_ex"))
                }
                if !aad.isEmpty {
                    guard EVP_DecryptUpdate(context, nil, &written, aad, Int32(aad.count)) == 1 else {
                        return .failure(.openSSL(.library, "EVP_DecryptUpdate(aad)"))
                    }
                }
                if ciphertextCount > 0 {
                    guard EVP_DecryptUpdate(context, out.baseAddress, &written, ciphertext, Int32(ciphertextCount)) == 1,
                          written == ciphertextCount else { return .failure(.openSSL(.library, "EVP_DecryptUpdate")) }
                }
                guard EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_GCM_SET_TAG, Int32(tagCount), &tag) == 1 else {
                    return .failure(.openSSL(.library, "set GCM tag"))
                }
                // Only Final checks the tag; until it succeeds the decrypted bytes must not be trusted or returned.
                guard EVP_DecryptFinal_ex(context, out.baseAddress, &written) == 1 else {
                    return .failure(.openSSL(.authenticationFailed, "sealed blob failed authentication (tampered, or wrong key or aad)"))
                }
                return .success(())
            }
        }
        try outcome.get()
        return plaintext
    }

    private static func checkKey(_ key: [UInt8]) throws(CryptoError) {
        guard key.count == keyCount else { throw CryptoError(.invalidKey, "AES-256-GCM needs a \(keyCount)-byte key, got \(key.count)") }
    }
}
