/// Why a crypto operation failed: `code` is stable for callers and logs, `message` carries OpenSSL's own words.
public struct CryptoError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The kinds of failure a caller can act on.
    public enum Code: String, Sendable {
        /// The key is unreadable, the wrong length, or not the algorithm required.
        case invalidKey
        /// A sealed blob is too short or has a version we do not know.
        case malformed
        /// A sealed blob's tag did not match: tampered, or the wrong key or associated data.
        case authenticationFailed
        /// OpenSSL failed where valid input should not, or the input is past its limits (2 GiB).
        case library
    }

    public let code: Code
    public let message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "\(code.rawValue): \(message)" }

    /// An error whose message ends with everything on this thread's OpenSSL error queue, which it empties.
    static func openSSL(_ code: Code, _ what: String) -> CryptoError {
        let reasons = OpenSSL.drainErrors()
        return CryptoError(code, reasons.isEmpty ? what : what + ": " + reasons.joined(separator: "; "))
    }
}
