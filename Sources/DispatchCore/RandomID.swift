/// Random identifiers: activity ids (UUID v4) and key secrets.
public enum RandomID {
    public static func uuid<G: RandomNumberGenerator>(using g: inout G) -> String {
        var b = (0..<16).map { _ in UInt8.random(in: 0...255, using: &g) }
        b[6] = (b[6] & 0x0F) | 0x40
        b[8] = (b[8] & 0x3F) | 0x80
        let h = hex(b)
        let u = Array(h)
        return String(u[0..<8]) + "-" + String(u[8..<12]) + "-" + String(u[12..<16]) + "-" + String(u[16..<20]) + "-" + String(u[20..<32])
    }

    public static func secret<G: RandomNumberGenerator>(using g: inout G) -> String {
        "dsp_" + hex((0..<24).map { _ in UInt8.random(in: 0...255, using: &g) })
    }

    static func hex(_ bytes: [UInt8]) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count * 2)
        for b in bytes { out.append(digits[Int(b >> 4)]); out.append(digits[Int(b & 0xF)]) }
        return String(decoding: out, as: UTF8.self)
    }
}
