import XCTest
import DispatchCore
import DispatchCLIKit

/// Parsing helpers for the CLI's unit tests (its pure pieces, without a process or a socket).
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
