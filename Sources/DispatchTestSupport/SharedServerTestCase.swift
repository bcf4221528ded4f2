import XCTest

/// One shared dispatchd per test class, for the tests that neither restart nor break their
/// server: started in the class's `setUp`, ended in its `tearDown`. A server that fails to
/// start fails each test with the start's error (from `server()`), not the whole run.
open class SharedServerTestCase: XCTestCase {
    public enum Ending: Sendable {
        /// SIGTERM and wait: graceful shutdown.
        case stop
        /// SIGKILL: cleanup only, where graceful shutdown is not the subject.
        case kill
    }

    /// Subclasses' classes run one after another, so one slot serves them all.
    nonisolated(unsafe) private static var shared: TestServer?
    nonisolated(unsafe) private static var startError: Error?

    /// How the class's server ends.
    open class var sharedServerEnding: Ending { .stop }

    override open class func setUp() {
        super.setUp()
        startError = nil
        do { shared = try TestServer.start() } catch { startError = error }
    }

    override open class func tearDown() {
        switch sharedServerEnding {
        case .stop: shared?.stop()
        case .kill: shared?.kill()
        }
        shared = nil
        super.tearDown()
    }

    /// The class's server, or the error that kept it from starting.
    public func server() throws -> TestServer {
        guard let s = Self.shared else { throw Self.startError ?? XCTSkip("no server") }
        return s
    }
}
