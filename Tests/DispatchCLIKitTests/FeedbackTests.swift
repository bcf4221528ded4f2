import XCTest
import DispatchCore
import DispatchCLIKit

/// What the CLI says when something is missing or slow (issue 14, "Feedback").
final class CLIFeedbackTests: XCTestCase {
    func testMissingTokenSaysWhatToSetAndWhereTheDevelopmentKeyIs() {
        let elsewhere = CLIFeedback.missingToken(devKeyHere: false)
        for fragment in ["DISPATCH_TOKEN", "--token-file", "--token", "local development server", "./.dispatch/dev-key"] {
            XCTAssertTrue(elsewhere.contains(fragment), "\(fragment) in: \(elsewhere)")
        }
        XCTAssertFalse(elsewhere.contains("export"))
        XCTAssertTrue(CLIFeedback.missingToken(devKeyHere: true).hasSuffix("there is one here: export DISPATCH_TOKEN=$(cat .dispatch/dev-key)"))
    }

    /// `--quiet` silences notes only where nobody watches: on a terminal they still show.
    func testNotesAreQuietOnlyWhenAskedAndNotOnATerminal() {
        XCTAssertTrue(CLIFeedback.showNotes(quiet: false, stderrIsTerminal: false))
        XCTAssertTrue(CLIFeedback.showNotes(quiet: false, stderrIsTerminal: true))
        XCTAssertTrue(CLIFeedback.showNotes(quiet: true, stderrIsTerminal: true))
        XCTAssertFalse(CLIFeedback.showNotes(quiet: true, stderrIsTerminal: false))
        XCTAssertEqual(CLIFeedback.retrying("cannot connect to http://127.0.0.1:8080: connection refused", budget: 30),
                       "cannot connect to http://127.0.0.1:8080: connection refused; retrying for up to 30s…")
        XCTAssertEqual(CLIFeedback.retrying("x", budget: 0.5), "x; retrying for up to 1s…")
        XCTAssertEqual(CLIFeedback.retrying("x", budget: 600), "x; retrying for up to 10m00s…")
    }

    func testQuietIsAGlobalFlag() throws {
        XCTAssertTrue(try command(["--quiet", "progress", "--id", "a"]).0.quiet)
        XCTAssertTrue(try command(["progress", "--id", "a", "--quiet"]).0.quiet)
        XCTAssertFalse(try command(["progress", "--id", "a"]).0.quiet)
    }
}
