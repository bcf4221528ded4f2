import DispatchBlockingHTTP
import DispatchCore
import DispatchSystem
import DispatchBenchKit
#if canImport(Glibc)
import Glibc
#endif

/// The orchestrator's end of one worker process: JSON lines in both directions.
final class WorkerHandle {
    let pid: pid_t
    let toWorker: Int32
    let fromWorker: Int32
    var buffer: [UInt8] = []
    var inbox: [JSONValue] = []
    let name: String

    init(name: String) throws {
        var inPipe: [Int32] = [0, 0]
        var outPipe: [Int32] = [0, 0]
        guard pipe(&inPipe) == 0, pipe(&outPipe) == 0 else { throw BenchError("pipe failed") }
        for fd in inPipe + outPipe { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        self.name = name
        pid = try Proc.spawn(Subprocess.executablePath(), ["worker", name], stdin: inPipe[0], stdout: outPipe[1])
        Glibc.close(inPipe[0])
        Glibc.close(outPipe[1])
        toWorker = inPipe[1]
        fromWorker = outPipe[0]
    }

    func send(_ body: (inout JSONWriter) -> Void) {
        var w = JSONWriter()
        w.beginObject()
        body(&w)
        w.endObject()
        w.bytes.append(0x0A)
        var off = 0
        while off < w.bytes.count {
            let r = w.bytes.withUnsafeBytes { write(toWorker, $0.baseAddress! + off, w.bytes.count - off) }
            if r > 0 { off += r } else if errno != EINTR { log("worker \(name): write failed"); return }
        }
    }

    /// Reads what is available without blocking; returns false on end of file.
    func pump() -> Bool {
        var buf = [UInt8](repeating: 0, count: 65536)
        let r = buf.withUnsafeMutableBytes { read(fromWorker, $0.baseAddress, $0.count) }
        if r <= 0 { return r < 0 && errno == EINTR }
        buffer.append(contentsOf: buf[0..<r])
        while let nl = buffer.firstIndex(of: 0x0A) {
            let line = Array(buffer[..<nl])
            buffer.removeSubrange(...nl)
            if let v = try? JSONParser.parse(line) { inbox.append(v) }
        }
        return true
    }

    /// Takes the first message whose `ev` is `ev` (and that `match` accepts).
    func take(_ ev: String, _ match: (JSONValue) -> Bool = { _ in true }) -> JSONValue? {
        if let k = inbox.firstIndex(where: { $0.string("ev") == ev && match($0) }) { return inbox.remove(at: k) }
        return nil
    }

    func stop() {
        send { $0.field("cmd", "exit") }
        Glibc.close(toWorker)
        if !Proc.wait(pid, seconds: 3) { kill(pid, SIGKILL); _ = Proc.wait(pid, seconds: 2) }
        startedPids.removeAll { $0 == pid }
        Glibc.close(fromWorker)
    }
}

enum Control {
    /// Waits until every handle has delivered a message `ev` (matching `match`), or the timeout.
    /// Returns the messages in handle order; nil entries timed out.
    static func collect(_ handles: [WorkerHandle], _ ev: String, timeout: Double,
                        _ match: (JSONValue) -> Bool = { _ in true }) -> [JSONValue?] {
        var got: [JSONValue?] = Array(repeating: nil, count: handles.count)
        let deadline = Clock.monotonicNanoseconds() + Int64(timeout * 1e9)
        while true {
            for (k, h) in handles.enumerated() where got[k] == nil {
                got[k] = h.take(ev, match)
                if got[k] == nil, let err = h.take("error") { log("worker \(h.name): \(err.string("message") ?? "")") }
            }
            if got.allSatisfy({ $0 != nil }) { return got }
            let now = Clock.monotonicNanoseconds()
            if now >= deadline { return got }
            var fds = handles.map { pollfd(fd: $0.fromWorker, events: Int16(POLLIN), revents: 0) }
            let ms = Int32(min(1000, max(1, (deadline - now) / 1_000_000)))
            let r = poll(&fds, nfds_t(fds.count), ms)
            if r > 0 {
                for (k, f) in fds.enumerated() where f.revents != 0 {
                    if !handles[k].pump() && got[k] == nil {
                        log("worker \(handles[k].name) exited")
                        return got
                    }
                }
            }
        }
    }

    static func sleep(_ seconds: Double) {
        usleep(UInt32(seconds * 1e6))
    }
}

/// A blocking HTTP/1.1 client for setup and one-at-a-time publishes (the orchestrator only).
enum BlockingHTTP {
    struct Response {
        var status: Int
        var event: BenchEvent?
    }

    /// A blocking TCP connection to host:port with a receive timeout and TCP_NODELAY.
    static func connect(host: String, port: UInt16, timeout: Double) throws -> Int32 {
        do {
            return try TCPStream.connectBlocking(host: host, port: Int(port), timeout: timeout, receiveTimeout: timeout)
        } catch {
            throw BenchError(error.message)
        }
    }

    /// Sends one request on a fresh connection. `body` is produced right before sending, so a
    /// timestamp inside it is taken as late as possible; its value is returned with the answer.
    static func request(host: String = "127.0.0.1", port: UInt16, method: String, path: String,
                        auth: String = "", timeout: Double = 10, body: () -> String) throws -> Response {
        let fd = try connect(host: host, port: port, timeout: timeout)
        defer { Glibc.close(fd) }
        let req = Worker.request(method, path, body: body(), auth: auth)
        var off = 0
        while off < req.count {
            let r = req.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + off, req.count - off, Int32(MSG_NOSIGNAL)) }
            guard r > 0 else { throw BenchError("send failed") }
            off += r
        }
        var parser = BenchStreamParser()
        var out: [BenchParseOutput] = []
        var response = Response(status: 0, event: nil)
        var buf = [UInt8](repeating: 0, count: 65536)
        while true {
            let r = buf.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            out.removeAll()
            if r > 0 {
                buf.withUnsafeBytes { parser.feed(UnsafeRawBufferPointer(rebasing: $0[0..<r]), into: &out) }
            } else {
                parser.finish(into: &out)
            }
            for o in out {
                switch o {
                case .headers(let status, _): response.status = status
                case .event(let e): response.event = e
                case .retry: break
                case .end: return response
                case .malformed: throw BenchError("malformed answer from \(path)")
                }
            }
            if r <= 0 { throw BenchError("no complete answer from \(method) \(path) (status \(response.status))") }
        }
    }

    /// Polls `GET path` until it answers 200.
    static func waitReady(port: UInt16, path: String, seconds: Double, alive: () -> Bool) -> Bool {
        let deadline = Clock.monotonicNanoseconds() + Int64(seconds * 1e9)
        while Clock.monotonicNanoseconds() < deadline {
            if !alive() { return false }
            if let r = try? request(port: port, method: "GET", path: path, timeout: 2, body: { "" }), r.status == 200 { return true }
            usleep(100_000)
        }
        return false
    }
}
