import DispatchSystem
import DispatchCore
import DispatchIO
import DispatchTestSupport
import Glibc
import XCTest

/// Contract §9 over the wire: CORS, status streams as a browser uses them, the Activities
/// view and openapi.json.
final class BrowserTests: XCTestCase {
    func testCORSOnEveryV1AnswerIncludingStreamsAndErrors() throws {
        let s = try TestServer.start(environment: ["DISPATCH_CORS_ORIGINS": "https://ops.example,http://localhost:3000"])
        defer { s.stop() }
        try s.startActivity("c")
        let ok = ["Origin": "https://ops.example"], other = ["Origin": "https://evil.example"]

        for (path, status) in [("/v1/activities", 200), ("/v1/activities/c", 200), ("/v1/activities/none", 404), ("/v1/nope", 404)] {
            let r = try s.client.get(path, headers: ok)
            XCTAssertEqual(r.status, status, path)
            XCTAssertEqual(r.headers["access-control-allow-origin"], "https://ops.example", path)
            XCTAssertEqual(r.headers["vary"], "Origin", path)
            XCTAssertNotNil(r.headers["access-control-expose-headers"], path)
            let o = try s.client.get(path, headers: other)
            XCTAssertNil(o.headers["access-control-allow-origin"], "another origin gets no CORS header: \(path)")
            XCTAssertEqual(o.headers["vary"], "Origin", path)
        }
        let unauthorized = try HTTPClient(port: s.port).get("/v1/activities", headers: ok)
        XCTAssertEqual(unauthorized.status, 401)
        XCTAssertEqual(unauthorized.headers["access-control-allow-origin"], "https://ops.example", "errors too")
        let post = try s.client.post("/v1/activities/c/update", #"{"progress":0.2}"#, headers: ok)
        XCTAssertEqual(post.headers["access-control-allow-origin"], "https://ops.example")
        // An empty answer too (touch once answered its 204 without them, and unlogged).
        let touch = try s.client.request("POST", "/v1/activities/c/touch", headers: ok)
        XCTAssertEqual(touch.status, 204)
        XCTAssertEqual(touch.headers["access-control-allow-origin"], "https://ops.example")
        XCTAssertNil(touch.headers["content-type"], "a 204 has no body to describe")
        // The access line is written once the answer went out: the client may read it first.
        XCTAssertTrue(waitUntil(5) { s.log().contains("route=/v1/activities/{id}/touch") }, "every answer is logged")
        XCTAssertNil(try s.client.get("/healthz", headers: ok).headers["access-control-allow-origin"], "only /v1")

        // Preflight: 204 with methods, headers and max-age for an allowed origin; bare 204 otherwise.
        let pre = try s.client.request("OPTIONS", "/v1/activities/c/update", headers: ok.merging([
            "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type,idempotency-key",
        ]) { $1 })
        XCTAssertEqual(pre.status, 204)
        XCTAssertEqual(pre.headers["access-control-allow-origin"], "https://ops.example")
        XCTAssertEqual(pre.headers["access-control-allow-methods"], "POST, OPTIONS")
        XCTAssertEqual(pre.headers["access-control-allow-headers"], "Authorization, Content-Type, Idempotency-Key, Last-Event-ID")
        XCTAssertEqual(pre.headers["access-control-max-age"], "7200")
        let preFeed = try HTTPClient(port: s.port).request("OPTIONS", "/v1/stream", headers: ok)
        XCTAssertEqual(preFeed.status, 204, "a preflight carries no credentials")
        XCTAssertEqual(preFeed.headers["access-control-allow-methods"], "GET, HEAD, OPTIONS")
        let preOther = try HTTPClient(port: s.port).request("OPTIONS", "/v1/activities", headers: other)
        XCTAssertEqual(preOther.status, 204)
        XCTAssertNil(preOther.headers["access-control-allow-origin"])
        XCTAssertNil(preOther.headers["access-control-allow-methods"])
        XCTAssertEqual(try HTTPClient(port: s.port).request("OPTIONS", "/v1/nope", headers: ok).status, 404)

        // Streams: the status stream and the feed carry the header on their 200 and their 204.
        for path in ["/v1/activities/c/status", "/v1/stream"] {
            let sock = try TestSocket.connect(port: s.port)
            try sock.send("GET \(path) HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(s.adminKey)\r\nOrigin: https://ops.example\r\n\r\n")
            let head = String(decoding: try sock.read(timeout: 5) ?? [], as: UTF8.self).lowercased()
            XCTAssertTrue(head.contains("access-control-allow-origin: https://ops.example"), "\(path): \(head)")
            sock.close()
        }
        try s.end("c")
        let done = try s.client.get("/v1/activities/c/status", headers: ok.merging(["Last-Event-ID": "99"]) { $1 })
        XCTAssertEqual(done.status, 204)
        XCTAssertEqual(done.headers["access-control-allow-origin"], "https://ops.example")
    }

    func testCORSStarAndDefaultNone() throws {
        let star = try TestServer.start(environment: ["DISPATCH_CORS_ORIGINS": "*"])
        defer { star.stop() }
        XCTAssertEqual(try star.client.get("/v1/activities", headers: ["Origin": "https://any.example"]).headers["access-control-allow-origin"], "*")
        let none = try TestServer.start()
        defer { none.stop() }
        let r = try none.client.get("/v1/activities", headers: ["Origin": "https://any.example"])
        XCTAssertNil(r.headers["access-control-allow-origin"])
        XCTAssertNil(r.headers["vary"])
        XCTAssertEqual(try HTTPClient(port: none.port).request("OPTIONS", "/v1/activities").status, 204, "OPTIONS is no longer 405")
    }

    /// Contract §9: `not_found` has id 0; the browser's reconnect with Last-Event-ID: 0 is 204,
    /// or the whole history once the activity exists.
    func testUnknownActivityStatusStreamStopsABrowser() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        let first = try s.stream("typo")
        XCTAssertTrue(try first.waitForEnd())
        XCTAssertEqual(first.events.map(\.event), ["not_found"])
        XCTAssertEqual(first.events.first?.id, "0")
        let again = try s.stream("typo", lastEventID: 0)
        XCTAssertTrue(try again.waitForEnd())
        XCTAssertEqual(again.status, 204)
        try s.startActivity("late")
        try s.update("late")
        let late = try s.stream("late", lastEventID: 0)
        XCTAssertEqual(try late.waitForEvents(2).map(\.id), ["1", "2"], "the whole history")
    }

    func testTheActivitiesViewIsServedWithTypesValidatorsAndAPolicy() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        let anon = HTTPClient(port: s.port)
        let page = try anon.get("/")
        XCTAssertEqual(page.status, 200)
        XCTAssertEqual(page.headers["content-type"], "text/html; charset=utf-8")
        XCTAssertTrue(page.text.contains("<script src=\"/app.js\" defer></script>"))
        XCTAssertTrue(page.headers["content-security-policy"]?.contains("script-src 'self'") ?? false)
        XCTAssertTrue(page.headers["content-security-policy"]?.contains("connect-src 'self'") ?? false)
        guard let etag = page.headers["etag"] else { return XCTFail("no ETag") }
        XCTAssertEqual(try anon.get("/", headers: ["If-None-Match": etag]).status, 304)
        XCTAssertEqual(try anon.get("/index.html").body, page.body)
        for (path, type) in [("/app.js", "text/javascript; charset=utf-8"), ("/dispatch.js", "text/javascript; charset=utf-8"), ("/style.css", "text/css; charset=utf-8"),
                             ("/favicon.svg", "image/svg+xml"), ("/openapi.json", "application/json")] {
            let r = try anon.get(path)
            XCTAssertEqual(r.status, 200, path)
            XCTAssertEqual(r.headers["content-type"], type, path)
            XCTAssertEqual(r.headers["x-content-type-options"], "nosniff", path)
            XCTAssertFalse(r.body.isEmpty, path)
        }
        // Byte for byte what is in web/: the build embeds the files as they are.
        for name in ["index.html", "app.js", "detail.js", "symbols.js", "dispatch.js", "style.css", "favicon.svg", "openapi.json"] {
            let onDisk = Files.read(TestPaths.repositoryRoot + "/web/" + name).map { Array($0.utf8) }
            XCTAssertEqual(try anon.get("/" + name).body, onDisk, name)
        }
        XCTAssertEqual(try anon.get("/dispatch.js").headers["access-control-allow-origin"], "*", "a page on another origin imports it")
        XCTAssertNil(try anon.get("/app.js").headers["access-control-allow-origin"])
        XCTAssertEqual(try anon.get("/secret.txt").status, 404)
        XCTAssertEqual(try anon.request("POST", "/", json: "{}").status, 405)
    }

    /// Every Route has a path in openapi.json, and every path there is a Route.
    func testOpenAPIDescribesExactlyTheRoutes() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        guard let doc = try HTTPClient(port: s.port).get("/openapi.json").json else { return XCTFail("not JSON") }
        XCTAssertEqual(doc["openapi"], .string("3.1.0"))
        // Relative: clients resolve it against wherever they fetched the document, not a fixed address.
        guard case .array(let servers)? = doc["servers"], servers.count == 1 else { return XCTFail("one server entry") }
        XCTAssertEqual(servers[0]["url"], .string("/"))
        guard case .object(let paths)? = doc["paths"] else { return XCTFail("no paths") }
        var routed: [String: Set<String>] = [:]
        for route in everyRoute() {
            let path = route == .page("index.html") ? "/" : (route.pattern == "/" ? "/" + routeFile(route) : route.pattern)
            for m in route.methods { routed[path, default: []].insert(m.rawValue.lowercased()) }
        }
        var documented: [String: Set<String>] = [:]
        for (path, item) in paths {
            guard case .object(let ops) = item else { continue }
            documented[path] = Set(ops.map(\.0).filter { ["get", "post", "put", "delete", "patch"].contains($0) })
        }
        XCTAssertEqual(documented, routed)
        // And the documented paths really route (with ids filled in).
        for path in documented.keys {
            let concrete = path.replacingOccurrences(of: "{id}", with: "x").replacingOccurrences(of: "{name}", with: "k")
                .replacingOccurrences(of: "{deviceToken}", with: "ab")
            guard case .route = Route.match(method: .get, path: concrete) else {
                if case .methodNotAllowed = Route.match(method: .get, path: concrete) { continue }
                return XCTFail("\(path) does not route")
            }
        }
    }

    private func routeFile(_ r: Route) -> String {
        if case .page(let name) = r { return name }
        return ""
    }

    /// One of each Route; the switch makes a new case fail to compile here until it is listed.
    private func everyRoute() -> [Route] {
        let all: [Route] = [.healthz, .readyz, .metrics, .startActivity, .listActivities, .activity("x"), .update("x"), .end("x"),
                            .changes, .events("x"), .status("x"), .cancel("x"), .touch("x"), .keys, .key("k"), .feed, .registerTokens,
                            .forgetDevice("ab"), .session, .liveActivity("x"), .openAPI, .page("index.html")] + Route.pageFiles.sorted().map { .page($0) }
        for r in all {
            switch r {
            case .healthz, .readyz, .metrics, .startActivity, .listActivities, .activity, .update, .end, .changes, .events, .status,
                 .cancel, .touch, .keys, .key, .feed, .registerTokens, .forgetDevice, .session, .liveActivity, .page, .openAPI: break
            }
        }
        return all
    }
}
