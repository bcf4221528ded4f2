#if canImport(Glibc)
import Glibc
#endif
import DispatchBuildInfo
import DispatchCore
import DispatchSystem
import DispatchCLIKit

/// `dispatch`: the publishing and watching CLI. Parsing and every decision live in
/// DispatchCLIKit; this target is the thin IO shell around them.

let arguments = Array(CommandLine.arguments.dropFirst())
let invocation: CLIInvocation
do {
    invocation = try CLIArguments.parse(arguments, environment: Subprocess.environment)
} catch {
    Output.err("dispatch: \(error.message)")
    if let details = error.details { Output.err(details) }
    Output.err("Try 'dispatch \(error.command.map { "\($0) " } ?? "")--help'.")
    exit(CLIExitCode.usage.rawValue)
}

switch invocation {
case .help(let topic):
    Output.out(CLIHelp.text(for: topic))
    exit(0)
case .version:
    Output.out("dispatch \(Version.description)")
    exit(0)
case .command(var global, let command):
    if global.tokenOnCommandLine {
        Output.err("dispatch: warning: --token is visible to other users in ps; prefer DISPATCH_TOKEN or --token-file")
    }
    if let file = global.tokenFile {
        guard let text = Files.read(file)?.trimmingNewlines, !text.isEmpty else {
            Output.err("dispatch: cannot read a token from \(file)")
            exit(CLIExitCode.usage.rawValue)
        }
        global.token = text
    }
    Notes.enabled = CLIFeedback.showNotes(quiet: global.quiet, stderrIsTerminal: System.isTerminal(2))
    // Every /v1 call needs a key: say how to give one instead of sending a request bound to
    // fail. `run` goes on without one (its command matters more than the tracking).
    if global.token == nil, command.name != "verify-webhook", command.name != "run" {
        Output.fail(command.name, CLIFeedback.missingToken(devKeyHere: Files.exists(CLIFeedback.devKeyPath)))
        exit(CLIExitCode.auth.rawValue)
    }
    // libcurl is loaded here, on the main thread, before `run` starts threads that use it
    // (curl_global_init is not thread-safe), and only for https: it costs start-up time.
    // Without it `run` still runs its command (its start is refused with the same reason).
    if global.endpoint.scheme == .https, command.name != "verify-webhook", let why = CurlStream.load(), command.name != "run" {
        Output.err("dispatch: \(why)")
        exit(CLIExitCode.unavailable.rawValue)
    }
    var client = Client(global: global)
    client.command = command.name
    let code: Int32
    switch command {
    case .start(let o): code = PublishCommands.start(o, client: client).rawValue
    case .progress(let o): code = PublishCommands.progress(o, client: client).rawValue
    case .end(let o): code = PublishCommands.end(o, client: client).rawValue
    case .watch(let o): code = WatchCommand(options: o, client: client).run()
    case .list(let o): code = ListCommand.run(o, client: client).rawValue
    case .run(let o): code = RunCommand(options: o, client: client).run()
    case .cancel(let o): code = CancelCommands.cancel(o, client: client).rawValue
    case .touch(let id): code = CancelCommands.touch(id, client: client).rawValue
    case .verifyWebhook(let o): code = CancelCommands.verifyWebhook(o)
    case .batch(let o): code = BatchCommand.run(o, client: client).rawValue
    }
    exit(code)
}
