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

    /// Reads a `Dispatch-Signature` header back: its time and its v1 signatures (lowercase hex).
    /// Nil for anything a signer would not write: a `t` given twice, or not 1-12 decimal digits
    /// (no sign: a time that far off would overflow the age check); no `v1`, one that is not
    /// 64 hex digits, or the same one twice. Several different `v1` stay allowed (a secret
    /// being rotated); unknown keys are ignored.
    public static func parseSignature(_ header: String) -> (timestamp: Int64, signatures: [String])? {
        var t: Int64?
        var v1: [String] = []
        for part in header.split(separator: ",") {
            let kv = part.split(separator: "=", maxSplits: 1)
            guard kv.count == 2 else { return nil }
            let key = kv[0].trimmingCharacters(in: " "), value = kv[1].trimmingCharacters(in: " ")
            switch key {
            case "t":
                guard t == nil, (1...12).contains(value.utf8.count), value.utf8.allSatisfy({ (0x30...0x39).contains($0) }),
                      let seconds = Int64(value) else { return nil }
                t = seconds
            case "v1":
                let hex = value.lowercased()
                guard hex.utf8.count == 64, hex.utf8.allSatisfy({ (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }),
                      !v1.contains(hex) else { return nil }
                v1.append(hex)
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
