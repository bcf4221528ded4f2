#if canImport(Glibc)
import Glibc
#endif
import DispatchCore

/// `dispatch`: the publishing and watching CLI. Parsing and every decision live in
/// DispatchCore (CLI+*.swift); this target is the thin IO shell around them.

// SwiftPM links this module into the test bundle and renames its entry point `dispatch_main`,
// which is also libdispatch's `dispatch_main()`; the Swift Testing runner's async main calls
// that and lands here. Inside a test bundle, hand over to the real libdispatch function.
// (Renaming the target, with the product still called `dispatch`, removes the clash.)
if CommandLine.arguments.first?.hasSuffix(".xctest") == true,
   let real = dlsym(UnsafeMutableRawPointer(bitPattern: -1), "dispatch_main") {  // RTLD_NEXT
    unsafeBitCast(real, to: (@convention(c) () -> Void).self)()
    exit(0)  // not reached: dispatch_main() never returns
}

let arguments = Array(CommandLine.arguments.dropFirst())
let invocation: CLIInvocation
do {
    invocation = try CLIArguments.parse(arguments, environment: System.environment)
} catch {
    Output.err("dispatch: \(error.message)")
    Output.err("Try 'dispatch \(error.command.map { "\($0) " } ?? "")--help'.")
    exit(CLIExitCode.usage.rawValue)
}

switch invocation {
case .help(let topic):
    Output.out(CLIHelp.text(for: topic))
    exit(0)
case .version:
    Output.out(CLIHelp.version)
    exit(0)
case .command(let global, let command):
    let client = Client(global: global)
    let code: Int32
    switch command {
    case .start(let o): code = PublishCommands.start(o, client: client).rawValue
    case .progress(let o): code = PublishCommands.progress(o, client: client).rawValue
    case .end(let o): code = PublishCommands.end(o, client: client).rawValue
    case .watch(let o): code = WatchCommand(options: o, client: client).run()
    case .run(let o): code = RunCommand(options: o, client: client).run()
    }
    exit(code)
}
