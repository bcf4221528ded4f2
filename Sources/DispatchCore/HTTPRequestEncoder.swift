/// The request side of the one HTTP/1.1 client (the response side is `HTTPResponseParser`):
/// the bytes of a request, for the CLI, the benchmark and the tests. CR and LF are dropped
/// from the target, names and values, so a value taken from a flag cannot add a header.
public enum HTTPRequestEncoder {
    /// `METHOD target HTTP/1.1`, `Host`, `headers` in order, `Content-Length` when there is a
    /// body (`[]` included), `Connection: close` when `close`, then the body.
    public static func encode(method: String, target: String, host: String, headers: [(String, String)] = [],
                              body: [UInt8]? = nil, close: Bool = true) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(128 + headers.count * 48 + (body?.count ?? 0))
        func line(_ s: String) {
            if s.utf8.contains(where: { $0 == 0x0D || $0 == 0x0A }) {
                out.append(contentsOf: s.utf8.lazy.filter { $0 != 0x0D && $0 != 0x0A })
            } else {
                out.append(contentsOf: s.utf8)
            }
            out.append(0x0D)
            out.append(0x0A)
        }
        line("\(method) \(target) HTTP/1.1")
        line("Host: \(host)")
        for (name, value) in headers { line("\(name): \(value)") }
        if let body { line("Content-Length: \(body.count)") }
        if close { line("Connection: close") }
        out.append(0x0D)
        out.append(0x0A)
        if let body { out.append(contentsOf: body) }
        return out
    }

    /// The same, with a text body (`nil`: none).
    public static func encode(method: String, target: String, host: String, headers: [(String, String)] = [],
                              body: String?, close: Bool = true) -> [UInt8] {
        encode(method: method, target: target, host: host, headers: headers, body: body.map { Array($0.utf8) }, close: close)
    }
}
