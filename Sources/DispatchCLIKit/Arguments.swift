// Long because it is the CLI's whole flag table (every option of every command, with its help
// line) and the one parser over it: a table reads best in one place.
import DispatchCore

/// Command-line parsing for the `dispatch` CLI: pure values in, pure values out, so every rule
/// (flag spelling, ranges, defaults from the environment) is unit-tested without a process.

public struct CLIUsageError: Error, Equatable, Sendable {
    public var message: String
    /// The command whose `--help` the user should read, if any.
    public var command: String?
    /// Lines printed after the message (the list of commands when none was given).
    public var details: String?
    public init(_ message: String, command: String? = nil, details: String? = nil) {
        self.message = message
        self.command = command
        self.details = details
    }
}

/// Options every command accepts, before or after the command name.
public struct CLIGlobalOptions: Equatable, Sendable {
    public static let defaultURL = "http://127.0.0.1:8080"
    public static let defaultRetryFor = 30.0

    public var endpoint: CLIEndpoint
    public var token: String?
    /// A file to read the token from (`--token-file`, `DISPATCH_TOKEN_FILE`) when none is given.
    public var tokenFile: String?
    /// The token came from `--token`: other users see it in `ps`; the CLI warns.
    public var tokenOnCommandLine = false
    public var json: Bool
    /// Seconds during which transient failures are retried.
    public var retryFor: Double
    /// Send the key over plain HTTP to another machine anyway (`--insecure-http`).
    public var insecureHTTP = false
    /// CA certificates (PEM) to trust for https instead of the system's (`--cacert`).
    public var caFile: String?
    /// No notes on stderr when it is not a terminal (`--quiet`); errors are always printed.
    public var quiet = false

    public init(endpoint: CLIEndpoint, token: String?, json: Bool, retryFor: Double) {
        self.endpoint = endpoint
        self.token = token
        self.json = json
        self.retryFor = retryFor
    }
}

public struct CLIStartOptions: Equatable, Sendable {
    public var activityID: String?
    public var name: String
    public var symbol: String?
    public var machine: String?
    public var cancelURL: String?
    public var status: String?
    public var state: String?
    /// 0...1 (already converted from `--percent`).
    public var progress: Double?
    /// Seconds without an update before the server ends it as stale (nil: the server's default).
    public var staleAfter: Int?
    /// Ask for a Live Activity on registered iPhones (push-to-start, contract §5.2).
    public var liveActivity: Bool
    /// Ask for an APNs broadcast channel (contract §5.5): one push per change for every phone.
    public var broadcast: Bool

    public init(activityID: String? = nil, name: String, symbol: String? = nil, machine: String? = nil,
                cancelURL: String? = nil, status: String? = nil, state: String? = nil, progress: Double? = nil,
                staleAfter: Int? = nil, liveActivity: Bool = false, broadcast: Bool = false) {
        self.activityID = activityID
        self.name = name
        self.symbol = symbol
        self.machine = machine
        self.cancelURL = cancelURL
        self.status = status
        self.state = state
        self.progress = progress
        self.staleAfter = staleAfter
        self.liveActivity = liveActivity
        self.broadcast = broadcast
    }
}

public struct CLIUpdateOptions: Equatable, Sendable {
    /// Seconds `progress` spends at most on one update, retries included (`--deadline`): a
    /// script reporting every second must not stall when the server is away.
    public static let defaultDeadline = 2.0

    public var activityID: String
    public var progress: Double?
    public var status: String?
    public var state: String?
    public var deadline: Double

    public init(activityID: String, progress: Double? = nil, status: String? = nil, state: String? = nil,
                deadline: Double = defaultDeadline) {
        self.activityID = activityID
        self.progress = progress
        self.status = status
        self.state = state
        self.deadline = deadline
    }
}

public struct CLIEndOptions: Equatable, Sendable {
    public var activityID: String
    public var state: String?
    public var status: String?
    public var error: String?
    public var progress: Double?

    public init(activityID: String, state: String? = nil, status: String? = nil, error: String? = nil, progress: Double? = nil) {
        self.activityID = activityID
        self.state = state
        self.status = status
        self.error = error
        self.progress = progress
    }
}

public struct CLIWatchOptions: Equatable, Sendable {
    public static let defaultWaitTimeout = 600.0

    public var activityID: String
    /// One line per event even on a terminal.
    public var plain: Bool
    /// Wait for an activity that does not exist yet (`--wait`).
    public var wait: Bool
    /// Seconds `--wait` waits at most; nil: no limit (`--wait-timeout 0`).
    public var waitTimeout: Double?

    public init(activityID: String, plain: Bool = false, wait: Bool = false, waitTimeout: Double? = defaultWaitTimeout) {
        self.activityID = activityID
        self.plain = plain
        self.wait = wait
        self.waitTimeout = waitTimeout
    }
}

public struct CLIRunOptions: Equatable, Sendable {
    public var start: CLIStartOptions
    /// The user's pattern for progress; nil: the common shapes (`CLIProgressShapes`).
    public var progressRegex: String?
    /// Read progress from the command's output at all (`--no-progress`: no, and the command
    /// then writes straight to the terminal).
    public var readProgress: Bool
    public var command: [String]
    /// Seconds between SIGTERM and SIGKILL after a remote cancel.
    public var killAfter: Double
    /// The status follows the command's last output line (`--status-from-output`).
    public var statusFromOutput: Bool

    public init(start: CLIStartOptions, progressRegex: String? = nil, readProgress: Bool = true, command: [String],
                killAfter: Double = CLIRunCancel.defaultKillAfter, statusFromOutput: Bool = false) {
        self.statusFromOutput = statusFromOutput
        self.start = start
        self.progressRegex = progressRegex
        self.readProgress = readProgress
        self.command = command
        self.killAfter = killAfter
    }
}

public enum CLICommand: Equatable, Sendable {
    case start(CLIStartOptions)
    case progress(CLIUpdateOptions)
    case end(CLIEndOptions)
    case watch(CLIWatchOptions)
    case list(CLIListOptions)
    case run(CLIRunOptions)
    case cancel(CLICancelOptions)
    /// `touch --id ID`.
    case touch(String)
    case verifyWebhook(CLIVerifyWebhookOptions)
    /// `batch [FILE|-]`: one JSON change per line, sent as `POST /v1/changes`.
    case batch(CLIBatchOptions)

    public var name: String {
        switch self {
        case .start: return "start"
        case .progress: return "progress"
        case .end: return "end"
        case .watch: return "watch"
        case .list: return "list"
        case .run: return "run"
        case .cancel: return "cancel"
        case .touch: return "touch"
        case .verifyWebhook: return "verify-webhook"
        case .batch: return "batch"
        }
    }
}

public enum CLIInvocation: Equatable, Sendable {
    /// Print the help of a command (nil: the overview) to stdout and exit 0.
    case help(String?)
    case version
    case command(CLIGlobalOptions, CLICommand)
}

public enum CLIArguments {
    /// The command names, in the order the help lists them (CLIHelp is the one table).
    public static let commands = CLIHelp.commands.map(\.name)

    /// Flag name (without `--`) -> whether it takes a value.
    public static let globalFlags: [String: Bool] = flags(CLIHelp.globalOptions)

    public static let commandFlags: [String: [String: Bool]] =
        Dictionary(uniqueKeysWithValues: CLIHelp.commands.map { ($0.name, flags($0.options)) })

    static func flags(_ options: [CLIOption]) -> [String: Bool] {
        Dictionary(uniqueKeysWithValues: options.map { ($0.name, $0.takesValue) })
    }

    /// `unknown option --precent (did you mean --percent?)`.
    static func unknownOption(_ name: String, command: String?) -> CLIUsageError {
        let known = CLIHelp.globalOptions.map(\.name) + (command.flatMap { CLIHelp.spec($0)?.options.map(\.name) } ?? [])
        let hint = CLISuggest.hint(for: name, among: known) { "--\($0)" }
        return CLIUsageError("unknown option --\(name)\(command.map { " for \($0)" } ?? "")\(hint)", command: command)
    }

    /// `unknown command 'strat' (did you mean 'start'?)`.
    static func unknownCommand(_ word: String) -> CLIUsageError {
        CLIUsageError("unknown command '\(word)'\(CLISuggest.hint(for: word, among: commands))",
                      details: CLISuggest.closest(to: word, among: commands) == nil ? "Commands:\n" + CLIHelp.commandList : nil)
    }

    public static let startStates = ["queued", "processing"]
    public static let updateStates = ["processing", "queued", "retrying", "idle"]
    public static let endStates = ["completed", "error", "cancelled", "rejected"]

    /// Parses `arguments` (without the program name). `environment` answers `DISPATCH_URL`,
    /// `DISPATCH_TOKEN` and `DISPATCH_MACHINE`; flags win over the environment.
    public static func parse(_ arguments: [String], environment: (String) -> String?) throws(CLIUsageError) -> CLIInvocation {
        var values: [String: String] = [:]
        var switches: Set<String> = []
        var commandName: String?
        var trailing: [String] = []
        var positional: String?
        var i = 0

        while i < arguments.count {
            let arg = arguments[i]
            i += 1
            if arg == "--" {
                guard commandName == "run" else { throw CLIUsageError("unexpected '--'", command: commandName) }
                trailing = Array(arguments[i...])
                break
            }
            if arg == "-h" { switches.insert("help"); continue }
            if arg == "--version" || arg == "-V" {
                if commandName == nil { return .version }
                throw CLIUsageError("unknown option --version", command: commandName)
            }
            if arg.hasPrefix("--") {
                var name = String(arg.dropFirst(2))
                var inlineValue: String?
                if let eq = name.firstIndex(of: "=") {
                    inlineValue = String(name[name.index(after: eq)...])
                    name = String(name[..<eq])
                }
                let takesValue: Bool
                if let g = globalFlags[name] {
                    takesValue = g
                } else if let c = commandName, let f = commandFlags[c]?[name] {
                    takesValue = f
                } else if commandName == nil, commandFlags.values.contains(where: { $0[name] != nil }) {
                    throw CLIUsageError("--\(name) must come after the command name")
                } else {
                    throw unknownOption(name, command: commandName)
                }
                if takesValue {
                    let value: String
                    if let inlineValue {
                        value = inlineValue
                    } else {
                        guard i < arguments.count else { throw CLIUsageError("--\(name) needs a value", command: commandName) }
                        value = arguments[i]
                        i += 1
                    }
                    guard values[name] == nil else { throw CLIUsageError("--\(name) given twice", command: commandName) }
                    values[name] = value
                } else {
                    guard inlineValue == nil else { throw CLIUsageError("--\(name) takes no value", command: commandName) }
                    switches.insert(name)
                }
                continue
            }
            if arg.hasPrefix("-") && arg.count > 1 {
                throw CLIUsageError("unknown option \(arg)", command: commandName)
            }
            // A bare word: the command name, `help TOPIC`, or the start of `run`'s command.
            if commandName == nil {
                if arg == "help" {
                    guard i < arguments.count else { return .help(nil) }
                    guard commands.contains(arguments[i]) || CLIHelp.topics.contains(arguments[i]) else { throw unknownCommand(arguments[i]) }
                    return .help(arguments[i])
                }
                guard commands.contains(arg) else { throw unknownCommand(arg) }
                commandName = arg
                continue
            }
            if commandName == "run" {
                trailing = Array(arguments[(i - 1)...])
                break
            }
            if commandName == "batch", positional == nil {
                positional = arg
                continue
            }
            throw CLIUsageError("unexpected argument '\(arg)'", command: commandName)
        }

        if switches.contains("help") { return .help(commandName) }
        guard let command = commandName else {
            throw CLIUsageError("missing command", details: "Usage: dispatch COMMAND [options]\n\nCommands:\n" + CLIHelp.commandList)
        }

        let global = try globalOptions(values: values, switches: switches, environment: environment, command: command)
        func nonEmpty(_ s: String?) -> String? { (s?.isEmpty ?? true) ? nil : s }
        func required(_ name: String) throws(CLIUsageError) -> String {
            guard let v = values[name], !v.isEmpty else { throw CLIUsageError("--\(name) is required", command: command) }
            return v
        }
        func state(_ allowed: [String]) throws(CLIUsageError) -> String? {
            guard let s = values["state"] else { return nil }
            guard allowed.contains(s) else {
                throw CLIUsageError("--state must be one of \(allowed.joined(separator: ", ")) (got '\(s)')", command: command)
            }
            return s
        }
        let machine = values["machine"] ?? nonEmpty(environment("DISPATCH_MACHINE"))

        switch command {
        case "start":
            let opts = CLIStartOptions(
                activityID: values["id"], name: try required("name"), symbol: values["symbol"],
                machine: machine, cancelURL: values["cancel-url"], status: values["status"],
                state: try state(startStates), progress: try progress(values, command: command),
                staleAfter: try staleAfter(values, command: command), liveActivity: switches.contains("live-activity"),
                broadcast: switches.contains("broadcast"))
            return .command(global, .start(opts))
        case "progress":
            var updateState = try state(updateStates)
            if switches.contains("idle") {
                guard updateState == nil || updateState == "idle" else {
                    throw CLIUsageError("--idle is --state idle; give one or the other", command: command)
                }
                updateState = "idle"
            }
            var deadline = CLIUpdateOptions.defaultDeadline
            if let text = values["deadline"] {
                guard let v = DurationText.seconds(text), v >= 0.1, v <= 3600 else {
                    throw CLIUsageError("--deadline must be a duration from 0.1 s to 1 h, such as 2, 0.5 or 30s (got '\(text)')", command: command)
                }
                deadline = v
            }
            let opts = CLIUpdateOptions(
                activityID: try required("id"), progress: try progress(values, command: command),
                status: values["status"], state: updateState, deadline: deadline)
            return .command(global, .progress(opts))
        case "end":
            let opts = CLIEndOptions(
                activityID: try required("id"), state: try state(endStates), status: values["status"],
                error: values["error"], progress: try progress(values, command: command))
            return .command(global, .end(opts))
        case "watch":
            var timeout: Double? = CLIWatchOptions.defaultWaitTimeout
            if let text = values["wait-timeout"] {
                guard let v = DurationText.seconds(text) else {
                    throw CLIUsageError("--wait-timeout must be a duration such as 90, 10m or 0 for no limit (got '\(text)')", command: command)
                }
                timeout = v == 0 ? nil : v
            }
            return .command(global, .watch(CLIWatchOptions(
                activityID: try required("id"), plain: switches.contains("plain"),
                wait: switches.contains("wait") || values["wait-timeout"] != nil, waitTimeout: timeout)))
        case "list":
            guard !(switches.contains("active") && switches.contains("finished")) else {
                throw CLIUsageError("give --active or --finished, not both", command: command)
            }
            var limit = CLIListOptions.defaultLimit
            if let text = values["limit"] {
                guard let n = Int(text), (1...CLIListOptions.maxLimit).contains(n) else {
                    throw CLIUsageError("--limit must be a whole number from 1 to \(CLIListOptions.maxLimit) (got '\(text)')", command: command)
                }
                limit = n
            }
            let filter: CLIListOptions.Filter? = switches.contains("active") ? .active : switches.contains("finished") ? .finished : nil
            // Not DISPATCH_MACHINE: that names this machine for publishing, and a list of
            // everything is what one expects without a flag.
            return .command(global, .list(CLIListOptions(filter: filter, machine: values["machine"], limit: limit)))
        case "cancel":
            return .command(global, .cancel(CLICancelOptions(activityID: try required("id"), reason: values["reason"])))
        case "touch":
            return .command(global, .touch(try required("id")))
        case "batch":
            var size = CLIBatch.maxChanges
            if let text = values["size"] {
                guard let n = Int(text), (1...CLIBatch.maxChanges).contains(n) else {
                    throw CLIUsageError("--size must be a whole number from 1 to \(CLIBatch.maxChanges) (got '\(text)')", command: command)
                }
                size = n
            }
            return .command(global, .batch(CLIBatchOptions(path: positional == "-" ? nil : positional, size: size)))
        case "verify-webhook":
            guard let secret = values["secret"] ?? nonEmpty(environment("DISPATCH_WEBHOOK_SECRET")), !secret.isEmpty else {
                throw CLIUsageError("--secret is required (or DISPATCH_WEBHOOK_SECRET)", command: command)
            }
            var maxAge = CLIVerifyWebhookOptions.defaultMaxAge
            if let text = values["max-age"] {
                guard let v = DurationText.seconds(text) else {
                    throw CLIUsageError("--max-age must be a duration such as 300, 5m or 0 for no limit (got '\(text)')", command: command)
                }
                maxAge = v
            }
            return .command(global, .verifyWebhook(CLIVerifyWebhookOptions(
                secret: secret, signature: try required("signature"), bodyPath: try required("body"), maxAge: maxAge)))
        default:  // "run", the only command left in `commands`
            guard !trailing.isEmpty else { throw CLIUsageError("run needs a command: dispatch run [options] -- CMD [ARGS...]", command: command) }
            if let pattern = values["progress-regex"] {
                guard !switches.contains("no-progress") else {
                    throw CLIUsageError("give either --progress-regex or --no-progress, not both", command: command)
                }
                _ = try CLIProgressExtractor(pattern: pattern)
            }
            let name = values["name"] ?? defaultRunName(trailing)
            let start = CLIStartOptions(
                activityID: values["id"], name: name, symbol: values["symbol"], machine: machine,
                cancelURL: values["cancel-url"], status: values["status"], state: "processing", progress: nil,
                staleAfter: try staleAfter(values, command: command) ?? CLIRunCancel.defaultStaleAfter,
                liveActivity: switches.contains("live-activity"), broadcast: switches.contains("broadcast"))
            var killAfter = CLIRunCancel.defaultKillAfter
            if let text = values["kill-after"] {
                guard let v = DurationText.seconds(text), v <= 86_400 else {
                    throw CLIUsageError("--kill-after must be a duration up to a day, such as 10, 30s or 2m (got '\(text)')", command: command)
                }
                killAfter = v
            }
            if switches.contains("status-from-output"), switches.contains("no-progress") {
                throw CLIUsageError("--status-from-output reads the command's output, which --no-progress leaves alone; give one", command: command)
            }
            return .command(global, .run(CLIRunOptions(start: start, progressRegex: values["progress-regex"],
                                                       readProgress: !switches.contains("no-progress"), command: trailing,
                                                       killAfter: killAfter, statusFromOutput: switches.contains("status-from-output"))))
        }
    }

    static func globalOptions(values: [String: String], switches: Set<String>, environment: (String) -> String?,
                              command: String) throws(CLIUsageError) -> CLIGlobalOptions {
        let urlText = values["url"] ?? environment("DISPATCH_URL").flatMap { $0.isEmpty ? nil : $0 } ?? CLIGlobalOptions.defaultURL
        let endpoint: CLIEndpoint
        do {
            endpoint = try CLIEndpoint.parse(urlText)
        } catch {
            throw CLIUsageError("bad URL '\(urlText)': \(error.message)", command: command)
        }
        let token = values["token"] ?? environment("DISPATCH_TOKEN")
        var retryFor = CLIGlobalOptions.defaultRetryFor
        if let r = values["retry-for"] {
            guard let v = parseNumber(r), v >= 0 else {
                throw CLIUsageError("--retry-for must be a number of seconds >= 0 (got '\(r)')", command: command)
            }
            retryFor = v
        }
        var options = CLIGlobalOptions(endpoint: endpoint, token: (token?.isEmpty ?? true) ? nil : token,
                                       json: switches.contains("json"), retryFor: retryFor)
        options.tokenOnCommandLine = values["token"] != nil
        if values["token"] == nil {
            // --token-file wins over the environment's token; DISPATCH_TOKEN over DISPATCH_TOKEN_FILE.
            if let file = values["token-file"] {
                options.token = nil
                options.tokenFile = file
            } else if options.token == nil, let file = environment("DISPATCH_TOKEN_FILE"), !file.isEmpty {
                options.tokenFile = file
            }
        }
        options.quiet = switches.contains("quiet")
        options.insecureHTTP = switches.contains("insecure-http") || environment("DISPATCH_INSECURE_HTTP") == "1"
        options.caFile = values["cacert"] ?? [environment("DISPATCH_CA_FILE"), environment("CURL_CA_BUNDLE")].lazy
            .compactMap { $0 }.first { !$0.isEmpty }
        if command != "verify-webhook",  // talks to no server
           let refusal = CLITransportPolicy.refusal(endpoint: endpoint, sendsKey: options.token != nil || options.tokenFile != nil,
                                                    insecureHTTP: options.insecureHTTP) {
            throw CLIUsageError(refusal, command: command)
        }
        return options
    }

    /// `--stale-after 10m`: whole seconds in the server's range (10 s to 7 days).
    static func staleAfter(_ values: [String: String], command: String) throws(CLIUsageError) -> Int? {
        guard let text = values["stale-after"] else { return nil }
        guard let v = DurationText.wholeSeconds(text), Validation.staleAfterRange.contains(v) else {
            throw CLIUsageError("--stale-after must be whole seconds from 10 s to 7 days, such as 90, 10m or 2h (got '\(text)')", command: command)
        }
        return v
    }

    /// `--percent 0..100` or `--progress 0..1`, converted to the API's 0...1; both at once is an error.
    static func progress(_ values: [String: String], command: String) throws(CLIUsageError) -> Double? {
        switch (values["percent"], values["progress"]) {
        case (nil, nil):
            return nil
        case (.some, .some):
            throw CLIUsageError("give either --percent or --progress, not both", command: command)
        case (let p?, nil):
            guard let v = parseNumber(p), let fraction = CLIProgress.fraction(fromPercent: v) else {
                throw CLIUsageError("--percent must be a number from 0 to 100 (got '\(p)')", command: command)
            }
            return fraction
        case (nil, let p?):
            guard let v = parseNumber(p), (0...1).contains(v) else {
                throw CLIUsageError("--progress must be a number from 0 to 1 (got '\(p)')", command: command)
            }
            return v
        }
    }

    /// A finite decimal number; no hex, no `nan`/`inf`.
    static func parseNumber(_ s: String) -> Double? {
        let trimmed = s.hasSuffix("%") ? String(s.dropLast()) : s
        guard !trimmed.isEmpty, trimmed.utf8.allSatisfy({ (0x30...0x39).contains($0) || $0 == 0x2E || $0 == 0x2D || $0 == 0x2B || $0 == 0x65 || $0 == 0x45 }),
              let v = Double(trimmed), v.isFinite else { return nil }
        return v
    }

    /// `run`'s activity name when `--name` is absent: the command line, cut to the API's 200 characters.
    public static func defaultRunName(_ command: [String]) -> String {
        let joined = CLIText.oneLine(command.joined(separator: " ")).cliTrimmed()
        let name = joined.isEmpty ? "command" : joined
        return name.count <= 200 ? name : String(name.prefix(199)) + "…"
    }
}

extension String {
    func cliTrimmed() -> String {
        var s = Substring(self)
        while s.first == " " || s.first == "\t" { s = s.dropFirst() }
        while s.last == " " || s.last == "\t" { s = s.dropLast() }
        return String(s)
    }
}
