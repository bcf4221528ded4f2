/// What waits on one activity, oldest first (the publish machine's ops). Taken from the front
/// by an index and changed in place: a request of many changes to one activity (up to 1,000
/// in a batch, more from concurrent publishers) is answered in linear time, not quadratic.
struct WaitLine<Element> {
    private var items: [Element] = []
    private var head = 0
    var isEmpty: Bool { head == items.count }
    var count: Int { items.count - head }
    /// Taken elements still stored (dropped once they are half the line).
    var taken: Int { head }

    mutating func append(_ e: Element) { items.append(e) }

    mutating func takeFirst() -> Element? {
        guard head < items.count else { return nil }
        let e = items[head]
        head += 1
        if head == items.count {
            items = []
            head = 0
        } else if head >= 64 && head * 2 >= items.count {
            // A line that never empties (publishers that keep coming) drops what was taken.
            items.removeFirst(head)
            head = 0
        }
        return e
    }
}
