import CCrypto

/// Signs with an EC P-256 private key as ES256 (ECDSA with SHA-256), the algorithm of APNs provider tokens.
///
/// `@unchecked Sendable`: the key is never changed after loading, and OpenSSL 3 lets many threads sign
/// with one EVP_PKEY, each through its own EVP_MD_CTX.
public final class ES256Signer: @unchecked Sendable {
    let key: OpaquePointer  // EVP_PKEY, owned

    /// Loads a private key from PEM text: PKCS#8 (`BEGIN PRIVATE KEY`, as in APNs' AuthKey_XXXX.p8) or SEC1.
    /// Throws `invalidKey` for anything but an unencrypted P-256 key.
    public init(pem: String) throws(CryptoError) {
        key = try loadP256(pem: pem, kind: .privateKey)
    }

    deinit { EVP_PKEY_free(key) }

    /// The 64-byte JOSE signature of `message`: r and s, each as 32 big-endian bytes.
    public func sign(_ message: [UInt8]) throws(CryptoError) -> [UInt8] {
        guard let context = EVP_MD_CTX_new() else { throw .openSSL(.library, "EVP_MD_CTX_new") }
        defer { EVP_MD_CTX_free(context) }
        guard EVP_DigestSignInit(context, nil, OpenSSL.sha256, nil, key) == 1 else { throw .openSSL(.library, "EVP_DigestSignInit") }
        // One call with a buffer of the key's maximum signature size (72 for P-256): asking for the size
        // first with a null buffer would mean a second EVP_DigestSign on the same context.
        var der = [UInt8](repeating: 0, count: Int(EVP_PKEY_get_size(key)))
        var derCount = der.count
        guard EVP_DigestSign(context, &der, &derCount, message, message.count) == 1 else { throw .openSSL(.library, "EVP_DigestSign") }

        let signature: OpaquePointer? = der.withUnsafeBufferPointer { buffer in
            var cursor = buffer.baseAddress
            return d2i_ECDSA_SIG(nil, &cursor, derCount)
        }
        guard let signature else { throw .openSSL(.library, "d2i_ECDSA_SIG") }
        defer { ECDSA_SIG_free(signature) }
        var r: OpaquePointer?, s: OpaquePointer?
        ECDSA_SIG_get0(signature, &r, &s)
        // BN_bn2binpad, not BN_bn2bin: r or s below 2^248 (about 1 in 128 signatures) needs its leading zero
        // bytes to keep the fixed 32-byte width the receiver splits on.
        var raw = [UInt8](repeating: 0, count: 64)
        let ok = raw.withUnsafeMutableBufferPointer { out in
            BN_bn2binpad(r, out.baseAddress, 32) == 32 && BN_bn2binpad(s, out.baseAddress! + 32, 32) == 32
        }
        guard ok else { throw .openSSL(.library, "BN_bn2binpad") }
        return raw
    }

    /// The public half as PEM (`BEGIN PUBLIC KEY`), for whoever checks our signatures.
    public func publicKeyPEM() throws(CryptoError) -> String {
        guard let bio = BIO_new(BIO_s_mem()) else { throw .openSSL(.library, "BIO_new") }
        defer { BIO_free(bio) }
        guard PEM_write_bio_PUBKEY(bio, key) == 1 else { throw .openSSL(.library, "PEM_write_bio_PUBKEY") }
        let count = Int(BIO_ctrl_pending(bio))
        let bytes = [UInt8](unsafeUninitializedCapacity: count) { out, initialized in
            initialized = count > 0 ? max(0, Int(BIO_read(bio, out.baseAddress, Int32(count)))) : 0
        }
        guard bytes.count == count else { throw .openSSL(.library, "BIO_read") }
        return String(decoding: bytes, as: UTF8.self)
    }
}

/// Checks ES256 signatures made with an EC P-256 key.
///
/// `@unchecked Sendable` for the same reason as `ES256Signer`: the key is only read.
public final class ES256Verifier: @unchecked Sendable {
    private let key: OpaquePointer  // EVP_PKEY, owned (one reference)

    /// Loads a public key from PEM text (`BEGIN PUBLIC KEY`); throws `invalidKey` for anything but P-256.
    public init(publicKeyPEM: String) throws(CryptoError) {
        key = try loadP256(pem: publicKeyPEM, kind: .publicKey)
    }

    /// Checks signatures made by `signer`.
    public init(signer: ES256Signer) {
        // Share the signer's key rather than copy it; each of us releases its own reference.
        OpenSSL.check(EVP_PKEY_up_ref(signer.key) == 1, "EVP_PKEY_up_ref")
        key = signer.key
    }

    deinit { EVP_PKEY_free(key) }

    /// Whether `signature64` (r ‖ s, 32 bytes each) is a valid signature of `message`.
    public func verify(signature64: [UInt8], message: [UInt8]) -> Bool {
        // A rejected signature leaves reasons on this thread's error queue; they must not surface in a later error.
        defer { ERR_clear_error() }
        guard signature64.count == 64, let der = Self.der(signature64) else { return false }
        guard let context = EVP_MD_CTX_new() else { return false }
        defer { EVP_MD_CTX_free(context) }
        guard EVP_DigestVerifyInit(context, nil, OpenSSL.sha256, nil, key) == 1 else { return false }
        return EVP_DigestVerify(context, der, der.count, message, message.count) == 1
    }

    /// r ‖ s re-encoded as the DER `SEQUENCE { INTEGER r, INTEGER s }` that OpenSSL verifies.
    private static func der(_ raw: [UInt8]) -> [UInt8]? {
        guard let signature = ECDSA_SIG_new() else { return nil }
        defer { ECDSA_SIG_free(signature) }
        let r = raw.withUnsafeBufferPointer { BN_bin2bn($0.baseAddress, 32, nil) }
        let s = raw.withUnsafeBufferPointer { BN_bin2bn($0.baseAddress! + 32, 32, nil) }
        // ECDSA_SIG_set0 takes ownership of r and s only when it succeeds.
        guard let r, let s, ECDSA_SIG_set0(signature, r, s) == 1 else {
            BN_free(r)
            BN_free(s)
            return nil
        }
        let count = i2d_ECDSA_SIG(signature, nil)
        guard count > 0 else { return nil }
        var der = [UInt8](repeating: 0, count: Int(count))
        let written = der.withUnsafeMutableBufferPointer { buffer in
            var cursor = buffer.baseAddress
            return i2d_ECDSA_SIG(signature, &cursor)
        }
        return written == count ? der : nil
    }
}

private enum PEMKind { case privateKey, publicKey }

/// Reads one key from PEM text and keeps it only if it is an EC key on P-256; the caller owns the result.
private func loadP256(pem: String, kind: PEMKind) throws(CryptoError) -> OpaquePointer {
    ERR_clear_error()  // so the reasons in a thrown error are this load's own
    let text = Array(pem.utf8)
    let loaded: OpaquePointer? = text.withUnsafeBytes { bytes in
        guard let bio = BIO_new_mem_buf(bytes.baseAddress, Int32(clamping: bytes.count)) else { return nil }
        defer { BIO_free(bio) }
        // A password callback that always refuses: with none, OpenSSL would prompt on the terminal for an
        // encrypted key, and a server has nobody there to answer.
        switch kind {
        case .privateKey: return PEM_read_bio_PrivateKey(bio, nil, { _, _, _, _ in -1 }, nil)
        case .publicKey: return PEM_read_bio_PUBKEY(bio, nil, { _, _, _, _ in -1 }, nil)
        }
    }
    let expected = kind == .privateKey ? "an unencrypted PEM private key" : "a PEM public key"
    guard let key = loaded else { throw .openSSL(.invalidKey, "could not read \(expected)") }

    guard EVP_PKEY_get_base_id(key) == EVP_PKEY_EC else {
        let type = EVP_PKEY_get0_type_name(key).map { String(cString: $0) } ?? "unknown"
        EVP_PKEY_free(key)
        throw CryptoError(.invalidKey, "ES256 needs an EC P-256 key, not \(type)")
    }
    var name = [CChar](repeating: 0, count: 80)
    var nameCount = 0
    let curve = EVP_PKEY_get_group_name(key, &name, name.count, &nameCount) == 1
        ? name.withUnsafeBufferPointer { String(cString: $0.baseAddress!) } : "unknown"
    // OpenSSL names P-256 "prime256v1" (its X9.62 name); the others are there in case that ever changes.
    guard ["prime256v1", "P-256", "secp256r1"].contains(curve) else {
        EVP_PKEY_free(key)
        throw CryptoError(.invalidKey, "ES256 needs an EC P-256 key, not an EC key on curve \(curve)")
    }
    return key
}
