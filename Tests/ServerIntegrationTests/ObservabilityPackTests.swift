import DispatchCore
import DispatchSystem
import DispatchTestSupport
import Glibc
import XCTest

/// contrib/'s observability pack against the real tools: promtool checks the rules, their
/// unit tests and the scrape example; Debian's prometheus scrapes a live dispatchd under a
/// little load, and every dashboard query and every rule expression must return data from it.
final class ObservabilityPackTests: XCTestCase {
    var contrib: String { TestPaths.repositoryRoot + "/contrib" }

    override func setUpWithError() throws {
        for tool in ["/usr/bin/promtool", "/usr/bin/prometheus"] where access(tool, X_OK) != 0 {
            throw TestError("\(tool) is missing: run scripts/install-deps.sh --tests (Debian's prometheus)")
        }
    }

    func testPromtoolChecksTheRulesTheirTestsAndTheScrapeExample() {
        let rules = Subprocess.run(["/usr/bin/promtool", "check", "rules", contrib + "/prometheus/alerts.yml"])
        XCTAssertEqual(rules.status, 0, rules.output)
        XCTAssertTrue(rules.output.contains("SUCCESS: 9 rules found"), rules.output)
        let tests = Subprocess.run(["/usr/bin/promtool", "test", "rules", contrib + "/prometheus/alerts_test.yml"])
        XCTAssertEqual(tests.status, 0, tests.output)
        XCTAssertTrue(tests.output.contains("SUCCESS"), tests.output)
        let config = Subprocess.run(["/usr/bin/promtool", "check", "config", contrib + "/prometheus/prometheus.yml"])
        XCTAssertEqual(config.status, 0, config.output)
    }

    /// Every alert has a test that makes it fire and one that keeps it quiet.
    func testEveryAlertFiresAndStaysQuietInItsUnitTests() throws {
        let names = try alertNames()
        XCTAssertEqual(names.count, 9)
        let tests = try XCTUnwrap(Files.read(contrib + "/prometheus/alerts_test.yml"))
        for name in names {
            let blocks = tests.components(separatedBy: "alertname: \(name)").dropFirst()
            XCTAssertTrue(blocks.contains { $0.hasPrefix(", exp_alerts: []") }, "\(name) has no quiet case")
            XCTAssertTrue(blocks.contains { $0.hasPrefix("\n        exp_alerts:\n          - exp_labels") }, "\(name) has no firing case")
        }
    }

    func testEveryDashboardQueryAndRuleReturnsDataFromALiveServer() throws {
        let apns = try FakeAPNs.start()
        defer { apns.stop() }
        let receiver = try WebhookReceiver()
        defer { receiver.stop() }
        let s = try TestServer.start(environment: apns.serverEnvironment.merging([
            "DISPATCH_WEBHOOK_SECRET": "observability-pack-secret", "DISPATCH_WEBHOOK_ALLOW_PRIVATE": "1", "DISPATCH_PUBLISH_RATE": "0",
        ]) { $1 })
        defer { s.stop() }

        let dir = "/tmp/dispatch-prometheus-\(getpid())"
        _ = Subprocess.run(["rm", "-rf", dir])
        XCTAssertEqual(mkdir(dir, 0o700), 0)
        defer { _ = Subprocess.run(["rm", "-rf", dir]) }
        let promPort = try TestServer.freePort()
        try Files.write(dir + "/prometheus.yml", """
            global: {scrape_interval: 1s, evaluation_interval: 1s}
            rule_files: ["\(contrib)/prometheus/alerts.yml"]
            scrape_configs:
              - job_name: dispatch
                static_configs: [{targets: ["127.0.0.1:\(s.port)"]}]
            """, mode: 0o600)
        let prometheus = try XCTUnwrap(Subprocess.start(["/bin/sh", "-c", """
            exec /usr/bin/prometheus --config.file=\(dir)/prometheus.yml --storage.tsdb.path=\(dir)/data \
              --web.listen-address=127.0.0.1:\(promPort) > \(dir)/prometheus.log 2>&1
            """]))
        defer { kill(prometheus, SIGTERM); _ = Subprocess.wait(prometheus) }

        // A little load: starts, updates, endings (one in error), a cancel with a webhook, a stream.
        let stream = try s.stream("pack-0")
        defer { stream.close() }
        for i in 0..<6 {
            try s.startActivity("pack-\(i)", extra: #","machine":"m\#(i % 2)","cancelURL":"http://127.0.0.1:\#(receiver.port)/cancel""#)
            XCTAssertEqual(try s.update("pack-\(i)", #"{"progress":0.3,"status":"working"}"#).status, 200)
        }
        XCTAssertEqual(try s.end("pack-0").status, 200)
        XCTAssertEqual(try s.end("pack-1", #"{"state":"error","error":"disk full"}"#).status, 200)
        XCTAssertEqual(try s.client.post("/v1/activities/pack-2/cancel", #"{"reason":"enough"}"#).status, 202)
        XCTAssertEqual(try s.client.get("/v1/activities/nope").status, 404)
        XCTAssertTrue(try stream.waitForEnd(timeout: 10), "the stream ends with its activity")

        let api = HTTPClient(port: promPort)
        XCTAssertTrue(try waitUntil(30) { (try? api.get("/-/ready"))?.status == 200 }, Files.read(dir + "/prometheus.log") ?? "")
        // Enough scrapes for every rate() window to hold two samples, and the rules evaluated.
        XCTAssertTrue(try waitUntil(30) { try query(api, "count(dispatch_webhook_outbox_pending) and count(dispatch_activities_live)") > 0 },
                      "the live count and the webhook outbox show in /metrics")
        for i in 3..<6 { XCTAssertEqual(try s.update("pack-\(i)", #"{"progress":0.6}"#).status, 200) }

        // Every panel and rule has data once Prometheus scraped those updates twice over: asked
        // again until then (or 30 s).
        var empty: [String] = []
        var checked = 0
        func look() throws {
            empty = []
            checked = 0
            for expr in try dashboardQueries() {
                checked += 1
                if try query(api, expr) == 0 { empty.append("panel: " + expr) }
            }
            for expr in try ruleExpressions() {
                checked += 1
                if try query(api, Self.comparisonsAsBool(expr)) == 0 { empty.append("rule: " + expr) }
            }
        }
        _ = try waitUntil(30) { try look(); return empty.isEmpty }
        XCTAssertTrue(empty.isEmpty, "queries without data:\n" + empty.joined(separator: "\n"))
        XCTAssertGreaterThanOrEqual(checked, 40)
        // And Prometheus itself loaded and evaluated every rule without an error.
        let rules = try api.get("/api/v1/rules").text
        XCTAssertEqual(rules.components(separatedBy: #""health":"ok""#).count - 1, 9, rules)
    }

    /// The number of series an instant query returns.
    func query(_ api: HTTPClient, _ expr: String) throws -> Int {
        let r = try api.get("/api/v1/query?query=" + Self.percentEncode(expr))
        guard r.status == 200, case .array(let result)? = r.json?["data"]?["result"] else {
            XCTFail("query failed (\(r.status)): \(expr): \(r.text)")
            return 0
        }
        return result.count
    }

    func dashboardQueries() throws -> [String] {
        let text = try XCTUnwrap(Files.read(contrib + "/grafana/dispatch-dashboard.json"))
        let doc = try JSONParser.parse(Array(text.utf8))
        guard case .array(let panels)? = doc["panels"] else { throw TestError("no panels") }
        var exprs: [String] = []
        var withoutTargets: [String] = []
        for panel in panels {
            guard case .string(let type)? = panel["type"], type != "row" else { continue }
            guard case .array(let targets)? = panel["targets"], !targets.isEmpty else { withoutTargets.append("\(panel)"); continue }
            for t in targets { if case .string(let e)? = t["expr"] { exprs.append(e) } }
        }
        XCTAssertTrue(withoutTargets.isEmpty, "panels without a query: \(withoutTargets)")
        // Every part of the deployment the pack promises has its panels.
        for family in ["dispatch_activities_live", "dispatch_streams_active", "dispatch_events_published_total", "dispatch_db_query_seconds",
                       "dispatch_push_sent_total", "dispatch_webhook_outbox_pending", "dispatch_carrier_up", "dispatch_carrier_messages_total"] {
            XCTAssertTrue(exprs.contains { $0.contains(family) }, "no panel reads \(family)")
        }
        return exprs
    }

    func alertNames() throws -> [String] {
        let text = try XCTUnwrap(Files.read(contrib + "/prometheus/alerts.yml"))
        return text.split(separator: "\n").compactMap { line in
            let t = line.drop { $0 == " " }
            return t.hasPrefix("- alert: ") ? String(t.dropFirst(9)) : nil
        }
    }

    /// The `expr` of every rule (one line, or a `|` block).
    func ruleExpressions() throws -> [String] {
        let lines = try XCTUnwrap(Files.read(contrib + "/prometheus/alerts.yml")).split(separator: "\n", omittingEmptySubsequences: false)
        var exprs: [String] = []
        var i = 0
        while i < lines.count {
            let line = lines[i]
            let indent = line.prefix { $0 == " " }.count
            let t = line.dropFirst(indent)
            i += 1
            guard t.hasPrefix("expr:") else { continue }
            let rest = t.dropFirst(5).drop { $0 == " " }
            guard rest == "|" else { exprs.append(String(rest)); continue }
            var block: [String] = []
            while i < lines.count, lines[i].prefix(while: { $0 == " " }).count > indent || lines[i].isEmpty {
                block.append(lines[i].drop { $0 == " " }.description)
                i += 1
            }
            exprs.append(block.joined(separator: " "))
        }
        XCTAssertEqual(exprs.count, try alertNames().count)
        return exprs
    }

    /// An alert expression filters: healthy, it returns nothing. With `bool` after each
    /// comparison it answers 0 or 1 instead, so it returns data exactly when every series it
    /// reads exists. Label matchers (inside braces) and strings are left alone.
    static func comparisonsAsBool(_ expr: String) -> String {
        let c = Array(expr)
        var out = ""
        var depth = 0
        var quote: Character?
        var i = 0
        while i < c.count {
            let ch = c[i]
            if let q = quote {
                out.append(ch)
                if ch == "\\", i + 1 < c.count { out.append(c[i + 1]); i += 2; continue }
                if ch == q { quote = nil }
                i += 1
                continue
            }
            switch ch {
            case "\"", "'", "`": quote = ch
            case "{": depth += 1
            case "}": depth -= 1
            default: break
            }
            if depth == 0, "<>=!".contains(ch) {
                let two = i + 1 < c.count ? String([ch, c[i + 1]]) : String(ch)
                let op = [">=", "<=", "==", "!="].contains(two) ? two : (ch == ">" || ch == "<" ? String(ch) : "")
                if !op.isEmpty {
                    out += op + " bool"
                    i += op.count
                    continue
                }
            }
            out.append(ch)
            i += 1
        }
        return out
    }

    static func percentEncode(_ s: String) -> String {
        var out = ""
        for b in s.utf8 {
            switch b {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
                 UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"):
                out.unicodeScalars.append(Unicode.Scalar(b))
            default:
                out += "%" + String(b, radix: 16, uppercase: true).leftPadded(2)
            }
        }
        return out
    }

    func testComparisonsBecomeBoolOutsideMatchers() {
        XCTAssertEqual(Self.comparisonsAsBool(#"min by (instance) (up{job!="x"}) == 0"#), #"min by (instance) (up{job!="x"}) == bool 0"#)
        XCTAssertEqual(Self.comparisonsAsBool(#"a / (b >= 4) > 0.25"#), #"a / (b >= bool 4) > bool 0.25"#)
        XCTAssertEqual(Self.comparisonsAsBool(#"x{r=~"a|b"} > 0 and on() y < 2"#), #"x{r=~"a|b"} > bool 0 and on() y < bool 2"#)
    }
}

private extension String {
    func leftPadded(_ n: Int) -> String { count >= n ? self : String(repeating: "0", count: n - count) + self }
}

/// docs/metrics.md against a live server's /metrics (issue 36: four families were missing).
final class MetricsDocTests: XCTestCase {
    /// The families a /metrics page declares (`# TYPE name kind`).
    static func families(_ page: String) -> Set<String> {
        Set(page.split(separator: "\n").compactMap { line -> String? in
            let parts = line.split(separator: " ")
            guard parts.count >= 3, parts[0] == "#", parts[1] == "TYPE" else { return nil }
            return String(parts[2])
        })
    }

    /// The series names docs/metrics.md's tables list (first column, in backquotes), with
    /// histograms' `_bucket`/`_sum`/`_count` folded into their family.
    static func documented() throws -> Set<String> {
        let doc = try XCTUnwrap(Files.read(TestPaths.repositoryRoot + "/docs/metrics.md"))
        var out = Set<String>()
        for line in doc.split(separator: "\n") where line.hasPrefix("| `dispatch_") || line.hasPrefix("| `process_") {
            let cell = line.dropFirst(2).prefix { $0 != "|" }
            for part in cell.split(separator: "`") where part.hasPrefix("dispatch_") || part.hasPrefix("process_") {
                out.insert(String(part.prefix { $0 == "_" || $0.isLetter || $0.isNumber }))
            }
        }
        return out
    }

    func testEveryFamilyOnMetricsIsDocumented() throws {
        let apns = try FakeAPNs.start()
        defer { apns.stop() }
        let s = try TestServer.start(environment: apns.serverEnvironment.merging(["DISPATCH_WEBHOOK_SECRET": "metrics-doc-secret-0123"]) { $1 })
        defer { s.stop() }
        try s.startActivity("doc-1")
        let page = try HTTPClient(port: s.port).get("/metrics").text
        let served = Self.families(page)
        XCTAssertGreaterThan(served.count, 20, page)
        let documented = try Self.documented()
        let missing = served.subtracting(documented).sorted()
        XCTAssertEqual(missing, [], "families on /metrics that docs/metrics.md does not describe")
    }
}
