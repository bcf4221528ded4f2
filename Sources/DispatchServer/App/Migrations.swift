import DispatchIO
import DispatchSystem
import Glibc

/// Plain SQL files in `Migrations/`, applied in name order, each once, each in a transaction,
/// recorded in `schema_migrations`. An advisory lock keeps concurrent servers from racing.
public enum Migrations {
    public struct File {
        public let version: String
        public let sql: String
    }

    /// The migrations compiled into this binary (from `Migrations/`, by the EmbedFiles
    /// plugin): a deployed dispatchd needs no files beside it.
    public static var embedded: [File] {
        EmbeddedMigrations.files.filter { $0.key.hasSuffix(".sql") }.sorted { $0.key < $1.key }
            .map { File(version: String($0.key.dropLast(4)), sql: $0.value) }
    }

    /// `DISPATCH_MIGRATIONS_DIR` when set (development: try a migration without rebuilding),
    /// else the embedded ones.
    public static func toApply() throws -> [File] {
        if let dir = Subprocess.environment("DISPATCH_MIGRATIONS_DIR"), !dir.isEmpty { return try load(from: dir) }
        return embedded
    }

    public static func load(from directory: String) throws -> [File] {
        guard let d = opendir(directory) else { throw PGError("cannot read migrations in \(directory)") }
        defer { closedir(d) }
        var names: [String] = []
        while let entry = readdir(d) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            if name.hasSuffix(".sql") { names.append(name) }
        }
        return try names.sorted().map { name in
            guard let text = Files.read(directory + "/" + name) else { throw PGError("cannot read \(name)") }
            return File(version: String(name.dropLast(4)), sql: text)
        }
    }

    /// Seconds one migration (or the wait for another server's) may take: a migration may
    /// rewrite a large table, but a database that never answers must not hang the start.
    public static let timeout: Double = 600

    /// Applies what is missing; returns the versions applied now.
    @discardableResult
    public static func apply(_ files: [File], conninfo: String, log: Logger) throws -> [String] {
        let db = try BlockingPG(conninfo, timeout: timeout)
        try db.script("SELECT \(AdvisoryLock.migrations.sessionLock)")
        defer { _ = try? db.script("SELECT \(AdvisoryLock.migrations.sessionUnlock)") }
        try db.script("CREATE TABLE IF NOT EXISTS schema_migrations (version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())")
        let done = Set(try db.query("SELECT version FROM schema_migrations").rows.compactMap { $0["version"] })
        var applied: [String] = []
        for file in files where !done.contains(file.version) {
            try db.script("BEGIN")
            do {
                try db.script(file.sql)
                try db.query("INSERT INTO schema_migrations (version) VALUES ($1)", [file.version])
                try db.script("COMMIT")
            } catch {
                _ = try? db.script("ROLLBACK")
                throw PGError("migration \(file.version) failed: \(error)")
            }
            log.info("migration.applied", [("version", file.version)])
            applied.append(file.version)
        }
        return applied
    }
}
