import DispatchIO
import Glibc
import XCTest

/// The paths that touch libevent 2.1's private layout (LibeventInternals), run in this
/// process on a real loop and loopback sockets, so that `make test-asan` sees every free
/// they make: a stream started on HTTP/1.1 and on HTTP/1.0 whose client leaves, and a
/// connection that leaves before completing a request.
final class LibeventInternalsTests: XCTestCase {
    func testTheVersionCheckAcceptsLibevent21Only() {
        XCTAssertNil(LibeventInternals.refusal(library: 0x0201_0C00, headers: 0x0201_0C00))
        XCTAssertNil(LibeventInternals.refusal(library: 0x0201_0800, headers: 0x0201_0C00), "another 2.1 patch release")
        let newer = LibeventInternals.refusal(library: 0x0202_0100, headers: 0x0201_0C00)
        XCTAssertEqual(newer, "running on libevent 2.2.1; its private layout is checked for 2.1.x only")
        XCTAssertNotNil(LibeventInternals.refusal(library: 0x0200_1600, headers: 0x0201_0C00), "2.0")
        XCTAssertEqual(LibeventInternals.refusal(library: 0x0201_0C00, headers: 0x0202_0100),
                       "built against libevent 2.2.1; its private layout is checked for 2.1.x only")
        XCTAssertNil(LibeventInternals.refusal(), "the libevent this test runs on")
    }

    final class Recorder: HTTPStreamDelegate {
        var peerClosed: [Int] = []
        func streamPeerClosed(_ tag: Int) { peerClosed.append(tag) }
        func streamDrained(_ tag: Int) {}
    }

    /// Runs the loop, calling `step` every 10 ms until it returns true (or 20 s pass: a failure).
    func run(_ loop: EventLoop, until step: @escaping () -> Bool) {
        var done = false
        let poll = loop.timer(after: 0.01, repeating: true) {
            if step() { done = true; loop.stop() }
        }
        let limit = loop.timer(after: 20) { loop.stop() }
        loop.run()
        poll.cancel()
        limit.cancel()
        XCTAssertTrue(done, "did not get there within 20 s")
    }

    func connect(_ port: Int, sending request: String) throws -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = in_port_t(UInt16(port).bigEndian)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        let r = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        guard r == 0 else { throw XCTSkip("cannot connect to 127.0.0.1:\(port)") }
        _ = request.withCString { send(fd, $0, strlen($0), Int32(MSG_NOSIGNAL)) }
        return fd
    }

    func drain(_ fd: Int32, into text: inout String) {
        var buf = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = recv(fd, &buf, buf.count, Int32(MSG_DONTWAIT))
            if n <= 0 { return }
            text += String(decoding: buf[..<n], as: UTF8.self)
        }
    }

    /// A stream's reply is started (its URI and reason phrase freed by hand, its chunking read
    /// from the request), then its client leaves: evhttp detaches the reply, which is freed
    /// once, and the stream hears of it.
    func testStartedStreamsWhoseClientsLeaveAreFreedOnce() throws {
        let loop = EventLoop()
        let server = HTTPServer(loop: loop, limits: HTTPLimits())
        try server.listen(host: "127.0.0.1", port: 0, reusePort: false)
        let port = try XCTUnwrap(server.boundPort())
        let recorder = Recorder()
        var streams: [String: HTTPStream] = [:]
        server.handler = { req in
            let stream = HTTPStream(loop: loop)
            stream.tag = req.path == "/http11" ? 11 : 10
            stream.delegate = recorder
            stream.attach(req)
            stream.begin(headers: [("Content-Type", "text/event-stream")], writeTimeout: 5)
            _ = stream.write(StreamPayload(Array("data: x\n\n".utf8)), maxBacklog: 1 << 20)
            streams[req.path ?? "?"] = stream
        }
        let c11 = try connect(port, sending: "GET /http11 HTTP/1.1\r\nHost: t\r\n\r\n")
        let c10 = try connect(port, sending: "GET /http10 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        var text11 = "", text10 = ""
        run(loop) {
            self.drain(c11, into: &text11)
            self.drain(c10, into: &text10)
            return text11.hasSuffix("data: x\n\n\r\n") && text10.hasSuffix("data: x\n\n")
        }
        XCTAssertTrue(text11.contains("Transfer-Encoding: chunked"), text11)
        XCTAssertTrue(text11.contains("\r\n\r\n9\r\ndata: x\n\n\r\n"), "one chunk: \(text11)")
        XCTAssertFalse(text10.contains("chunked"), text10)
        XCTAssertTrue(text10.contains("\r\n\r\ndata: x\n\n"), text10)
        close(c11)
        close(c10)
        var turnsAfter = 0
        run(loop) {
            // One more turn after both are told, for the detached replies' deferred free.
            if recorder.peerClosed.count == 2 { turnsAfter += 1 }
            return turnsAfter >= 2
        }
        XCTAssertEqual(recorder.peerClosed.sorted(), [10, 11])
        XCTAssertEqual(streams.count, 2)
        XCTAssertFalse(streams.values.contains { $0.isOpen })
        XCTAssertEqual(server.connectionsOpen, 0)
        // A stream holds its server: let both go.
        streams.removeAll()
        server.handler = { _ in }
    }

    /// A client that sends half a request and leaves: evhttp drops the connection without a
    /// close callback, and the guard's sweep releases its reference when it sees that.
    func testAConnectionDroppedBeforeItsFirstRequestIsReleased() throws {
        let loop = EventLoop()
        let server = HTTPServer(loop: loop, limits: HTTPLimits())
        try server.listen(host: "127.0.0.1", port: 0, reusePort: false)
        let port = try XCTUnwrap(server.boundPort())
        var answered = 0
        server.handler = { req in answered += 1; req.respond(status: 204, body: []) }
        let fd = try connect(port, sending: "GET /half HTTP/1.1\r\nHo")
        run(loop) { server.connectionsOpen == 1 }
        close(fd)
        run(loop) { server.connectionsOpen == 0 }
        XCTAssertEqual(answered, 0)
        XCTAssertEqual(server.connectionsCut, 0, "it left by itself")
    }
}
