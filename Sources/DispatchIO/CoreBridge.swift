import DispatchCore

enum DispatchCoreTimestamp {
    static func format(_ ms: Int64) -> String { Timestamp.format(milliseconds: ms) }
}
