/// The bytes of an answer's head (and a sized body): pure framing, no socket, so the
/// connection writes what these return and tests can read them byte for byte.
extension HTTPConnection {
    /// What the answer says of the connection: nothing (the version's default), or either way.
    enum ConnectionHeader { case none, close, keepAlive }

    /// A status line, headers and a sized body, in one array.
    static func response(status: Int, minor: Int, headers: [(String, String)], contentType: String, body: [UInt8], sendBody: Bool,
                         connection: ConnectionHeader, date: [UInt8]) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(160 + body.count + headers.reduce(0) { $0 + $1.0.utf8.count + $1.1.utf8.count + 4 })
        statusLine(&out, status: status, minor: minor)
        var hasType = false
        for (k, v) in headers {
            if !hasType && k.utf8.count == 12 && k.lowercased() == "content-type" { hasType = true }
            header(&out, k, v)
        }
        if !hasType && !body.isEmpty && status != 204 {
            out.append(contentsOf: "Content-Type: ".utf8)
            out.append(contentsOf: contentType.utf8)
            out.append(0x0D); out.append(0x0A)
        }
        if status != 204 && status != 304 {
            out.append(contentsOf: "Content-Length: ".utf8)
            out.append(contentsOf: String(body.count).utf8)
            out.append(0x0D); out.append(0x0A)
        }
        switch connection {
        case .none: break
        case .close: out.append(contentsOf: "Connection: close\r\n".utf8)
        case .keepAlive: out.append(contentsOf: "Connection: keep-alive\r\n".utf8)
        }
        out.append(contentsOf: date)
        out.append(0x0D); out.append(0x0A)
        if sendBody && status != 204 && status != 304 { out.append(contentsOf: body) }
        return out
    }

    /// A stream's status line and headers; its body follows as it comes (chunked or until close).
    static func streamHead(minor: Int, headers: [(String, String)], chunked: Bool, close: Bool, date: [UInt8]) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(256)
        statusLine(&out, status: 200, minor: minor)
        for (k, v) in headers { header(&out, k, v) }
        if chunked { out.append(contentsOf: "Transfer-Encoding: chunked\r\n".utf8) }
        if close { out.append(contentsOf: "Connection: close\r\n".utf8) }
        out.append(contentsOf: date)
        out.append(0x0D); out.append(0x0A)
        return out
    }

    private static func header(_ out: inout [UInt8], _ name: String, _ value: String) {
        out.append(contentsOf: name.utf8)
        out.append(0x3A); out.append(0x20)
        out.append(contentsOf: value.utf8)
        out.append(0x0D); out.append(0x0A)
    }

    private static func statusLine(_ out: inout [UInt8], status: Int, minor: Int) {
        out.append(contentsOf: minor == 0 ? "HTTP/1.0 ".utf8 : "HTTP/1.1 ".utf8)
        out.append(contentsOf: String(status).utf8)
        out.append(0x20)
        out.append(contentsOf: HTTPRequest.reason(status).utf8)
        out.append(0x0D); out.append(0x0A)
    }
}

/// Reading a head the parser refused.
extension HTTPConnection {
    /// Line feeds in the first `n` bytes at `p`, up to the end of the head.
    static func lines(_ p: UnsafeMutableRawPointer, _ n: Int) -> Int {
        let b = p.assumingMemoryBound(to: UInt8.self)
        var count = 0
        var i = 0
        while i < n {
            if b[i] == 0x0A {
                count += 1
                if i >= 2 && b[i - 1] == 0x0D && b[i - 2] == 0x0A { break }
                if i >= 1 && b[i - 1] == 0x0A { break }
            }
            i += 1
        }
        return count
    }
}
