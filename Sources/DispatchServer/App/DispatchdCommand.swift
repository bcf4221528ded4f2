/// dispatchd's commands: what argv asks for, and the Usage lines of `--help`, from one list.
enum DispatchdCommand: String, CaseIterable, Sendable {
    case serve, migrate, check, keys, webhooks, push

    /// Commands that work on an existing database and must never create one. Their own
    /// options come first on the command line; server settings may follow.
    var isAdmin: Bool {
        switch self {
        case .keys, .webhooks, .push: return true
        case .serve, .migrate, .check: return false
        }
    }

    /// The Usage lines: the invocation and, when it fits on the line, what it does.
    var usage: [(String, String)] {
        switch self {
        case .serve: return [("dispatchd [options]", "serve (runs migrations first)")]
        case .migrate: return [("dispatchd migrate [options]", "apply database migrations and exit")]
        case .check: return [("dispatchd check [options]", "exit 0 when the server on --listen is ready (health checks)")]
        case .keys:
            return [("dispatchd keys create --name NAME --scope SCOPE[,SCOPE] [--machine M]", ""), ("dispatchd keys list", ""),
                    ("dispatchd keys revoke NAME", "")]
        case .webhooks:
            return [("dispatchd webhooks status [--state pending|delivered|failed] [--limit N]", ""), ("dispatchd webhooks retry DELIVERY_ID", "")]
        case .push: return [("dispatchd push status", "the Live Activity push outbox: pending, failed, up to date")]
        }
    }

    /// The Usage section of `--help`, in the order of the commands.
    static var usageLines: String {
        var lines: [(String, String)] = []
        for command in allCases {
            lines += command.usage
            if command == .check { lines.append(("dispatchd --version", "the release and the commit it was built from")) }
        }
        return lines.map { invocation, help in
            help.isEmpty ? "  \(invocation)\n" : "  \(invocation.padding(35)) \(help)\n"
        }.joined()
    }
}

/// One dispatchd command line, parsed.
enum DispatchdInvocation: Equatable {
    case help
    case version
    /// `serverArguments` are server settings (`--database-url`...); `commandArguments` an admin
    /// command's own (`create --name ci`).
    case run(DispatchdCommand, serverArguments: [String], commandArguments: [String])
    /// A first word that names no command (reported once the settings are read, as before).
    case unknown(String, serverArguments: [String])

    /// `isSetting` tells a server setting's flag (with or without `=value`) among an admin
    /// command's arguments.
    static func parse(_ arguments: [String], isSetting: (String) -> Bool) -> DispatchdInvocation {
        if arguments.contains("--help") || arguments.contains("-h") || arguments.first == "help" { return .help }
        if arguments.first == "--version" || arguments.first == "version" { return .version }
        guard let first = arguments.first, !first.hasPrefix("-") else {
            return .run(.serve, serverArguments: arguments, commandArguments: [])
        }
        let rest = Array(arguments.dropFirst())
        guard let command = DispatchdCommand(rawValue: first) else { return .unknown(first, serverArguments: rest) }
        guard command.isAdmin else { return .run(command, serverArguments: rest, commandArguments: []) }
        var own = rest
        var settings: [String] = []
        var i = 0
        while i < own.count {
            if isSetting(own[i]) {
                let takesValue = !own[i].contains("=")
                settings.append(own.remove(at: i))
                if takesValue, i < own.count { settings.append(own.remove(at: i)) }
            } else {
                i += 1
            }
        }
        return .run(command, serverArguments: settings, commandArguments: own)
    }
}
