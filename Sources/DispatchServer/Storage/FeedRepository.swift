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
    /// The snapshot, its name and the object's own fields; the frame, once built, as much again.
    var byteCount: Int { json.utf8.count + name.utf8.count + 96 }
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
    /// How many activities the initial set would walk, when the replay asked for it.
    var activities: Int64?
    /// Rows the read brought and their bytes, before the budget's cut (to size the next page).
    var fetched = 0
    var fetchedBytes = 0
}

/// All SQL of the feed (contract §8). Each read is one statement, so the rows and the newest
/// position it reports come from one snapshot: what the FeedHub's "drop what the read
/// covered" rule needs. Pages run on the database's feed session, never ahead of point reads,
/// and ask for about the rows their byte budget sends (`PageSizer`), walking an index in
/// position order: `feed_latest` for the initial set, the changes' position index for replays.
struct FeedRepository {
    let db: Database

    /// Terminal event names, for the `state=finished` filter in SQL.
    static let terminalNames = "'completed','error','cancelled','rejected'"

    /// A page of the initial set: every activity's current snapshot with the position of its
    /// latest change, oldest first, after `after`: live ones and those finished since `since`
    /// (ms); with `state=active`, also those that finished after `firstHead` (during earlier
    /// pages), so a list learns they left. At most `limit` rows, cut to `maxBytes`.
    func initialPage(_ f: FeedFilter, after: Int64, firstHead: Int64?, since: Int64, limit: Int, maxBytes: Int,
                     _ completion: @escaping (Result<FeedPage, DispatchError>) -> Void) {
        db.readFeed(PGQuery("""
            SELECT (SELECT coalesce(max(position), 0) FROM activity_events) AS head, page.*
            FROM (SELECT 1) one LEFT JOIN LATERAL (
              SELECT e.position, e.event, e.data, a.machine
              FROM feed_latest l
              JOIN activities a ON a.activity_id = l.activity_id
              JOIN activity_events e ON e.position = l.position
              WHERE l.position > $1::bigint
                AND ($2::text IS NULL OR a.machine = $2)
                AND (a.ended_ms IS NULL OR a.ended_ms >= $3::bigint OR l.position > coalesce($4::bigint, 9223372036854775807))
                AND CASE $5::text
                      WHEN 'active' THEN a.ended_ms IS NULL OR l.position > coalesce($4::bigint, 9223372036854775807)
                      WHEN 'finished' THEN a.ended_ms IS NOT NULL
                      ELSE true END
              ORDER BY l.position LIMIT $6::bigint
            ) page ON true
            """, [String(after), f.machine, String(since), firstHead.map { String($0) }, f.state?.rawValue ?? "",
                  String(limit)], name: "feed_initial_page")) { result in
            completion(result.map { Self.page($0, limit: limit, maxBytes: maxBytes) })
        }
    }

    /// A page of the changes after `after` matching the filter, with the horizon and the
    /// newest position drawn (to tell whether `after` can be resumed at all). With
    /// `countActivities`, also how many activities the initial set would walk, when `after`
    /// is more than `FeedResume.replayFloor` changes behind (to tell whether replaying costs
    /// more than starting over); nil otherwise.
    func replayPage(_ f: FeedFilter, after: Int64, limit: Int, maxBytes: Int, countActivities: Bool,
                    _ completion: @escaping (Result<FeedPage, DispatchError>) -> Void) {
        db.readFeed(PGQuery("""
            WITH meta AS (
              SELECT coalesce((SELECT max(position) FROM activity_events), 0) AS head,
                     (SELECT position FROM feed_horizon) AS horizon,
                     (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM feed_positions) AS issued
            )
            SELECT m.head, m.horizon, m.issued,
                   CASE WHEN $5::boolean AND greatest(m.head, m.issued) - $1::bigint > \(FeedResume.replayFloor)
                        THEN (SELECT count(*) FROM feed_latest) END AS activities,
                   page.*
            FROM meta m LEFT JOIN LATERAL (
              SELECT e.position, e.event, e.data, a.machine
              FROM activity_events e JOIN activities a ON a.activity_id = e.activity_id
              WHERE e.position > $1::bigint
                AND ($2::text IS NULL OR a.machine = $2)
                AND ($3::text <> 'finished' OR e.event IN (\(Self.terminalNames)))
              ORDER BY e.position LIMIT $4::bigint
            ) page ON true
            """, [String(after), f.machine, f.state?.rawValue ?? "", String(limit), countActivities ? "true" : "false"],
            name: "feed_replay_page")) { result in
            completion(result.map { r in
                var p = Self.page(r, limit: limit, maxBytes: maxBytes)
                p.horizon = r.first?.int64("horizon") ?? 0
                p.issued = r.first?.int64("issued") ?? 0
                p.activities = r.first?.int64("activities")
                return p
            })
        }
    }

    /// Every stored change after `after`, oldest first (the source's catch-up, unfiltered).
    func changes(after: Int64, limit: Int, _ completion: @escaping (Result<FeedPage, DispatchError>) -> Void) {
        db.readFeed(PGQuery("""
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

    /// The rows that fit the byte budget; complete when the read returned fewer rows than
    /// asked (nothing more matched) and none was cut.
    private static func page(_ r: PGResult, limit: Int, maxBytes: Int) -> FeedPage {
        let read = r.rows.compactMap(event(row:))
        let kept = PageSizer.fitting(read.map(\.json.utf8.count), budget: maxBytes)
        return FeedPage(events: Array(read.prefix(kept)), head: r.first?.int64("head") ?? 0,
                        complete: read.count < limit && kept == read.count, fetched: read.count,
                        fetchedBytes: read.reduce(0) { $0 + $1.json.utf8.count })
    }
}
