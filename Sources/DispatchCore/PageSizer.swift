/// How many rows a history or feed page asks the database for, so that the read brings about
/// what the page's byte budget will send, rather than a fixed row limit most of which is
/// thrown away (a 64 KiB budget sends ~90 rows of 700 bytes; asking for 1,001 cost ten times
/// the work). The average row size is learnt from the pages read.
public struct PageSizer: Sendable {
    public let maxRows: Int
    public private(set) var averageRowBytes: Double

    public init(maxRows: Int, initialRowBytes: Int = 512) {
        precondition(maxRows >= 1 && initialRowBytes >= 1)
        self.maxRows = maxRows
        averageRowBytes = Double(initialRowBytes)
    }

    /// Rows to ask for a page of `budget` bytes: a quarter more than the average says will
    /// fit (so an average page is rarely cut short), plus the row that may overflow it.
    public func rows(forBudget budget: Int) -> Int {
        let fit = Double(max(budget, 1)) / averageRowBytes
        return min(maxRows, max(2, Int((fit * 1.25).rounded(.up)) + 1))
    }

    /// A page came back: `rows` rows of `bytes` bytes in all.
    public mutating func observe(rows: Int, bytes: Int) {
        guard rows > 0 else { return }
        let sample = max(1, Double(bytes) / Double(rows))
        // Quick to learn, slow to forget one odd page.
        averageRowBytes = averageRowBytes * 0.7 + sample * 0.3
    }

    /// How many leading rows of these sizes a page of `budget` bytes sends: every row that
    /// starts below the budget (the first one always, however large).
    public static func fitting(_ sizes: [Int], budget: Int) -> Int {
        var used = 0
        for (i, s) in sizes.enumerated() {
            if i > 0 && used >= budget { return i }
            used += s
        }
        return sizes.count
    }
}
