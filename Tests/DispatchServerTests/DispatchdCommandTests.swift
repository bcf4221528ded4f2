@testable import DispatchServer
import XCTest

final class DispatchdCommandTests: XCTestCase {
    private func parse(_ argv: [String]) -> DispatchdInvocation {
        DispatchdInvocation.parse(argv) { arg in ServerConfig.settings.contains { arg == $0.flag || arg.hasPrefix($0.flag + "=") } }
    }

    func testArgvTable() {
        let table: [([String], DispatchdInvocation)] = [
            ([], .run(.serve, serverArguments: [], commandArguments: [])),
            (["--listen", "127.0.0.1:0"], .run(.serve, serverArguments: ["--listen", "127.0.0.1:0"], commandArguments: [])),
            (["serve", "--workers", "2"], .run(.serve, serverArguments: ["--workers", "2"], commandArguments: [])),
            (["migrate"], .run(.migrate, serverArguments: [], commandArguments: [])),
            (["check", "--listen=127.0.0.1:9"], .run(.check, serverArguments: ["--listen=127.0.0.1:9"], commandArguments: [])),
            (["help"], .help), (["migrate", "-h"], .help), (["keys", "list", "--help"], .help),
            (["--version"], .version), (["version"], .version),
            (["sevre", "--workers", "2"], .unknown("sevre", serverArguments: ["--workers", "2"])),
            // An admin command's own options stay its own; server settings go to the server, with their values.
            (["keys", "create", "--name", "ci", "--database-url", "postgres://x", "--scope", "publish"],
             .run(.keys, serverArguments: ["--database-url", "postgres://x"], commandArguments: ["create", "--name", "ci", "--scope", "publish"])),
            (["webhooks", "status", "--data-dir=/d", "--limit", "5"],
             .run(.webhooks, serverArguments: ["--data-dir=/d"], commandArguments: ["status", "--limit", "5"])),
            (["push", "status", "--database-url"], .run(.push, serverArguments: ["--database-url"], commandArguments: ["status"])),
        ]
        for (argv, expected) in table {
            XCTAssertEqual(parse(argv), expected, "\(argv)")
        }
    }

    func testEveryCommandIsInTheHelpAndOnlyAdminCommandsSkipCreatingADatabase() {
        let usage = ServerConfig.usage()
        for command in DispatchdCommand.allCases {
            XCTAssertTrue(usage.contains(command == .serve ? "  dispatchd [options]  " : "  dispatchd \(command.rawValue) "), "\(command)")
        }
        XCTAssertTrue(usage.contains("\n  dispatchd push status               the Live Activity push outbox"), usage)
        XCTAssertEqual(DispatchdCommand.allCases.filter(\.isAdmin), [.keys, .webhooks, .push])
    }
}
