import DispatchCore
import DispatchIO

/// One change on the feed: its position, what the filters look at, and its SSE frame, built
/// once (on first use) and shared by every subscriber.
final class FeedEvent: FeedChange {
    let position: Int64
    let machine: String?
    let isTerminal: Bool
    let name: String
    let json: String
    private var framed: StreamPayload?

    init(position: Int64, name: String, json: String, machine: String?) {
        self.position = position
        self.name = name
        self.json = json
        self.machine = machine
        isTerminal = WireEvent.terminalName(name)
    }

    /// The frame; `framing` runs only the first time (counted by the shell's metric).
    func payload(framing: () -> Void) -> StreamPayload {
        if let framed { return framed }
        framing()
        let p = StreamPayload(SSE.encode(id: String(position), event: name, data: json))
        framed = p
        return p
    }

    /// A change announced on the NATS carrier.
    convenience init(change c: CarrierMessage.Change) {
        self.init(notice: ChangeNotice(position: c.position, activityID: c.activityID, seq: c.seq, event: c.event, json: c.json))
    }

    /// A change heard through NOTIFY: the machine tag comes from its snapshot.
    convenience init(notice n: ChangeNotice) {
        var machine: String?
        if case .string(let m)? = (try? JSONParser.parse(n.json))?["machine"] { machine = m }
        self.init(position: n.position, name: n.event, json: n.json, machine: machine)
    }
}

/// A page of feed rows and what the read says about its snapshot.
struct FeedPage {
    var events: [FeedEvent]
    /// The newest position visible to the read.
    var head: Int64
    /// Every candidate came back (not cut by the row limit or the byte budget).
    var complete: Bool
    /// The retention horizon and the newest position ever drawn (replays only).
    var horizon: Int64 = 0
    var issued: Int64 = 0
}

/// All SQL of the feed (contract §8). Each read is one statement, so the rows and the newest
/// position it reports come from one snapshot: what the FeedHub's "drop what the read
/// covered" rule needs.
struct FeedRepository {
    let db: Database

    /// Terminal event names, for the `state=finished` filter in SQL.
    static let terminalNames = "'completed','error','cancelled','rejected'"

    /// A page of the initial set: every activity's current snapshot with the position of its
    /// latest change, oldest first, after `after`: live ones and those finished since `since`
    /// (ms); with `state=active`, also those that finished after `firstHead` (during earlier
    /// pages), so a list learns they left.
    func initialPage(_ f: FeedFilter, after: Int64, firstHead: Int64?, since: Int64, limit: Int, maxBytes: Int,
                     _ completion: @escaping (Result<FeedPage, DispatchError>) -> Void) {
        db.read(PGQuery("""
            WITH head AS (SELECT coalesce(max(position), 0) AS p FROM activity_events)
            SELECT h.p AS head, page.* FROM head h LEFT JOIN (
              SELECT q.*, count(*) OVER () AS n, row_number() OVER (ORDER BY q.position) AS rn,
                     sum(octet_length(q.data)) OVER (ORDER BY q.position) AS upto
              FROM (
                SELECT e.position, e.event, e.data, a.machine
                FROM activities a JOIN activity_events e ON e.activity_id = a.activity_id AND e.seq = a.seq
                WHERE e.position > $1::bigint
                  AND ($2::text IS NULL OR a.machine = $2)
                  AND (a.ended_ms IS NULL OR a.ended_ms >= $3::bigint OR e.position > coalesce($4::bigint, (SELECT p FROM head)))
                  AND CASE $5::text
                        WHEN 'active' THEN a.ended_ms IS NULL OR e.position > coalesce($4::bigint, (SELECT p FROM head))
                        WHEN 'finished' THEN a.ended_ms IS NOT NULL
                        ELSE true END
                ORDER BY e.position LIMIT $6::bigint + 1
              ) q
            ) page ON page.rn <= $6::bigint AND page.upto - octet_length(page.data) < $7::bigint
            ORDER BY page.position
            """, [String(after), f.machine, String(since), firstHead.map { String($0) }, f.state?.rawValue ?? "",
                  String(limit), String(maxBytes)], name: "feed_initial")) { result in
            completion(result.map { Self.page($0) })
        }
    }

    /// A page of the changes after `after` matching the filter, with the horizon and the
    /// newest position drawn (to tell whether `after` can be resumed at all).
    func replayPage(_ f: FeedFilter, after: Int64, limit: Int, maxBytes: Int,
                    _ completion: @escaping (Result<FeedPage, DispatchError>) -> Void) {
        db.read(PGQuery("""
            WITH meta AS (
              SELECT coalesce((SELECT max(position) FROM activity_events), 0) AS head,
                     (SELECT position FROM feed_horizon) AS horizon,
                     (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM feed_positions) AS issued
            )
            SELECT m.head, m.horizon, m.issued, page.* FROM meta m LEFT JOIN (
              SELECT q.*, count(*) OVER () AS n, row_number() OVER (ORDER BY q.position) AS rn,
                     sum(octet_length(q.data)) OVER (ORDER BY q.position) AS upto
              FROM (
                SELECT e.position, e.event, e.data, a.machine
                FROM activity_events e JOIN activities a ON a.activity_id = e.activity_id
                WHERE e.position > $1::bigint
                  AND ($2::text IS NULL OR a.machine = $2)
                  AND ($3::text <> 'finished' OR e.event IN (\(Self.terminalNames)))
                ORDER BY e.position LIMIT $4::bigint + 1
              ) q
            ) page ON page.rn <= $4::bigint AND page.upto - octet_length(page.data) < $5::bigint
            ORDER BY page.position
            """, [String(after), f.machine, f.state?.rawValue ?? "", String(limit), String(maxBytes)], name: "feed_replay")) { result in
            completion(result.map { r in
                var p = Self.page(r)
                p.horizon = r.first?.int64("horizon") ?? 0
                p.issued = r.first?.int64("issued") ?? 0
                return p
            })
        }
    }

    /// Every stored change after `after`, oldest first (the source's catch-up, unfiltered).
    func changes(after: Int64, limit: Int, _ completion: @escaping (Result<FeedPage, DispatchError>) -> Void) {
        db.read(PGQuery("""
            SELECT e.position, e.event, e.data, a.machine
            FROM activity_events e JOIN activities a ON a.activity_id = e.activity_id
            WHERE e.position > $1::bigint ORDER BY e.position LIMIT $2::bigint
            """, [String(after), String(limit)], name: "feed_changes")) { result in
            completion(result.map { r in
                let events = r.rows.compactMap(Self.event(row:))
                return FeedPage(events: events, head: events.last?.position ?? after, complete: r.rows.count < limit)
            })
        }
    }

    private static func event(row r: PGRow) -> FeedEvent? {
        guard let position = r.int64("position"), let name = r["event"], let data = r["data"] else { return nil }
        return FeedEvent(position: position, name: name, json: data, machine: r["machine"])
    }

    private static func page(_ r: PGResult) -> FeedPage {
        let events = r.rows.compactMap(event(row:))
        let total = r.first?.int64("n") ?? 0
        return FeedPage(events: events, head: r.first?.int64("head") ?? 0, complete: Int64(events.count) >= total)
    }
}
