/// Every PostgreSQL advisory lock Dispatch takes, with what it guards. The ids live here and
/// nowhere else in Swift: SQL text is built from these cases, so a new lock picks a free id in
/// one place. PostgreSQL keeps the one-key (`bigint`) and two-key (`int4, int4`) forms apart, so
/// a per-key lock's first id never collides with a one-key lock of the same number; they are
/// still all distinct here, to keep `pg_locks` readable.
enum AdvisoryLock: Int64 {
    /// Schema migrations: a session lock held while one server applies what is missing, so
    /// servers starting together never race on `schema_migrations` (`Migrations.apply`).
    case migrations = 7_345_102
    /// Feed positions (contract section 8; Migrations/0003_feed_positions.sql): NOTIFY-mode
    /// publish batches hold it from drawing their positions to their commit, so positions are
    /// handed out in commit order; the numbering passes take it with a try (`SequencerSQL`).
    /// One lock, so a pass and a NOTIFY-mode writer never interleave, whichever carrier each
    /// server runs.
    case feedPositions = 7_345_103
    /// A key's live-activity limit: `(7345110, key)` per key, transaction-scoped, serialises
    /// one key's starts across servers. Taken only inside SQL, by `dispatch_live_quota` in
    /// Migrations/0010_key_limits.sql (an applied migration, so the literal stays there); listed
    /// here so that no other lock takes the id.
    case keyLiveQuota = 7_345_110
    /// A key's device limit: `(7345111, key)` per key, transaction-scoped, serialises one key's
    /// device registrations so the limit is exact (`DeviceRepository.register`).
    case deviceKey = 7_345_111
    /// The APNs provider token's renewal: a session lock held while one process makes a token
    /// and stores it, so the deployment signs one, not one per process (`ProviderTokenStore`).
    case apnsProviderToken = 7_345_121

    /// Waits for the lock; released at the transaction's end.
    var xactLock: String { "pg_advisory_xact_lock(\(rawValue))" }
    /// Takes the lock if free (true) or not (false); released at the transaction's end.
    var tryXactLock: String { "pg_try_advisory_xact_lock(\(rawValue))" }
    /// Waits for the lock; held until `sessionUnlock` or the session's end.
    var sessionLock: String { "pg_advisory_lock(\(rawValue))" }
    var sessionUnlock: String { "pg_advisory_unlock(\(rawValue))" }

    /// The two-key form for one API key (`key`: SQL for a bigint key id, folded into `int4`);
    /// released at the transaction's end. Keys that fold together only share a lock: harmless.
    func xactLock(perKey key: String) -> String {
        "pg_advisory_xact_lock(\(rawValue), (\(key)::bigint % 2147483647)::integer)"
    }
}
