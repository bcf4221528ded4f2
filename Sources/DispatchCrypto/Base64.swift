/// Base64 (RFC 4648): the standard alphabet with `=` padding, and base64url without padding (as JWTs use).
///
/// Decoding is strict: no whitespace, no characters outside the alphabet, padding only where the
/// variant has it, and unused trailing bits must be zero, so every byte string has exactly one spelling.
public enum Base64 {
    private static let standard = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)
    private static let url = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)
    private static let standardValues = values(of: standard)
    private static let urlValues = values(of: url)

    /// Standard base64 with `=` padding.
    public static func encode(_ bytes: some Collection<UInt8>) -> String {
        encode(Array(bytes), alphabet: standard, padded: true)
    }

    /// The bytes of standard, padded base64 text, or nil if it is not exactly that.
    public static func decode(_ text: String) -> [UInt8]? {
        decode(Array(text.utf8), values: standardValues, padded: true)
    }

    /// base64url (`-` and `_`) without padding.
    public static func urlEncode(_ bytes: some Collection<UInt8>) -> String {
        encode(Array(bytes), alphabet: url, padded: false)
    }

    /// The bytes of unpadded base64url text, or nil if it is not exactly that.
    public static func urlDecode(_ text: String) -> [UInt8]? {
        decode(Array(text.utf8), values: urlValues, padded: false)
    }

    private static func encode(_ bytes: [UInt8], alphabet: [UInt8], padded: Bool) -> String {
        var out: [UInt8] = []
        out.reserveCapacity((bytes.count + 2) / 3 * 4)
        var i = 0
        while i < bytes.count {
            let remaining = bytes.count - i
            let group = UInt32(bytes[i]) << 16
                | (remaining > 1 ? UInt32(bytes[i + 1]) << 8 : 0)
                | (remaining > 2 ? UInt32(bytes[i + 2]) : 0)
            let chars = min(remaining, 3) + 1  // 1 byte -> 2 chars, 2 -> 3, 3 -> 4
            for j in 0..<chars { out.append(alphabet[Int(group >> (18 - 6 * UInt32(j)) & 0x3F)]) }
            if padded { for _ in chars..<4 { out.append(UInt8(ascii: "=")) } }
            i += 3
        }
        return String(decoding: out, as: UTF8.self)
    }

    private static func decode(_ chars: [UInt8], values: [UInt8], padded: Bool) -> [UInt8]? {
        var count = chars.count
        if padded {
            guard count % 4 == 0 else { return nil }
            // At most two `=`, and only at the end; any other `=` fails the alphabet check below.
            for _ in 0..<2 where count > 0 && chars[count - 1] == UInt8(ascii: "=") { count -= 1 }
        }
        guard count % 4 != 1 else { return nil }  // one leftover character carries only 6 bits: not a byte
        var out: [UInt8] = []
        out.reserveCapacity(count / 4 * 3 + 2)
        var i = 0
        while i < count {
            let n = min(4, count - i)
            var group: UInt32 = 0
            for j in 0..<4 {
                let value = j < n ? values[Int(chars[i + j])] : 0
                guard value != invalid else { return nil }
                group = group << 6 | UInt32(value)
            }
            let bytes = n - 1  // 2 chars -> 1 byte, 3 -> 2, 4 -> 3
            // The bits past the last whole byte must be zero: otherwise two spellings decode alike.
            guard group & (0xFF_FFFF >> (8 * UInt32(bytes))) == 0 else { return nil }
            for j in 0..<bytes { out.append(UInt8(truncatingIfNeeded: group >> (16 - 8 * UInt32(j)))) }
            i += 4
        }
        return out
    }

    private static let invalid: UInt8 = 0xFF

    private static func values(of alphabet: [UInt8]) -> [UInt8] {
        var values = [UInt8](repeating: invalid, count: 256)
        for (value, char) in alphabet.enumerated() { values[Int(char)] = UInt8(value) }
        return values
    }
}
