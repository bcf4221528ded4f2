import DispatchCore
import DispatchSystem
import Glibc

/// A real local HTTP receiver for cancel webhooks (Tests/tools/webhook_receiver.py): records
/// every request and answers as scripted. It lives as long as this object holds its stdin.
public final class WebhookReceiver: @unchecked Sendable {
    public let pid: pid_t
    public let port: Int
    private var stdinFD: Int32

    public struct Request: Sendable {
        public let path: String
        public let headers: [String: String]
        public let body: String
        public let time: Double
    }

    public init() throws {
        var input: [Int32] = [-1, -1], output: [Int32] = [-1, -1]
        guard pipe(&input) == 0, pipe(&output) == 0 else { throw TestError("pipe") }
        // Ours only: a dispatchd started later must not hold the receiver's stdin open.
        for fd in input + output { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        var options = Subprocess.Options()
        options.stdin = .fd(input[0])
        options.stdout = .fd(output[1])
        let script = TestPaths.repositoryRoot + "/Tests/tools/webhook_receiver.py"
        let spawned = Subprocess.spawn(["/usr/bin/python3", script], options)
        close(input[0])
        close(output[1])
        guard case .success(let p) = spawned else {
            close(input[1]); close(output[0])
            throw TestError("cannot start \(script)")
        }
        pid = p
        stdinFD = input[1]
        var line: [UInt8] = []
        var byte: UInt8 = 0
        var poller = pollfd(fd: output[0], events: Int16(POLLIN), revents: 0)
        let deadline = Clock.monotonic() + 20
        while byte != 10, Clock.monotonic() < deadline {
            guard poll(&poller, 1, 200) > 0 else { continue }
            guard read(output[0], &byte, 1) == 1 else { break }
            line.append(byte)
        }
        close(output[0])
        guard case .number(let n)? = (try? JSONParser.parse(line))?["port"] else {
            kill(pid, SIGKILL); _ = Subprocess.wait(pid); close(stdinFD)
            throw TestError("the receiver did not say its port: \(String(decoding: line, as: UTF8.self))")
        }
        port = Int(n)
    }

    deinit { stop() }

    public func stop() {
        guard stdinFD >= 0 else { return }
        close(stdinFD)
        stdinFD = -1
        if Subprocess.wait(pid, seconds: 5) == nil { kill(pid, SIGKILL); _ = Subprocess.wait(pid) }
    }

    public func url(_ path: String = "/hook") -> String { "http://127.0.0.1:\(port)\(path)" }

    /// Answers in order, then `otherwise` for every request after: `{"status": 500}`,
    /// `{"action": "drop"}` (closed unanswered), `{"action": "delay", "seconds": S, "status": 200}`.
    public func script(_ respond: [String], otherwise: String = #"{"status":200}"#) throws {
        let r = try HTTPClient(port: port).post("/_script", #"{"respond":[\#(respond.joined(separator: ","))],"otherwise":\#(otherwise)}"#)
        guard r.status == 200 else { throw TestError("script: \(r.status) \(r.text)") }
    }

    public func requests() throws -> [Request] {
        let r = try HTTPClient(port: port).get("/_requests")
        guard case .array(let items)? = r.json?["requests"] else { throw TestError("requests: \(r.text)") }
        return items.map { item in
            var headers: [String: String] = [:]
            if case .object(let members)? = item["headers"] {
                for (k, v) in members { if case .string(let s) = v { headers[k] = s } }
            }
            var path = "", body = ""
            var time = 0.0
            if case .string(let p)? = item["path"] { path = p }
            if case .string(let b)? = item["body"] { body = b }
            if case .number(let t)? = item["time"] { time = t }
            return Request(path: path, headers: headers, body: body, time: time)
        }
    }

    public func clear() throws { _ = try HTTPClient(port: port).request("DELETE", "/_requests") }

    /// Waits (bounded) until at least `count` requests arrived.
    @discardableResult
    public func waitForRequests(_ count: Int, timeout: Double = 30) throws -> [Request] {
        let deadline = Clock.monotonic() + timeout
        while true {
            let got = try requests()
            if got.count >= count || Clock.monotonic() > deadline { return got }
            usleep(100_000)
        }
    }
}
