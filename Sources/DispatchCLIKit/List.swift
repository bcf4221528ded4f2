import DispatchCore

/// `dispatch list`: which page to ask for next, and how activities are shown. Pure: the shell
/// fetches `GET /v1/activities` pages and prints what these return.

public struct CLIListOptions: Equatable, Sendable {
    public enum Filter: String, Sendable {
        /// Live: queued, processing, retrying, idle.
        case active
        /// Terminal: completed, error, cancelled, rejected.
        case finished
    }

    public static let defaultLimit = 50
    public static let maxLimit = 100_000

    public var filter: Filter?
    public var machine: String?
    /// How many activities to show at most, newest first.
    public var limit: Int

    public init(filter: Filter? = nil, machine: String? = nil, limit: Int = defaultLimit) {
        self.filter = filter
        self.machine = machine
        self.limit = limit
    }
}

public enum CLIList {
    /// The server answers at most this many per page.
    public static let pageSize = 500

    /// `/v1/activities?state=active&machine=M&limit=N&cursor=C` for the next page, asking for no
    /// more than the `remaining` activities still wanted.
    public static func path(_ o: CLIListOptions, remaining: Int, cursor: String?) -> String {
        var query: [String] = []
        if let f = o.filter { query.append("state=\(f.rawValue)") }
        if let m = o.machine { query.append("machine=\(CLIHTTP.encodeSegment(m))") }
        query.append("limit=\(min(max(remaining, 1), pageSize))")
        if let c = cursor { query.append("cursor=\(CLIHTTP.encodeSegment(c))") }
        return "/v1/activities?" + query.joined(separator: "&")
    }

    /// One page of the answer: its activities and the cursor of the next page (nil: the last).
    /// nil when the body is not that shape.
    public static func page(_ body: [UInt8]) -> (activities: [JSONValue], next: String?)? {
        guard let value = try? JSONParser.parse(body, maxDepth: 64), case .array(let items)? = value["activities"] else { return nil }
        if case .string(let c)? = value["nextCursor"], !c.isEmpty { return (items, c) }
        return (items, nil)
    }

    /// For pipes: one line per activity, tab-separated, always seven fields (`-` when empty):
    /// id, state, progress, machine, updatedAt, task name, status. `cut -f1` gives the ids.
    public static func plainLine(_ v: CLIActivityView) -> String {
        func field(_ s: String?) -> String {
            guard let s, !s.isEmpty else { return "-" }
            return CLIText.oneLine(s)  // a tab becomes a space: the fields stay seven
        }
        return [field(v.activityID), field(v.state), CLIProgress.percentText(v.progress), field(v.machine),
                field(v.updatedAtText), field(v.taskName), field(v.status)].joined(separator: "\t")
    }

    /// For a terminal: a table that fits `width`. Ids are never cut (they are what one copies);
    /// the name and the status share what is left, the status shrinking first.
    public static func table(_ views: [CLIActivityView], width: Int, now: Double) -> [String] {
        let header = ["ID", "STATE", "PROGRESS", "MACHINE", "UPDATED"]
        let rows: [[String]] = views.map { v in
            [CLIText.oneLine(v.activityID), CLIText.oneLine(v.state ?? "-"), CLIProgress.percentText(v.progress),
             CLIText.oneLine(v.machine ?? "-"), v.updatedAt.map { CLIProgress.duration(max(0, now - $0)) + " ago" } ?? "-"]
        }
        var widths = header.map(\.count)
        for row in rows {
            for (i, cell) in row.enumerated() { widths[i] = max(widths[i], cell.count) }
        }
        func pad(_ s: String, _ n: Int) -> String { s + String(repeating: " ", count: max(0, n - s.count)) }
        let fixed = widths.reduce(0, +) + 2 * widths.count  // two spaces after each column
        let room = max(width - fixed, 12)
        var lines = [header.enumerated().map { pad($0.element, widths[$0.offset]) }.joined(separator: "  ") + "  TASK"]
        for (row, v) in zip(rows, views) {
            let name = CLIText.oneLine(v.taskName ?? "")
            let status = CLIText.oneLine(v.status ?? "")
            var task = CLIProgress.truncate(name, to: room)
            let statusRoom = room - task.count - 3
            if !status.isEmpty, statusRoom >= 4 { task += " — " + CLIProgress.truncate(status, to: statusRoom) }
            lines.append(row.enumerated().map { pad($0.element, widths[$0.offset]) }.joined(separator: "  ") + "  " + task)
        }
        return lines
    }

    /// What an empty answer says on a terminal.
    public static func emptyNote(_ o: CLIListOptions) -> String {
        var what = o.filter.map { "no \($0.rawValue) activities" } ?? "no activities"
        if let m = o.machine { what += " on \(CLIText.oneLine(m))" }
        return what
    }
}

/// Compact JSON text of a parsed value (keys in their order), for `list --json`: one snapshot
/// per line, as `watch --json` prints them.
public enum CLIJSON {
    public static func encode(_ value: JSONValue) -> String {
        var w = JSONWriter()
        write(value, &w)
        return w.string
    }

    static func write(_ value: JSONValue, _ w: inout JSONWriter) {
        switch value {
        case .null: w.null()
        case .bool(let b): w.bool(b)
        case .number(let d): w.number(d)
        case .string(let s): w.string(s)
        case .array(let items):
            w.beginArray()
            for item in items { write(item, &w) }
            w.endArray()
        case .object(let members):
            w.beginObject()
            for (k, v) in members {
                w.key(k)
                write(v, &w)
            }
            w.endObject()
        }
    }
}
