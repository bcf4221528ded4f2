import DispatchSystem
import DispatchTestSupport
import Glibc
import XCTest

/// Real tools against a real server: the Activities view in headless Chromium (Selenium), and
/// schemathesis against /openapi.json. Both are installed by `scripts/install-deps.sh`
/// (`make test` runs it): Debian's chromium and chromium-driver, and a Python venv in
/// .build/pyenv with Tests/tools/requirements.txt.
final class BrowserToolsTests: XCTestCase {
    var python: String { TestPaths.repositoryRoot + "/.build/pyenv/bin/python" }
    var tools: String { TestPaths.repositoryRoot + "/Tests/tools" }

    override func setUpWithError() throws {
        guard access(python, X_OK) == 0 else {
            throw TestError("\(python) is missing: run scripts/install-deps.sh (make test does)")
        }
    }

    /// Sign in (the key traded for a session cookie), watch rows, bars, badges and the finished
    /// list follow the API, a stalled row, the 1,200-event history paged to the first event,
    /// the chart, the phone's view, cancel and end behind a confirmation, what read and publish
    /// keys may do, deep links and filters across reloads, dark and mobile layouts, no key in
    /// any request URL or web storage, and a server restart. Writes the screenshots in docs/.
    func testActivitiesViewInChromium() throws {
        // With APNs (a fake): the page shows the phone's view only where phones get pushes.
        let apns = try FakeAPNs.start()
        defer { apns.stop() }
        let s = try TestServer.start(environment: ["DISPATCH_PUBLISH_RATE": "0"].merging(apns.serverEnvironment) { $1 })
        defer { s.stop() }
        let control = "/tmp/dispatch-browser-\(getpid())-\(s.port)"
        _ = Subprocess.run(["rm", "-rf", control])
        XCTAssertEqual(mkdir(control, 0o700), 0)
        defer { _ = Subprocess.run(["rm", "-rf", control]) }
        let docs = TestPaths.repositoryRoot + "/docs"
        let (output, status, restarted) = try runWithRestarts(s, control: control,
            "exec '\(python)' '\(tools)/browser_test.py' main '\(s.baseURL)' '\(s.adminKey)' '\(docs)' '\(control)'")
        print(output)
        XCTAssertEqual(status, 0, troubleFirst(output))
        XCTAssertTrue(restarted, "the script asked for a restart")
        XCTAssertTrue(output.contains("0 failed"), troubleFirst(output))
    }

    /// web/dispatch.js imported into a signed-in page: watchActivity on an unknown id (one
    /// request, no reconnects), a failed job's `error` event, a resume past the end (204), an
    /// ActivityFeed through a `reset`, a filter, a job ending with no listener, and a server
    /// restart mid-stream (every seq once, the feed resumed by position).
    func testDispatchModuleInChromium() throws {
        let s = try TestServer.start(environment: ["DISPATCH_PUBLISH_RATE": "0"])
        defer { s.stop() }
        let control = "/tmp/dispatch-module-\(getpid())-\(s.port)"
        _ = Subprocess.run(["rm", "-rf", control])
        XCTAssertEqual(mkdir(control, 0o700), 0)
        defer { _ = Subprocess.run(["rm", "-rf", control]) }
        let (output, status, restarted) = try runWithRestarts(s, control: control,
            "exec '\(python)' '\(tools)/dispatch_js_test.py' '\(s.baseURL)' '\(s.adminKey)' '\(control)'")
        print(output)
        XCTAssertEqual(status, 0, troubleFirst(output))
        XCTAssertTrue(restarted, "the script asked for a restart")
        XCTAssertTrue(output.contains(" passed, 0 failed"), troubleFirst(output))
    }

    /// The Activities view's rough edges at 390x844 and 1440x900 (Tests/tools/view_edges_test.py):
    /// nothing overflows a row, the ETA and the stalled hint are whole, a queued job is never
    /// stalled, unknown and invalid ids, the Dynamic Island's title and failed bar, the chart's
    /// labels and single point, no 401 for a visitor. Screenshots: .build/browser-shots/.
    /// Run twice: on a server pushing to a fake APNs (the phone's view checked), and on one
    /// without APNs (the phone panels give way to a note).
    func testActivitiesViewEdgesInChromium() throws {
        let apns = try FakeAPNs.start()
        defer { apns.stop() }
        for withAPNs in [true, false] {
            let s = try TestServer.start(environment: ["DISPATCH_PUBLISH_RATE": "0"].merging(withAPNs ? apns.serverEnvironment : [:]) { $1 })
            defer { s.stop() }
            let shots = TestPaths.repositoryRoot + "/.build/browser-shots/" + (withAPNs ? "apns" : "no-apns")
            _ = Subprocess.run(["mkdir", "-p", shots])
            let r = Subprocess.run(["/bin/sh", "-c", "exec '\(python)' '\(tools)/view_edges_test.py' '\(s.baseURL)' '\(s.adminKey)' '\(shots)' "
                + (withAPNs ? "apns" : "none") + " 2>&1"])
            print(r.output)
            XCTAssertEqual(r.status, 0, troubleFirst(r.output))
            XCTAssertTrue(r.output.contains(" passed, 0 failed"), troubleFirst(r.output))
        }
    }

    /// A script's output with what went wrong first (its FAIL line, a traceback), then the
    /// whole of it: a failure summary that shows one line shows the one that matters.
    private func troubleFirst(_ output: String) -> String {
        let trouble = output.split(separator: "\n").filter { !$0.hasPrefix("ok ") && !$0.hasPrefix("browser: ") }.suffix(6)
        return (trouble.isEmpty ? "" : trouble.joined(separator: " | ") + "\n") + output
    }

    /// Runs `command` (its output into CONTROL/output.txt), restarting the server once when it
    /// writes CONTROL/restart and answering with CONTROL/restarted.
    private func runWithRestarts(_ s: TestServer, control: String, _ command: String) throws -> (String, Int32, Bool) {
        let out = control + "/output.txt"
        guard let pid = Subprocess.start(["/bin/sh", "-c", command + " > '\(out)' 2>&1"]) else { throw TestError("cannot start python") }
        var restarted = false
        var status: Int32 = 0
        let deadline = Clock.monotonic() + 300
        while waitpid(pid, &status, WNOHANG) == 0 {
            if !restarted && access(control + "/restart", F_OK) == 0 {
                try s.restart()
                restarted = true
                _ = Subprocess.run(["touch", control + "/restarted"])
            }
            if Clock.monotonic() > deadline {
                kill(pid, SIGKILL)
                _ = Subprocess.wait(pid)
                throw TestError("took over 300 s: \(Files.read(out) ?? "")")
            }
            usleep(50_000)
        }
        return (Files.read(out) ?? "", Subprocess.exitCode(status), restarted)
    }

    /// 50,000 activities (written straight into the real schema, copies of one the API made):
    /// the page loads them all, goes Live, draws only the rows on screen, scrolls end to end
    /// and still shows an update and a new job at once.
    func testFiftyThousandActivitiesInChromium() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        let count = 50_000
        try s.startActivity("template", extra: #","machine":"farm","systemImage":"cpu","initialProgress":0.3,"status":"working""#)
        let pg = try TestPostgres.shared()
        // Every column copied from the template's row, so the bulk follows the schema as it is.
        _ = try pg.sql(s.conninfo, """
            INSERT INTO activities SELECT (jsonb_populate_record(NULL::activities, to_jsonb(t) || jsonb_build_object(
                'activity_id', 'bulk-' || i, 'task_name', 'Bulk job ' || i, 'machine', 'farm-' || (i % 7),
                'created_ms', t.created_ms - i * 1000, 'updated_ms', t.updated_ms - i * 10,
                'ended_ms', CASE WHEN i % 10 = 0 THEN t.updated_ms - i * 5 END,
                'state', CASE WHEN i % 10 = 0 THEN 'completed' ELSE t.state END))).*
            FROM activities t, generate_series(1, \(count)) i WHERE t.activity_id = 'template'
            """, timeout: 300)
        _ = try pg.sql(s.conninfo, """
            INSERT INTO activity_events SELECT (jsonb_populate_record(NULL::activity_events, to_jsonb(e) || jsonb_build_object(
                'activity_id', a.activity_id, 'event', a.state, 'position', nextval('feed_positions'), 'created_ms', a.updated_ms,
                'data', (e.data::jsonb || jsonb_build_object('activityId', a.activity_id, 'taskName', a.task_name, 'machine', a.machine,
                    'state', a.state, 'createdAt', to_char(to_timestamp(a.created_ms / 1000.0) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
                    'updatedAt', to_char(to_timestamp(a.updated_ms / 1000.0) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
                    'endedAt', CASE WHEN a.ended_ms IS NULL THEN NULL
                        ELSE to_char(to_timestamp(a.ended_ms / 1000.0) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') END))::text))).*
            FROM activities a JOIN activity_events e ON e.activity_id = 'template' AND e.seq = 1
            WHERE a.activity_id LIKE 'bulk-%' ORDER BY a.updated_ms
            """, timeout: 300)
        XCTAssertEqual(try pg.sql(s.conninfo, "SELECT count(*) FROM activities").first?.first, String(count + 1))
        let r = Subprocess.run(["/bin/sh", "-c", "exec '\(python)' '\(tools)/browser_test.py' scale '\(s.baseURL)' '\(s.adminKey)' \(count) 2>&1"])
        print(r.output)
        XCTAssertEqual(r.status, 0, troubleFirst(r.output))
        XCTAssertTrue(r.output.contains("0 failed"), troubleFirst(r.output))
    }

    /// Every documented answer conforms to /openapi.json and no generated input gets a 5xx
    /// (see Tests/tools/schemathesis.toml for the one allowed 501). Streams are left out
    /// (they do not end), and so is key revocation (it could revoke the key the run uses).
    func testSchemathesisAgainstOpenAPI() throws {
        let s = try TestServer.start(environment: ["DISPATCH_PUBLISH_RATE": "0"])
        defer { s.stop() }
        let r = Subprocess.run([
            TestPaths.repositoryRoot + "/.build/pyenv/bin/schemathesis", "--config-file", tools + "/schemathesis.toml", "run",
            s.baseURL + "/openapi.json", "-H", "Authorization: Bearer \(s.adminKey)",
            "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
            "--exclude-path-regex", "/status$|^/v1/stream$|^/v1/keys/",
            "--max-examples", "30", "--phases", "examples,coverage,fuzzing", "--request-timeout", "5", "-w", "1",
            "--seed", "20261130",
        ], environment: Subprocess.currentEnvironment().merging(["NO_COLOR": "1"]) { $1 })
        XCTAssertEqual(r.status, 0, troubleFirst(r.output))
        XCTAssertTrue(r.output.contains("passed"), troubleFirst(r.output))
    }
}
