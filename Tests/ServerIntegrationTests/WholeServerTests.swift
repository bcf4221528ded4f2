import DispatchCore
import DispatchSystem
import DispatchTestSupport
import Glibc
import XCTest

/// Whatever worker takes the request, /metrics and /readyz answer for the whole server.
final class WholeServerTests: XCTestCase {
    func testMetricsAreTheWholeServersOnEveryScrape() throws {
        let s = try TestServer.start(environment: ["DISPATCH_WORKERS": "2"])
        defer { s.stop() }
        try s.startActivity("WHOLE")
        let streams = try (0..<40).map { _ in try s.stream("WHOLE") }
        for st in streams { _ = try st.waitForEvents(1) }
        // Both workers hold streams (the kernel spreads connections), and both publish their
        // state every second: once a scrape counts all 40, every later one must.
        XCTAssertTrue(try waitUntil(10) { try s.metric("dispatch_streams_active") == 40 }, "both workers' states published")
        var seen: Set<Double> = []
        for _ in 0..<20 { seen.insert(try s.metric("dispatch_streams_active")) }
        XCTAssertEqual(seen, [40], "successive scrapes disagree: \(seen)")
        let text = try HTTPClient(port: s.port).get("/metrics").text
        XCTAssertTrue(text.contains("process_resident_memory_bytes{worker=\"0\"}") && text.contains("process_resident_memory_bytes{worker=\"1\"}"),
                      "per-worker process figures are kept")
        XCTAssertFalse(text.contains("dispatch_streams_active{worker"), "no per-worker stream series: they would count twice")
    }

    func testReadinessIsEveryWorkers() throws {
        let s = try TestServer.start(environment: ["DISPATCH_WORKERS": "2"])
        defer { s.stop() }
        XCTAssertTrue(waitUntil(10) { s.log().contains("worker.listening worker=1") && s.log().contains("worker.listening worker=0") })
        let pids = s.log().split(separator: "\n").filter { $0.contains("supervisor.worker_started") }.compactMap { line -> pid_t? in
            line.split(separator: " ").first { $0.hasPrefix("pid=") }.flatMap { pid_t($0.dropFirst(4)) }
        }
        XCTAssertEqual(pids.count, 2, s.log())
        func readyz() -> (Int, String)? {
            // A request may land on the stopped worker: a short socket timeout skips it.
            guard let sock = try? TestSocket.connect(port: s.port) else { return nil }
            defer { sock.close() }
            try? sock.send("GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            guard let raw = try? sock.readAll(timeout: 1), let r = try? HTTPClient.parse(raw) else { return nil }
            return (r.status, r.text)
        }
        XCTAssertTrue(waitUntil(10) { readyz()?.0 == 200 })
        // One worker stops (SIGSTOP: it cannot answer or publish its state).
        kill(pids[1], SIGSTOP)
        defer { kill(pids[1], SIGCONT) }
        var answer: (Int, String)?
        XCTAssertTrue(waitUntil(15) {
            answer = readyz()
            return answer?.0 == 503
        }, "the other worker kept saying ready: \(String(describing: answer))")
        XCTAssertTrue(answer?.1.contains("\"worker\":1") == true, answer?.1 ?? "")
        kill(pids[1], SIGCONT)
        XCTAssertTrue(waitUntil(15) { readyz()?.0 == 200 })
    }

    /// systemd's Type=notify: READY=1 once every worker is ready, STOPPING=1 on SIGTERM.
    func testSystemdHearsReadyOnceEveryWorkerIsUpAndStopping() throws {
        let path = "/tmp/dispatch-notify-\(getpid())"
        unlink(path)
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        defer { close(fd); unlink(path) }
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &addr.sun_path) { raw in for (i, b) in path.utf8.enumerated() { raw[i] = b } }
        XCTAssertEqual(withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
            bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) } }, 0)
        func next(timeout: Double) -> String? {
            var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&pfd, 1, Int32(timeout * 1000)) > 0 else { return nil }
            var buf = [UInt8](repeating: 0, count: 512)
            let n = recv(fd, &buf, buf.count, 0)
            return n > 0 ? String(decoding: buf[0..<n], as: UTF8.self) : nil
        }
        let s = TestServer(port: try TestServer.freePort(), conninfo: try TestPostgres.shared().freshDatabase(),
                           environment: ["DISPATCH_WORKERS": "2", "NOTIFY_SOCKET": path])
        try s.launch()
        let ready = next(timeout: 10)
        XCTAssertTrue(ready?.hasPrefix("READY=1") == true, String(describing: ready))
        XCTAssertEqual(try HTTPClient(port: s.port).get("/readyz").status, 200, "READY=1 came when the server was ready")
        XCTAssertTrue(s.log().contains("worker.listening worker=0") && s.log().contains("worker.listening worker=1"))
        Glibc.kill(s.pid, SIGTERM)
        XCTAssertTrue(next(timeout: 10)?.hasPrefix("STOPPING=1") == true)
        s.stop()
    }
}
