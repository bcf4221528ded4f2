import DispatchCore

/// The CLI's commands and options as data: the parser reads which flags exist and which take a
/// value from here, and the help is drawn from the same table, so a flag cannot be accepted
/// without being documented (or documented without being accepted). docs/cli.md is the long
/// form of the same reference.

/// One option of a command, as the parser reads it and the help shows it.
public struct CLIOption: Equatable, Sendable {
    /// Without the leading `--`.
    public var name: String
    /// The value's placeholder in the help (`NAME`); nil for a switch.
    public var value: String?
    /// One or more lines.
    public var help: String

    public init(_ name: String, _ value: String? = nil, _ help: String) {
        self.name = name
        self.value = value
        self.help = help
    }

    public var takesValue: Bool { value != nil }

    /// `--name NAME`, `-h, --help`.
    var label: String {
        let flag = name == "help" ? "-h, --help" : "--\(name)"
        return value.map { "\(flag) \($0)" } ?? flag
    }
}

/// One command: how it is called, what it does in a line, its options, and the rest.
public struct CLICommandSpec: Equatable, Sendable {
    public var name: String
    /// `dispatch start --name NAME [options]`.
    public var synopsis: String
    /// One line, for the overview.
    public var summary: String
    public var options: [CLIOption]
    /// Paragraphs shown after the options.
    public var details: String

    public init(_ name: String, synopsis: String, summary: String, options: [CLIOption], details: String) {
        self.name = name
        self.synopsis = synopsis
        self.summary = summary
        self.options = options
        self.details = details
    }
}

public enum CLIHelp {
    /// Options every command accepts, before or after the command name.
    public static let globalOptions: [CLIOption] = [
        CLIOption("url", "URL", """
        the server, http(s)://host[:port][/prefix]
        [env DISPATCH_URL, default http://127.0.0.1:8080]
        """),
        CLIOption("token", "KEY", """
        API key sent as "Authorization: Bearer KEY"  [env DISPATCH_TOKEN]
        (other users see command lines in ps: prefer the variable or a file)
        """),
        CLIOption("token-file", "PATH", "read the API key from a file  [env DISPATCH_TOKEN_FILE]"),
        CLIOption("cacert", "FILE", """
        for https, trust the CA certificates in this PEM file instead of the
        system's  [env DISPATCH_CA_FILE, or CURL_CA_BUNDLE]
        """),
        CLIOption("insecure-http", nil, """
        send the key over plain http:// to another machine anyway (refused
        otherwise: only loopback is safe)  [env DISPATCH_INSECURE_HTTP=1]
        """),
        CLIOption("json", nil, "print the server's JSON answer (the activity snapshot) instead of text"),
        CLIOption("retry-for", "SECS", """
        retry transient failures (connection refused, 5xx, 429 rate_limited)
        for this long  [default 30; progress uses its --deadline]
        """),
        CLIOption("quiet", nil, """
        no notes on stderr ("retrying…", run's activity id) when stderr is not a
        terminal (cron, CI logs); errors are always printed
        """),
        CLIOption("help", nil, "show help"),
    ]

    public static let commands: [CLICommandSpec] = [
        CLICommandSpec("start", synopsis: "dispatch start --name NAME [options]",
                       summary: "create an activity; prints its id",
                       options: [
                           CLIOption("name", "NAME", "task name shown to watchers (required, 1-200 characters)"),
                           CLIOption("id", "ID", "choose the activity id ([A-Za-z0-9._:-], up to 128); default: the server makes a UUID"),
                           CLIOption("symbol", "NAME", "SF Symbol name, e.g. arrow.down.circle.fill"),
                           CLIOption("machine", "TAG", "origin machine tag  [env DISPATCH_MACHINE]"),
                           CLIOption("cancel-url", "URL", "http(s) URL the server calls when someone cancels the activity"),
                           CLIOption("status", "TEXT", "initial status line"),
                           CLIOption("state", "STATE", "queued (default) or processing"),
                           CLIOption("percent", "P", "initial progress, 0-100"),
                           CLIOption("progress", "F", "initial progress, 0-1 (instead of --percent)"),
                           CLIOption("stale-after", "DUR", """
                           end it as stale (error) when no update or touch comes for this long:
                           10s to 7d, e.g. 90, 10m, 2h  [default: the server's, usually 1d]
                           """),
                           CLIOption("live-activity", nil, "start a Live Activity on iPhones registered for push-to-start"),
                           CLIOption("broadcast", nil, "update its Live Activities through an APNs broadcast channel (iOS 18): one push per change for every phone"),
                       ],
                       details: """
                       Prints only the new activity's id on stdout (with --json: the snapshot), so
                       id=$(dispatch start ...) works.
                       """),
        CLICommandSpec("progress", synopsis: "dispatch progress --id ID [options]",
                       summary: "report progress, status or state",
                       options: [
                           CLIOption("id", "ID", "the activity (required)"),
                           CLIOption("percent", "P", "progress, 0-100"),
                           CLIOption("progress", "F", "progress, 0-1 (instead of --percent)"),
                           CLIOption("status", "TEXT", "status line (one line, up to 200 characters)"),
                           CLIOption("state", "STATE", """
                           processing (default), queued, retrying (counts a new attempt) or idle
                           (alive but waiting: paused, throttled, waiting for a resource)
                           """),
                           CLIOption("idle", nil, "the same as --state idle"),
                           CLIOption("deadline", "DUR", """
                           give up after this long, retries included, e.g. 2, 0.5, 10s
                           [default 2]: the update is dropped and progress exits 8
                           """),
                       ],
                       details: """
                       Publishes one change of an activity that is still running; prints nothing (--json: the
                       snapshot). A script that reports every second never stalls on a server that is away:
                       after --deadline (not --retry-for) progress says so in one line on stderr and exits 8;
                       the next update carries the news. start and end retry for --retry-for instead.
                       """),
        CLICommandSpec("end", synopsis: "dispatch end --id ID [options]",
                       summary: "finish an activity",
                       options: [
                           CLIOption("id", "ID", "the activity (required)"),
                           CLIOption("state", "STATE", """
                           completed (default), error, cancelled, or rejected (refused before it
                           ran: only from queued)
                           """),
                           CLIOption("status", "TEXT", "final status line"),
                           CLIOption("error", "TEXT", "error message (up to 500 characters), e.g. with --state error"),
                           CLIOption("percent", "P", "final progress, 0-100"),
                           CLIOption("progress", "F", "final progress, 0-1 (instead of --percent)"),
                       ],
                       details: """
                       A terminal activity never changes again: ending it again differently exits 5
                       (conflict); repeating the exact same end succeeds.
                       """),
        CLICommandSpec("watch", synopsis: "dispatch watch --id ID [--plain] [--wait [--wait-timeout DUR]]",
                       summary: "follow an activity live until it ends",
                       options: [
                           CLIOption("id", "ID", "the activity (required)"),
                           CLIOption("plain", nil, "one line per event even on a terminal"),
                           CLIOption("wait", nil, """
                           if the activity does not exist yet, wait for it to start (asking
                           once a second) instead of exiting 3
                           """),
                           CLIOption("wait-timeout", "DUR", "how long --wait waits, e.g. 90, 10m, 2h; 0: no limit  [default 10m]"),
                       ],
                       details: """
                       Follows the activity's status stream until it ends. On a terminal it draws a live
                       line (state, progress bar, status, machine, elapsed time); otherwise, or with
                       --plain, it prints one line per event:  #SEQ EVENT PERCENT [MACHINE] STATUS
                       With --json it prints each event's snapshot as one JSON line.

                       A dropped connection or a server restart does not end the watch: it reconnects with
                       Last-Event-ID after the server's retry: delay, so no event is lost or shown twice; it
                       gives up when the server stays unreachable longer than --retry-for.

                       Exits 0 when the job completes, 1 when it ends in error, cancelled or rejected, 3
                       when the activity does not exist (with --wait: when it has not started in time).
                       """),
        CLICommandSpec("list", synopsis: "dispatch list [--active | --finished] [--machine TAG] [--limit N]",
                       summary: "list activities, newest first",
                       options: [
                           CLIOption("active", nil, "only live ones (queued, processing, retrying, idle)"),
                           CLIOption("finished", nil, "only finished ones (completed, error, cancelled, rejected)"),
                           CLIOption("machine", "TAG", "only those published from this machine"),
                           CLIOption("limit", "N", "show at most N, newest first  [default 50]"),
                       ],
                       details: """
                       On a terminal: a table (id, state, progress, machine, last update, task and status).
                       Otherwise one line per activity, seven tab-separated fields: id, state, progress,
                       machine, updatedAt, task name, status ('-' when empty); `cut -f1` gives the ids.
                       With --json: each activity's snapshot as one JSON line. Reads as many pages of
                       GET /v1/activities as N needs.
                       """),
        CLICommandSpec("run", synopsis: "dispatch run [options] [--] CMD [ARGS...]",
                       summary: "run a command as an activity",
                       options: [
                           CLIOption("name", "NAME", "task name (default: the command line)"),
                           CLIOption("id", "ID", "choose the activity id"),
                           CLIOption("symbol", "NAME", "SF Symbol name"),
                           CLIOption("machine", "TAG", """
                           origin machine tag  [env DISPATCH_MACHINE; default: the host name
                           when it fits (A-Z a-z 0-9 . _ -, up to 64) and the key is not bound]
                           """),
                           CLIOption("cancel-url", "URL", "cancel callback URL"),
                           CLIOption("status", "TEXT", "status while running (default: \"Running\")"),
                           CLIOption("status-from-output", nil, """
                           the status follows CMD's last output line (control characters
                           removed, cut to 200 characters)
                           """),
                           CLIOption("live-activity", nil, "start a Live Activity on iPhones registered for push-to-start"),
                           CLIOption("broadcast", nil, "update its Live Activities through an APNs broadcast channel (iOS 18): one push per change for every phone"),
                           CLIOption("progress-regex", "RE", """
                           read progress with this regular expression instead of the usual
                           shapes: exactly one capture group holding a percentage,
                           e.g. 'progress=([0-9.]+)'
                           """),
                           CLIOption("no-progress", nil, """
                           do not read progress: CMD writes straight to the terminal (for
                           full-screen or interactive programs)
                           """),
                           CLIOption("stale-after", "DUR", """
                           end the activity as stale when run stops touching it for this long
                           (its machine died): 10s to 7d  [default 10m]
                           """),
                           CLIOption("kill-after", "DUR", """
                           after a remote cancel, SIGKILL the command this long after SIGTERM
                           [default 10s]
                           """),
                       ],
                       details: """
                       Runs CMD at once and tracks it as an activity (state processing): the start,
                       progress, and the end with CMD's outcome (exit 0 -> completed; otherwise error, with
                       the exit status in the error text) are published in the background, so a slow or
                       unreachable server never delays CMD; what could not be sent is sent when the server
                       answers (the end is tried for --retry-for after CMD is over). The activity's id (a
                       UUID unless --id) is printed on stderr at once. Exits with CMD's own exit code.
                       SIGINT, SIGTERM and SIGHUP reach CMD, and the activity ends cancelled. Without a key,
                       or when the server refuses the start, CMD runs untracked (with a warning).

                       Progress is read from CMD's output (stdout and stderr, which pass through unchanged):
                       the last percentage (68%, 68.5%) or count (12/40, [3/10]) on a line, published at
                       most about 4 times a second.

                       While CMD runs, run follows the activity's status stream: when someone cancels it
                       (dispatch cancel, the dashboard, the phone), CMD's process group gets SIGTERM, then
                       SIGKILL if it is still running after --kill-after; the activity ends cancelled with
                       the reason, and run exits 143 (137 when SIGKILL was needed). It also touches the
                       activity every third of --stale-after, so the activity ends as stale (error) only
                       if this machine stops answering.
                       """),
        CLICommandSpec("cancel", synopsis: "dispatch cancel --id ID [--reason TEXT]",
                       summary: "ask the activity's publisher to stop the job",
                       options: [
                           CLIOption("id", "ID", "the activity (required)"),
                           CLIOption("reason", "TEXT", "why (one line, up to 200 characters); shown to watchers and to run"),
                       ],
                       details: """
                       The server marks the activity cancelRequested, sends the event cancel_requested to
                       everyone watching, and calls its cancel URL (a signed webhook) if it has one. The
                       job itself stops when its publisher ends it: dispatch run does so by itself. Asking
                       again is fine (nothing changes); a finished activity exits 5. Needs a device or
                       admin key, or the publish key that started the activity.
                       """),
        CLICommandSpec("touch", synopsis: "dispatch touch --id ID",
                       summary: "\"still alive\": renew the stale deadline",
                       options: [CLIOption("id", "ID", "the activity (required)")],
                       details: """
                       Tells the server the activity's publisher is alive although it has nothing new to
                       say: renews its stale deadline (see start --stale-after). No event, nothing pushed.
                       A finished activity exits 5. Needs the publish key that started it (or an admin key).
                       """),
        CLICommandSpec("batch", synopsis: "dispatch batch [FILE|-]",
                       summary: "send many changes at once: one JSON change per line",
                       options: [CLIOption("size", "N", "changes per request, 1-1000  [default 1000]")],
                       details: """
                       Reads FILE (or standard input, also with -): one change per line, a JSON object
                       {"op": "start"|"update"|"end", "activityId": ..., ...the fields of that call}, such as
                         {"op":"update","activityId":"render-17","progress":0.4}
                       and sends them as POST /v1/changes, up to 1000 changes (1 MiB) per request. Prints
                       one result per change, in input order, as a JSON line: {"status":201|200,"snapshot":{...}}
                       or {"status":4xx,"error":{"code":...,"message":...}}. Blank lines are skipped; a line
                       that is not a JSON object gets a 400 result without being sent. Each change without
                       an idempotencyKey gets one, reused when a request is retried, so none applies twice.
                       Exits 0 when every change was accepted, 9 when some were refused; a request refused
                       as a whole stops it with that answer's code (4, 6, 7).
                       """),
        CLICommandSpec("verify-webhook", synopsis: "dispatch verify-webhook --signature HEADER --body FILE [--secret SECRET] [--max-age DUR]",
                       summary: "check a cancel webhook's signature",
                       options: [
                           CLIOption("signature", "HEADER", "the Dispatch-Signature header's value (required)"),
                           CLIOption("body", "FILE", "the raw request body, or - for stdin (required)"),
                           CLIOption("secret", "SECRET", """
                           the deployment's webhook secret  [env DISPATCH_WEBHOOK_SECRET]
                           (the environment keeps it out of ps listings)
                           """),
                           CLIOption("max-age", "DUR", "how far t may be from now, either way; 0: no limit  [default 5m]"),
                       ],
                       details: """
                       Checks a cancel webhook the way docs/webhooks.md describes: HEADER is the request's
                       Dispatch-Signature value (t=<unix seconds>,v1=<hex>), FILE holds the request body
                       exactly as received. Valid when one v1 equals the HMAC-SHA256 of "<t>.<body>" under
                       the secret (compared in constant time) and t is within --max-age of now. Exits 0
                       when valid, 1 when not (the reason on stderr). Talks to no server.
                       """),
    ]

    public static func spec(_ command: String) -> CLICommandSpec? {
        commands.first { $0.name == command }
    }

    public static func text(for command: String?) -> String {
        switch command {
        case "exit-codes": return exitCodes
        case "env": return environment
        default:
            guard let command, let spec = spec(command) else { return overview }
            return render(spec)
        }
    }

    /// Options and their explanations in two columns; continuation lines are indented to the
    /// second column.
    static func table(_ options: [CLIOption]) -> String {
        let column = 23
        var lines: [String] = []
        for option in options {
            let label = "  " + option.label
            let pad = label.count < column - 1 ? String(repeating: " ", count: column - label.count) : "\n" + String(repeating: " ", count: column)
            let helpLines = option.help.split(separator: "\n", omittingEmptySubsequences: false)
            lines.append(label + pad + (helpLines.first.map(String.init) ?? ""))
            for more in helpLines.dropFirst() { lines.append(String(repeating: " ", count: column) + more) }
        }
        return lines.joined(separator: "\n")
    }

    /// A command's help: how to call it, its own options, one line naming the global ones, what
    /// it does in detail, and where the shared tables are (`dispatch help env`, `exit-codes`).
    /// The options come first: they are what `--help` is read for.
    static func render(_ spec: CLICommandSpec) -> String {
        """
        \(spec.synopsis)
          \(spec.summary)

        Options:
        \(table(spec.options + [helpOption]))

        \(globalLine)

        \(spec.details)

        Exit codes: dispatch help exit-codes
        """
    }

    static var helpOption: CLIOption { globalOptions.first { $0.name == "help" }! }

    /// `Global options (...): --url --token ...`, wrapped.
    static var globalLine: String {
        var lines = ["Global options (dispatch help env; before or after the command):"]
        for option in globalOptions where option.name != "help" {
            let word = " " + option.label
            if lines[lines.count - 1].count + word.count > 88 { lines.append("   ") }
            lines[lines.count - 1] += word
        }
        return lines.joined(separator: "\n")
    }

    /// Topics of `dispatch help TOPIC` besides the commands: the tables every command shares.
    public static let topics = ["exit-codes", "env"]

    static var environment: String {
        """
        Global options (every command, before or after its name) and the environment variables
        they read; a flag wins over its variable:

        \(table(globalOptions.filter { $0.name != "help" }))

        Read by some commands:
          DISPATCH_MACHINE         start, run: the machine tag (--machine)
          DISPATCH_WEBHOOK_SECRET  verify-webhook: the secret (--secret)
          HTTPS_PROXY, NO_PROXY    for https://: a proxy to tunnel through, hosts to reach directly
        """
    }

    static let exitCodes = """
    Exit codes (all commands):
      0  success (watch: the job completed)
      1  watch: the job ended in error, cancelled or rejected
      2  usage error (bad flags or values)
      3  not found (unknown activity; watch: not_found)
      4  authentication or permission refused (401/403)
      5  conflict (409): the activity already ended, or a state change it does not allow
      6  server unreachable, or 5xx (or 429 rate_limited) until --retry-for ran out
      7  input rejected by the server (400/413/415, a 429 limit such as too_many_live_activities)
      8  progress: no answer within --deadline (default 2 s); the update was dropped
      9  batch: every change was answered, and some were refused (see their result lines)
      run: the command's own exit code (128+N when it died of signal N); after a remote
           cancel 143 (SIGTERM stopped it) or 137 (it needed SIGKILL)
      verify-webhook: 0 the signature is valid, 1 it is not
    """

    /// One line per command: `  dispatch start    --name NAME [options]   create an activity; prints its id`.
    public static var commandList: String {
        let width = (commands.map(\.name.count).max() ?? 0)
        return commands.map { c in
            "  dispatch \(c.name)" + String(repeating: " ", count: width - c.name.count) + "  " + c.summary
        }.joined(separator: "\n")
    }

    public static var overview: String {
        """
        dispatch — publish and watch Dispatch activities (long-running jobs)

        Usage: dispatch COMMAND [options]

        Commands:
        \(commandList)
          dispatch help COMMAND  (or dispatch COMMAND --help): one command's options
          dispatch help env      the global options and their environment variables
          dispatch help exit-codes

        Example:
          id=$(dispatch start --name "Debian 13 Trixie ISO" --symbol arrow.down.circle.fill --machine shodan)
          dispatch progress --id "$id" --percent 68 --status "Downloading at 18.4 MB/s (68%)"
          dispatch end --id "$id" --status "Completed"

        Every publish carries an Idempotency-Key made once and reused on each retry, so a retried
        publish is applied at most once.

        Global options (before or after the command):
        \(table(globalOptions))

        \(exitCodes)
        """
    }
}
