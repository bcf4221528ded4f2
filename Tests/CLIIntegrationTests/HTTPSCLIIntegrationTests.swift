import DispatchSystem
import DispatchCore
import DispatchCLIKit
import DispatchTestSupport
import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// The CLI over https:// (libcurl, loaded only then): through nginx terminating TLS in front of
/// a real dispatchd, with a CA made by the test; watch's streaming and reconnection across the
/// proxy; the HTTPS_PROXY a machine may need; and the refusal to send a key in clear text.
final class HTTPSCLIIntegrationTests: CLIServerTestCase {
    private var proxy: TLSReverseProxy!

    override func setUpWithError() throws {
        try super.setUpWithError()
        proxy = try TLSReverseProxy(upstreamPort: ctx.server.port)
    }

    override func tearDown() {
        proxy?.stop()
        super.tearDown()
    }

    /// The CLI's environment for the proxy's URL, trusting the test CA the way `how` says.
    private func env(_ how: String = "DISPATCH_CA_FILE", url: String? = nil) -> [String: String] {
        var env = ctx.environment
        env["DISPATCH_URL"] = url ?? proxy.url
        if how != "none" { env[how] = proxy.caFile }
        return env
    }

    private func run(_ args: [String], _ env: [String: String]) throws -> (Int32, String, String) {
        let p = try CLIProcess(ctx.dispatch, args, environment: env)
        let code = p.wait()
        return (code, p.stdout, p.stderr)
    }

    /// Every publish and a watch over TLS, the CA given each of the three ways; then the proxy
    /// dies under the watch and comes back: the watch reconnects through it with Last-Event-ID
    /// and shows every event once.
    func testPublishAndWatchOverHTTPSAcrossAProxyRestart() throws {
        let (code, out, err) = try run(["start", "--name", "over TLS", "--machine", "shodan", "--cacert", proxy.caFile], env("none"))
        XCTAssertEqual(code, 0, err)
        let id = out.trimmingCharacters(in: .whitespacesAndNewlines)
        XCTAssertEqual(try ctx.snapshot(id)?["taskName"]?.stringValue, "over TLS")

        let watch = try CLIProcess(ctx.dispatch, ["watch", "--id", id, "--retry-for", "60"], environment: env("DISPATCH_CA_FILE"))
        eventually(30, "the watch to show the start") { watch.stdoutLines.count >= 1 }
        XCTAssertEqual(try run(["progress", "--id", id, "--percent", "10"], env("CURL_CA_BUNDLE")).0, 0)
        eventually(30, "the watch to show the progress") { watch.stdoutLines.count >= 2 }

        proxy.kill9()
        // Published straight to the server while the proxy is down: the watch must get it from
        // the history when it is back (Last-Event-ID), not lose it.
        XCTAssertEqual(try ctx.run(["progress", "--id", id, "--percent", "20", "--idle", "--status", "paused"]).0, 0)
        // Down long enough for the watch's first reconnect (after the server's retry: 3 s) to fail.
        eventually(30, "the watch to say it is retrying") { watch.stderr.contains("retrying") }
        try proxy.start()
        XCTAssertEqual(try run(["progress", "--id", id, "--percent", "30"], env()).0, 0)
        XCTAssertEqual(try run(["end", "--id", id, "--status", "Completed"], env()).0, 0)
        XCTAssertEqual(watch.wait(), 0, watch.stderr)
        let lines = watch.stdoutLines
        XCTAssertEqual(lines.map { $0.split(separator: " ").first.map(String.init) ?? "" }, ["#1", "#2", "#3", "#4", "#5"], watch.stdout)
        XCTAssertEqual(lines[2], "#3 idle 20% [shodan] paused")
        XCTAssertTrue(watch.stderr.contains("reconnected"), "the end of the outage too: \(watch.stderr)")
    }

    /// A certificate nobody vouches for is not an outage: exit 6 at once with what to do, not
    /// --retry-for seconds of retries.
    func testAnUntrustedCertificateFailsAtOnceAndSaysWhatToDo() throws {
        let started = Date()
        let (code, _, err) = try run(["progress", "--id", "x", "--percent", "5"], env("none"))
        XCTAssertEqual(code, CLIExitCode.unavailable.rawValue, err)
        XCTAssertLessThan(Date().timeIntervalSince(started), 10, "no retries for a verification failure")
        XCTAssertTrue(err.contains("not trusted"), err)
        XCTAssertTrue(err.contains("--cacert"), err)
        XCTAssertFalse(err.contains("retrying"), err)

        // The name must match the certificate too (it is for localhost and 127.0.0.1 only).
        let (wrongName, _, wrongErr) = try run(["touch", "--id", "x"], env(url: "https://127.0.0.2:\(proxy.port)"))
        XCTAssertEqual(wrongName, CLIExitCode.unavailable.rawValue, wrongErr)
        XCTAssertTrue(wrongErr.contains("not trusted") && wrongErr.contains("127.0.0.2"), wrongErr)
        XCTAssertLessThan(Date().timeIntervalSince(started), 10, "no retries for a verification failure")
    }

    /// https_proxy / HTTPS_PROXY and NO_PROXY work as in curl: the CLI tunnels through the
    /// proxy with CONNECT, and goes direct for the hosts NO_PROXY names.
    func testHTTPSProxyFromTheEnvironment() throws {
        let forward = try ConnectProxy()
        defer { forward.close() }
        var viaProxy = env(url: "https://localhost:\(proxy.port)")
        viaProxy["HTTPS_PROXY"] = "http://127.0.0.1:\(forward.port)"
        let (code, out, err) = try run(["start", "--name", "through a proxy", "--json"], viaProxy)
        XCTAssertEqual(code, 0, err)
        XCTAssertEqual(forward.targets, ["localhost:\(proxy.port)"])
        let id = try XCTUnwrap(try JSONParser.parse(out)["activityId"]?.stringValue)

        let watch = try CLIProcess(ctx.dispatch, ["watch", "--id", id], environment: viaProxy)
        eventually(30, "the watch through the proxy") { watch.stdoutLines.count >= 1 }
        XCTAssertEqual(forward.targets.count, 2, "the stream went through the tunnel too")

        viaProxy["NO_PROXY"] = "localhost"
        XCTAssertEqual(try run(["end", "--id", id], viaProxy).0, 0)
        XCTAssertEqual(watch.wait(), 0, watch.stderr)
        XCTAssertEqual(forward.targets.count, 2, "NO_PROXY: straight to the server")
    }

    /// A key is not sent in clear text to another machine unless the user says the network is
    /// trusted: a usage error (2) before anything is sent, with the two ways out.
    func testTheKeyIsNotSentOverPlainHTTPToAnotherMachine() throws {
        // 0.0.0.0 reaches this machine on Linux, but it is no loopback address: the policy
        // refuses it, and --insecure-http lets the same request through to the real server.
        let remoteLooking = "http://0.0.0.0:\(ctx.server.port)"
        let (code, _, err) = try ctx.run(["start", "--name", "clear text", "--url", remoteLooking])
        XCTAssertEqual(code, CLIExitCode.usage.rawValue, err)
        XCTAssertTrue(err.contains("refusing to send the API key over plain HTTP"), err)
        XCTAssertTrue(err.contains("https://") && err.contains("--insecure-http"), err)

        let (allowed, out, allowedErr) = try ctx.run(["start", "--name", "clear text", "--url", remoteLooking, "--insecure-http"])
        XCTAssertEqual(allowed, 0, allowedErr)
        XCTAssertNotNil(try ctx.snapshot(out.trimmingCharacters(in: .whitespacesAndNewlines)))
        XCTAssertEqual(try ctx.run(["start", "--name", "clear text", "--url", remoteLooking], env: ["DISPATCH_INSECURE_HTTP": "1"]).0, 0)
    }
}
