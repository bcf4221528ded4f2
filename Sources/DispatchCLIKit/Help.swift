import DispatchCore

/// The `dispatch` CLI's help texts. docs/cli.md is the long form of the same reference.
public enum CLIHelp {

    public static func text(for command: String?) -> String {
        switch command {
        case "start": return start
        case "progress": return progress
        case "end": return end
        case "watch": return watch
        case "run": return run
        case "cancel": return cancel
        case "touch": return touch
        case "verify-webhook": return verifyWebhook
        default: return overview
        }
    }

    static let globalOptions = """
    Global options (before or after the command):
      --url URL          server, http://host[:port][/prefix]  [env DISPATCH_URL, default http://127.0.0.1:8080]
                         (plain HTTP only: no TLS; use a local TLS proxy for a remote server)
      --token KEY        API key sent as "Authorization: Bearer KEY"  [env DISPATCH_TOKEN]
                         (other users see command lines in ps: prefer the variable or a file)
      --token-file PATH  read the API key from a file  [env DISPATCH_TOKEN_FILE]
      --json             print the server's JSON answer (the activity snapshot) instead of text
      --retry-for SECS   retry transient failures (connection refused, 429, 5xx) for this long  [default 30]
      -h, --help         show help
    """

    static let exitCodes = """
    Exit codes (all commands):
      0  success (watch: the job completed)
      1  watch: the job ended in error, cancelled or rejected
      2  usage error (bad flags or values)
      3  not found (unknown activity; watch: not_found)
      4  authentication or permission refused (401/403)
      5  conflict (409): the activity already ended, or a state change it does not allow
      6  server unreachable, or 5xx/429 until --retry-for ran out
      7  input rejected by the server (400/413/415)
      run: the command's own exit code (128+N when it died of signal N); after a remote
           cancel 143 (SIGTERM stopped it) or 137 (it needed SIGKILL)
      verify-webhook: 0 the signature is valid, 1 it is not
    """

    public static let overview = """
    dispatch — publish and watch Dispatch activities (long-running jobs)

    Usage:
      dispatch start    --name NAME [options]           create an activity; prints its id
      dispatch progress --id ID [--percent P] [...]     report progress or status
      dispatch end      --id ID [--state S] [...]       finish an activity
      dispatch watch    --id ID                         follow an activity live until it ends
      dispatch run      [options] -- CMD [ARGS...]      run a command as an activity
      dispatch cancel   --id ID [--reason TEXT]         ask the activity's publisher to stop the job
      dispatch touch    --id ID                         "still alive": renew the stale deadline
      dispatch verify-webhook --signature H --body FILE [--secret S]
                                                        check a cancel webhook's signature
      dispatch help COMMAND | dispatch COMMAND --help   details of one command

    Example:
      id=$(dispatch start --name "Debian 13 Trixie ISO" --symbol arrow.down.circle.fill --machine shodan)
      dispatch progress --id "$id" --percent 68 --status "Downloading at 18.4 MB/s (68%)"
      dispatch end --id "$id" --status "Completed"

    Every publish carries an Idempotency-Key made once and reused on each retry, so a retried
    publish is applied at most once.

    \(globalOptions)

    \(exitCodes)
    """

    public static let start = """
    dispatch start --name NAME [options]

    Creates an activity and prints only its id on stdout (with --json: the snapshot), so
    id=$(dispatch start ...) works.

    Options:
      --name NAME          task name shown to watchers (required, 1-200 characters)
      --id ID              choose the activity id ([A-Za-z0-9._:-], up to 128); default: the server makes a UUID
      --symbol NAME        SF Symbol name, e.g. arrow.down.circle.fill
      --machine TAG        origin machine tag  [env DISPATCH_MACHINE]
      --cancel-url URL     http(s) URL the server calls when someone cancels the activity
      --status TEXT        initial status line
      --state STATE        queued (default) or processing
      --percent P          initial progress, 0-100
      --progress F         initial progress, 0-1 (instead of --percent)
      --stale-after DUR    end it as stale (error) when no update or touch comes for this long:
                           10s to 7d, e.g. 90, 10m, 2h  [default: the server's, usually 1d]
      --live-activity      start a Live Activity on iPhones registered for push-to-start

    \(globalOptions)

    \(exitCodes)
    """

    public static let progress = """
    dispatch progress --id ID [options]

    Publishes one change of an activity that is still running.

    Options:
      --id ID              the activity (required)
      --percent P          progress, 0-100
      --progress F         progress, 0-1 (instead of --percent)
      --status TEXT        status line (one line, up to 200 characters)
      --state STATE        processing (default), queued, retrying (counts a new attempt) or idle
                           (alive but waiting: paused, throttled, waiting for a resource)
      --idle               the same as --state idle

    \(globalOptions)

    \(exitCodes)
    """

    public static let end = """
    dispatch end --id ID [options]

    Ends an activity. A terminal activity never changes again: ending it again differently
    exits 5 (conflict); repeating the exact same end succeeds.

    Options:
      --id ID              the activity (required)
      --state STATE        completed (default), error, cancelled, or rejected (refused before it
                           ran: only from queued)
      --status TEXT        final status line
      --error TEXT         error message (up to 500 characters), e.g. with --state error
      --percent P          final progress, 0-100
      --progress F         final progress, 0-1 (instead of --percent)

    \(globalOptions)

    \(exitCodes)
    """

    public static let watch = """
    dispatch watch --id ID [--plain]

    Follows an activity's status stream until it ends. On a terminal it draws a live line
    (progress bar, status, machine, elapsed time); otherwise, or with --plain, it prints one
    line per event:  #SEQ EVENT PERCENT [MACHINE] STATUS
    With --json it prints each event's snapshot as one JSON line.

    A dropped connection or a server restart does not end the watch: it reconnects with
    Last-Event-ID after the server's retry: delay, so no event is lost or shown twice; it gives
    up when the server stays unreachable longer than --retry-for.

    Exits 0 when the job completes, 1 when it ends in error, cancelled or rejected, 3 when the
    activity does not exist.

    Options:
      --id ID              the activity (required)
      --plain              one line per event even on a terminal

    \(globalOptions)

    \(exitCodes)
    """

    public static let run = """
    dispatch run [options] [--] CMD [ARGS...]

    Starts an activity (state processing), runs CMD, and ends the activity with CMD's outcome:
    exit 0 -> completed; otherwise error, with the exit status in the error text. Exits with
    CMD's own exit code. SIGINT, SIGTERM and SIGHUP reach CMD, and the activity ends cancelled.
    If the activity cannot be started (server down, bad key), a warning is printed and CMD
    still runs: the work matters more than its tracking.

    While CMD runs, run follows the activity's status stream: when someone cancels it (dispatch
    cancel, the dashboard, the phone), CMD's process group gets SIGTERM, then SIGKILL if it is
    still running after --kill-after; the activity ends cancelled with the reason, and run
    exits 143 (137 when SIGKILL was needed). It also touches the activity every third of
    --stale-after, so the activity ends as stale (error) only if this machine stops answering.

    Options:
      --name NAME          task name (default: the command line)
      --id ID              choose the activity id
      --symbol NAME        SF Symbol name
      --machine TAG        origin machine tag  [env DISPATCH_MACHINE]
      --cancel-url URL     cancel callback URL
      --status TEXT        status while running (default: "Running")
      --live-activity      start a Live Activity on iPhones registered for push-to-start
      --progress-regex RE  read progress from CMD's output (stdout and stderr): a regular
                           expression with exactly one capture group holding a percentage,
                           e.g. '([0-9.]+)%'. The output still passes through unchanged;
                           progress is published at most about 4 times a second.
      --stale-after DUR    end the activity as stale when run stops touching it for this long
                           (its machine died): 10s to 7d  [default 10m]
      --kill-after DUR     after a remote cancel, SIGKILL the command this long after SIGTERM
                           [default 10s]

    \(globalOptions)

    \(exitCodes)
    """

    public static let cancel = """
    dispatch cancel --id ID [--reason TEXT]

    Asks for an activity to be cancelled: the server marks it cancelRequested, sends the event
    cancel_requested to everyone watching, and calls its cancel URL (a signed webhook) if it has
    one. The job itself stops when its publisher ends it: dispatch run does so by itself.
    Asking again is fine (nothing changes); a finished activity exits 5. Needs a device or
    admin key, or the publish key that started the activity.

    Options:
      --id ID              the activity (required)
      --reason TEXT        why (one line, up to 200 characters); shown to watchers and to run

    \(globalOptions)

    \(exitCodes)
    """

    public static let touch = """
    dispatch touch --id ID

    Tells the server the activity's publisher is alive although it has nothing new to say:
    renews its stale deadline (see start --stale-after). No event, nothing pushed. A finished
    activity exits 5. Needs the publish key that started it (or an admin key).

    Options:
      --id ID              the activity (required)

    \(globalOptions)

    \(exitCodes)
    """

    public static let verifyWebhook = """
    dispatch verify-webhook --signature HEADER --body FILE [--secret SECRET] [--max-age DUR]

    Checks a cancel webhook the way docs/webhooks.md describes: HEADER is the request's
    Dispatch-Signature value (t=<unix seconds>,v1=<hex>), FILE holds the request body exactly
    as received (- for stdin). Valid when one v1 equals the HMAC-SHA256 of "<t>.<body>" under
    the secret (compared in constant time) and t is within --max-age of now. Exits 0 when
    valid, 1 when not (the reason on stderr). Talks to no server.

    Options:
      --signature HEADER   the Dispatch-Signature header's value (required)
      --body FILE          the raw request body, or - for stdin (required)
      --secret SECRET      the deployment's webhook secret  [env DISPATCH_WEBHOOK_SECRET]
                           (the environment keeps it out of ps listings)
      --max-age DUR        how far t may be from now, either way; 0: no limit  [default 5m]

    \(globalOptions)

    \(exitCodes)
    """
}
