import DispatchCore

/// `dispatch batch [FILE|-]`: one JSON change per input line, sent as `POST /v1/changes`
/// requests, one result per line out. The decisions (what a line becomes, how lines are cut
/// into requests, what is printed, the exit code) are here; the shell only reads and sends.
public struct CLIBatchOptions: Equatable, Sendable {
    /// The input file; nil or `-`: standard input.
    public var path: String?
    /// Changes per request (`--size`).
    public var size: Int

    public init(path: String?, size: Int = CLIBatch.maxChanges) {
        self.path = path
        self.size = size
    }
}

public enum CLIBatch {
    /// What the server takes in one request.
    public static let maxChanges = 1000
    public static let maxBodyBytes = 1 << 20

    /// One input line.
    public enum Line: Equatable, Sendable {
        /// A change to send: the line's object, with an `idempotencyKey` when it had none, so
        /// a request retried after a lost answer applies nothing twice.
        case change([UInt8])
        /// Refused here without sending (not a JSON object): its result line.
        case refused(String)
    }

    /// Non-blank lines, each with its 1-based line number (blank lines and `\r` endings are skipped).
    public static func lines(_ input: [UInt8]) -> [(number: Int, text: String)] {
        var out: [(Int, String)] = []
        var number = 0
        for raw in input.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false) {
            number += 1
            var bytes = raw
            if bytes.last == UInt8(ascii: "\r") { bytes = bytes.dropLast() }
            let text = String(decoding: bytes, as: UTF8.self)
            if text.allSatisfy({ $0 == " " || $0 == "\t" }) { continue }
            out.append((number, text))
        }
        return out
    }

    public static func prepare(_ text: String, number: Int, newKey: () -> String) -> Line {
        let value: JSONValue
        do {
            value = try JSONParser.parse(text)
        } catch {
            return .refused(refusal(400, "invalid_json", "line \(number) is not JSON: \(error.message) at byte \(error.offset)"))
        }
        guard case .object(var members) = value else {
            return .refused(refusal(400, "invalid_json", "line \(number) is not a JSON object"))
        }
        if !members.contains(where: { $0.0 == "idempotencyKey" }) { members.append(("idempotencyKey", .string(newKey()))) }
        return .change(Array(CLIJSON.encode(.object(members)).utf8))
    }

    /// A result line made here: the shape of the server's.
    static func refusal(_ status: Int, _ code: String, _ message: String) -> String {
        var w = JSONWriter()
        w.beginObject()
        w.field("status", Int64(status))
        w.key("error")
        w.beginObject()
        w.field("code", code)
        w.field("message", message)
        w.endObject()
        w.endObject()
        return w.string
    }

    /// Cuts the changes into requests: at most `maxChanges` each and a body within `maxBodyBytes`
    /// (a change too large for any request goes alone: the server answers it 413).
    public static func requests(_ changes: [[UInt8]], maxChanges: Int = maxChanges, maxBodyBytes: Int = maxBodyBytes) -> [Range<Int>] {
        var out: [Range<Int>] = []
        var start = 0
        var bytes = 14  // {"changes":[]}
        for (i, c) in changes.enumerated() {
            let size = c.count + 1
            if i > start && (i - start >= maxChanges || bytes + size > maxBodyBytes) {
                out.append(start..<i)
                start = i
                bytes = 14
            }
            bytes += size
        }
        if start < changes.count { out.append(start..<changes.count) }
        return out
    }

    public static func body(_ changes: ArraySlice<[UInt8]>) -> [UInt8] {
        var out = Array(#"{"changes":["#.utf8)
        for (i, c) in changes.enumerated() {
            if i > 0 { out.append(UInt8(ascii: ",")) }
            out += c
        }
        out += Array("]}".utf8)
        return out
    }

    /// The result lines of an answer, one per change sent; nil when it is not that shape.
    public static func results(_ body: [UInt8], expected: Int) -> [String]? {
        guard let value = try? JSONParser.parse(body), case .array(let items)? = value["results"], items.count == expected else { return nil }
        return items.map { CLIJSON.encode($0) }
    }

    /// Whether a result line says the change was accepted (2xx).
    public static func accepted(_ line: String) -> Bool {
        guard let value = try? JSONParser.parse(line), case .number(let status)? = value["status"] else { return false }
        return (200..<300).contains(Int(status))
    }

    /// Every change answered: 0 when each was accepted, `someRefused` when any was not.
    public static func exitCode(refused: Int) -> CLIExitCode {
        refused == 0 ? .success : .someRefused
    }
}
