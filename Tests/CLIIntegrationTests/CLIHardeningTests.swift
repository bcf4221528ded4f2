import DispatchSystem
import DispatchCore
import DispatchCLIKit
import DispatchTestSupport
import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// The CLI's part of the hardening issue: where the key comes from and goes, and bounded memory.
final class CLIHardeningTests: CLIServerTestCase {
    /// `--token` shows in `ps`: it still works, with a warning; a token file works quietly.
    func testTokenFromAFileAndAWarningForTheCommandLine() throws {
        var env = ctx.environment
        env["DISPATCH_TOKEN"] = nil
        let flag = try CLIProcess(ctx.dispatch, ["--token", ctx.server.adminKey, "start", "--name", "flag"], environment: env)
        XCTAssertEqual(flag.wait(), 0, flag.stderr)
        XCTAssertTrue(flag.stderr.contains("visible to other users"), flag.stderr)

        let path = "/tmp/dispatch-token-\(getpid())"
        try Files.write(path, ctx.server.adminKey + "\n", mode: 0o600)
        defer { unlink(path) }
        let file = try CLIProcess(ctx.dispatch, ["--token-file", path, "start", "--name", "file"], environment: env)
        XCTAssertEqual(file.wait(), 0, file.stderr)
        XCTAssertEqual(file.stderr, "")
        env["DISPATCH_TOKEN_FILE"] = path
        let fromEnv = try CLIProcess(ctx.dispatch, ["start", "--name", "env file"], environment: env)
        XCTAssertEqual(fromEnv.wait(), 0, fromEnv.stderr)
        let missing = try CLIProcess(ctx.dispatch, ["--token-file", "/nonexistent", "start", "--name", "x"], environment: env)
        XCTAssertEqual(missing.wait(), CLIExitCode.usage.rawValue)
        XCTAssertTrue(missing.stderr.contains("/nonexistent"), missing.stderr)
    }

    /// The wrapped command does not inherit the API key.
    func testRunDoesNotPassTheKeyToTheCommand() throws {
        let (code, out, err) = try ctx.run(["run", "--", "/bin/sh", "-c", "echo key=${DISPATCH_TOKEN:-none} url=${DISPATCH_URL:-none}"])
        XCTAssertEqual(code, 0, err)
        XCTAssertEqual(out, "key=none url=\(ctx.server.baseURL)\n")
    }

    /// A "stream" that sends one endless line: the CLI gives up with a clear message instead of
    /// buffering it (a 300 MB line once took it to 317 MB).
    func testWatchDoesNotBufferAnEndlessLine() throws {
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &addr) { p in p.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, len) == 0 && getsockname(listener, $0, &len) == 0 } }
        listen(listener, 4)
        let port = Int(UInt16(bigEndian: addr.sin_port))
        let flooder = Thread {
            let fd = accept(listener, nil, nil)
            guard fd >= 0 else { return }
            var buf = [UInt8](repeating: 0, count: 4096)
            _ = recv(fd, &buf, buf.count, 0)
            let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\ndata: "
            _ = head.withCString { send(fd, $0, strlen($0), Int32(MSG_NOSIGNAL)) }
            let chunk = [UInt8](repeating: UInt8(ascii: "x"), count: 1 << 16)
            for _ in 0..<(64 * 16) where chunk.withUnsafeBytes({ send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }) > 0 {}
            close(fd)
        }
        flooder.start()
        defer { close(listener) }
        var env = ctx.environment
        env["DISPATCH_URL"] = "http://127.0.0.1:\(port)"
        let watch = try CLIProcess(ctx.dispatch, ["watch", "--id", "endless", "--plain"], environment: env)
        var peakKB = 0
        let deadline = Clock.monotonic() + 30
        while Clock.monotonic() < deadline, watch.isRunning {
            peakKB = max(peakKB, (ProcessFigures.residentBytes(of: watch.pid) ?? 0) / 1024)
            usleep(20_000)
        }
        XCTAssertEqual(watch.wait(), CLIExitCode.unavailable.rawValue, watch.stderr)
        XCTAssertTrue(watch.stderr.contains("larger than"), watch.stderr)
        XCTAssertLessThan(peakKB, 32 * 1024, "the CLI's memory grew to \(peakKB) KiB")
    }
}
