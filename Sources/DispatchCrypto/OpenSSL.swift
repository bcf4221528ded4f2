import CCrypto

/// Internal glue shared by the public types: fetched algorithms, the error queue, byte access.
enum OpenSSL {
    // OpenSSL 3's EVP_sha256() and EVP_aes_256_gcm() look the algorithm up in the provider store on
    // every use (a lock and a hash lookup). Fetched once, they are immutable and safe to share across threads.
    nonisolated(unsafe) static let sha256: OpaquePointer = fetched(EVP_MD_fetch(nil, "SHA256", nil), "SHA256")
    nonisolated(unsafe) static let aes256GCM: OpaquePointer = fetched(EVP_CIPHER_fetch(nil, "AES-256-GCM", nil), "AES-256-GCM")

    private static func fetched(_ algorithm: OpaquePointer?, _ name: String) -> OpaquePointer {
        // A libcrypto without SHA-256 or AES-GCM is a broken install, not an input we can handle.
        guard let algorithm else { fatalError("libcrypto has no \(name): \(drainErrors().joined(separator: "; "))") }
        return algorithm
    }

    /// Empties this thread's OpenSSL error queue, oldest first, as OpenSSL's error strings.
    static func drainErrors() -> [String] {
        var reasons: [String] = []
        while case let code = ERR_get_error(), code != 0 {
            var buffer = [CChar](repeating: 0, count: 256)
            ERR_error_string_n(code, &buffer, buffer.count)
            reasons.append(buffer.withUnsafeBufferPointer { String(cString: $0.baseAddress!) })
        }
        return reasons
    }

    /// For calls that only fail when memory runs out: nothing to recover, so stop with OpenSSL's reason.
    static func check(_ ok: Bool, _ what: @autoclosure () -> String) {
        if !ok { fatalError("\(what()): \(drainErrors().joined(separator: "; "))") }
    }
}

/// Calls `body` with the bytes in contiguous memory, copying only collections that are not contiguous.
func withContiguousBytes<R>(_ bytes: some Collection<UInt8>, _ body: (UnsafeRawBufferPointer) -> R) -> R {
    if let result = bytes.withContiguousStorageIfAvailable({ body(UnsafeRawBufferPointer($0)) }) { return result }
    return Array(bytes).withUnsafeBytes(body)
}
