/// Durations as people write them: `90`, `90s`, `10m`, `1h30m`, `2d`, `1.5s`. One reader and
/// one writer for the server's stale message and the CLI's `--stale-after` and `--kill-after`.
public enum DurationText {
    /// Seconds in `text`: a plain number (seconds), or number+unit groups with units `ms`, `s`,
    /// `m`, `h`, `d` in any order (`1h30m`). nil when it is not one, negative, or not finite.
    public static func seconds(_ text: String) -> Double? {
        let t = Array(text.utf8)
        guard !t.isEmpty, t.count <= 64 else { return nil }
        if let plain = Double(text), plain.isFinite, plain >= 0, t.allSatisfy({ isDigit($0) || $0 == 0x2E }) { return plain }
        var total = 0.0
        var i = 0
        while i < t.count {
            let start = i
            while i < t.count, isDigit(t[i]) || t[i] == 0x2E { i += 1 }
            guard i > start, let n = Double(String(decoding: t[start..<i], as: UTF8.self)) else { return nil }
            let unitStart = i
            while i < t.count, (0x61...0x7A).contains(t[i]) { i += 1 }
            let unit: Double
            switch String(decoding: t[unitStart..<i], as: UTF8.self) {
            case "ms": unit = 0.001
            case "s": unit = 1
            case "m": unit = 60
            case "h": unit = 3600
            case "d": unit = 86_400
            default: return nil
            }
            total += n * unit
        }
        return total.isFinite ? total : nil
    }

    /// Whole seconds in `text` (see `seconds`); nil when it is not a whole number of seconds.
    public static func wholeSeconds(_ text: String) -> Int? {
        guard let s = seconds(text), s.rounded() == s, s <= Double(Int32.max) else { return nil }
        return Int(s)
    }

    /// `10s`, `5m`, `1h30m`, `1d`, `2d3h4m5s`: whole seconds, largest units first, zero parts left out.
    public static func format(seconds: Int) -> String {
        guard seconds > 0 else { return "0s" }
        var left = seconds
        var out = ""
        for (unit, size) in [("d", 86_400), ("h", 3600), ("m", 60), ("s", 1)] where left >= size {
            out += "\(left / size)\(unit)"
            left %= size
        }
        return out
    }

    private static func isDigit(_ b: UInt8) -> Bool { (0x30...0x39).contains(b) }
}

/// What the server writes when it ends an activity nobody updated in time (contract §5.4).
public enum StaleEnd {
    /// The end: state `error`, `error: "stale: no update for <duration>"`, progress and status kept.
    public static func command(staleAfter: Int) -> EndCommand {
        EndCommand(state: .error, error: "stale: no update for \(DurationText.format(seconds: staleAfter))")
    }
}
