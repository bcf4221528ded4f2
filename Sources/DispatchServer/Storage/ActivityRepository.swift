import DispatchCore
import DispatchIO
import PGCore

extension StoredActivity {
    /// Decodes a row of `ActivityRepository.columns`; nil when the row breaks the schema's rules.
    init?(row r: PGRow) {
        guard let id = r["activity_id"], let name = r["task_name"], let state = r["state"].flatMap(ActivityState.init(rawValue:)),
              let attempt = r.int64("attempt"), let seq = r.int64("seq"), let created = r.int64("created_ms"),
              let updated = r.int64("updated_ms"), let lastEvent = r["last_event"], let startFP = r["start_fingerprint"]
        else { return nil }
        let activity = Activity(activityId: id, taskName: name, systemImage: r["system_image"], machine: r["machine"],
                                cancelURL: r["cancel_url"], state: state, progress: r.double("progress"), status: r["status"],
                                attempt: attempt, seq: seq, cancelRequested: r.bool("cancel_requested") ?? false,
                                liveActivity: r.bool("live_activity") ?? false, createdAt: created, updatedAt: updated, endedAt: r.int64("ended_ms"),
                                error: r["error"], cancelReason: r["cancel_reason"],
                                broadcast: r.bool("broadcast") ?? false, channelId: r["channel_id"])
        self.init(activity: activity, lastEvent: lastEvent, ownerKeyID: r.int64("owner_key_id"), startFingerprint: startFP,
                  endFingerprint: r["end_fingerprint"], staleAfter: r.int("stale_after_s") ?? 0, touchedMs: r.int64("touched_ms") ?? 0)
    }
}

/// One stored change: what history reads and replays return.
struct StoredEvent {
    var seq: Int64
    var name: String
    var data: String
    var createdMs: Int64

    init(seq: Int64, name: String, data: String, createdMs: Int64) {
        self.seq = seq
        self.name = name
        self.data = data
        self.createdMs = createdMs
    }

    init?(row r: PGRow) {
        guard let seq = r.int64("seq"), let name = r["event"], let data = r["data"], let created = r.int64("created_ms") else { return nil }
        self.init(seq: seq, name: name, data: data, createdMs: created)
    }
}

/// All SQL on `activities` and `activity_events`, and the decoding of their rows.
struct ActivityRepository {
    let db: Database

    /// The columns `StoredActivity(row:)` reads, from `activities a`.
    static let columns = "a.activity_id, a.task_name, a.system_image, a.machine, a.cancel_url, a.state, a.progress, a.status, a.attempt, a.seq, a.cancel_requested, a.created_ms, a.updated_ms, a.ended_ms, a.error, a.last_event, a.owner_key_id, a.start_fingerprint, a.end_fingerprint, a.live_activity, a.stale_after_s, a.touched_ms, a.cancel_reason, a.broadcast, a.channel_id"

    func read(_ id: String, _ completion: @escaping (Result<StoredActivity?, DispatchError>) -> Void) {
        db.read(PGQuery("SELECT \(Self.columns) FROM activities a WHERE a.activity_id = $1", [id], name: "read_activity")) { result in
            completion(result.map { $0.first.flatMap(StoredActivity.init(row:)) })
        }
    }

    /// `read` for many activities in one statement (the snapshots of the status streams that
    /// connected in one loop turn): the activities found, by id; an id missing (or whose row
    /// breaks the schema's rules) is not found.
    func readMany(_ ids: [String], _ completion: @escaping (Result<[String: StoredActivity], DispatchError>) -> Void) {
        db.read(Self.readManyStatement(ids)) { result in
            completion(result.map { r in
                var out: [String: StoredActivity] = [:]
                out.reserveCapacity(r.rows.count)
                for row in r.rows {
                    guard let s = StoredActivity(row: row) else { continue }
                    out[s.activity.activityId] = s
                }
                return out
            })
        }
    }

    /// An index probe per id, whatever the table's size: `LIMIT 1` keeps each look-up a
    /// subquery of its own. Without it PostgreSQL flattens the LATERAL into a plain join and,
    /// for a few hundred ids on a table of thousands, hashes the whole table (12 ms for 250 ids
    /// on 8,000 rows, against 1 ms probing).
    static func readManyStatement(_ ids: [String]) -> PGQuery {
        PGQuery("""
            SELECT a.* FROM unnest($1::text[]) AS k(activity_id)
            CROSS JOIN LATERAL (SELECT \(columns) FROM activities a WHERE a.activity_id = k.activity_id LIMIT 1) a
            """, [PGArray.text(ids)], name: "read_activities")
    }

    /// Stored events after `after`, oldest first: at most `limit`, and no more than about
    /// `maxBytes` of event data (the first event always comes, whatever its size).
    func history(_ id: String, after: Int64, limit: Int64, maxBytes: Int = Int(Int32.max),
                 _ completion: @escaping (Result<[StoredEvent], DispatchError>) -> Void) {
        db.read(PGQuery("""
            SELECT seq, event, data, created_ms FROM (
              SELECT seq, event, data, created_ms, sum(octet_length(data)) OVER (ORDER BY seq) AS upto
              FROM activity_events WHERE activity_id = $1 AND seq > $2::bigint ORDER BY seq LIMIT $3::bigint
            ) page WHERE upto - octet_length(data) < $4::bigint ORDER BY seq
            """, [id, String(after), String(limit), String(maxBytes)], name: "read_history")) { result in
            completion(result.map { $0.rows.compactMap(StoredEvent.init(row:)) })
        }
    }

    /// The stored events after each given seq, for many activities in one statement (what a
    /// turn's carrier hints point at), oldest first per activity, at most `limit` each.
    func histories(_ after: [(id: String, seq: Int64)], limit: Int64,
                   _ completion: @escaping (Result<[String: [StoredEvent]], DispatchError>) -> Void) {
        db.read(PGQuery("""
            SELECT c.activity_id, e.seq, e.event, e.data, e.created_ms
            FROM unnest($1::text[], $2::bigint[]) AS c(activity_id, after)
            CROSS JOIN LATERAL (
              SELECT seq, event, data, created_ms FROM activity_events
              WHERE activity_id = c.activity_id AND seq > c.after ORDER BY seq LIMIT $3::bigint
            ) e
            """, [PGArray.text(after.map(\.id)), PGArray.numbers(after.map(\.seq)), String(limit)], name: "read_histories")) { result in
            completion(result.map { r in
                var out: [String: [StoredEvent]] = [:]
                for row in r.rows {
                    guard let id = row["activity_id"], let e = StoredEvent(row: row) else { continue }
                    out[id, default: []].append(e)
                }
                return out
            })
        }
    }

    /// Stored events newest first: the `limit` newest, or the `limit` before `before` (a
    /// history view paging backwards, contract §3).
    func historyBackwards(_ id: String, before: Int64?, limit: Int64,
                          _ completion: @escaping (Result<[StoredEvent], DispatchError>) -> Void) {
        db.read(PGQuery("""
            SELECT seq, event, data, created_ms FROM activity_events
            WHERE activity_id = $1 AND seq < $2::bigint ORDER BY seq DESC LIMIT $3::bigint
            """, [id, String(before ?? Int64.max), String(limit)], name: "read_history_desc")) { result in
            completion(result.map { $0.rows.compactMap(StoredEvent.init(row:)) })
        }
    }

    struct ListQuery {
        var finished: Bool?
        var machine: String?
        /// Case-insensitive substring of the activity id or the task name.
        var text: String?
        var limit: Int64
        var cursor: ListCursor?
    }

    func list(_ q: ListQuery, _ completion: @escaping (Result<[Activity], DispatchError>) -> Void) {
        var conditions: [String] = []
        var params: [String?] = []
        if let f = q.finished { conditions.append(f ? "ended_ms IS NOT NULL" : "ended_ms IS NULL") }
        if let m = q.machine { params.append(m); conditions.append("machine = $\(params.count)") }
        if let t = q.text {
            params.append(t.lowercased())
            conditions.append("(strpos(lower(a.activity_id), $\(params.count)) > 0 OR strpos(lower(a.task_name), $\(params.count)) > 0)")
        }
        if let c = q.cursor {
            params.append(String(c.createdAt)); params.append(c.activityId)
            conditions.append("(created_ms, activity_id) < ($\(params.count - 1)::bigint, $\(params.count))")
        }
        params.append(String(q.limit))
        let whereClause = conditions.isEmpty ? "" : "WHERE " + conditions.joined(separator: " AND ")
        db.read(PGQuery("SELECT \(Self.columns) FROM activities a \(whereClause) ORDER BY a.created_ms DESC, a.activity_id DESC LIMIT $\(params.count)", params)) { result in
            completion(result.map { $0.rows.compactMap { StoredActivity(row: $0)?.activity } })
        }
    }

    /// Deletes up to 5,000 finished activities that ended before `cutoff`, with their history
    /// (a cascading foreign key). Live activities are never touched. Raises the feed's
    /// horizon to the newest position deleted (every sub-statement sees the history before the
    /// cascade), so a feed resuming from before it is told to reset.
    func prune(endedBefore cutoff: Int64, _ completion: @escaping (Int) -> Void) {
        db.read(PGQuery("""
            WITH victims AS (
              SELECT activity_id FROM activities WHERE ended_ms IS NOT NULL AND ended_ms < $1::bigint LIMIT 5000
            ), old AS (
              DELETE FROM activities WHERE activity_id IN (SELECT activity_id FROM victims) RETURNING 1
            ), horizon AS (
              UPDATE feed_horizon SET position = GREATEST(position,
                (SELECT coalesce(max(e.position), 0) FROM activity_events e WHERE e.activity_id IN (SELECT activity_id FROM victims)))
              RETURNING 1
            )
            SELECT count(*) AS pruned FROM old
            """, [String(cutoff)], name: "prune"), timeout: db.backgroundTimeout) { result in
            completion((try? result.get().first?.int("pruned")) ?? 0)
        }
    }

    /// The row a publish is planned against, and what this Idempotency-Key already applied to
    /// this activity, if anything.
    func readForPublish(_ id: String, idempotencyKey: String?,
                        _ completion: @escaping (Result<PublishRead?, DispatchError>) -> Void) {
        db.read(PGQuery("""
            SELECT \(Self.columns), r.data AS replay, r.event AS replay_event, r.seq AS replay_seq
            FROM activities a LEFT JOIN activity_events r ON r.activity_id = a.activity_id AND r.idempotency_key = $2
            WHERE a.activity_id = $1
            """, [id, idempotencyKey], name: "read_for_publish")) { result in
            completion(result.map { r in r.first.flatMap(Self.publishRead) })
        }
    }

    /// `readForPublish` for many activities in one statement (the reads one turn of the publish
    /// machine asks for: a request of many changes reads each of its activities afresh). One
    /// answer per read, in the reads' order. A statement per read cost PostgreSQL ~20 µs of CPU
    /// each; this one ~4 µs per activity.
    func readManyForPublish(_ reads: [(activityID: String, idempotencyKey: String?)],
                            _ completion: @escaping (Result<[PublishRead?], DispatchError>) -> Void) {
        db.read(Self.readManyForPublishStatement(reads)) { result in
            completion(result.map { r in
                var out = [PublishRead?](repeating: nil, count: reads.count)
                for row in r.rows {
                    guard let ord = row.int("ord"), (1...reads.count).contains(ord) else { continue }
                    out[ord - 1] = Self.publishRead(row)
                }
                return out
            })
        }
    }

    /// Index probes per activity, as `readManyStatement` (`LIMIT 1`: never a hash of the whole
    /// table or history).
    static func readManyForPublishStatement(_ reads: [(activityID: String, idempotencyKey: String?)]) -> PGQuery {
        PGQuery("""
            SELECT k.ord, a.*, r.data AS replay, r.event AS replay_event, r.seq AS replay_seq
            FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS k(activity_id, idempotency_key, ord)
            CROSS JOIN LATERAL (SELECT \(columns) FROM activities a WHERE a.activity_id = k.activity_id LIMIT 1) a
            LEFT JOIN LATERAL (
              SELECT e.data, e.event, e.seq FROM activity_events e
              WHERE e.activity_id = k.activity_id AND e.idempotency_key = k.idempotency_key LIMIT 1
            ) r ON true
            """, [PGArray.text(reads.map(\.activityID)), PGArray.text(reads.map(\.idempotencyKey))], name: "read_for_publish_many")
    }

    /// A row of `read_for_publish` (or its many form): the activity, and what the request's
    /// Idempotency-Key already applied to it; nil when the row breaks the schema's rules.
    private static func publishRead(_ row: PGRow) -> PublishRead? {
        guard let stored = StoredActivity(row: row) else { return nil }
        var replay: PublishReplay?
        if let json = row["replay"], let event = row["replay_event"], let seq = row.int64("replay_seq") {
            replay = PublishReplay(json: json, event: event, seq: seq)
        }
        return PublishRead(stored: stored, replay: replay)
    }

    // MARK: - Writes (statements for the group commit)

    typealias Change = PublishBatch.Change
    typealias Start = PublishBatch.Start
    typealias Update = PublishBatch.Update
    typealias Webhook = PublishBatch.Webhook

    /// NOTIFY payloads stay under PostgreSQL's 8000 bytes: `position \n id \n seq \n event \n
    /// json`, the json left out when it would not fit (listeners then read history).
    static let maxNotifyPayload = 7850

    /// Creates a batch's new activities in one statement; an id that exists already comes back
    /// in no row. Their first history rows are written by the batch's finalize step.
    ///
    /// Each key may hold at most `maxLivePerKey` live activities (contract §6): the starts a
    /// key may not make are not inserted and come back as `over_limit_id` rows (when their id
    /// does not exist already: a start of an existing id is planned again as usual). The quota
    /// comes from `dispatch_live_quota` (Migrations/0010_key_limits.sql), which serialises a
    /// key's starts across sessions and servers with an advisory lock held to the commit and
    /// counts after the lock with a fresh snapshot: a key never exceeds its limit, however many
    /// starts race. Within a batch, a key's starts are taken in the batch's order.
    ///
    /// Each key may also finish at most `maxFinishedPerKey` activities in 24 hours (issue 36):
    /// `dispatch_start_quota` (Migrations/0021_finished_per_key.sql) counts the key's ends since
    /// `now` less the window under the same lock, and a start it refuses for that comes back as
    /// an `over_limit_id` row with `over_finished_free_at` (when one more start may pass).
    static func startsStatement(_ starts: [Start], maxLivePerKey: Int, maxFinishedPerKey: Int = KeyRules.defaultMaxFinished,
                                now: Int64) -> PGQuery {
        let a = starts.map(\.event.snapshot)
        let staleAt: [Int64?] = starts.map {
            $0.staleAfter > 0 && !$0.event.snapshot.state.isTerminal ? $0.event.snapshot.updatedAt + Int64($0.staleAfter) * 1000 : nil
        }
        return PGQuery("""
            WITH n AS (
              SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::float8[], $8::text[],
                                   $9::bigint[], $10::bigint[], $11::text[], $12::boolean[], $13::integer[], $14::bigint[], $15::boolean[])
                WITH ORDINALITY AS n(activity_id, task_name, system_image, machine, cancel_url, state, progress, status,
                                     created_ms, owner_key_id, start_fingerprint, live_activity, stale_after_s, stale_at_ms, broadcast, ord)
            ), wanted AS (
              SELECT owner_key_id, count(*)::integer AS starts FROM n WHERE owner_key_id IS NOT NULL GROUP BY owner_key_id
            ), quota AS (
              SELECT * FROM dispatch_start_quota(ARRAY(SELECT owner_key_id FROM wanted ORDER BY owner_key_id),
                                                 ARRAY(SELECT starts FROM wanted ORDER BY owner_key_id), $16::integer,
                                                 $17::integer, $18::bigint)
            ), refused AS (
              SELECT r.activity_id, CASE WHEN q.finished_full THEN coalesce(q.free_at_ms, 0) END AS free_at FROM (
                SELECT n.activity_id, n.owner_key_id, row_number() OVER (PARTITION BY n.owner_key_id ORDER BY n.ord) AS rank FROM n
              ) r JOIN quota q ON q.key_id = r.owner_key_id WHERE r.rank > q.allowed
            ), created AS (
              INSERT INTO activities (activity_id, task_name, system_image, machine, cancel_url, state, progress, status,
                                      attempt, seq, last_event, created_ms, updated_ms, owner_key_id, start_fingerprint,
                                      live_activity, stale_after_s, stale_at_ms, broadcast)
              SELECT n.activity_id, n.task_name, n.system_image, n.machine, n.cancel_url, n.state, n.progress, n.status,
                     1, 1, n.state, n.created_ms, n.created_ms, n.owner_key_id, n.start_fingerprint,
                     n.live_activity, n.stale_after_s, n.stale_at_ms, n.broadcast
              FROM n WHERE n.activity_id NOT IN (SELECT activity_id FROM refused)
              ON CONFLICT (activity_id) DO NOTHING RETURNING activity_id
            )
            SELECT activity_id, NULL::text AS over_limit_id, NULL::bigint AS over_finished_free_at FROM created
            UNION ALL
            SELECT NULL, f.activity_id, f.free_at FROM refused f WHERE NOT EXISTS (SELECT 1 FROM activities x WHERE x.activity_id = f.activity_id)
            """, [PGArray.text(a.map(\.activityId)), PGArray.text(a.map(\.taskName)), PGArray.text(a.map(\.systemImage)),
                  PGArray.text(a.map(\.machine)), PGArray.text(a.map(\.cancelURL)), PGArray.text(a.map(\.state.rawValue)),
                  PGArray.text(a.map { $0.progress.map { "\($0)" } }), PGArray.text(a.map(\.status)),
                  PGArray.numbers(a.map(\.createdAt)), PGArray.numbers(starts.map(\.ownerKeyID)),
                  PGArray.text(starts.map(\.fingerprint)), PGArray.text(a.map { $0.liveActivity ? "true" : "false" }),
                  PGArray.numbers(starts.map { Int64($0.staleAfter) }), PGArray.numbers(staleAt),
                  PGArray.text(a.map { $0.broadcast ? "true" : "false" }), String(maxLivePerKey),
                  String(maxFinishedPerKey), String(now - KeyRules.finishedWindowMs)],
            name: "publish_starts")
    }

    /// Applies a batch's changes in one statement (one executor start and one constraint check
    /// set for the batch, not one per change). A change applies only if the activity is still
    /// at its expected seq and its Idempotency-Key was not applied yet; its id comes back then.
    /// A batch holds one change per activity (the publisher serialises each activity's), and
    /// rows are locked in id order (a nested loop over the sorted changes and the primary key),
    /// so two servers' batches never deadlock.
    ///
    /// Progress updates change no indexed column, so they stay heap-only (HOT): the stale
    /// deadline `stale_at_ms` (indexed) is cleared by the end only, never moved per change (the
    /// sweeper works out the real deadline from `updated_ms` and `touched_ms`).
    static func updatesStatement(_ updates: [Update]) -> PGQuery {
        let sorted = updates.sorted { $0.event.snapshot.activityId < $1.event.snapshot.activityId }
        let a = sorted.map(\.event.snapshot)
        return PGQuery("""
            WITH c AS (
              SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::float8[], $5::text[], $6::bigint[], $7::bigint[],
                                   $8::text[], $9::bigint[], $10::bigint[], $11::text[], $12::text[], $13::text[],
                                   $14::boolean[], $15::text[], $16::text[], $17::text[], $18::bigint[])
                AS c(activity_id, expected_seq, state, progress, status, attempt, seq, last_event, updated_ms, ended_ms,
                     error, end_fingerprint, idempotency_key, cancel_requested, cancel_reason, hook_id, hook_body, stale_touch)
            ), upd AS (
              UPDATE activities a SET state = c.state, progress = c.progress, status = c.status, attempt = c.attempt,
                     seq = c.seq, last_event = c.last_event, updated_ms = c.updated_ms, ended_ms = c.ended_ms,
                     error = c.error, end_fingerprint = c.end_fingerprint, cancel_requested = c.cancel_requested,
                     cancel_reason = coalesce(c.cancel_reason, a.cancel_reason),
                     stale_at_ms = CASE WHEN c.ended_ms IS NULL THEN a.stale_at_ms END
              FROM c
              WHERE a.activity_id = c.activity_id AND a.seq = c.expected_seq
                AND (c.stale_touch IS NULL OR coalesce(a.touched_ms, 0) = c.stale_touch)
                AND (c.idempotency_key IS NULL OR NOT EXISTS (
                  SELECT 1 FROM activity_events e WHERE e.activity_id = c.activity_id AND e.idempotency_key = c.idempotency_key))
              RETURNING a.activity_id, a.cancel_url, c.hook_id, c.hook_body
            ), hook AS (
              INSERT INTO webhook_outbox (delivery_id, activity_id, url, body)
              SELECT hook_id, activity_id, cancel_url, hook_body FROM upd WHERE hook_id IS NOT NULL AND cancel_url IS NOT NULL
            )
            SELECT activity_id FROM upd
            """, [PGArray.text(a.map(\.activityId)), PGArray.numbers(sorted.map(\.expectedSeq)), PGArray.text(a.map(\.state.rawValue)),
                  PGArray.text(a.map { $0.progress.map { "\($0)" } }), PGArray.text(a.map(\.status)), PGArray.numbers(a.map(\.attempt)),
                  PGArray.numbers(a.map(\.seq)), PGArray.text(sorted.map(\.event.name.rawValue)), PGArray.numbers(a.map(\.updatedAt)),
                  PGArray.numbers(a.map(\.endedAt)), PGArray.text(a.map(\.error)), PGArray.text(sorted.map(\.endFingerprint)),
                  PGArray.text(sorted.map(\.idempotencyKey)), PGArray.text(a.map { $0.cancelRequested ? "true" : "false" }),
                  PGArray.text(sorted.map(\.cancelReason)), PGArray.text(sorted.map { $0.webhook?.deliveryID }),
                  PGArray.text(sorted.map { $0.webhook?.body }), PGArray.numbers(sorted.map(\.staleTouch))],
            name: "publish_updates")
    }

    /// A publish batch as statements: its changes in one, its new activities in another, then
    /// the position lock and the finalize. PostgreSQL runs the pipeline batch as one implicit
    /// transaction committed at its sync point (no BEGIN/COMMIT: an error rolls the whole batch
    /// back instead of leaving the session in an aborted transaction), so a batch is at most
    /// four statements however many changes it carries. `writes`: how many statements lead
    /// (their RETURNING lists the activities whose change applied).
    /// `numbering`: with `.bySequencer` the changes are numbered after the commit, so no
    /// position lock is taken (see `finalizeStatement`).
    static func publishStatements(_ batch: PublishBatch, maxLivePerKey: Int, maxFinishedPerKey: Int = KeyRules.defaultMaxFinished,
                                  numbering: FeedNumbering) -> (queries: [PGQuery], writes: Int) {
        var queries: [PGQuery] = []
        // Changes to existing activities first: an end the batch carries frees its key's place
        // for a start in the same batch (the live quota counts what this transaction wrote),
        // as it would have if it had been published alone before it.
        if !batch.updates.isEmpty { queries.append(updatesStatement(batch.updates)) }
        if !batch.starts.isEmpty { queries.append(startsStatement(batch.starts, maxLivePerKey: maxLivePerKey, maxFinishedPerKey: maxFinishedPerKey, now: batch.now)) }
        let writes = queries.count
        if numbering == .atCommit { queries.append(positionLock) }
        queries.append(finalizeStatement(batch.changes, pushes: batch.marksPushes, now: batch.now, numbering: numbering))
        return (queries, writes)
    }

    /// How a publish batch ended, from its results: a change applied iff a write's RETURNING
    /// listed its activity (not iff the finalize gave it a position: one may come later).
    static func publishResult(_ result: Result<[PGResult], PGError>, writes: Int) -> PublishBatchResult {
        guard case .success(let rs) = result, let finalize = rs.last else { return .connectionFailed }
        guard rs.allSatisfy(\.ok) else {
            if let refused = rs.first(where: { Database.refusedWrite($0.sqlState) }) {
                return .refused((refused.errorMessage ?? "").trimmingNewlines)
            }
            return .rolledBack((rs.first { $0.sqlState != nil }?.errorMessage ?? "batch rolled back").trimmingNewlines)
        }
        var applied: Set<String> = [], overLimit: Set<String> = [], overFinished: [String: Int64] = [:]
        for r in rs.prefix(writes) {
            for row in r.rows {
                if let id = row["activity_id"] { applied.insert(id) }
                guard row.has("over_limit_id"), let id = row["over_limit_id"] else { continue }
                if row.has("over_finished_free_at"), let freeAt = row.int64("over_finished_free_at") {
                    overFinished[id] = freeAt
                } else {
                    overLimit.insert(id)
                }
            }
        }
        return .committed(applied: applied, pushesMarked: finalize.first?.int64("pushes") ?? 0, overLimit: overLimit,
                          overFinished: overFinished)
    }

    /// Feed order: the finalize step of a batch takes this lock after its changes, so positions
    /// are drawn in commit order (see `AdvisoryLock.feedPositions`).
    static let positionLock = PGQuery("SELECT \(AdvisoryLock.feedPositions.xactLock)", name: "position_lock")

    /// The last statement of a publish batch, under `positionLock`: writes the history rows of
    /// the changes that applied (the activity rows this transaction wrote, `xmin`), each with
    /// its feed position, sends one NOTIFY per change in position order, and (with APNs
    /// configured) marks the push outbox: one entry per activity that has update tokens
    /// (`push_activity_outbox`, Migrations/0016: one row write per change whatever the number
    /// of phones; the sender fans it out to the tokens), a push-to-start row per device for a
    /// new `liveActivity` activity, and the broadcast channel's row. The history row is
    /// written once, with its position (no second write to set it).
    /// It reads with a snapshot taken after the changes held their row locks, so a token
    /// registered concurrently is either seen here or registered after this commit (the
    /// registration locks the activity row, and then marks its own push). Entries are upserted
    /// in activity order, the order the push sender's marks lock them in, so the two never
    /// deadlock; an entry the sender paces (`due_at` ahead) keeps its `due_at` for a
    /// progress-only change, while a state change or an end cuts the pace short (down to the
    /// whole second of the last push's timestamp, never an entry being sent). An entry already
    /// waiting to be claimed, at this priority or higher, is left as it is (no write: under a
    /// burst of changes the outbox costs nothing more): the sender reads the activity after its
    /// claim commits, so it pushes this change anyway. An entry being sent gets the new seq. The
    /// look-ups are LATERAL subqueries or EXISTS probes (index probes per change): as plain
    /// joins, the generic plan of this prepared statement scanned whole tables on every batch.
    ///
    /// With the NATS carrier (`.bySequencer`), the history rows are written without a position
    /// and nothing is notified: the sequencer numbers them after the commit (see
    /// `SequencerMachine`), and the worker announces the changes on NATS itself.
    static func finalizeStatement(_ changes: [Change], pushes: Bool, now: Int64, numbering: FeedNumbering = .atCommit) -> PGQuery {
        let sequenced = numbering == .bySequencer
        let marks = pushes ? """
            , marks AS (
              INSERT INTO push_activity_outbox AS o (activity_id, wanted_seq, priority, pending_since_ms)
              SELECT p.activity_id, max(p.seq), max(p.priority), $8::bigint
              FROM placed p
              WHERE EXISTS (SELECT 1 FROM activity_tokens x WHERE x.activity_id = p.activity_id)
              GROUP BY p.activity_id
              ORDER BY p.activity_id
              ON CONFLICT (activity_id) DO UPDATE SET
                wanted_seq = GREATEST(o.wanted_seq, EXCLUDED.wanted_seq),
                priority = CASE WHEN o.wanted_seq > o.sent_seq THEN GREATEST(o.priority, EXCLUDED.priority) ELSE EXCLUDED.priority END,
                pending_since_ms = CASE WHEN o.wanted_seq > o.sent_seq THEN o.pending_since_ms ELSE EXCLUDED.pending_since_ms END,
                due_at = CASE WHEN EXCLUDED.priority = 10 AND o.lease_id IS NULL AND o.attempts = 0
                                THEN GREATEST(now(), LEAST(o.due_at, to_timestamp(o.last_timestamp)))
                              WHEN o.wanted_seq > o.sent_seq THEN o.due_at ELSE GREATEST(o.due_at, now()) END
              WHERE NOT (o.wanted_seq > o.sent_seq AND o.lease_id IS NULL AND o.priority >= EXCLUDED.priority)
              RETURNING 1
            ), starts AS (
              INSERT INTO push_outbox (activity_id, device_id, kind, wanted_seq, priority, pending_since_ms)
              SELECT p.activity_id, d.id, 'start', 1, 10, $8::bigint
              FROM placed p CROSS JOIN LATERAL (
                SELECT 1 FROM activities x WHERE x.activity_id = p.activity_id AND x.live_activity LIMIT 1) a
              CROSS JOIN (\(DeviceRepository.pushToStartTargets)) d
              WHERE p.seq = 1
              ORDER BY p.activity_id, d.id
              ON CONFLICT (activity_id, device_id, kind) DO NOTHING
              RETURNING 1
            ), channels AS (
              INSERT INTO broadcast_outbox (activity_id)
              SELECT p.activity_id FROM placed p CROSS JOIN LATERAL (
                SELECT 1 FROM activities x WHERE x.activity_id = p.activity_id AND x.broadcast LIMIT 1) a
              WHERE p.seq = 1
              ON CONFLICT (activity_id) DO NOTHING
              RETURNING 1
            ), casts AS (
              UPDATE broadcast_outbox b SET wanted_seq = GREATEST(b.wanted_seq, p.seq),
                priority = CASE WHEN b.wanted_seq > b.sent_seq THEN GREATEST(b.priority, p.priority) ELSE p.priority END,
                pending_since_ms = CASE WHEN b.wanted_seq > b.sent_seq THEN b.pending_since_ms ELSE $8::bigint END,
                due_at = CASE WHEN p.priority = 10 AND b.lease_id IS NULL AND b.attempts = 0 AND b.phase = 'live'
                              THEN GREATEST(now(), LEAST(b.due_at, to_timestamp(b.last_timestamp)))
                              WHEN b.wanted_seq > b.sent_seq THEN b.due_at ELSE GREATEST(b.due_at, now()) END
              FROM (SELECT activity_id, max(seq) AS seq, max(priority) AS priority FROM placed WHERE seq > 1 GROUP BY activity_id) p
              WHERE b.activity_id = p.activity_id
              RETURNING 1
            )
            """ : ""
        let counted = pushes ? ", (SELECT count(*) FROM marks) + (SELECT count(*) FROM starts) + (SELECT count(*) FROM channels) + (SELECT count(*) FROM casts) AS pushes" : ", 0 AS pushes"
        let notified = """
            SELECT pg_notify('\(Channel.events)', ordered.position || E'\\n' || ordered.activity_id || E'\\n' || ordered.seq
                             || E'\\n' || ordered.event || E'\\n'
                             || CASE WHEN octet_length(ordered.data) + octet_length(ordered.activity_id) <= \(maxNotifyPayload - 64)
                                     THEN ordered.data ELSE '' END) AS notified,
                   ordered.activity_id, ordered.seq, ordered.position\(counted)
            FROM (SELECT * FROM placed ORDER BY position) ordered
            """
        return PGQuery("""
            WITH c AS (
              SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::smallint[])
                WITH ORDINALITY AS c(activity_id, seq, event, data, idempotency_key, created_ms, priority, ord)
            ), inserted AS (
              INSERT INTO activity_events (activity_id, seq, event, data, idempotency_key, created_ms, position)
              SELECT c.activity_id, c.seq, c.event, c.data, c.idempotency_key, c.created_ms, \(sequenced ? "NULL::bigint" : "nextval('feed_positions')")
              FROM c CROSS JOIN LATERAL (
                SELECT 1 FROM activities a
                WHERE a.activity_id = c.activity_id AND a.seq = c.seq AND a.xmin = pg_current_xact_id()::xid LIMIT 1) mine
              ORDER BY c.ord
              RETURNING activity_id, seq, position, event, data
            ), placed AS (
              SELECT i.activity_id, i.seq, i.position, i.event, i.data, c.priority FROM inserted i JOIN c USING (activity_id, seq)
            )\(marks)
            \(sequenced ? "SELECT placed.activity_id, placed.seq, placed.position\(counted) FROM placed" : notified)
            """, [PGArray.text(changes.map(\.activityID)), PGArray.numbers(changes.map(\.seq)), PGArray.text(changes.map(\.event)),
                  PGArray.text(changes.map(\.data)), PGArray.text(changes.map(\.idempotencyKey)), PGArray.numbers(changes.map(\.createdMs)),
                  PGArray.numbers(changes.map { Int64($0.pushPriority) })] + (pushes ? [String(now)] : []),
            name: (pushes ? "publish_finalize_push" : "publish_finalize") + (sequenced ? "_sequenced" : ""))
    }
}
