import DispatchCore
import PGCore
import DispatchCrypto
import DispatchIO

/// All SQL on devices and their tokens (contract §5.1), and the outbox marks a registration
/// makes. Tokens arrive here sealed (`TokenVault`); no statement ever sees one in the clear.
enum DeviceRepository {
    /// A Live Activity cannot outlive its activity's end by more than this: its token goes then.
    static let forgetAfterEndMs: Int64 = 12 * 3_600_000

    /// One registration as one pipeline batch, hence one transaction, in this order: the
    /// key's device lock, the device (if the key may have it), its push-to-start token, a
    /// share lock on every named activity, the forgotten tokens, the new ones with their
    /// outbox marks, and the summary. Every statement names the device by (key, token): a
    /// key reaches its own registrations only (contract §6).
    ///
    /// The device limit is exact: the key's advisory lock serialises its registrations across
    /// sessions and servers, and the upsert, a later statement, counts with a snapshot taken
    /// after the lock was granted. A new device past `maxDevices` (0: no limit) is not
    /// inserted; every later statement then finds no device and writes nothing, and the
    /// upsert returns no row (`upsertIndex`: the API answers `429 too_many_devices`).
    ///
    /// The lock closes the race with publishing (see `ActivityRepository.finalizeStatement`):
    /// a change committed before the lock is seen by the marks (`wanted_seq` = the activity's
    /// seq after it); a change after waits for this commit, and its own finalize then sees
    /// the token and marks it. Either way the newest state reaches the new token, once.
    /// Without APNs (`pushes` false) the tokens are kept and nothing is queued.
    static func register(_ r: DeviceRegistration, keyID: Int64, maxDevices: Int, maxTokens: Int, vault: TokenVault, pushes: Bool,
                         nowMs: Int64) throws(CryptoError) -> [PGQuery] {
        let device = try vault.seal(r.deviceToken)
        let mac = Bytea.literal(device.mac)
        let key = String(keyID)
        // The stored push-to-start token stays unless the registration names one or null.
        var pts: TokenVault.Sealed?
        if case .set(let t)? = r.pushToStart { pts = try vault.seal(t) }
        let keepsPushToStart = r.pushToStart == nil
        var queries = [PGQuery("SELECT \(AdvisoryLock.deviceKey.xactLock(perKey: "$1"))", [key], name: "device_key_lock")]
        queries.append(PGQuery("""
            INSERT INTO devices AS d (key_id, token_mac, token_sealed, token_hint, push_to_start_mac, push_to_start_sealed,
                                      push_to_start_hint, push_to_start_at, environment)
            SELECT $8::bigint, $1::bytea, $2::bytea, $3, $4::bytea, $5::bytea, $6, CASE WHEN $4::bytea IS NULL THEN NULL ELSE now() END,
                   coalesce($10::text, 'production')
            WHERE $9::integer <= 0
               OR EXISTS (SELECT 1 FROM devices x WHERE x.key_id = $8::bigint AND x.token_mac = $1::bytea)
               OR (SELECT count(*) FROM devices x WHERE x.key_id = $8::bigint) < $9::integer
            ON CONFLICT (key_id, token_mac) DO UPDATE SET updated_at = now(), environment = coalesce($10::text, d.environment),
              push_to_start_mac = CASE WHEN $7::text = 'keep' THEN d.push_to_start_mac ELSE EXCLUDED.push_to_start_mac END,
              push_to_start_sealed = CASE WHEN $7::text = 'keep' THEN d.push_to_start_sealed ELSE EXCLUDED.push_to_start_sealed END,
              push_to_start_hint = CASE WHEN $7::text = 'keep' THEN d.push_to_start_hint ELSE EXCLUDED.push_to_start_hint END,
              push_to_start_at = CASE WHEN $7::text = 'keep' THEN d.push_to_start_at ELSE EXCLUDED.push_to_start_at END
            RETURNING d.id
            """, [mac, Bytea.literal(device.sealed), device.hint, pts.map { Bytea.literal($0.mac) },
                  pts.map { Bytea.literal($0.sealed) }, pts?.hint, keepsPushToStart ? "keep" : "replace", key, String(maxDevices), r.environment?.rawValue],
            name: "device_upsert"))
        if case .forget? = r.pushToStart {
            queries.append(PGQuery("""
                DELETE FROM push_outbox WHERE kind = 'start' AND wanted_seq > sent_seq
                  AND device_id = (SELECT id FROM devices WHERE key_id = $2::bigint AND token_mac = $1::bytea)
                """, [mac, key], name: "device_forget_push_to_start"))
        }
        let ids = r.activityTokens.map(\.activityID).sorted()
        if !ids.isEmpty {
            queries.append(PGQuery("SELECT activity_id FROM activities WHERE activity_id = ANY($1::text[]) ORDER BY activity_id FOR SHARE",
                                   [PGArray.text(ids)], name: "device_lock_activities"))
        }
        let forgotten = r.activityTokens.filter { $0.change == .forget }.map(\.activityID)
        if !forgotten.isEmpty {
            queries.append(PGQuery("""
                WITH dev AS (SELECT id FROM devices WHERE key_id = $3::bigint AND token_mac = $1::bytea),
                gone AS (DELETE FROM activity_tokens t USING dev WHERE t.device_id = dev.id AND t.activity_id = ANY($2::text[]) RETURNING 1)
                DELETE FROM push_outbox o USING dev WHERE o.device_id = dev.id AND o.kind = 'update' AND o.activity_id = ANY($2::text[])
                """, [mac, PGArray.text(forgotten), key], name: "device_forget_tokens"))
        }
        var set: [(id: String, token: TokenVault.Sealed)] = []
        for t in r.activityTokens {
            if case .set(let token) = t.change { set.append((t.activityID, try vault.seal(token))) }
        }
        if !set.isEmpty && !pushes {
            queries.append(PGQuery("""
                WITH dev AS (SELECT id FROM devices WHERE key_id = $6::bigint AND token_mac = $1::bytea)
                INSERT INTO activity_tokens AS t (device_id, activity_id, token_mac, token_sealed, token_hint, registered_at)
                SELECT dev.id, i.activity_id, i.mac, i.sealed, i.hint, now()
                FROM unnest($2::text[], $3::bytea[], $4::bytea[], $5::text[]) AS i(activity_id, mac, sealed, hint) CROSS JOIN dev
                ORDER BY i.activity_id
                ON CONFLICT (device_id, activity_id) DO UPDATE SET token_mac = EXCLUDED.token_mac,
                  token_sealed = EXCLUDED.token_sealed, token_hint = EXCLUDED.token_hint, registered_at = now()
                """, [mac, PGArray.text(set.map(\.id)), Bytea.array(set.map(\.token.mac)),
                      Bytea.array(set.map(\.token.sealed)), PGArray.text(set.map(\.token.hint)), key], name: "device_keep_tokens"))
        } else if !set.isEmpty {
            queries.append(PGQuery("""
                WITH dev AS (SELECT id FROM devices WHERE key_id = $8::bigint AND token_mac = $1::bytea),
                input AS (SELECT * FROM unnest($2::text[], $3::bytea[], $4::bytea[], $5::text[]) AS i(activity_id, mac, sealed, hint)),
                old AS (SELECT t.activity_id, t.token_mac FROM activity_tokens t JOIN dev ON t.device_id = dev.id
                        WHERE t.activity_id = ANY($2::text[])),
                -- The same token for the same activity registered by other keys: the phone's
                -- pushes go through one registration only, the lowest device id (as the
                -- publish path's marks choose it), so this one pushes only when it is that.
                twins AS (SELECT t.activity_id, t.device_id FROM activity_tokens t JOIN input i
                            ON t.activity_id = i.activity_id AND t.token_mac = i.mac CROSS JOIN dev
                          WHERE t.device_id <> dev.id),
                saved AS (
                  INSERT INTO activity_tokens AS t (device_id, activity_id, token_mac, token_sealed, token_hint, registered_at)
                  SELECT dev.id, i.activity_id, i.mac, i.sealed, i.hint, now() FROM input i CROSS JOIN dev ORDER BY i.activity_id
                  ON CONFLICT (device_id, activity_id) DO UPDATE SET token_mac = EXCLUDED.token_mac,
                    token_sealed = EXCLUDED.token_sealed, token_hint = EXCLUDED.token_hint, registered_at = now()
                  RETURNING 1
                ),
                -- This registration takes over from twins with a higher id: their pending
                -- pushes of the activity would reach the same phone a second time.
                superseded AS (
                  DELETE FROM push_outbox o USING twins w, dev
                  WHERE o.kind = 'update' AND o.activity_id = w.activity_id AND o.device_id = w.device_id AND w.device_id > dev.id
                  RETURNING 1
                )
                -- A new or changed token gets the activity's newest state. A phone that was
                -- started by a push-to-start already shows what that push carried.
                INSERT INTO push_outbox AS o (activity_id, device_id, kind, wanted_seq, sent_seq, last_timestamp, priority, pending_since_ms)
                SELECT a.activity_id, dev.id, 'update', a.seq,
                       CASE WHEN old.activity_id IS NULL THEN coalesce(s.sent_seq, 0) ELSE 0 END,
                       coalesce(s.last_timestamp, 0), 10, $6::bigint
                FROM input i CROSS JOIN dev
                JOIN activities a ON a.activity_id = i.activity_id
                LEFT JOIN old ON old.activity_id = i.activity_id
                LEFT JOIN push_outbox s ON s.activity_id = a.activity_id AND s.device_id = dev.id AND s.kind = 'start'
                WHERE old.token_mac IS DISTINCT FROM i.mac AND (a.ended_ms IS NULL OR a.ended_ms > $6::bigint - $7::bigint)
                  AND NOT EXISTS (SELECT 1 FROM twins w WHERE w.activity_id = i.activity_id AND w.device_id < dev.id)
                ORDER BY a.activity_id
                ON CONFLICT (activity_id, device_id, kind) DO UPDATE SET
                  wanted_seq = GREATEST(o.wanted_seq, EXCLUDED.wanted_seq), sent_seq = 0, priority = 10,
                  pending_since_ms = EXCLUDED.pending_since_ms, due_at = now(), failed = false, attempts = 0,
                  lease_id = NULL, lease_until = NULL
                RETURNING 1
                """, [mac, PGArray.text(set.map(\.id)), Bytea.array(set.map(\.token.mac)),
                      Bytea.array(set.map(\.token.sealed)), PGArray.text(set.map(\.token.hint)),
                      String(nowMs), String(forgetAfterEndMs), key], name: "device_set_tokens"))
        }
        if !set.isEmpty { queries.append(boundTokens(mac: mac, keyID: keyID, max: maxTokens)) }
        queries.append(summaryQuery(mac: mac, keyID: keyID))
        return queries
    }

    /// A device keeps at most `max` activity tokens (contract §5.1): beyond that, the tokens of
    /// the activities that changed least recently go (a vanished activity's first), with
    /// their pending pushes, so neither the table, the summary nor a publish's fan-out grows
    /// with one phone's registrations.
    static func boundTokens(mac: String, keyID: Int64, max: Int) -> PGQuery {
        PGQuery("""
            WITH dev AS (SELECT id FROM devices WHERE key_id = $2::bigint AND token_mac = $1::bytea),
            excess AS (
              SELECT t.activity_id FROM activity_tokens t JOIN dev ON t.device_id = dev.id
              LEFT JOIN activities a ON a.activity_id = t.activity_id
              ORDER BY coalesce(a.updated_ms, -1) DESC, t.registered_at DESC, t.activity_id DESC
              OFFSET $3::bigint),
            gone AS (
              DELETE FROM activity_tokens t USING dev WHERE t.device_id = dev.id AND t.activity_id IN (SELECT activity_id FROM excess)
              RETURNING t.activity_id)
            DELETE FROM push_outbox o USING dev WHERE o.device_id = dev.id AND o.kind = 'update' AND o.activity_id IN (SELECT activity_id FROM gone)
            """, [mac, String(keyID), String(max)], name: "device_bound_tokens")
    }

    /// Index of the upsert in `register`'s batch: no row means the device limit refused it.
    static let upsertIndex = 1

    static func summaryQuery(mac: String, keyID: Int64) -> PGQuery {
        PGQuery("""
            SELECT d.token_hint, d.push_to_start_hint, d.environment, t.activity_id, t.token_hint AS activity_hint
            FROM devices d LEFT JOIN activity_tokens t ON t.device_id = d.id
            WHERE d.key_id = $2::bigint AND d.token_mac = $1::bytea ORDER BY t.activity_id
            """, [mac, String(keyID)], name: "device_summary")
    }

    /// The answer to a registration: hints only, never a token.
    static func summaryJSON(_ r: PGResult, apns: Bool) -> [UInt8] {
        var w = JSONWriter()
        w.beginObject()
        w.field("deviceToken", r.first?["token_hint"])
        w.field("pushToStartToken", r.first?["push_to_start_hint"])
        w.field("environment", r.first?["environment"])
        w.key("activityTokens")
        w.beginObject()
        for row in r.rows {
            if let id = row["activity_id"] { w.field(id, row["activity_hint"]) }
        }
        w.endObject()
        w.field("pushes", apns)
        w.endObject()
        return w.bytes
    }

    /// Forgets this key's registration of a device: its tokens and outbox rows go with it (ON
    /// DELETE CASCADE). Another key's registration of the same device is not touched.
    static func forget(mac: [UInt8], keyID: Int64) -> PGQuery {
        PGQuery("DELETE FROM devices WHERE key_id = $2::bigint AND token_mac = $1::bytea RETURNING id",
                [Bytea.literal(mac), String(keyID)], name: "device_forget")
    }

    /// The retention job: activity tokens (and their outbox rows) 12 hours after their activity
    /// ended or vanished, outbox rows and entries of finished activities that have nothing left to send
    /// after an hour, devices nobody refreshed (registered again) for `deviceRetentionS`
    /// seconds or whose key was revoked, with their tokens and pushes, and refused broadcast
    /// channels' rows 12 hours after the end. At most 5,000 of each per run.
    static func retention(nowMs: Int64, deviceRetentionS: Int64) -> PGQuery {
        PGQuery("""
            WITH old_tokens AS (
              DELETE FROM activity_tokens t WHERE (t.device_id, t.activity_id) IN (
                SELECT x.device_id, x.activity_id FROM activity_tokens x LEFT JOIN activities a ON a.activity_id = x.activity_id
                WHERE a.ended_ms < $1::bigint - $2::bigint
                   OR (a.activity_id IS NULL AND x.registered_at < now() - $2::bigint * interval '1 millisecond')
                LIMIT 5000)
              RETURNING 1
            ), old_rows AS (
              DELETE FROM push_outbox o WHERE (o.activity_id, o.device_id, o.kind) IN (
                SELECT x.activity_id, x.device_id, x.kind FROM push_outbox x LEFT JOIN activities a ON a.activity_id = x.activity_id
                WHERE a.activity_id IS NULL OR a.ended_ms < $1::bigint - $2::bigint
                   OR (a.ended_ms < $1::bigint - 3600000 AND (x.sent_seq >= x.wanted_seq OR x.failed))
                LIMIT 5000)
              RETURNING 1
            ), old_entries AS (
              DELETE FROM push_activity_outbox o WHERE o.activity_id IN (
                SELECT x.activity_id FROM push_activity_outbox x LEFT JOIN activities a ON a.activity_id = x.activity_id
                WHERE a.activity_id IS NULL OR a.ended_ms < $1::bigint - $2::bigint
                   OR (a.ended_ms < $1::bigint - 3600000 AND x.sent_seq >= x.wanted_seq)
                LIMIT 5000)
              RETURNING 1
            ), old_devices AS (
              DELETE FROM devices d WHERE d.id IN (
                SELECT x.id FROM devices x WHERE x.updated_at < now() - $3::bigint * interval '1 second'
                UNION
                SELECT x.id FROM devices x JOIN api_keys k ON k.id = x.key_id WHERE k.revoked_at IS NOT NULL
                LIMIT 5000)
              RETURNING 1
            ), old_channels AS (
              -- Channels APNs would not make, kept for `push status` until their activity is long over.
              DELETE FROM broadcast_outbox b WHERE b.activity_id IN (
                SELECT x.activity_id FROM broadcast_outbox x LEFT JOIN activities a ON a.activity_id = x.activity_id
                WHERE x.phase = 'failed' AND (a.activity_id IS NULL OR a.ended_ms < $1::bigint - $2::bigint)
                LIMIT 5000)
              RETURNING 1
            )
            SELECT (SELECT count(*) FROM old_tokens) AS tokens, (SELECT count(*) FROM old_rows) + (SELECT count(*) FROM old_entries) AS rows,
                   (SELECT count(*) FROM old_devices) AS devices, (SELECT count(*) FROM old_channels) AS channels
            """, [String(nowMs), String(forgetAfterEndMs), String(deviceRetentionS)], name: "push_retention")
    }

    /// The devices a push-to-start of a new activity goes to (contract §5.2): those registered
    /// by a key that may read it (`read`, `publish` or `admin`, not revoked), once per
    /// push-to-start token however many keys registered it (the lowest device id carries it).
    /// Devices from before registrations had keys get none. A subquery for the publish path's
    /// finalize statement, yielding `id`.
    static let pushToStartTargets = """
        SELECT DISTINCT ON (d.push_to_start_mac) d.id FROM devices d JOIN api_keys k ON k.id = d.key_id
        WHERE d.push_to_start_sealed IS NOT NULL AND k.revoked_at IS NULL AND k.scopes && ARRAY['read', 'publish', 'admin']
        ORDER BY d.push_to_start_mac, d.id
        """

    /// The registrations an update of activity `activityColumn` is pushed to: one per activity
    /// token, the lowest device id when several keys registered the same token, so a phone
    /// gets each push once. A subquery for the publish path's finalize statement, yielding
    /// `device_id`.
    static func updateTargets(activityColumn: String) -> String {
        """
        SELECT DISTINCT ON (x.token_mac) x.device_id FROM activity_tokens x WHERE x.activity_id = \(activityColumn)
        ORDER BY x.token_mac, x.device_id
        """
    }

    /// Outbox totals for `dispatchd push status`: the per-device rows, then the per-activity
    /// entries the publish path marks (each pushed to every token of its activity).
    static let totals = PGQuery("""
        SELECT count(*) FILTER (WHERE wanted_seq > sent_seq AND NOT failed) AS pending,
               count(*) FILTER (WHERE wanted_seq > sent_seq AND NOT failed AND due_at <= now()) AS due,
               count(*) FILTER (WHERE wanted_seq > sent_seq AND NOT failed AND lease_until > now()) AS sending,
               count(*) FILTER (WHERE wanted_seq > sent_seq AND NOT failed AND lease_id IS NULL AND due_at > now()) AS backing_off,
               count(*) FILTER (WHERE failed) AS failed,
               count(*) FILTER (WHERE sent_seq >= wanted_seq) AS settled,
               (SELECT count(*) FROM devices) AS devices,
               (SELECT count(*) FROM devices WHERE push_to_start_mac IS NOT NULL) AS push_to_start,
               (SELECT count(*) FROM activity_tokens) AS activity_tokens,
               (SELECT count(*) FROM push_activity_outbox) AS entries,
               (SELECT count(*) FROM push_activity_outbox WHERE wanted_seq > sent_seq) AS entries_pending,
               (SELECT count(*) FROM push_activity_outbox WHERE wanted_seq > sent_seq AND due_at <= now()) AS entries_due,
               (SELECT count(*) FROM push_activity_outbox WHERE wanted_seq > sent_seq AND lease_until > now()) AS entries_sending,
               (SELECT count(*) FROM push_activity_outbox WHERE wanted_seq > sent_seq AND lease_id IS NULL AND due_at > now()) AS entries_paced
        FROM push_outbox
        """, name: "push_totals")

    /// Cheap enough for a gauge every few seconds: the due-index scans. Rows and entries with a
    /// push to make (an entry is one push per token of its activity).
    static let depth = PGQuery("""
        SELECT (SELECT count(*) FROM push_outbox WHERE wanted_seq > sent_seq AND NOT failed)
             + (SELECT count(*) FROM push_activity_outbox WHERE wanted_seq > sent_seq) AS depth
        """, name: "push_depth")

    /// Per device: pending pushes on its own rows, failed ones, live activities started on it by
    /// a push-to-start whose update token has not arrived yet (their changes wait for it), and
    /// when it was last pushed to.
    static let perDevice = PGQuery("""
        SELECT d.id, d.token_hint, d.push_to_start_hint,
               (SELECT count(*) FROM activity_tokens t WHERE t.device_id = d.id) AS activity_tokens,
               count(o.kind) FILTER (WHERE o.wanted_seq > o.sent_seq AND NOT o.failed) AS pending,
               count(o.kind) FILTER (WHERE o.failed) AS failed,
               count(o.kind) FILTER (WHERE o.kind = 'start' AND o.sent_seq > 0 AND NOT EXISTS (
                   SELECT 1 FROM activity_tokens t WHERE t.device_id = d.id AND t.activity_id = o.activity_id)
                 AND EXISTS (SELECT 1 FROM activities a WHERE a.activity_id = o.activity_id AND a.ended_ms IS NULL)) AS waiting_for_token,
               -- Its own rows' pushes, or the last fan-out of an activity it holds a token for
               -- (fan-outs write nothing per device; a push of one that failed has a row).
               GREATEST(max(o.sent_at), (SELECT max(e.sent_at) FROM activity_tokens t
                                         JOIN push_activity_outbox e ON e.activity_id = t.activity_id
                                         WHERE t.device_id = d.id AND e.last_devices > 0)) AS last_sent,
               (SELECT x.last_status FROM push_outbox x WHERE x.device_id = d.id AND x.last_status IS NOT NULL
                ORDER BY coalesce(x.sent_at, x.due_at) DESC LIMIT 1) AS last_status
        FROM devices d LEFT JOIN push_outbox o ON o.device_id = d.id
        GROUP BY d.id ORDER BY d.id LIMIT $1::bigint
        """, ["1000"])
}
