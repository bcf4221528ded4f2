import DispatchSystem
import DispatchTestSupport
import Foundation
import Glibc
import XCTest

/// Issue 36: the embedded PostgreSQL keeps its promises. Killed at any step of start-up,
/// dispatchd leaves no `postgres` behind; a data dir that was moved in part, or is another
/// user's, is said plainly (exit 2) and nothing is started.
final class EmbeddedStartupTests: XCTestCase {
    var dirs: [String] = []

    override func tearDown() {
        for dir in dirs {
            let ctl = "/usr/lib/postgresql/15/bin/pg_ctl"
            _ = Subprocess.run((getuid() == 0 ? ["runuser", "-u", "postgres", "--"] : []) + [ctl, "-D", dir + "/pg", "-m", "immediate", "stop"])
            _ = Subprocess.run(["rm", "-rf", dir, dir + ".log"])
        }
    }

    func freshDir() -> String {
        let dir = "/tmp/dispatch-startup-\(getpid())-\(Int.random(in: 0..<1_000_000))"
        dirs.append(dir)
        return dir
    }

    func environment(_ dir: String, port: Int) -> [String: String] {
        var env = Subprocess.currentEnvironment()
        env["DATABASE_URL"] = nil
        env["DISPATCH_DATA_DIR"] = dir
        env["DISPATCH_LISTEN"] = "127.0.0.1:\(port)"
        env["DISPATCH_WORKERS"] = "1"
        env["DISPATCH_LOG_LEVEL"] = "info"
        return env
    }

    /// Whether a postmaster serves `dir`'s cluster.
    func postgresRunning(_ dir: String) -> Bool {
        Subprocess.run(["pgrep", "-f", "--", "-D \(dir)/pg"]).status == 0
    }

    func testKilledAtEveryStepOfStartUpItLeavesNoPostgres() throws {
        // nil: at once; then as each step is logged as begun or done.
        let steps: [String?] = [nil, "embedded_postgres.initdb", "embedded_postgres.started", "migration.applied", "keys.development",
                                "worker.listening"]
        for step in steps {
            let dir = freshDir()
            let port = try TestServer.freePort()
            let pid = try XCTUnwrap(Subprocess.start(["/bin/sh", "-c", "exec \(TestPaths.binary("dispatchd")) >> \(dir).log 2>&1"],
                                                     environment: environment(dir, port: port)))
            if let step {
                XCTAssertTrue(waitUntil(60) { (Files.read(dir + ".log") ?? "").contains("msg=\(step)") }, "\(step): \(Files.read(dir + ".log") ?? "")")
            } else {
                usleep(50_000)
            }
            kill(pid, SIGKILL)
            _ = Subprocess.wait(pid)
            let gone = waitUntil(20) { !self.postgresRunning(dir) }
            XCTAssertTrue(gone, "dispatchd killed at \(step ?? "its start") left postgres running for \(dir)")
        }
    }

    func testADataDirMovedInPartIsSaidPlainlyAndStartsNothing() throws {
        let dir = freshDir()
        let port = try TestServer.freePort()
        let pid = try XCTUnwrap(Subprocess.start(["/bin/sh", "-c", "exec \(TestPaths.binary("dispatchd")) >> \(dir).log 2>&1"],
                                                 environment: environment(dir, port: port)))
        XCTAssertTrue(waitUntil(60) { (try? HTTPClient(port: port).get("/readyz").status) == 200 }, Files.read(dir + ".log") ?? "")
        kill(pid, SIGTERM)
        XCTAssertNotNil(Subprocess.wait(pid, seconds: 20))
        XCTAssertFalse(postgresRunning(dir), "stopped with its server")

        // The cluster stays, the files beside it went (a newcomer moved part of the data dir).
        XCTAssertEqual(rename(dir + "/pg-password", dir + "-pg-password"), 0)
        defer { unlink(dir + "-pg-password") }
        let t0 = Clock.monotonic()
        let moved = Subprocess.run([TestPaths.binary("dispatchd")], environment: environment(dir, port: try TestServer.freePort()))
        XCTAssertEqual(moved.status, 2, moved.output)
        XCTAssertTrue(moved.output.contains("moved") && moved.output.contains(dir + "/pg-password"), moved.output)
        XCTAssertLessThan(Clock.monotonic() - t0, 10, "said at once")
        XCTAssertFalse(postgresRunning(dir), "nothing started")
        XCTAssertFalse(Files.exists(dir + "/pg-password"), "no new password made up for the old cluster")

        // Put back: it serves again, with the same data.
        XCTAssertEqual(rename(dir + "-pg-password", dir + "/pg-password"), 0)
        let again = try XCTUnwrap(Subprocess.start(["/bin/sh", "-c", "exec \(TestPaths.binary("dispatchd")) >> \(dir).log 2>&1"],
                                                   environment: environment(dir, port: port)))
        XCTAssertTrue(waitUntil(60) { (try? HTTPClient(port: port).get("/readyz").status) == 200 }, Files.read(dir + ".log") ?? "")
        kill(again, SIGTERM)
        XCTAssertNotNil(Subprocess.wait(again, seconds: 20))
    }

    /// A server started while the previous one's watchdog holds the data dir's lock (a moment
    /// for each look, the whole of a cluster's stop) waits for it and serves: it is not refused
    /// as if another server were serving (loaded runs saw exit 1 right after a stop).
    func testAStartWhileThePreviousWatchdogHoldsTheLockWaitsAndServes() throws {
        let dir = freshDir()
        let port = try TestServer.freePort()
        let first = try XCTUnwrap(Subprocess.start(["/bin/sh", "-c", "exec \(TestPaths.binary("dispatchd")) >> \(dir).log 2>&1"],
                                                   environment: environment(dir, port: port)))
        XCTAssertTrue(waitUntil(60) { (try? HTTPClient(port: port).get("/readyz").status) == 200 }, Files.read(dir + ".log") ?? "")
        kill(first, SIGTERM)
        XCTAssertNotNil(Subprocess.wait(first, seconds: 20))

        // What the watchdog does, held longer: flock(1) on the lock.
        let lockPath = dir + "/dispatchd.lock"
        let holder = try XCTUnwrap(Subprocess.start(["flock", lockPath, "sleep", "2"]))
        XCTAssertTrue(waitUntil(10) { Subprocess.run(["flock", "-n", lockPath, "true"]).status != 0 }, "the lock is held")
        let again = try XCTUnwrap(Subprocess.start(["/bin/sh", "-c", "exec \(TestPaths.binary("dispatchd")) >> \(dir).log 2>&1"],
                                                   environment: environment(dir, port: port)))
        XCTAssertTrue(waitUntil(60) { (try? HTTPClient(port: port).get("/readyz").status) == 200 }, Files.read(dir + ".log") ?? "")
        XCTAssertTrue((Files.read(dir + ".log") ?? "").contains("msg=embedded_postgres.lock_wait"))
        XCTAssertEqual(Subprocess.wait(holder), 0)
        kill(again, SIGTERM)
        XCTAssertNotNil(Subprocess.wait(again, seconds: 20))
    }

    func testAnotherUsersDataDirAndAnUnreachableOneAreRefused() throws {
        guard getuid() == 0 else { throw XCTSkip("needs root to make a directory another user's") }
        let dir = freshDir()
        XCTAssertEqual(mkdir(dir, 0o700), 0)
        XCTAssertEqual(Subprocess.run(["chown", "nobody", dir]).status, 0)
        let theirs = Subprocess.run([TestPaths.binary("dispatchd")], environment: environment(dir, port: try TestServer.freePort()))
        XCTAssertEqual(theirs.status, 2, theirs.output)
        XCTAssertTrue(theirs.output.contains("belongs to uid"), theirs.output)
        XCTAssertFalse(postgresRunning(dir))

        // As root, a data dir under a private parent: the postgres user cannot reach it. Said,
        // not moved elsewhere in silence.
        let parent = freshDir()
        XCTAssertEqual(mkdir(parent, 0o700), 0)
        let inside = parent + "/data"
        let unreachable = Subprocess.run([TestPaths.binary("dispatchd")], environment: environment(inside, port: try TestServer.freePort()))
        XCTAssertEqual(unreachable.status, 2, unreachable.output)
        XCTAssertTrue(unreachable.output.contains("cannot reach \(inside)"), unreachable.output)
        XCTAssertFalse(Files.exists("/var/lib/dispatch/" + String(SHA256Hex.of(inside).prefix(16))), "no cluster made elsewhere")
    }
}
