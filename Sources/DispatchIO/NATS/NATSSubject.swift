/// One NATS subject token from any string. In a subject `.` separates tokens, `*` and `>` are
/// wildcards and whitespace ends it, while activity ids may hold `.`, `:` and more; so an id
/// travels as base64url of its UTF-8 bytes without padding (letters, digits, `-`, `_`: a third
/// longer, never `.`). The empty id, which base64 would make an empty (invalid) token, is `_`:
/// one character is never a base64 length, so the two cannot meet.
public enum NATSSubject {
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)
    private static let values: [UInt8] = {
        var table = [UInt8](repeating: 0xFF, count: 256)
        for (i, c) in alphabet.enumerated() { table[Int(c)] = UInt8(i) }
        return table
    }()

    public static func token(_ id: String) -> String {
        let bytes = Array(id.utf8)
        if bytes.isEmpty { return "_" }
        var out: [UInt8] = []
        out.reserveCapacity((bytes.count * 4 + 2) / 3)
        var i = 0
        while i < bytes.count {
            let b0 = UInt32(bytes[i])
            let b1 = i + 1 < bytes.count ? UInt32(bytes[i + 1]) : 0
            let b2 = i + 2 < bytes.count ? UInt32(bytes[i + 2]) : 0
            let group = b0 << 16 | b1 << 8 | b2
            let chars = min(4, (bytes.count - i) + 1)
            for k in 0..<chars { out.append(alphabet[Int((group >> UInt32(18 - 6 * k)) & 63)]) }
            i += 3
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// The id a token came from; nil for anything `token` never returns (a wildcard, a foreign
    /// character, a base64 length that cannot be, stray bits, bytes that are not UTF-8).
    public static func decode(_ token: String) -> String? {
        if token == "_" { return "" }
        let chars = Array(token.utf8)
        guard !chars.isEmpty, chars.count % 4 != 1 else { return nil }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(chars.count * 3 / 4)
        var i = 0
        while i < chars.count {
            let n = min(4, chars.count - i)
            var group: UInt32 = 0
            for k in 0..<4 {
                var v: UInt32 = 0
                if k < n {
                    let d = values[Int(chars[i + k])]
                    if d == 0xFF { return nil }
                    v = UInt32(d)
                }
                group = group << 6 | v
            }
            let produced = n - 1
            // Bits past the last whole byte must be zero, or two tokens would name one id.
            let unused = group & ((1 << UInt32(8 * (3 - produced))) - 1)
            if unused != 0 { return nil }
            for k in 0..<produced { bytes.append(UInt8((group >> UInt32(16 - 8 * k)) & 0xFF)) }
            i += 4
        }
        return String(validating: bytes, as: UTF8.self)
    }
}
