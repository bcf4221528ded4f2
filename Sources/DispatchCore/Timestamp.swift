/// Milliseconds since the Unix epoch, rendered as RFC 3339 UTC (`2026-11-29T22:53:26.123Z`).
public enum Timestamp {
    public static func format(milliseconds ms: Int64) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(24)
        append(milliseconds: ms, to: &out)
        return String(decoding: out, as: UTF8.self)
    }

    /// `format`'s text appended to JSON or a log line, without a String for each part (every
    /// snapshot carries two or three).
    public static func append(milliseconds ms: Int64, to out: inout [UInt8]) {
        let millis = Int((ms % 1000 + 1000) % 1000)
        let totalSeconds = (ms - Int64(millis)) / 1000
        var days = totalSeconds / 86_400
        var secs = Int(totalSeconds % 86_400)
        if secs < 0 { secs += 86_400; days -= 1 }
        let (y, m, d) = civilFromDays(days)
        if (0...9999).contains(y) {
            digits(Int(y), 4, &out)
        } else {
            out.append(contentsOf: String(y).utf8)
        }
        out.append(0x2D); digits(m, 2, &out)
        out.append(0x2D); digits(d, 2, &out)
        out.append(0x54); digits(secs / 3600, 2, &out)
        out.append(0x3A); digits(secs % 3600 / 60, 2, &out)
        out.append(0x3A); digits(secs % 60, 2, &out)
        out.append(0x2E); digits(millis, 3, &out)
        out.append(0x5A)
    }

    /// `v` (≥ 0) in exactly `width` decimal digits.
    private static func digits(_ v: Int, _ width: Int, _ out: inout [UInt8]) {
        var divisor = 1
        for _ in 1..<width { divisor *= 10 }
        var rest = v
        while divisor > 0 {
            out.append(0x30 + UInt8(truncatingIfNeeded: rest / divisor % 10))
            rest %= divisor
            divisor /= 10
        }
    }

    /// Howard Hinnant's days-to-civil algorithm.
    static func civilFromDays(_ z0: Int64) -> (Int64, Int, Int) {
        let z = z0 + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let doe = z - era * 146_097
        let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365
        let y = yoe + era * 400
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let d = Int(doy - (153 * mp + 2) / 5 + 1)
        let m = Int(mp < 10 ? mp + 3 : mp - 9)
        return (m <= 2 ? y + 1 : y, m, d)
    }

    static func daysFromCivil(_ y0: Int64, _ m: Int, _ d: Int) -> Int64 {
        let y = m <= 2 ? y0 - 1 : y0
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let mm = Int64(m > 2 ? m - 3 : m + 9)
        let doy = (153 * mm + 2) / 5 + Int64(d) - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        return era * 146_097 + doe - 719_468
    }

    /// Parses the format `format` writes (and whole seconds, without the fraction).
    public static func parse(_ s: String) -> Int64? {
        let b = Array(s.utf8)
        func num(_ r: Range<Int>) -> Int64? {
            guard r.upperBound <= b.count else { return nil }
            var v: Int64 = 0
            for i in r { guard (0x30...0x39).contains(b[i]) else { return nil }; v = v * 10 + Int64(b[i] - 0x30) }
            return v
        }
        guard b.count >= 20, b[4] == 0x2D, b[7] == 0x2D, b[10] == 0x54, b[13] == 0x3A, b[16] == 0x3A,
              let y = num(0..<4), let mo = num(5..<7), let d = num(8..<10),
              let h = num(11..<13), let mi = num(14..<16), let sec = num(17..<19),
              (1...12).contains(mo), (1...31).contains(d), h < 24, mi < 60, sec < 61 else { return nil }
        var ms: Int64 = 0
        if b[19] == 0x2E {
            guard b.count == 24, b[23] == 0x5A, let f = num(20..<23) else { return nil }
            ms = f
        } else {
            guard b.count == 20, b[19] == 0x5A else { return nil }
        }
        let days = daysFromCivil(y, Int(mo), Int(d))
        return ((days * 86_400) + h * 3600 + mi * 60 + sec) * 1000 + ms
    }
}
