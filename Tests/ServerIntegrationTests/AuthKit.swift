import DispatchSystem
import DispatchCore
import DispatchCrypto
import DispatchIO
import DispatchServer
import DispatchTestSupport
import Glibc
import XCTest

/// Helpers of AuthAndHostileInputTests (raw exchanges, JSON fields, stream waits).
enum AuthKit {
    static func string(_ v: JSONValue?) -> String? {
        if case .string(let s)? = v { return s }
        return nil
    }

    static func number(_ v: JSONValue?) -> Double? {
        if case .number(let n)? = v { return n }
        return nil
    }

    static func assertError(_ r: HTTPClient.Response, _ status: Int, _ code: String, _ context: String = "",
                            file: StaticString = #filePath, line: UInt = #line) {
        XCTAssertEqual(r.status, status, "\(context): \(r.text)", file: file, line: line)
        XCTAssertEqual(r.headers["content-type"], "application/json", context, file: file, line: line)
        guard case .object? = r.json?["error"] else {
            return XCTFail("\(context): error body is not {\"error\":{...}}: \(r.text)", file: file, line: line)
        }
        XCTAssertEqual(string(r.json?["error"]?["code"]), code, "\(context): \(r.text)", file: file, line: line)
        XCTAssertFalse((string(r.json?["error"]?["message"]) ?? "").isEmpty, "\(context): no message", file: file, line: line)
    }

    @discardableResult
    static func start(_ c: HTTPClient, _ id: String) throws -> HTTPClient.Response {
        let r = try c.post("/v1/activities/start", #"{"activityId":"\#(id)","taskName":"Job \#(id)","state":"processing"}"#)
        XCTAssertEqual(r.status, 201, r.text)
        return r
    }

    /// Creates a key through `POST /v1/keys` and returns its secret.
    static func createKey(_ s: TestServer, _ name: String, _ scopes: [String], machine: String? = nil) throws -> String {
        let m = machine.map { #","machine":"\#($0)""# } ?? ""
        let r = try s.client.post("/v1/keys", #"{"name":"\#(name)","scopes":[\#(scopes.map { "\"\($0)\"" }.joined(separator: ","))]\#(m)}"#)
        guard r.status == 201, let secret = string(r.json?["secret"]) else { throw TestError("create key \(name): \(r.status) \(r.text)") }
        return secret
    }

    /// `dispatchd keys ...` against the server's database.
    static func keysCommand(_ s: TestServer, _ args: [String]) -> Subprocess.Output {
        var env = Subprocess.currentEnvironment()
        env["DATABASE_URL"] = s.conninfo
        env["DISPATCH_LOG_LEVEL"] = "warning"
        return Subprocess.run([TestPaths.binary("dispatchd"), "keys"] + args, environment: env)
    }

    /// A POST with a raw body (for bytes a String cannot carry).
    static func post(_ s: TestServer, _ path: String, _ body: [UInt8]) throws -> HTTPClient.Response {
        let head = "POST \(path) HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer \(s.adminKey)\r\n"
            + "Content-Type: application/json\r\nContent-Length: \(body.count)\r\n\r\n"
        let sock = try TestSocket.connect(port: s.port)
        defer { sock.close() }
        try sock.send(Array(head.utf8) + body)
        return try HTTPClient.parse(try sock.readAll(timeout: 30))
    }

    /// Sends raw bytes (the server may hang up midway) and reads until the server closes.
    static func exchange(port: Int, _ bytes: [UInt8], timeout: Double = 30) -> (status: Int?, closed: Bool, raw: [UInt8]) {
        guard let sock = try? TestSocket.connect(port: port) else { return (nil, false, []) }
        defer { sock.close() }
        try? sock.send(bytes)
        var out: [UInt8] = []
        let deadline = Clock.monotonic() + timeout
        var closed = false
        while Clock.monotonic() < deadline {
            guard let chunk = try? sock.read(timeout: 0.5) else { continue }
            if chunk.isEmpty { closed = true; break }
            out.append(contentsOf: chunk)
        }
        // The status code of whatever arrived, even an answer cut off mid-head: the hostile
        // tests check what the server said, so this peeks rather than parses.
        var status: Int?
        if out.starts(with: Array("HTTP/1.".utf8)), out.count > 12 {
            status = Int(String(decoding: out[9..<12], as: UTF8.self))
        }
        return (status, closed, out)
    }

    /// Waits until the server has closed every socket; reports those still open and whether
    /// any got a 2xx answer.
    static func waitForClose(_ sockets: [TestSocket], timeout: Double) -> (stillOpen: Int, sawSuccess: Bool) {
        var open = Set(sockets.indices)
        var received = [[UInt8]](repeating: [], count: sockets.count)
        let deadline = Clock.monotonic() + timeout
        while !open.isEmpty && Clock.monotonic() < deadline {
            let order = Array(open)
            var fds = order.map { pollfd(fd: sockets[$0].fd, events: Int16(POLLIN), revents: 0) }
            guard poll(&fds, nfds_t(fds.count), 500) > 0 else { continue }
            for (k, i) in order.enumerated() where fds[k].revents != 0 {
                var buf = [UInt8](repeating: 0, count: 4096)
                let n = recv(sockets[i].fd, &buf, buf.count, Int32(MSG_DONTWAIT))
                if n > 0 { received[i].append(contentsOf: buf[0..<n]) } else if n == 0 || (errno != EAGAIN && errno != EINTR) { open.remove(i) }
            }
        }
        let success = received.contains { $0.starts(with: Array("HTTP/1.1 2".utf8)) || $0.starts(with: Array("HTTP/1.0 2".utf8)) }
        return (open.count, success)
    }

    static func randomBytes(_ n: Int) -> [UInt8] {
        var g = SystemRandomNumberGenerator()
        return (0..<n).map { _ in UInt8.random(in: 0...255, using: &g) }
    }

    /// Resident memory of a process in kB.
    static func residentKB(_ pid: pid_t) -> Int? {
        ProcessFigures.residentBytes(of: pid).map { $0 / 1024 }
    }

    /// Alive and not a zombie.
    static func alive(_ pid: pid_t) -> Bool {
        guard pid > 0, kill(pid, 0) == 0 else { return false }
        var status: Int32 = 0
        return waitpid(pid, &status, WNOHANG) == 0
    }

    static func eventually(_ timeout: Double, _ condition: () -> Bool) -> Bool {
        let deadline = Clock.monotonic() + timeout
        while Clock.monotonic() < deadline {
            if condition() { return true }
            usleep(100_000)
        }
        return condition()
    }
}
