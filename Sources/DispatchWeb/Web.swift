/// The Activities view and the API description, compiled in from `web/` by the EmbedFiles
/// plugin (see `WebAssets.embed`): `dispatchd` serves them with nothing to install.
public enum Web {
    /// A served file: its text, media type and a strong validator.
    public struct File: Sendable {
        public let body: [UInt8]
        public let contentType: String
        public let etag: String
    }

    /// Every file of `web/`, by name, ready to serve.
    public static let files: [String: File] = {
        var out: [String: File] = [:]
        for (name, text) in WebAssets.files {
            let body = Array(text.utf8)
            out[name] = File(body: body, contentType: contentType(name), etag: "\"" + fnv1a(body) + "\"")
        }
        return out
    }()

    public static func contentType(_ name: String) -> String {
        switch name.split(separator: ".").last ?? "" {
        case "html": return "text/html; charset=utf-8"
        case "js": return "text/javascript; charset=utf-8"
        case "css": return "text/css; charset=utf-8"
        case "svg": return "image/svg+xml"
        case "json": return "application/json"
        default: return "text/plain; charset=utf-8"
        }
    }

    /// A content hash for ETags (64-bit FNV-1a, hex): not security, only "did it change".
    static func fnv1a(_ bytes: [UInt8]) -> String {
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        for b in bytes { h = (h ^ UInt64(b)) &* 0x100_0000_01b3 }
        let hex = String(h, radix: 16)
        return String(repeating: "0", count: 16 - hex.count) + hex
    }
}
