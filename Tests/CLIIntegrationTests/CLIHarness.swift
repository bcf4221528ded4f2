import DispatchSystem
import DispatchCore
import DispatchCLIKit
import DispatchTestSupport
import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// A `dispatch` (or any) process started by a test, with stdout and stderr captured in files
/// so a long-running one (watch, run) can be read while it runs.
final class CLIProcess {
    let process = Process()
    private let outPath: String
    private let errPath: String

    init(_ executable: String, _ arguments: [String], environment: [String: String], stdinNull: Bool = true) throws {
        let dir = NSTemporaryDirectory()
        let tag = "cli-\(getpid())-\(UUID().uuidString)"
        outPath = dir + tag + ".out"
        errPath = dir + tag + ".err"
        _ = FileManager.default.createFile(atPath: outPath, contents: nil)
        _ = FileManager.default.createFile(atPath: errPath, contents: nil)
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        process.environment = environment
        process.standardOutput = try FileHandle(forWritingTo: URL(fileURLWithPath: outPath))
        process.standardError = try FileHandle(forWritingTo: URL(fileURLWithPath: errPath))
        if stdinNull { process.standardInput = FileHandle.nullDevice }
        try process.run()
    }

    deinit {
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        try? FileManager.default.removeItem(atPath: outPath)
        try? FileManager.default.removeItem(atPath: errPath)
    }

    var pid: pid_t { process.processIdentifier }
    var isRunning: Bool { process.isRunning }
    var stdout: String { (try? String(contentsOfFile: outPath, encoding: .utf8)) ?? "" }
    var stderr: String { (try? String(contentsOfFile: errPath, encoding: .utf8)) ?? "" }
    var stdoutLines: [String] { stdout.split(separator: "\n").map(String.init) }

    /// Waits for the exit; a process still running after `timeout` is killed and the test fails.
    @discardableResult
    func wait(timeout: TimeInterval = 60, file: StaticString = #filePath, line: UInt = #line) -> Int32 {
        let deadline = Date().addingTimeInterval(timeout)
        while process.isRunning && Date() < deadline { usleep(10_000) }
        if process.isRunning {
            XCTFail("process still running after \(timeout)s; stdout: \(stdout) stderr: \(stderr)", file: file, line: line)
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
        process.waitUntilExit()
        return process.terminationStatus
    }

    var diedOfSignal: Bool { process.terminationReason == .uncaughtSignal }
}

/// Polls `condition` until it holds or `timeout` passes (no timing assertion: only a bound).
func eventually(_ timeout: TimeInterval = 30, _ what: String, file: StaticString = #filePath, line: UInt = #line,
                _ condition: () throws -> Bool) rethrows {
    let deadline = Date().addingTimeInterval(timeout)
    while Date() < deadline {
        if try condition() { return }
        usleep(20_000)
    }
    XCTFail("timed out waiting for \(what)", file: file, line: line)
}

/// The CLI tests' view of a running server.
struct CLITestContext {
    let server: TestServer
    let dispatch = TestPaths.binary("dispatch")

    var environment: [String: String] {
        var env: [String: String] = ["DISPATCH_URL": server.baseURL, "DISPATCH_TOKEN": server.adminKey]
        env["PATH"] = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"
        return env
    }

    func start(_ args: [String], env: [String: String] = [:]) throws -> CLIProcess {
        try CLIProcess(dispatch, args, environment: environment.merging(env) { $1 })
    }

    /// Runs `dispatch ARGS` to the end: (exit code, stdout, stderr).
    @discardableResult
    func run(_ args: [String], env: [String: String] = [:], file: StaticString = #filePath, line: UInt = #line) throws -> (Int32, String, String) {
        let p = try start(args, env: env)
        let code = p.wait(file: file, line: line)
        return (code, p.stdout, p.stderr)
    }

    /// `GET path` with the admin key, from this process (not through the CLI).
    func get(_ path: String) throws -> (Int, JSONValue?) {
        let r = try server.client.get(path)
        return (r.status, r.json)
    }

    func snapshot(_ id: String) throws -> JSONValue? {
        let (status, json) = try get("/v1/activities/\(id)")
        return status == 200 ? json : nil
    }

    /// The stored events of an activity, oldest first.
    func events(_ id: String) throws -> [JSONValue] {
        let (_, json) = try get("/v1/activities/\(id)/events?after=0&limit=1000")
        guard case .array(let items)? = json?["events"] else { return [] }
        return items
    }
}

extension JSONValue {
    var stringValue: String? { if case .string(let s) = self { return s } else { return nil } }
    var numberValue: Double? { if case .number(let d) = self { return d } else { return nil } }
}

/// A TCP proxy in front of the server that forwards each request and, for the first
/// `dropResponses` connections, reads the server's whole answer and then hangs up without
/// passing it on: the publish is committed, the client never hears so.
final class LossyProxy: @unchecked Sendable {
    let port: Int
    private let listenFD: Int32
    private let targetPort: Int
    private let lock = NSLock()
    private var toDrop: Int
    private var forwarded = 0

    var requestsForwarded: Int { lock.lock(); defer { lock.unlock() }; return forwarded }

    init(targetPort: Int, dropResponses: Int) throws {
        struct ProxyError: Error {}
        self.targetPort = targetPort
        toDrop = dropResponses
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        listenFD = fd
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = 0
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        let ok = withUnsafeMutablePointer(to: &addr) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, len) == 0 && listen(fd, 16) == 0 && getsockname(fd, $0, &len) == 0
            }
        }
        guard ok else { throw ProxyError() }
        port = Int(UInt16(bigEndian: addr.sin_port))
        Thread.detachNewThread { [self] in acceptLoop() }
    }

    func close() { shutdown(listenFD, Int32(SHUT_RDWR)); Glibc.close(listenFD) }

    private func acceptLoop() {
        while true {
            let client = accept(listenFD, nil, nil)
            if client < 0 { return }
            handle(client)
        }
    }

    private func handle(_ client: Int32) {
        defer { Glibc.close(client) }
        // Read the request: head, then Content-Length bytes.
        var request: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = recv(client, &buffer, buffer.count, 0)
            if n <= 0 { return }
            request += buffer[..<n]
            let text = String(decoding: request, as: UTF8.self)
            guard let headEnd = text.range(of: "\r\n\r\n") else { continue }
            let head = text[..<headEnd.lowerBound].lowercased()
            var length = 0
            for line in head.split(separator: "\r\n") where line.hasPrefix("content-length:") {
                length = Int(line.dropFirst("content-length:".count).trimmingCharacters(in: .whitespaces)) ?? 0
            }
            if request.count >= text.utf8.distance(from: text.utf8.startIndex, to: headEnd.upperBound) + length { break }
        }
        guard let socket = try? TestSocket.connect(port: targetPort) else { return }
        defer { socket.close() }
        let upstream = socket.fd
        guard send(upstream, request, request.count, Int32(MSG_NOSIGNAL)) == request.count else { return }
        var response: [UInt8] = []
        var parser = HTTPResponseParser()
        reading: while true {
            let n = recv(upstream, &buffer, buffer.count, 0)
            let events = (n > 0 ? try? parser.feed(buffer[..<n]) : try? parser.finish()) ?? [.end]
            if n > 0 { response += buffer[..<n] }
            if events.contains(.end) || n <= 0 { break reading }
        }
        lock.lock()
        forwarded += 1
        let drop = toDrop > 0
        if drop { toDrop -= 1 }
        lock.unlock()
        if !drop { _ = send(client, response, response.count, Int32(MSG_NOSIGNAL)) }
    }
}

/// `TestServer.stop()` with a bound: SIGTERM, then SIGKILL if the server has not exited after
/// `grace` seconds (so a server that hangs in shutdown cannot hang the CLI tests). The CLI's
/// behaviour across the restart is what these tests check; the server's own shutdown has its tests.
func stopServer(_ server: TestServer, grace: TimeInterval = 15) throws {
    let pid = server.pid
    guard pid > 0 else { return }
    kill(pid, SIGTERM)
    let deadline = Date().addingTimeInterval(grace)
    var status: Int32 = 0
    while Date() < deadline {
        if waitpid(pid, &status, WNOHANG) == pid { return }  // reaped; launch() replaces the pid
        usleep(20_000)
    }
    print("warning: dispatchd \(pid) did not exit within \(grace)s of SIGTERM; killing it")
    server.kill()
}

/// Stop (bounded, as above) and start again on the same port and database.
func restartServer(_ server: TestServer) throws {
    try stopServer(server)
    try server.launch()
}
