/// One parameterised statement. A `name` makes it a prepared statement, prepared once per
/// connection (the driver decides when to send the Parse).
public struct PGQuery: Sendable, Equatable {
    public var name: String?
    public var sql: String
    public var params: [String?]

    public init(_ sql: String, _ params: [String?] = [], name: String? = nil) {
        self.sql = sql
        self.params = params
        self.name = name
    }
}

/// A result's column names, shared by all of its rows.
public final class PGColumns: Sendable {
    public let names: [String]
    let index: [String: Int]

    public init(_ names: [String]) {
        self.names = names
        var index: [String: Int] = [:]
        for (i, n) in names.enumerated() where index[n] == nil { index[n] = i }
        self.index = index
    }
}

/// One row, read by column name. Values are PostgreSQL's text format; nil is SQL NULL.
public struct PGRow: Sendable {
    public let columns: PGColumns
    public let values: [String?]

    public init(columns: PGColumns, values: [String?]) {
        self.columns = columns
        self.values = values
    }

    /// The value of `column`; nil for NULL. A column the query does not return is a bug in
    /// the query, not in the data: it traps.
    public subscript(_ column: String) -> String? {
        guard let i = columns.index[column] else { preconditionFailure("no column \(column) in \(columns.names)") }
        return values[i]
    }

    public func has(_ column: String) -> Bool { columns.index[column] != nil }

    public func int64(_ column: String) -> Int64? { self[column].flatMap { Int64($0) } }
    public func int(_ column: String) -> Int? { self[column].flatMap { Int($0) } }
    public func double(_ column: String) -> Double? { self[column].flatMap { Double($0) } }
    /// PostgreSQL's text form of a boolean is `t` or `f`.
    public func bool(_ column: String) -> Bool? { self[column].map { $0 == "t" } }
}

/// A statement's outcome: rows, or the server's error.
public struct PGResult: Sendable {
    public var rows: [PGRow]
    public var columns: PGColumns
    public var errorMessage: String?
    public var sqlState: String?
    public var affectedRows: Int

    public init(rows: [PGRow] = [], columns: PGColumns = PGColumns([]), errorMessage: String? = nil,
                sqlState: String? = nil, affectedRows: Int = 0) {
        self.rows = rows
        self.columns = columns
        self.errorMessage = errorMessage
        self.sqlState = sqlState
        self.affectedRows = affectedRows
    }

    /// A result with rows given as arrays of values (tests, and the libpq shell).
    public init(columns names: [String], rows values: [[String?]], affectedRows: Int? = nil) {
        let columns = PGColumns(names)
        self.init(rows: values.map { PGRow(columns: columns, values: $0) }, columns: columns,
                  affectedRows: affectedRows ?? values.count)
    }

    public static func failure(_ message: String, sqlState: String? = nil) -> PGResult {
        PGResult(errorMessage: message, sqlState: sqlState)
    }

    /// What a statement skipped after an earlier error in its pipeline batch reports.
    public static let aborted = PGResult(errorMessage: "statement skipped: an earlier statement in the batch failed")

    public var ok: Bool { errorMessage == nil }
    public var first: PGRow? { rows.first }
}

public struct PGError: Error, Sendable, Equatable, CustomStringConvertible {
    public let message: String
    public var description: String { message }
    public init(_ message: String) { self.message = message }
}
