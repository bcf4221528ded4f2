import XCTest
import DispatchCore
import DispatchCLIKit

/// The CLI's arguments and environment, parsed without a process.
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
