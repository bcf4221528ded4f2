import DispatchSystem
import Glibc
import XCTest
@testable import DispatchIO

/// What the layer sets once per listening socket for every connection, and a stream answered
/// whole (`respondStream`: a finished job's status stream) framed byte for byte as a stream
/// that ends at once.
extension HTTPServerWireTests {
    func handleWhole(_ req: HTTPRequest) -> Bool {
        switch req.path ?? "" {
        case "/whole":
            req.respondStream(headers: [("Content-Type", "text/event-stream")],
                              payloads: [StreamPayload(Array("retry: 3000\n\n".utf8)), StreamPayload(Array("data: last\n\n".utf8))])
        case "/sockopt":
            var nodelay: Int32 = 0, sendBuffer: Int32 = 0
            var size = socklen_t(MemoryLayout<Int32>.size)
            getsockopt(req.connection.fd, Int32(IPPROTO_TCP), TCP_NODELAY, &nodelay, &size)
            size = socklen_t(MemoryLayout<Int32>.size)
            getsockopt(req.connection.fd, SOL_SOCKET, SO_SNDBUF, &sendBuffer, &size)
            req.respond(status: 200, headers: [("X-NoDelay", "\(nodelay)"), ("X-SendBuffer", "\(sendBuffer)")], body: [])
        default:
            return false
        }
        return true
    }

    func testEveryConnectionHasNoDelayAndTheFixedSendBuffer() throws {
        try start()
        for _ in 0..<2 {
            let fd = try connect()
            defer { close(fd) }
            send(fd, "GET /sockopt HTTP/1.1\r\nHost: x\r\n\r\n")
            let r = read(fd) { $0.contains("\r\n\r\n") }
            XCTAssertTrue(r.text.contains("X-NoDelay: 1\r\n"), r.text)
            // The kernel reports twice what was set.
            XCTAssertTrue(r.text.contains("X-SendBuffer: \(2 * HTTPServer.sendBufferBytes)\r\n"), r.text)
        }
    }

    func testAStreamAnsweredWholeIsFramedAsAStreamThatEndsAtOnce() throws {
        try start()
        let fd = try connect()
        defer { close(fd) }
        // HTTP/1.1: chunks and the last chunk, then the connection serves the next request.
        send(fd, "GET /whole HTTP/1.1\r\nHost: x\r\n\r\n")
        let r = read(fd) { $0.hasSuffix("\r\n0\r\n\r\n") }
        let head = r.text.components(separatedBy: "\r\n\r\n")[0]
        XCTAssertTrue(head.hasPrefix("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nDate: "), head)
        XCTAssertFalse(head.contains("Connection:"), head)
        XCTAssertTrue(r.text.hasSuffix("\r\n\r\nd\r\nretry: 3000\n\n\r\nc\r\ndata: last\n\n\r\n0\r\n\r\n"), r.text)
        XCTAssertFalse(r.closed)
        send(fd, "GET /text HTTP/1.1\r\nHost: x\r\n\r\n")
        XCTAssertTrue(read(fd) { $0.hasSuffix("some text") }.text.hasPrefix("HTTP/1.1 200 OK\r\n"))

        // HTTP/1.1 asking to close: the same bytes, then the close.
        let closing = try connect()
        defer { close(closing) }
        send(closing, "GET /whole HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        let c = read(closing)
        XCTAssertTrue(c.closed)
        XCTAssertTrue(c.text.contains("Transfer-Encoding: chunked\r\nConnection: close\r\n"), c.text)
        XCTAssertTrue(c.text.hasSuffix("\r\n0\r\n\r\n"), c.text)

        // HTTP/1.0 (even asking for keep-alive): raw frames, framed by the close.
        let old = try connect()
        defer { close(old) }
        send(old, "GET /whole HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        let o = read(old)
        XCTAssertTrue(o.closed, "an HTTP/1.0 stream ends with the connection")
        XCTAssertTrue(o.text.hasPrefix("HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n"), o.text)
        XCTAssertFalse(o.text.contains("Transfer-Encoding"), o.text)
        XCTAssertTrue(o.text.hasSuffix("\r\n\r\nretry: 3000\n\ndata: last\n\n"), o.text)
    }
}
