/// The body of the signed call to an activity's `cancelURL` (contract §5.3), and the
/// signature header's format. Signing itself (HMAC-SHA256) is the shell's.
public enum CancelWebhook {
    /// `{"activityId","reason","requestedAt","seq"}`, one line, fields in that order.
    public static func body(activityID: String, reason: String?, requestedAt: Int64, seq: Int64) -> String {
        var w = JSONWriter()
        w.beginObject()
        w.field("activityId", activityID)
        w.field("reason", reason)
        w.field("requestedAt", Timestamp.format(milliseconds: requestedAt))
        w.field("seq", seq)
        w.endObject()
        return w.string
    }

    /// What is signed: `"<unix seconds>.<body>"`.
    public static func signedText(timestamp: Int64, body: String) -> String { "\(timestamp).\(body)" }

    /// `Dispatch-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "t.body">`.
    public static func signatureHeader(timestamp: Int64, hexMAC: String) -> String { "t=\(timestamp),v1=\(hexMAC)" }

    /// Reads a `Dispatch-Signature` header back: its time and its v1 signatures (hex).
    public static func parseSignature(_ header: String) -> (timestamp: Int64, signatures: [String])? {
        var t: Int64?
        var v1: [String] = []
        for part in header.split(separator: ",") {
            let kv = part.split(separator: "=", maxSplits: 1)
            guard kv.count == 2 else { return nil }
            let key = kv[0].trimmingCharacters(in: " "), value = kv[1].trimmingCharacters(in: " ")
            switch key {
            case "t": t = Int64(value)
            case "v1": v1.append(value.lowercased())
            default: continue
            }
        }
        guard let t, !v1.isEmpty else { return nil }
        return (t, v1)
    }
}

extension Substring {
    func trimmingCharacters(in set: Character) -> String {
        String(drop { $0 == set }.reversed().drop { $0 == set }.reversed())
    }
}
