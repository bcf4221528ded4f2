/// PostgreSQL array literals for one parameter carrying a whole batch (`unnest($1::text[])`):
/// one statement for many rows instead of one statement per row.
public enum PGArray {
    /// `{"a","b\"c",NULL}`: every element quoted, `"` and `\` escaped; nil is NULL. Any
    /// element type PostgreSQL parses from text works (`::float8[]`, `::boolean[]`).
    public static func text(_ values: [String?]) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(values.reduce(2) { $0 + ($1?.utf8.count ?? 4) + 3 })
        out.append(UInt8(ascii: "{"))
        for (i, value) in values.enumerated() {
            if i > 0 { out.append(UInt8(ascii: ",")) }
            guard let value else {
                out.append(contentsOf: "NULL".utf8)
                continue
            }
            out.append(UInt8(ascii: "\""))
            for byte in value.utf8 {
                if byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") { out.append(UInt8(ascii: "\\")) }
                out.append(byte)
            }
            out.append(UInt8(ascii: "\""))
        }
        out.append(UInt8(ascii: "}"))
        return String(decoding: out, as: UTF8.self)
    }

    /// `{1,2,NULL}`.
    public static func numbers(_ values: [Int64?]) -> String {
        "{" + values.map { $0.map(String.init) ?? "NULL" }.joined(separator: ",") + "}"
    }
}
