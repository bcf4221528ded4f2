// Long: one test class per CLI piece (arguments, endpoint, publish, rendering, watch), sharing
// the parsing helpers below.
import XCTest
import DispatchCore
import DispatchCLIKit

/// The CLI's pure pieces, without a process or a socket.
/// Parsing helpers for every test class here.
extension XCTestCase {
    func parseArguments(_ args: [String], env: [String: String] = [:]) throws -> CLIInvocation {
        try CLIArguments.parse(args, environment: { env[$0] })
    }

    func command(_ args: [String], env: [String: String] = [:]) throws -> (CLIGlobalOptions, CLICommand) {
        guard case .command(let g, let c) = try parseArguments(args, env: env) else {
            XCTFail("not a command: \(args)")
            throw CLIUsageError("not a command")
        }
        return (g, c)
    }

    func usageError(_ args: [String], env: [String: String] = [:], file: StaticString = #filePath, line: UInt = #line) -> CLIUsageError? {
        do {
            let result = try parseArguments(args, env: env)
            XCTFail("expected a usage error for \(args), got \(result)", file: file, line: line)
            return nil
        } catch let e as CLIUsageError {
            return e
        } catch {
            XCTFail("unexpected error \(error)", file: file, line: line)
            return nil
        }
    }
}

final class CLIArgumentTests: XCTestCase {
    func testStartWithEveryFlag() throws {
        let (g, c) = try command(["start", "--name", "Debian 13 Trixie ISO", "--symbol", "arrow.down.circle.fill",
                                  "--machine", "shodan", "--id", "TEST-1", "--cancel-url", "https://x.example/c",
                                  "--status", "Queued", "--state", "processing", "--percent", "68"])
        XCTAssertEqual(g.endpoint, CLIEndpoint(host: "127.0.0.1", port: 8080))
        XCTAssertNil(g.token)
        XCTAssertFalse(g.json)
        XCTAssertEqual(g.retryFor, 30)
        XCTAssertEqual(c, .start(CLIStartOptions(activityID: "TEST-1", name: "Debian 13 Trixie ISO", symbol: "arrow.down.circle.fill",
                                                 machine: "shodan", cancelURL: "https://x.example/c", status: "Queued",
                                                 state: "processing", progress: 0.68)))
    }

    func testGlobalFlagsBeforeOrAfterTheCommandAndEqualsForm() throws {
        let (a, _) = try command(["--url", "http://h:1", "--json", "progress", "--id=x", "--token=t", "--retry-for", "2.5", "--insecure-http"])
        XCTAssertEqual(a.endpoint, CLIEndpoint(host: "h", port: 1))
        XCTAssertEqual(a.token, "t")
        XCTAssertTrue(a.json)
        XCTAssertEqual(a.retryFor, 2.5)
    }

    func testEnvironmentGivesDefaultsAndFlagsWin() throws {
        let env = ["DISPATCH_URL": "http://10.0.0.1:9000/base/", "DISPATCH_TOKEN": "envkey", "DISPATCH_MACHINE": "xerxes",
                   "DISPATCH_INSECURE_HTTP": "1"]
        let (g, c) = try command(["start", "--name", "n"], env: env)
        XCTAssertEqual(g.endpoint, CLIEndpoint(host: "10.0.0.1", port: 9000, basePath: "/base"))
        XCTAssertEqual(g.token, "envkey")
        guard case .start(let s) = c else { return XCTFail() }
        XCTAssertEqual(s.machine, "xerxes")
        let (g2, c2) = try command(["start", "--name", "n", "--token", "flag", "--machine", "m", "--url", "http://a"], env: env)
        XCTAssertEqual(g2.token, "flag")
        XCTAssertEqual(g2.endpoint, CLIEndpoint(host: "a", port: 80))
        guard case .start(let s2) = c2 else { return XCTFail() }
        XCTAssertEqual(s2.machine, "m")
        let (g3, _) = try command(["progress", "--id", "x"], env: ["DISPATCH_TOKEN": ""])
        XCTAssertNil(g3.token, "an empty token is no token")
    }

    func testProgressAndEndOptions() throws {
        XCTAssertEqual(try command(["progress", "--id", "a", "--progress", "0.5", "--status", "s", "--state", "retrying"]).1,
                       .progress(CLIUpdateOptions(activityID: "a", progress: 0.5, status: "s", state: "retrying")))
        XCTAssertEqual(try command(["end", "--id", "a", "--state", "error", "--error", "disk full", "--percent", "100"]).1,
                       .end(CLIEndOptions(activityID: "a", state: "error", status: nil, error: "disk full", progress: 1)))
        XCTAssertEqual(try command(["end", "--id", "a"]).1, .end(CLIEndOptions(activityID: "a")))
        // idle and rejected (contract §1): a waiting job, a job refused before it ran.
        XCTAssertEqual(try command(["progress", "--id", "a", "--idle", "--status", "waiting for a GPU"]).1,
                       .progress(CLIUpdateOptions(activityID: "a", status: "waiting for a GPU", state: "idle")))
        XCTAssertEqual(try command(["progress", "--id", "a", "--state", "idle"]).1, .progress(CLIUpdateOptions(activityID: "a", state: "idle")))
        XCTAssertEqual(try command(["progress", "--id", "a", "--idle", "--state", "idle"]).1, .progress(CLIUpdateOptions(activityID: "a", state: "idle")))
        XCTAssertEqual(try command(["end", "--id", "a", "--state", "rejected", "--error", "quota"]).1,
                       .end(CLIEndOptions(activityID: "a", state: "rejected", error: "quota")))
        XCTAssertEqual(try command(["watch", "--id", "a", "--plain"]).1, .watch(CLIWatchOptions(activityID: "a", plain: true)))
    }

    func testRunSplitsItsOwnFlagsFromTheCommand() throws {
        let (_, c) = try command(["run", "--name", "nightly backup", "--progress-regex", "([0-9]+)%", "--", "./backup.sh", "--verbose", "--", "x"])
        guard case .run(let r) = c else { return XCTFail() }
        XCTAssertEqual(r.command, ["./backup.sh", "--verbose", "--", "x"])
        XCTAssertEqual(r.start.name, "nightly backup")
        XCTAssertEqual(r.start.state, "processing")
        XCTAssertEqual(r.progressRegex, "([0-9]+)%")
        // Without `--`, the first bare word starts the command and the rest is its own.
        let (_, c2) = try command(["run", "--json", "sleep", "--help", "1"])
        guard case .run(let r2) = c2 else { return XCTFail() }
        XCTAssertEqual(r2.command, ["sleep", "--help", "1"])
        XCTAssertEqual(r2.start.name, "sleep --help 1")
        XCTAssertTrue(r2.readProgress, "progress is read by default")
        XCTAssertNil(r2.progressRegex)
        let (_, c3) = try command(["run", "--no-progress", "--", "vim"])
        guard case .run(let r3) = c3 else { return XCTFail() }
        XCTAssertFalse(r3.readProgress)
        XCTAssertNotNil(usageError(["run", "--no-progress", "--progress-regex", "(x)", "--", "true"]))
    }

    func testDefaultRunNameIsBounded() {
        XCTAssertEqual(CLIArguments.defaultRunName(["a", "b\nc"]), "a b c")
        XCTAssertEqual(CLIArguments.defaultRunName([String(repeating: "x", count: 500)]).count, 200)
    }

    func testUsageErrors() {
        XCTAssertEqual(usageError(["start"])?.message, "--name is required")
        XCTAssertEqual(usageError(["start"])?.command, "start")
        XCTAssertNotNil(usageError(["progress", "--percent", "5"]))          // no --id
        XCTAssertNotNil(usageError(["progress", "--id", "a", "--percent", "101"]))
        XCTAssertNotNil(usageError(["progress", "--id", "a", "--percent", "-1"]))
        XCTAssertNotNil(usageError(["progress", "--id", "a", "--percent", "nan"]))
        XCTAssertNotNil(usageError(["progress", "--id", "a", "--percent", "0x10"]))
        XCTAssertNotNil(usageError(["progress", "--id", "a", "--progress", "1.5"]))
        XCTAssertNotNil(usageError(["progress", "--id", "a", "--percent", "5", "--progress", "0.05"]))
        XCTAssertNotNil(usageError(["progress", "--id", "a", "--state", "completed"]))
        XCTAssertNotNil(usageError(["end", "--id", "a", "--state", "processing"]))
        XCTAssertNotNil(usageError(["progress", "--id", "a", "--idle", "--state", "processing"]))
        XCTAssertNotNil(usageError(["progress", "--id", "a", "--state", "rejected"]))
        XCTAssertNotNil(usageError(["end", "--id", "a", "--state", "idle"]))
        XCTAssertNotNil(usageError(["start", "--name", "n", "--state", "retrying"]))
        XCTAssertNotNil(usageError(["progress", "--id", "a", "--error", "x"]))  // not a progress flag
        XCTAssertNotNil(usageError(["progress", "--id", "a", "--id", "b"]))
        XCTAssertNotNil(usageError(["progress", "--id"]))
        XCTAssertNotNil(usageError(["progress", "--id", "a", "extra"]))
        XCTAssertNotNil(usageError(["frobnicate"]))
        XCTAssertNotNil(usageError(["--id", "a", "progress"]))
        XCTAssertNotNil(usageError(["run", "--name", "x"]))                  // no command
        XCTAssertNotNil(usageError(["run", "--progress-regex", "([0-9]+", "--", "true"]))
        XCTAssertNotNil(usageError(["run", "--progress-regex", "[0-9]+", "--", "true"]))  // no capture group
        XCTAssertNotNil(usageError(["progress", "--id", "a", "--url", "ftp://secure.example"]))
        XCTAssertNotNil(usageError(["progress", "--id", "a", "--retry-for", "-3"]))
        XCTAssertNotNil(usageError(["watch", "--id", "a", "--plain=yes"]))
        XCTAssertNotNil(usageError(["progress", "-x"]))
    }

    func testHelpAndVersion() throws {
        XCTAssertEqual(usageError([])?.message, "missing command", "no arguments: exit 2 with the list of commands")
        XCTAssertTrue(usageError([])?.details?.contains("dispatch watch") == true)
        XCTAssertEqual(try parseArguments(["help"]), .help(nil))
        XCTAssertEqual(try parseArguments(["--help"]), .help(nil))
        XCTAssertEqual(try parseArguments(["-h"]), .help(nil))
        XCTAssertEqual(try parseArguments(["help", "watch"]), .help("watch"))
        XCTAssertEqual(try parseArguments(["run", "--help"]), .help("run"))
        XCTAssertEqual(try parseArguments(["progress", "--id", "x", "-h"]), .help("progress"))
        XCTAssertEqual(try parseArguments(["--version"]), .version)
    }

    /// Every flag a command accepts is documented in that command's help.
    func testEveryFlagIsDocumented() {
        for (command, flags) in CLIArguments.commandFlags {
            let help = CLIHelp.text(for: command)
            for flag in flags.keys {
                XCTAssertTrue(help.contains("--\(flag)"), "--\(flag) missing from `dispatch \(command) --help`")
            }
            for flag in CLIArguments.globalFlags.keys {
                XCTAssertTrue(help.contains("--\(flag)"), "--\(flag) missing from `dispatch \(command) --help`")
            }
        }
        for code in CLIExitCode.allCases {
            XCTAssertTrue(CLIHelp.overview.contains("  \(code.rawValue)  "), "exit code \(code) not documented")
        }
        for command in CLIArguments.commands {
            XCTAssertTrue(CLIHelp.overview.contains("dispatch \(command) "), "\(command) missing from the overview")
        }
    }

    /// `dispatch COMMAND --help`: the synopsis, then that command's options, then the global
    /// ones, then the explanations; every option on a line of its own, its text in one column.
    func testHelpShowsTheCommandsOptionsFirst() {
        for spec in CLIHelp.commands {
            let help = CLIHelp.text(for: spec.name)
            let lines = help.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
            XCTAssertEqual(lines.first, spec.synopsis)
            XCTAssertEqual(lines[1], "  " + spec.summary)
            XCTAssertEqual(lines[3], "Options:", spec.name)
            XCTAssertTrue(lines[4].hasPrefix("  --\(spec.options[0].name)"), "\(spec.name): \(lines[4])")
            let own = lines.firstIndex { $0.hasPrefix("  --\(spec.options.last!.name)") }!
            let global = lines.firstIndex { $0.hasPrefix("Global options") }!
            let details = lines.firstIndex { $0.hasPrefix(String(spec.details.prefix(20))) }!
            XCTAssertLessThan(own, global, spec.name)
            XCTAssertLessThan(global, details, spec.name)
            for line in lines where line.hasPrefix("  --") && line.count > 23 {
                XCTAssertEqual(Array(line)[22], " ", "the text starts in one column: \(line)")
            }
        }
        XCTAssertTrue(CLIHelp.text(for: "run").contains("\n  --progress-regex RE  read progress"), CLIHelp.text(for: "run"))
        XCTAssertTrue(CLIHelp.text(for: "verify-webhook").contains("\n  --signature HEADER   the Dispatch-Signature"))
        XCTAssertTrue(CLIHelp.text(for: "start").contains("\n  -h, --help           show help"))
    }

    /// An unknown command or flag says which one was probably meant.
    func testDidYouMean() {
        XCTAssertEqual(usageError(["strat", "--name", "x"])?.message, "unknown command 'strat' (did you mean 'start'?)")
        XCTAssertEqual(usageError(["progres"])?.message, "unknown command 'progres' (did you mean 'progress'?)")
        XCTAssertEqual(usageError(["wacth"])?.message, "unknown command 'wacth' (did you mean 'watch'?)")
        XCTAssertEqual(usageError(["update", "--id", "a"])?.message, "unknown command 'update' (did you mean 'progress'?)")
        XCTAssertEqual(usageError(["help", "wach"])?.message, "unknown command 'wach' (did you mean 'watch'?)")
        let far = usageError(["frobnicate"])
        XCTAssertEqual(far?.message, "unknown command 'frobnicate'")
        XCTAssertTrue(far?.details?.contains("dispatch start") == true, "nothing close: the list instead")
        XCTAssertEqual(usageError(["progress", "--id", "a", "--precent", "5"])?.message,
                       "unknown option --precent for progress (did you mean --percent?)")
        XCTAssertEqual(usageError(["watch", "--id", "a", "--plian"])?.message, "unknown option --plian for watch (did you mean --plain?)")
        XCTAssertEqual(usageError(["start", "--name", "a", "--tokn", "x"])?.message, "unknown option --tokn for start (did you mean --token?)")
        XCTAssertEqual(usageError(["start", "--name", "a", "--xyzzy"])?.message, "unknown option --xyzzy for start")

        XCTAssertEqual(CLISuggest.distance("strat", "start"), 1, "a swap of neighbours is one edit")
        XCTAssertEqual(CLISuggest.distance("", "abc"), 3)
        XCTAssertEqual(CLISuggest.distance("kitten", "sitting"), 3)
        XCTAssertEqual(CLISuggest.closest(to: "en", among: CLIArguments.commands), "end")
        XCTAssertEqual(CLISuggest.closest(to: "verify", among: CLIArguments.commands), "verify-webhook")
        XCTAssertEqual(CLISuggest.closest(to: "START", among: CLIArguments.commands), "start")
        XCTAssertNil(CLISuggest.closest(to: "x", among: CLIArguments.commands))
    }
}

final class CLIEndpointAndHTTPTests: XCTestCase {
    func testEndpointParsing() throws {
        XCTAssertEqual(try CLIEndpoint.parse("http://127.0.0.1:8080"), CLIEndpoint(host: "127.0.0.1", port: 8080))
        XCTAssertEqual(try CLIEndpoint.parse("HTTP://Example.org/"), CLIEndpoint(host: "Example.org", port: 80))
        XCTAssertEqual(try CLIEndpoint.parse("http://[::1]:9/x/y"), CLIEndpoint(host: "::1", port: 9, basePath: "/x/y"))
        XCTAssertEqual(try CLIEndpoint.parse("http://[::1]:9").hostHeader, "[::1]:9")
        for bad in ["ftp://a", "a:80", "http://", "https://", "http://a:0", "http://a:70000", "http://a:x",
                    "http://u:p@a", "http://a/?q", "http://[::1", "http://a b", "https://a\\b"] {
            XCTAssertThrowsError(try CLIEndpoint.parse(bad), bad)
        }
        let secure = try CLIEndpoint.parse("https://dispatch.example/api/")
        XCTAssertEqual(secure, CLIEndpoint(host: "dispatch.example", port: 443, basePath: "/api", scheme: .https))
        XCTAssertEqual(secure.hostHeader, "dispatch.example")
        XCTAssertEqual(secure.display, "https://dispatch.example/api")
        XCTAssertEqual(secure.connectURL, "https://dispatch.example:443/")
        XCTAssertEqual(try CLIEndpoint.parse("HTTPS://[::1]:8443").connectURL, "https://[::1]:8443/")
        XCTAssertEqual(try CLIEndpoint.parse("https://h:443").hostHeader, "h")
        XCTAssertEqual(try CLIEndpoint.parse("https://h:80").hostHeader, "h:80")
    }

    /// A key goes over plain HTTP only to this machine, unless the user says the network is trusted.
    func testURLPolicy() throws {
        for url in ["http://127.0.0.1:8080", "http://127.3.4.5", "http://localhost:1", "http://LOCALHOST", "http://[::1]:80",
                    "http://[0:0:0:0:0:0:0:1]", "http://[::ffff:127.0.0.1]", "https://10.0.0.5", "https://example.org"] {
            XCTAssertNil(CLITransportPolicy.refusal(endpoint: try CLIEndpoint.parse(url), sendsKey: true, insecureHTTP: false), url)
        }
        for url in ["http://10.0.0.5:8080", "http://example.org", "http://128.0.0.1", "http://[::2]", "http://localhost.evil.example",
                    "http://127.0.0.1.nip.io", "http://[::ffff:10.0.0.1]", "http://0.0.0.0", "http://1270.0.0.1"] {
            let endpoint = try CLIEndpoint.parse(url)
            XCTAssertNotNil(CLITransportPolicy.refusal(endpoint: endpoint, sendsKey: true, insecureHTTP: false), url)
            XCTAssertNil(CLITransportPolicy.refusal(endpoint: endpoint, sendsKey: true, insecureHTTP: true), url)
            XCTAssertNil(CLITransportPolicy.refusal(endpoint: endpoint, sendsKey: false, insecureHTTP: false), "no key, nothing to leak: \(url)")
        }
        XCTAssertEqual(CLIAddress.ipv6("fe80::1%eth0"), [0xfe, 0x80] + [UInt8](repeating: 0, count: 13) + [1])
        XCTAssertNil(CLIAddress.ipv6("1::2::3"))
        XCTAssertNil(CLIAddress.ipv6("12345::"))
        XCTAssertNil(CLIAddress.ipv4("1.2.3"))

        // Through the parser: a usage error (exit 2) that says why and what to do.
        let refused = usageError(["progress", "--id", "a", "--url", "http://10.0.0.5:8080"], env: ["DISPATCH_TOKEN": "k"])
        XCTAssertEqual(refused?.command, "progress")
        XCTAssertTrue(refused?.message.contains("--insecure-http") == true, refused?.message ?? "")
        XCTAssertTrue(refused?.message.contains("https://") == true, refused?.message ?? "")
        XCTAssertNotNil(usageError(["progress", "--id", "a", "--url", "http://10.0.0.5"], env: ["DISPATCH_TOKEN_FILE": "/k"]))
        XCTAssertTrue(try command(["progress", "--id", "a", "--url", "http://10.0.0.5", "--insecure-http"], env: ["DISPATCH_TOKEN": "k"]).0.insecureHTTP)
        XCTAssertNoThrow(try command(["progress", "--id", "a", "--url", "http://10.0.0.5"], env: ["DISPATCH_TOKEN": "k", "DISPATCH_INSECURE_HTTP": "1"]))
        XCTAssertNoThrow(try command(["verify-webhook", "--secret", "s", "--signature", "t=1,v1=a", "--body", "-"],
                                     env: ["DISPATCH_TOKEN": "k", "DISPATCH_URL": "http://10.0.0.5"]), "verify-webhook sends nothing")
        // The CA for https: the flag, then DISPATCH_CA_FILE, then curl's CURL_CA_BUNDLE.
        XCTAssertEqual(try command(["touch", "--id", "a", "--cacert", "/flag.pem"], env: ["DISPATCH_CA_FILE": "/env.pem"]).0.caFile, "/flag.pem")
        XCTAssertEqual(try command(["touch", "--id", "a"], env: ["DISPATCH_CA_FILE": "/env.pem", "CURL_CA_BUNDLE": "/curl.pem"]).0.caFile, "/env.pem")
        XCTAssertEqual(try command(["touch", "--id", "a"], env: ["CURL_CA_BUNDLE": "/curl.pem"]).0.caFile, "/curl.pem")
        XCTAssertNil(try command(["touch", "--id", "a"]).0.caFile)
    }

    func testRequestEncodingAndHeaderInjection() {
        let bytes = CLIHTTP.encodeRequest(method: "POST", path: "/v1/activities/start",
                                          endpoint: CLIEndpoint(host: "h", port: 81, basePath: "/p"),
                                          headers: [("Authorization", "Bearer a\r\nX-Evil: 1")], body: Array("{}".utf8))
        XCTAssertEqual(String(decoding: bytes, as: UTF8.self),
                       "POST /p/v1/activities/start HTTP/1.1\r\nHost: h:81\r\nAuthorization: Bearer aX-Evil: 1\r\n"
                       + "Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
        XCTAssertEqual(CLIHTTP.encodeSegment("TEST-1.a_b:c~"), "TEST-1.a_b:c~")
        XCTAssertEqual(CLIHTTP.encodeSegment("a/b c?é"), "a%2Fb%20c%3F%C3%A9")
    }

    func testStatusToExitCode() {
        XCTAssertEqual(CLIHTTPDisposition.of(status: 409, body: Array(#"{"error":{"code":"concurrent_changes","message":"retry"}}"#.utf8)), .retry,
                       "a transient conflict is retried like a 503")
        XCTAssertEqual(CLIHTTPDisposition.of(status: 409, body: Array(#"{"error":{"code":"already_finished","message":"done"}}"#.utf8)), .fail(.conflict))
        XCTAssertEqual(CLIHTTPDisposition.of(status: 200), .success)
        XCTAssertEqual(CLIHTTPDisposition.of(status: 201), .success)
        XCTAssertEqual(CLIHTTPDisposition.of(status: 400), .fail(.rejected))
        XCTAssertEqual(CLIHTTPDisposition.of(status: 413), .fail(.rejected))
        XCTAssertEqual(CLIHTTPDisposition.of(status: 415), .fail(.rejected))
        XCTAssertEqual(CLIHTTPDisposition.of(status: 401), .fail(.auth))
        XCTAssertEqual(CLIHTTPDisposition.of(status: 403), .fail(.auth))
        XCTAssertEqual(CLIHTTPDisposition.of(status: 404), .fail(.notFound))
        XCTAssertEqual(CLIHTTPDisposition.of(status: 409), .fail(.conflict))
        XCTAssertEqual(CLIHTTPDisposition.of(status: 429), .retry)
        XCTAssertEqual(CLIHTTPDisposition.of(status: 500), .retry)
        XCTAssertEqual(CLIHTTPDisposition.of(status: 503), .retry)
        XCTAssertEqual(CLIHTTPDisposition.of(status: 302), .fail(.unavailable))
        XCTAssertEqual([0, 1, 2, 3, 4, 5, 6, 7, 8], CLIExitCode.allCases.map(\.rawValue))
    }

    func testServerErrorDescription() {
        let body = Array(#"{"error":{"code":"not_found","message":"no activity \u001b[2Jx"}}"#.utf8)
        XCTAssertEqual(CLIServerError.parse(body), CLIServerError(code: "not_found", message: "no activity \u{1B}[2Jx"))
        XCTAssertEqual(CLIServerError.describe(status: 404, body: body), "no activity  [2Jx (not_found, HTTP 404)")
        XCTAssertEqual(CLIServerError.describe(status: 502, body: Array("<html>".utf8)), "bad gateway (HTTP 502)")
    }
}

final class CLIPublishTests: XCTestCase {
    func testRequestBodiesCarryOnlyGivenFields() {
        XCTAssertEqual(String(decoding: CLIRequestBody.start(CLIStartOptions(name: "n \"q\"")), as: UTF8.self), #"{"taskName":"n \"q\""}"#)
        XCTAssertEqual(String(decoding: CLIRequestBody.start(CLIStartOptions(activityID: "i", name: "n", symbol: "s", machine: "m",
                                                                             cancelURL: "http://c", status: "st", state: "queued", progress: 0.68)), as: UTF8.self),
                       #"{"activityId":"i","taskName":"n","systemImage":"s","machine":"m","cancelURL":"http://c","initialProgress":0.68,"status":"st","state":"queued"}"#)
        XCTAssertEqual(String(decoding: CLIRequestBody.update(CLIUpdateOptions(activityID: "a")), as: UTF8.self), "{}")
        XCTAssertEqual(String(decoding: CLIRequestBody.update(CLIUpdateOptions(activityID: "a", progress: 1, status: "s", state: "retrying")), as: UTF8.self),
                       #"{"progress":1,"status":"s","state":"retrying"}"#)
        XCTAssertEqual(String(decoding: CLIRequestBody.end(CLIEndOptions(activityID: "a", state: "error", status: "x", error: "disk full", progress: 0.5)), as: UTF8.self),
                       #"{"progress":0.5,"status":"x","state":"error","error":"disk full"}"#)
    }

    func testPercentConversion() {
        XCTAssertEqual(CLIProgress.fraction(fromPercent: 68), 0.68)
        XCTAssertEqual(CLIProgress.fraction(fromPercent: 0), 0)
        XCTAssertEqual(CLIProgress.fraction(fromPercent: 100), 1)
        XCTAssertNil(CLIProgress.fraction(fromPercent: 100.01))
        XCTAssertNil(CLIProgress.fraction(fromPercent: .nan))
        XCTAssertEqual(JSONWriter.formatNumber(CLIProgress.fraction(fromPercent: 29)!), "0.29")
    }

    func testRetryPolicyBacksOffWithinTheBudget() {
        let p = CLIRetryPolicy(budget: 3)
        XCTAssertEqual(p.delay(failures: 1, elapsed: 0), 0.1)
        XCTAssertEqual(p.delay(failures: 2, elapsed: 0.1), 0.2)
        XCTAssertEqual(p.delay(failures: 3, elapsed: 0.3), 0.4)
        XCTAssertEqual(p.delay(failures: 10, elapsed: 0.5), 2.0)     // capped
        XCTAssertEqual(p.delay(failures: 10, elapsed: 2.5), 0.5)     // last try at the deadline
        XCTAssertNil(p.delay(failures: 11, elapsed: 3.0))
        XCTAssertNil(CLIRetryPolicy(budget: 0).delay(failures: 1, elapsed: 0))
        XCTAssertEqual(p.delay(failures: 1, elapsed: 0, retryAfter: 1), 1)
        XCTAssertEqual(CLIRetryPolicy(budget: 100).delay(failures: 1, elapsed: 0, retryAfter: 3600), 10)  // bounded
        XCTAssertEqual(CLIRetryPolicy.parseRetryAfter(" 5 "), 5)
        XCTAssertNil(CLIRetryPolicy.parseRetryAfter("Wed, 21 Oct 2015 07:28:00 GMT"))
    }

    func testIdempotencyKeyFormat() {
        XCTAssertEqual(CLIIdempotencyKey.make(0, 0x0123456789abcdef), "00000000000000000123456789abcdef")
        XCTAssertEqual(CLIIdempotencyKey.make(.max, 1).count, 32)
    }
}

final class CLIRenderingTests: XCTestCase {
    let snapshot = #"{"activityId":"TEST-RTORRENT-01","taskName":"Debian 13 Trixie ISO","systemImage":"arrow.down.circle.fill","machine":"shodan","cancelURL":null,"state":"processing","progress":0.68,"status":"Downloading at 18.4 MB/s (68%)","attempt":1,"seq":5,"cancelRequested":false,"createdAt":"2026-11-29T22:53:26.123Z","updatedAt":"2026-11-29T22:55:01.004Z","endedAt":null}"#

    func testSnapshotView() throws {
        let v = try XCTUnwrap(CLIActivityView(jsonText: snapshot))
        XCTAssertEqual(v.activityID, "TEST-RTORRENT-01")
        XCTAssertEqual(v.progress, 0.68)
        XCTAssertEqual(v.seq, 5)
        XCTAssertFalse(v.isTerminal)
        XCTAssertEqual(v.createdAt ?? 0, 1_795_992_806.123, accuracy: 0.0001)
        XCTAssertEqual(v.elapsed(now: 1_795_992_806.123 + 62) ?? 0, 62, accuracy: 0.001)
        XCTAssertNil(CLIActivityView(jsonText: "{}"))
        XCTAssertNil(CLIActivityView(jsonText: "not json"))
    }

    func testTimestamps() {
        XCTAssertEqual(CLIProgress.parseTimestamp("1970-01-01T00:00:00Z"), 0)
        XCTAssertEqual(CLIProgress.parseTimestamp("2000-03-01T00:00:00.5Z"), 951_868_800.5)
        XCTAssertEqual(CLIProgress.parseTimestamp("2026-11-29T23:53:26+01:00"), CLIProgress.parseTimestamp("2026-11-29T22:53:26Z"))
        XCTAssertNil(CLIProgress.parseTimestamp("2026-11-29 nope"))
        XCTAssertNil(CLIProgress.parseTimestamp("2026-13-29T22:53:26Z"))
        XCTAssertNil(CLIProgress.parseTimestamp("2026-11-29T22:53:26"))
    }

    func testPercentBarAndDuration() {
        XCTAssertEqual(CLIProgress.percentText(0.68), "68%")
        XCTAssertEqual(CLIProgress.percentText(0.29), "29%")
        XCTAssertEqual(CLIProgress.percentText(0.685), "68.5%")
        XCTAssertEqual(CLIProgress.percentText(nil), "-")
        XCTAssertEqual(CLIProgress.bar(0.5, cells: 10), "[█████░░░░░]")
        XCTAssertEqual(CLIProgress.bar(1, cells: 4), "[████]")
        XCTAssertEqual(CLIProgress.bar(nil, cells: 3), "[···]")
        XCTAssertEqual(CLIProgress.duration(42.9), "42s")
        XCTAssertEqual(CLIProgress.duration(185), "3m05s")
        XCTAssertEqual(CLIProgress.duration(3720), "1h02m")
        XCTAssertEqual(CLIProgress.duration(-5), "0s")
    }

    func testPlainLine() throws {
        var v = try XCTUnwrap(CLIActivityView(jsonText: snapshot))
        XCTAssertEqual(CLIProgress.plainLine(event: "processing", view: v),
                       "#5 processing 68% [shodan] Downloading at 18.4 MB/s (68%)")
        v.state = "error"; v.error = "disk\nfull"; v.machine = nil; v.status = nil; v.progress = nil
        XCTAssertEqual(CLIProgress.plainLine(event: "error", view: v), "#5 error - — error: disk full")
        XCTAssertEqual(CLIProgress.plainLine(event: "not_found", view: CLIActivityView(activityID: "x")), "not_found x")
    }

    func testLiveLineFitsTheWidthAndKeepsTheBar() throws {
        let v = try XCTUnwrap(CLIActivityView(jsonText: snapshot))
        let now = v.createdAt! + 62
        let wide = CLIProgress.liveLine(view: v, width: 120, now: now, frame: 0)
        XCTAssertEqual(wide, "⠋ Debian 13 Trixie ISO [█████████████░░░░░░░] 68% processing  Downloading at 18.4 MB/s (68%) · shodan · 1m02s")
        for width in [20, 40, 60, 79, 80, 100] {
            let line = CLIProgress.liveLine(view: v, width: width, now: now, frame: 3)
            XCTAssertLessThanOrEqual(line.count, width, "width \(width): \(line)")
            if width >= 40 { XCTAssertTrue(line.contains("68%"), "width \(width): \(line)") }
        }
        var done = v
        done.state = "completed"
        XCTAssertTrue(CLIProgress.liveLine(view: done, width: 100, now: now, frame: 0).hasPrefix("✔ "))
    }

    /// The live line names the state: "waiting" for idle, the attempt while retrying, and each
    /// final state with a mark of its own (rejected is not shown as an error).
    func testLiveLineShowsTheState() throws {
        var v = try XCTUnwrap(CLIActivityView(jsonText: snapshot))
        let now = v.createdAt! + 62
        func line(_ state: String, attempt: Int? = nil, width: Int = 120) -> String {
            v.state = state
            v.attempt = attempt
            return CLIProgress.liveLine(view: v, width: width, now: now, frame: 0)
        }
        XCTAssertEqual(line("idle"), "‖ Debian 13 Trixie ISO [█████████████░░░░░░░] 68% waiting  Downloading at 18.4 MB/s (68%) · shodan · 1m02s")
        XCTAssertTrue(line("retrying", attempt: 3).contains("68% retrying (attempt 3)  "), line("retrying", attempt: 3))
        XCTAssertTrue(line("queued").hasPrefix("⠋ Debian 13 Trixie ISO [█████████████░░░░░░░] 68% queued  "))
        XCTAssertTrue(line("rejected").hasPrefix("⊗ Debian 13 Trixie ISO [█████████████░░░░░░░] 68% rejected  "))
        XCTAssertTrue(line("error").hasPrefix("✘ "))
        XCTAssertTrue(line("cancelled").hasPrefix("⊘ "))
        XCTAssertEqual(Set(["completed", "error", "cancelled", "rejected", "idle"].map { CLIProgress.glyph(CLIActivityView(activityID: "a", state: $0), frame: 0) }).count, 5,
                       "one mark per final state, and one for waiting")
        // Narrow terminals keep the state: the bar and the attempt's words shrink first.
        for width in [30, 40, 50, 60] {
            let l = line("retrying", attempt: 12, width: width)
            XCTAssertLessThanOrEqual(l.count, width, l)
            XCTAssertTrue(l.contains("retry"), "width \(width): \(l)")
            let idle = line("idle", width: width)
            XCTAssertLessThanOrEqual(idle.count, width, idle)
            XCTAssertTrue(idle.contains("waiting"), "width \(width): \(idle)")
        }
        XCTAssertEqual(CLIProgress.plainLine(event: "retrying", view: { var r = v; r.state = "retrying"; r.attempt = 2; return r }()),
                       "#5 retrying 68% (attempt 2) [shodan] Downloading at 18.4 MB/s (68%)")
    }

    func testProgressExtractor() throws {
        let x = try CLIProgressExtractor(pattern: "([0-9]+(?:[.,][0-9]+)?)%")
        XCTAssertEqual(x.progress(in: "Downloading 68% done"), 0.68)
        XCTAssertEqual(x.progress(in: "10% ... 20,5%"), 0.205)
        XCTAssertNil(x.progress(in: "no numbers"))
        XCTAssertNil(x.progress(in: "150%"))
        let custom = try CLIProgressExtractor(pattern: #"progress=(\d+)"#)
        XCTAssertEqual(custom.progress(in: "step progress=7 of 100"), 0.07)
        XCTAssertThrowsError(try CLIProgressExtractor(pattern: "(a)(b)"))
        XCTAssertThrowsError(try CLIProgressExtractor(pattern: "("))
    }

    /// What `run` reads as progress when given no pattern, and what it leaves alone.
    func testProgressShapes() {
        let cases: [(String, Double?)] = [
            ("Downloading 68% done", 0.68), ("68.5%", 0.685), ("68,5 %", nil), ("[68,5%]", 0.685), ("100%", 1), ("0%", 0),
            ("10% ... 20%", 0.2), ("150%", nil), ("(45%) eta 3s", 0.45),
            ("[3/10] Compiling Foo", 0.3), ("12/40 files", 0.3), ("Building [====>  ] 120/200: crate", 0.6),
            ("━━━━━━ 1.2/4.8 MB 5.0 MB/s", 0.25), ("step 1/1", 1), ("1/0", nil), ("41/40", nil),
            ("10% then 3/4", 0.75), ("3/4 then 10%", 0.1),
            ("2024/05/06 12:00", nil), ("route 10.0.0.1/24", nil), ("sha256%20", nil), ("version 1.2.3/4", nil),
            ("x86/64", nil), ("a/12", nil), ("no numbers", nil), ("", nil), ("99999999999999999%", nil),
            ("épée 50%", 0.5), ("ü50%", nil),
        ]
        for (line, expected) in cases {
            XCTAssertEqual(CLIProgressShapes.progress(in: line), expected, line)
        }
    }

    func testLineSplitter() {
        var s = CLILineSplitter(maxLineBytes: 8)
        XCTAssertEqual(s.feed(Array("a\r\nb\rc".utf8)), ["a", "b"])
        XCTAssertEqual(s.feed(Array("d\n\n".utf8)), ["cd"])
        XCTAssertEqual(s.feed(Array("0123456789".utf8)), ["01234567"])
        XCTAssertEqual(s.finish(), "89")
        XCTAssertNil(s.finish())
    }
}

extension CLIWatchState.Action {
    var isDisplay: Bool { if case .display = self { return true } else { return false } }
}

final class CLIWatchStateTests: XCTestCase {
    private func event(_ seq: Int, _ name: String, state: String? = nil) -> SSEEvent {
        SSEEvent(id: String(seq), event: name, data: #"{"activityId":"A","state":"\#(state ?? name)","seq":\#(seq)}"#)
    }

    func testStreamThroughCompletion() {
        var w = CLIWatchState(activityID: "A")
        XCTAssertNil(w.lastEventID)
        XCTAssertEqual(w.answered(status: 200), .readStream)
        XCTAssertEqual(w.received(event(1, "queued")).count, 1)
        XCTAssertEqual(w.lastEventID, "1")
        XCTAssertEqual(w.received(event(2, "processing")).count, 1)
        let last = w.received(event(3, "completed"))
        XCTAssertEqual(last.last, .finish(.success))
    }

    func testReconnectDropsWhatWasAlreadyShown() {
        var w = CLIWatchState(activityID: "A")
        _ = w.received(event(1, "queued"))
        _ = w.received(event(2, "processing"))
        w.retryAdvised(milliseconds: 1500)
        XCTAssertEqual(w.streamEnded(), .reconnect(afterMilliseconds: 1500))
        XCTAssertEqual(w.received(event(2, "processing")), [])  // a server that repeats itself
        XCTAssertEqual(w.received(event(3, "processing")).count, 1)
        XCTAssertEqual(w.lastEventID, "3")
    }

    func testEndStatesAndErrors() {
        var w = CLIWatchState(activityID: "A")
        XCTAssertEqual(w.received(event(4, "error")).last, .finish(.jobFailed))
        var c = CLIWatchState(activityID: "A")
        XCTAssertEqual(c.received(event(4, "cancelled")).last, .finish(.jobFailed))
        var r = CLIWatchState(activityID: "A")
        XCTAssertEqual(r.received(event(4, "rejected")).last, .finish(.jobFailed), "rejected is final: watch ends like on error")
        var n = CLIWatchState(activityID: "A")
        XCTAssertEqual(n.received(SSEEvent(id: nil, event: "not_found", data: #"{"activityId":"A"}"#)).last, .finish(.notFound))
        var h = CLIWatchState(activityID: "A")
        XCTAssertEqual(h.answered(status: 204), .fetchSnapshot)
        XCTAssertEqual(h.answered(status: 401), .finish(.auth))
        XCTAssertEqual(h.answered(status: 404), .finish(.notFound))
        XCTAssertEqual(h.answered(status: 503), .retryConnect)
        // After a 204 the final snapshot decides; an event already shown is not shown again.
        var s = CLIWatchState(activityID: "A")
        _ = s.received(event(3, "processing"))
        let done = CLIActivityView(activityID: "A", state: "completed", seq: 4)
        XCTAssertEqual(s.snapshotFetched(done), [.display(event: "completed", view: done), .finish(.success)])
        var t = CLIWatchState(activityID: "A")
        _ = t.received(event(4, "processing"))
        XCTAssertEqual(t.snapshotFetched(CLIActivityView(activityID: "A", state: "error", seq: 4)), [.finish(.jobFailed)])
        var u = CLIWatchState(activityID: "A")
        _ = u.received(event(1, "queued"))
        let rejected = CLIActivityView(activityID: "A", state: "rejected", seq: 2)
        XCTAssertEqual(u.snapshotFetched(rejected), [.display(event: "rejected", view: rejected), .finish(.jobFailed)],
                       "after a 204, a rejected snapshot ends the watch instead of reconnecting for ever")
    }

    /// `watch --wait`: not_found means "not started yet" until the deadline; once the activity
    /// was seen, not_found is final again.
    func testWaitingForAnActivityThatDoesNotExistYet() throws {
        let notFound = SSEEvent(id: "0", event: "not_found", data: #"{"activityId":"A"}"#)
        var w = CLIWatchState(activityID: "A", waitForStart: .until(100))
        XCTAssertEqual(w.received(notFound, now: 10), [.awaitActivity(afterMilliseconds: 1000)])
        XCTAssertNil(w.lastEventID, "not_found's id 0 is no Last-Event-ID: the next connection asks afresh")
        XCTAssertEqual(w.received(notFound, now: 99.75), [.awaitActivity(afterMilliseconds: 250)], "the last look lands on the deadline")
        XCTAssertEqual(w.received(notFound, now: 100).last, .finish(.notFound))
        XCTAssertEqual(try XCTUnwrap(w.received(notFound, now: 100).first).isDisplay, true, "the timeout shows not_found")

        var f = CLIWatchState(activityID: "A", waitForStart: .forever)
        XCTAssertEqual(f.received(notFound, now: 1e9), [.awaitActivity(afterMilliseconds: 1000)])
        XCTAssertEqual(f.received(event(1, "queued"), now: 1e9).count, 1)
        XCTAssertEqual(f.waitForStart, .no)
        XCTAssertEqual(f.received(notFound, now: 1e9).last, .finish(.notFound), "it existed: gone now is final")

        var n = CLIWatchState(activityID: "A")
        XCTAssertEqual(n.received(notFound, now: 0).last, .finish(.notFound), "without --wait: exit 3 at once")
        let (_, c) = try command(["watch", "--id", "A", "--wait"])
        XCTAssertEqual(c, .watch(CLIWatchOptions(activityID: "A", wait: true, waitTimeout: 600)))
        XCTAssertEqual(try command(["watch", "--id", "A", "--wait-timeout", "90s"]).1, .watch(CLIWatchOptions(activityID: "A", wait: true, waitTimeout: 90)))
        XCTAssertEqual(try command(["watch", "--id", "A", "--wait", "--wait-timeout", "0"]).1, .watch(CLIWatchOptions(activityID: "A", wait: true, waitTimeout: nil)))
        XCTAssertNotNil(usageError(["watch", "--id", "A", "--wait-timeout", "soon"]))
    }

    /// Contract §1: completed, error, cancelled and rejected are the terminal states; idle is live.
    func testTerminalStatesAreTheContractsFour() {
        for state in ["completed", "error", "cancelled", "rejected"] {
            XCTAssertTrue(CLIActivityView(activityID: "A", state: state).isTerminal, state)
        }
        for state in ["queued", "processing", "retrying", "idle"] {
            XCTAssertFalse(CLIActivityView(activityID: "A", state: state).isTerminal, state)
        }
        XCTAssertEqual(CLIActivityView.terminalStates, ["completed", "error", "cancelled", "rejected"])
    }
}
