/// "Did you mean …": the closest known word to a mistyped command or flag.
public enum CLISuggest {
    /// Words people type for a command that has another name here.
    public static let aliases: [String: String] = [
        "ls": "list", "create": "start", "new": "start", "update": "progress", "status": "watch",
        "follow": "watch", "tail": "watch", "finish": "end", "done": "end", "stop": "cancel",
        "kill": "cancel", "exec": "run", "ping": "touch", "heartbeat": "touch", "verify": "verify-webhook",
    ]

    /// The candidate closest to `word`: a known alias, else the one at the smallest edit distance
    /// (at most 1 for words of up to 4 characters, 2 for longer ones; ties go to the earlier
    /// candidate), else the only candidate `word` is a prefix of. nil when nothing is close.
    public static func closest(to word: String, among candidates: [String]) -> String? {
        let w = word.lowercased()
        if let a = aliases[w], candidates.contains(a) { return a }
        guard !w.isEmpty else { return nil }
        let limit = w.count <= 4 ? 1 : 2
        var best: (word: String, distance: Int)?
        for c in candidates {
            let d = distance(w, c.lowercased())
            if d <= limit, d < (best?.distance ?? Int.max) { best = (c, d) }
        }
        if let best { return best.word }
        let prefixed = candidates.filter { $0.lowercased().hasPrefix(w) }
        return w.count >= 2 && prefixed.count == 1 ? prefixed[0] : nil
    }

    /// Optimal string alignment distance: insertions, deletions, substitutions and swaps of two
    /// neighbours (`strat` -> `start` is 1) each cost 1.
    public static func distance(_ a: String, _ b: String) -> Int {
        let x = Array(a.unicodeScalars), y = Array(b.unicodeScalars)
        if x.isEmpty { return y.count }
        if y.isEmpty { return x.count }
        var rows = [[Int]](repeating: [Int](repeating: 0, count: y.count + 1), count: x.count + 1)
        for i in 0...x.count { rows[i][0] = i }
        for j in 0...y.count { rows[0][j] = j }
        for i in 1...x.count {
            for j in 1...y.count {
                let cost = x[i - 1] == y[j - 1] ? 0 : 1
                var d = min(rows[i - 1][j] + 1, rows[i][j - 1] + 1, rows[i - 1][j - 1] + cost)
                if i > 1, j > 1, x[i - 1] == y[j - 2], x[i - 2] == y[j - 1] { d = min(d, rows[i - 2][j - 2] + 1) }
                rows[i][j] = d
            }
        }
        return rows[x.count][y.count]
    }

    /// ` (did you mean 'start'?)`, or "" when nothing is close.
    public static func hint(for word: String, among candidates: [String], quote: (String) -> String = { "'\($0)'" }) -> String {
        closest(to: word, among: candidates).map { " (did you mean \(quote($0))?)" } ?? ""
    }
}
