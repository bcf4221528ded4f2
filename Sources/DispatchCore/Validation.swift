/// Turns request bodies and path pieces into commands, enforcing every rule of the
/// contract's field table. Nothing here touches storage: bad input changes nothing.
public enum Validation {
    public static let maxBodyBytes = 16 * 1024

    /// Names, machine tags and activity ids: 1 to `maxLength` bytes of A-Z a-z 0-9 . _ -, and
    /// `:` too when `colon` (activity ids). The one check of that alphabet, so the rules for
    /// key names, machines and ids cannot drift apart.
    public static func isTag(_ s: String, maxLength: Int = 64, colon: Bool = false) -> Bool {
        let u = s.utf8
        guard (1...maxLength).contains(u.count) else { return false }
        return u.allSatisfy { b in
            (0x30...0x39).contains(b) || (0x41...0x5A).contains(b) || (0x61...0x7A).contains(b)
                || b == 0x2E || b == 0x5F || b == 0x2D || (colon && b == 0x3A)
        }
    }

    public static func isValidActivityID(_ s: String) -> Bool {
        isTag(s, maxLength: 128, colon: true)
    }

    public static func activityID(_ s: String) throws(DispatchError) -> String {
        guard isValidActivityID(s) else {
            throw DispatchError(.invalidField, "activityId must be 1-128 characters of A-Z a-z 0-9 . _ : -")
        }
        return s
    }

    static func hasControlCharacters(_ s: String) -> Bool {
        s.unicodeScalars.contains { $0.value < 0x20 || (0x7F...0x9F).contains($0.value) || $0.value == 0x2028 || $0.value == 0x2029 }
    }

    /// Parses a body that must be a JSON object with only the allowed keys.
    public static func object(_ body: [UInt8], allowed: Set<String>) throws(DispatchError) -> [String: JSONValue] {
        try fields(members(body, of: "a JSON object", limit: maxBodyBytes), allowed: allowed)
    }

    /// The members of a body that must be `shape` (a JSON object) of at most `limit` bytes.
    static func members(_ body: [UInt8], of shape: String, limit: Int) throws(DispatchError) -> [(String, JSONValue)] {
        guard body.count <= limit else {
            throw DispatchError(.bodyTooLarge, "request body is larger than \(limit) bytes")
        }
        let value: JSONValue
        do {
            value = try JSONParser.parse(body)
        } catch {
            throw DispatchError(.invalidJSON, "body is not valid JSON: \(error.message) at byte \(error.offset)")
        }
        guard case .object(let members) = value else {
            throw DispatchError(.invalidJSON, "body must be \(shape)")
        }
        return members
    }

    /// An object's members as a dictionary, when every key is allowed (the last of repeated keys wins).
    public static func fields(_ members: [(String, JSONValue)], allowed: Set<String>) throws(DispatchError) -> [String: JSONValue] {
        var out: [String: JSONValue] = [:]
        for (k, v) in members {
            guard allowed.contains(k) else {
                throw DispatchError(.unknownField, "unknown field \"\(k)\"; allowed: \(allowed.sorted().joined(separator: ", "))")
            }
            out[k] = v
        }
        return out
    }

    static func optionalString(_ fields: [String: JSONValue], _ key: String) throws(DispatchError) -> String?? {
        switch fields[key] {
        case nil: return nil
        case .null?: return .some(nil)
        case .string(let s)?: return .some(s)
        case let other?: throw DispatchError(.invalidField, "\(key) must be a string, not \(other.typeName)")
        }
    }

    static func progress(_ fields: [String: JSONValue], _ key: String) throws(DispatchError) -> Patch<Double> {
        switch fields[key] {
        case nil: return .keep
        case .null?: return .set(nil)
        case .number(let d)?:
            guard d.isFinite, d >= 0, d <= 1 else { throw DispatchError(.invalidField, "\(key) must be a number from 0 to 1") }
            return .set(d)
        case let other?: throw DispatchError(.invalidField, "\(key) must be a number from 0 to 1 or null, not \(other.typeName)")
        }
    }

    /// Text fields are limited in characters (as people count them) and in bytes, at four per
    /// character: one extended grapheme cluster can be kilobytes of combining marks.
    static func fitsLimit(_ s: String, characters max: Int) -> Bool {
        s.utf8.count <= max * 4 && s.count <= max
    }

    static func status(_ fields: [String: JSONValue], key: String = "status", max: Int = 200) throws(DispatchError) -> Patch<String> {
        guard let value = try optionalString(fields, key) else { return .keep }
        guard let s = value else { return .set(nil) }
        guard fitsLimit(s, characters: max) else {
            throw DispatchError(.invalidField, "\(key) must be at most \(max) characters and \(max * 4) bytes")
        }
        guard !hasControlCharacters(s) else {
            throw DispatchError(.invalidField, "\(key) must be one line without control characters")
        }
        return .set(s)
    }

    static func state(_ fields: [String: JSONValue], allowed: [ActivityState], default def: ActivityState) throws(DispatchError) -> ActivityState {
        guard let value = try optionalString(fields, "state"), let text = value else { return def }
        guard let s = ActivityState(rawValue: text), allowed.contains(s) else {
            throw DispatchError(.invalidField, "state must be one of \(allowed.map(\.rawValue).joined(separator: ", "))")
        }
        return s
    }

    static func charset(_ s: String, _ ok: (UInt8) -> Bool) -> Bool { s.utf8.allSatisfy(ok) }

    public static func isValidCancelURL(_ s: String) -> Bool {
        guard s.utf8.count <= 2048, s.utf8.allSatisfy({ (0x21...0x7E).contains($0) }) else { return false }
        let lower = s.lowercased()
        let rest: Substring
        if lower.hasPrefix("https://") { rest = lower.dropFirst(8) } else if lower.hasPrefix("http://") { rest = lower.dropFirst(7) } else { return false }
        let authority = rest.prefix { $0 != "/" && $0 != "?" && $0 != "#" }
        let hostPort = authority.split(separator: "@", omittingEmptySubsequences: false).last ?? ""
        let host = hostPort.hasPrefix("[") ? hostPort.prefix { $0 != "]" } : hostPort.prefix { $0 != ":" }
        return !host.isEmpty && host != "["
    }

    /// The fields of each publishing call's body (§2).
    public static let startFields: Set<String> = ["activityId", "taskName", "systemImage", "machine", "cancelURL",
                                                  "initialProgress", "status", "state", "liveActivity", "staleAfter", "broadcast"]
    public static let updateFields: Set<String> = ["progress", "status", "state"]
    public static let endFields: Set<String> = ["progress", "status", "state", "error"]

    public static func start(_ body: [UInt8]) throws(DispatchError) -> StartCommand {
        try start(fields: try object(body, allowed: startFields))
    }

    /// A start's fields, already checked to be among `startFields` (a body, or one change of `POST /v1/changes`).
    public static func start(fields f: [String: JSONValue]) throws(DispatchError) -> StartCommand {
        var cmd = StartCommand(taskName: "")
        if let v = try optionalString(f, "activityId"), let id = v { cmd.activityId = try activityID(id) }
        guard let nameValue = try optionalString(f, "taskName"), let rawName = nameValue else {
            throw DispatchError(.missingField, "taskName is required")
        }
        let name = trimmed(rawName)
        guard !hasControlCharacters(name) else { throw DispatchError(.invalidField, "taskName must not contain control characters") }
        guard !name.isEmpty, fitsLimit(name, characters: 200) else {
            throw DispatchError(.invalidField, "taskName must be 1-200 characters and at most 800 bytes")
        }
        cmd.taskName = name
        if let v = try optionalString(f, "systemImage"), let s = v {
            guard (1...100).contains(s.utf8.count), charset(s, { (0x61...0x7A).contains($0) || (0x30...0x39).contains($0) || $0 == 0x2E })
            else { throw DispatchError(.invalidField, "systemImage must be 1-100 characters of a-z 0-9 .") }
            cmd.systemImage = s
        }
        if let v = try optionalString(f, "machine"), let s = v {
            guard isTag(s) else { throw DispatchError(.invalidField, "machine must be 1-64 characters of A-Z a-z 0-9 . _ -") }
            cmd.machine = s
        }
        if let v = try optionalString(f, "cancelURL"), let s = v {
            guard isValidCancelURL(s) else { throw DispatchError(.invalidField, "cancelURL must be an absolute http or https URL of at most 2048 characters") }
            cmd.cancelURL = s
        }
        if case .set(let p) = try progress(f, "initialProgress") { cmd.initialProgress = p }
        if case .set(let s) = try status(f) { cmd.status = s }
        cmd.state = try state(f, allowed: [.queued, .processing], default: .queued)
        switch f["liveActivity"] {
        case nil, .null?: break
        case .bool(let b)?: cmd.liveActivity = b
        case let other?: throw DispatchError(.invalidField, "liveActivity must be true or false, not \(other.typeName)")
        }
        switch f["broadcast"] {
        case nil, .null?: break
        case .bool(let b)?: cmd.broadcast = b
        case let other?: throw DispatchError(.invalidField, "broadcast must be true or false, not \(other.typeName)")
        }
        switch f["staleAfter"] {
        case nil, .null?: break
        case .number(let d)? where d.rounded() == d && staleAfterRange.contains(Int(exactly: d) ?? 0):
            cmd.staleAfter = Int(d)
        case _?:
            throw DispatchError(.invalidField, "staleAfter must be whole seconds from \(staleAfterRange.lowerBound) to \(staleAfterRange.upperBound)")
        }
        return cmd
    }

    public static func update(_ body: [UInt8]) throws(DispatchError) -> UpdateCommand {
        try update(fields: try object(body, allowed: updateFields))
    }

    public static func update(fields f: [String: JSONValue]) throws(DispatchError) -> UpdateCommand {
        return UpdateCommand(progress: try progress(f, "progress"), status: try status(f),
                             state: try state(f, allowed: [.processing, .queued, .retrying, .idle], default: .processing))
    }

    public static func end(_ body: [UInt8]) throws(DispatchError) -> EndCommand {
        try end(fields: try object(body, allowed: endFields))
    }

    public static func end(fields f: [String: JSONValue]) throws(DispatchError) -> EndCommand {
        var cmd = EndCommand(progress: try progress(f, "progress"), status: try status(f),
                             state: try state(f, allowed: [.completed, .error, .cancelled, .rejected], default: .completed))
        if case .set(let e) = try status(f, key: "error", max: 500) { cmd.error = e }
        return cmd
    }

    /// `staleAfter` on a start: ten seconds to a week.
    public static let staleAfterRange = 10...604_800

    /// `POST /v1/activities/{id}/cancel`: an optional one-line reason.
    public static func cancel(_ body: [UInt8]) throws(DispatchError) -> String? {
        if body.isEmpty { return nil }
        let f = try object(body, allowed: ["reason"])
        guard case .set(let reason) = try status(f, key: "reason", max: 200) else { return nil }
        return reason
    }

    static func trimmed(_ s: String) -> String {
        var scalars = Substring(s).unicodeScalars[...]
        while let first = scalars.first, first.properties.isWhitespace { scalars = scalars.dropFirst() }
        while let last = scalars.last, last.properties.isWhitespace { scalars = scalars.dropLast() }
        return String(String.UnicodeScalarView(scalars))
    }

    /// `Last-Event-ID`: a seq we issued. Anything else is ignored (a fresh subscription).
    public static func lastEventID(_ header: String?) -> Int64? {
        guard let header, !header.isEmpty, header.utf8.count <= 19,
              header.utf8.allSatisfy({ (0x30...0x39).contains($0) }) else { return nil }
        return Int64(header)
    }

    /// Whether a `Content-Type` value says JSON: `application/json` in any case, with spaces or
    /// tabs around it and parameters (`; charset=utf-8`) allowed. Read from the bytes, with no
    /// string split, trimmed or lowercased (it runs on every publish).
    public static func isJSONContentType<C: Collection>(_ value: C?) -> Bool where C.Element == UInt8 {
        guard let value else { return false }
        let want: StaticString = "application/json"
        var i = value.startIndex
        func skipBlanks() { while i != value.endIndex, value[i] == 0x20 || value[i] == 0x09 { value.formIndex(after: &i) } }
        skipBlanks()
        for k in 0..<want.utf8CodeUnitCount {
            guard i != value.endIndex else { return false }
            let b = value[i]
            guard (b >= 0x41 && b <= 0x5A ? b | 0x20 : b) == want.utf8Start[k] else { return false }
            value.formIndex(after: &i)
        }
        skipBlanks()
        return i == value.endIndex || value[i] == UInt8(ascii: ";")
    }

    /// Small positive integers from the query string (`limit`, `after`).
    public static func integer(_ text: String?, name: String, range: ClosedRange<Int64>, default def: Int64) throws(DispatchError) -> Int64 {
        guard let text else { return def }
        guard text.utf8.count <= 19, !text.isEmpty, text.utf8.allSatisfy({ (0x30...0x39).contains($0) }),
              let v = Int64(text), range.contains(v) else {
            throw DispatchError(.invalidQuery, "\(name) must be an integer from \(range.lowerBound) to \(range.upperBound)")
        }
        return v
    }
}
