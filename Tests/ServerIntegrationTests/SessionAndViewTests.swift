import DispatchCore
import DispatchCrypto
import DispatchSystem
import DispatchTestSupport
import Glibc
import XCTest

/// What the Activities view needs from the server, over the wire: browser sessions (§7) and
/// their hostile cases, history newest first (§3), search, and the phone's push (§5.2).
final class SessionAndViewTests: XCTestCase {
    private func string(_ v: JSONValue?) -> String? {
        if case .string(let s)? = v { return s }
        return nil
    }

    private func number(_ v: JSONValue?) -> Double? {
        if case .number(let n)? = v { return n }
        return nil
    }

    /// Starts a session for `key` and returns the cookie's value.
    private func signIn(_ s: TestServer, key: String, headers: [String: String] = [:]) throws -> (cookie: String, setCookie: String) {
        let r = try HTTPClient(port: s.port, token: key).request("POST", "/v1/session", headers: headers)
        XCTAssertEqual(r.status, 204, r.text)
        let set = try XCTUnwrap(r.headers["set-cookie"])
        let value = try XCTUnwrap(set.split(separator: ";").first.map { String($0.dropFirst("dispatch_session=".count)) })
        XCTAssertTrue(set.hasPrefix("dispatch_session="), set)
        return (value, set)
    }

    func testSessionCookieStandsForItsKeyAndChangesNeedOurOrigin() throws {
        let s = try TestServer.start(environment: ["DISPATCH_CORS_ORIGINS": "*"])
        defer { s.stop() }
        try s.startActivity("web-1")
        let (cookie, set) = try signIn(s, key: s.adminKey)
        XCTAssertTrue(set.contains("; HttpOnly") && set.contains("; SameSite=Strict") && set.contains("; Path=/"), set)
        XCTAssertFalse(set.contains("Secure"), "plain HTTP from an untrusted peer: no Secure")
        XCTAssertEqual(try s.sessionSQL("SELECT count(*) FROM browser_sessions WHERE secret_hash = $1", [SHA256Hex.of(cookie)]).first?.first, "1",
                       "only the SHA-256 of the secret is stored")
        XCTAssertEqual(try s.sessionSQL("SELECT count(*) FROM browser_sessions WHERE secret_hash = $1", [cookie]).first?.first, "0")

        let browser = HTTPClient(port: s.port)
        let withCookie = ["Cookie": "theme=dark; dispatch_session=\(cookie)"]
        let who = try browser.get("/v1/session", headers: withCookie)
        XCTAssertEqual(who.status, 200, who.text)
        XCTAssertEqual(string(who.json?["keyName"]), "bootstrap")
        XCTAssertEqual(who.json?["scopes"], .array([.string("admin")]))
        XCTAssertEqual(try browser.get("/v1/activities/web-1", headers: withCookie).status, 200, "reads need no Origin")
        XCTAssertEqual(try browser.get("/v1/session").status, 401, "no cookie, no key")

        // A change through the cookie: our own Origin only.
        let own = "http://127.0.0.1:\(s.port)"
        let noOrigin = try browser.post("/v1/activities/web-1/update", #"{"progress":0.3}"#, headers: withCookie)
        XCTAssertEqual(noOrigin.status, 403, noOrigin.text)
        for origin in ["http://evil.example", "null", "https://127.0.0.1:\(s.port)", "http://127.0.0.1:\(s.port).evil.example"] {
            let r = try browser.post("/v1/activities/web-1/update", #"{"progress":0.3}"#, headers: withCookie.merging(["Origin": origin]) { $1 })
            XCTAssertEqual(r.status, 403, origin)
            XCTAssertNil(r.headers["access-control-allow-credentials"], "CORS never allows credentials")
        }
        XCTAssertEqual(try s.seq("web-1"), 1, "nothing changed")
        let ok = try browser.post("/v1/activities/web-1/update", #"{"progress":0.3}"#, headers: withCookie.merging(["Origin": own]) { $1 })
        XCTAssertEqual(ok.status, 200, ok.text)
        XCTAssertNil(ok.headers["access-control-allow-credentials"])
        let pre = try browser.request("OPTIONS", "/v1/session", headers: ["Origin": "https://any.example", "Access-Control-Request-Method": "POST"])
        XCTAssertNil(pre.headers["access-control-allow-credentials"])
        XCTAssertTrue(s.log().contains("key=bootstrap"), "the request log names the session's key")
        XCTAssertTrue(s.log().contains("msg=web.open url=http://127.0.0.1:\(s.port)/"), "the start-up log says where the page is")

        // The feed and a status stream open with the cookie alone (an EventSource without access_token).
        let feed = try TestSocket.connect(port: s.port)
        try feed.send("GET /v1/stream HTTP/1.1\r\nHost: 127.0.0.1:\(s.port)\r\nCookie: dispatch_session=\(cookie)\r\n\r\n")
        let head = String(decoding: try feed.read(timeout: 5) ?? [], as: UTF8.self)
        XCTAssertTrue(head.hasPrefix("HTTP/1.1 200"), head)
        feed.close()

        // A bearer key in the header wins over the cookie.
        XCTAssertEqual(try browser.get("/v1/session", headers: withCookie.merging(["Authorization": "Bearer wrong-key-0123456789"]) { $1 }).status, 401)

        // Sign out: through the cookie it is a change, so our Origin; then the cookie is dead.
        XCTAssertEqual(try browser.request("DELETE", "/v1/session", headers: withCookie).status, 403)
        let out = try browser.request("DELETE", "/v1/session", headers: withCookie.merging(["Origin": own]) { $1 })
        XCTAssertEqual(out.status, 204)
        XCTAssertTrue(out.headers["set-cookie"]?.contains("Max-Age=0") ?? false, out.headers["set-cookie"] ?? "no Set-Cookie")
        let gone = try browser.get("/v1/session", headers: withCookie)
        XCTAssertEqual(gone.status, 401)
        XCTAssertEqual(gone.errorCode, "unauthorized")
    }

    func testSessionsEndWithTheirKeyAndAfterTwelveIdleHours() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        let made = try s.client.post("/v1/keys", #"{"name":"viewer","scopes":["read"]}"#)
        let secret = try XCTUnwrap(string(made.json?["secret"]), made.text)
        let (cookie, _) = try signIn(s, key: secret)
        let (idle, _) = try signIn(s, key: secret)
        let browser = HTTPClient(port: s.port)
        let who = try browser.get("/v1/session", headers: ["Cookie": "dispatch_session=\(cookie)"])
        XCTAssertEqual(who.json?["scopes"], .array([.string("read")]))
        // A read key's cookie may read but not change anything, even from our own page.
        try s.startActivity("ro")
        let r = try browser.post("/v1/activities/ro/cancel", "{}", headers: ["Cookie": "dispatch_session=\(cookie)", "Origin": "http://127.0.0.1:\(s.port)"])
        XCTAssertEqual(r.status, 403)
        XCTAssertEqual(r.errorCode, "forbidden")

        // Twelve hours without use: over (the clock is the database's).
        _ = try s.sessionSQL("UPDATE browser_sessions SET last_used_at = now() - interval '12 hours 1 minute' WHERE secret_hash = $1", [SHA256Hex.of(idle)])
        XCTAssertEqual(try browser.get("/v1/session", headers: ["Cookie": "dispatch_session=\(idle)"]).status, 401)
        // Used an hour ago: still on, and the use is written down (at most once a minute).
        _ = try s.sessionSQL("UPDATE browser_sessions SET last_used_at = now() - interval '1 hour' WHERE secret_hash = $1", [SHA256Hex.of(cookie)])
        XCTAssertEqual(try browser.get("/v1/session", headers: ["Cookie": "dispatch_session=\(cookie)"]).status, 200)
        XCTAssertTrue(try waitUntil(5) {
            try s.sessionSQL("SELECT last_used_at > now() - interval '1 minute' FROM browser_sessions WHERE secret_hash = $1", [SHA256Hex.of(cookie)]).first?.first == "t"
        })

        // A stream held through the session ends with the key's revocation, and so does the session.
        let feed = try TestSocket.connect(port: s.port)
        try feed.send("GET /v1/stream HTTP/1.1\r\nHost: 127.0.0.1:\(s.port)\r\nCookie: dispatch_session=\(cookie)\r\n\r\n")
        XCTAssertTrue(String(decoding: try feed.read(timeout: 5) ?? [], as: UTF8.self).hasPrefix("HTTP/1.1 200"))
        XCTAssertEqual(try s.client.request("DELETE", "/v1/keys/viewer").status, 200)
        XCTAssertEqual(try browser.get("/v1/session", headers: ["Cookie": "dispatch_session=\(cookie)"]).status, 401)
        _ = try feed.readAll(timeout: 5)  // returns once the server closed the stream
        XCTAssertEqual(try feed.read(timeout: 0.2), [], "end of stream: the server closed it")
        feed.close()
    }

    func testSecureOnlyBehindATrustedProxy() throws {
        let trusted = try TestServer.start(environment: ["DISPATCH_TRUSTED_PROXIES": "10.0.0.0/8, 127.0.0.1/32"])
        defer { trusted.stop() }
        let (_, set) = try signIn(trusted, key: trusted.adminKey, headers: ["X-Forwarded-Proto": "https"])
        XCTAssertTrue(set.hasSuffix("; Secure"), set)
        // Behind HTTPS our own origin is https://host.
        let (cookie, _) = try signIn(trusted, key: trusted.adminKey, headers: ["X-Forwarded-Proto": "https"])
        try trusted.startActivity("tls")
        let h = ["Cookie": "dispatch_session=\(cookie)", "X-Forwarded-Proto": "https"]
        let c = HTTPClient(port: trusted.port)
        XCTAssertEqual(try c.post("/v1/activities/tls/update", "{}", headers: h.merging(["Origin": "http://127.0.0.1:\(trusted.port)"]) { $1 }).status, 403)
        XCTAssertEqual(try c.post("/v1/activities/tls/update", "{}", headers: h.merging(["Origin": "https://127.0.0.1:\(trusted.port)"]) { $1 }).status, 200)

        let untrusted = try TestServer.start(environment: ["DISPATCH_TRUSTED_PROXIES": "10.0.0.0/8"])
        defer { untrusted.stop() }
        let (_, plain) = try signIn(untrusted, key: untrusted.adminKey, headers: ["X-Forwarded-Proto": "https"])
        XCTAssertFalse(plain.contains("Secure"), "a header from an untrusted peer is not believed")
        XCTAssertEqual(try HTTPClient(port: untrusted.port).request("POST", "/v1/session").status, 401, "a session needs a key")
    }

    func testHistoryNewestFirstPagesBackwardsCompletely() throws {
        let s = try TestServer.start(environment: ["DISPATCH_PUBLISH_RATE": "0"])
        defer { s.stop() }
        try s.startActivity("long")
        for i in 1...249 { XCTAssertEqual(try s.update("long", #"{"progress":\#(Double(i) / 1000)}"#).status, 200) }
        var seen: [Int64] = []
        var path = "/v1/activities/long/events?order=desc&limit=100"
        while true {
            let r = try s.client.get(path)
            XCTAssertEqual(r.status, 200, r.text)
            guard case .array(let events)? = r.json?["events"], !events.isEmpty else { break }
            let seqs = events.compactMap { number($0["seq"]).map(Int64.init) }
            XCTAssertEqual(seqs, seqs.sorted(by: >), "newest first")
            seen += seqs
            path = "/v1/activities/long/events?before=\(seqs.last!)&limit=100"
        }
        XCTAssertEqual(seen, Array((1...250).reversed()), "every event once")
        let page = try s.client.get("/v1/activities/long/events?order=desc&before=3&limit=10")
        guard case .array(let firstPage)? = page.json?["events"] else { return XCTFail(page.text) }
        XCTAssertEqual(firstPage.first?["seq"], .number(2))
        for bad in ["order=sideways", "order=desc&after=3", "order=asc&before=3", "before=0", "before=x"] {
            let r = try s.client.get("/v1/activities/long/events?" + bad)
            XCTAssertEqual(r.status, 400, bad)
            XCTAssertEqual(r.errorCode, "invalid_query", bad)
        }
        XCTAssertEqual(try s.client.get("/v1/activities/nope/events?order=desc").status, 404)
    }

    func testSearchMatchesIdOrTaskNameIgnoringCase() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        _ = try s.client.post("/v1/activities/start", #"{"activityId":"ci-4711","taskName":"Nightly Backup"}"#)
        _ = try s.client.post("/v1/activities/start", #"{"activityId":"iso-1","taskName":"Debian ISO"}"#)
        _ = try s.client.post("/v1/activities/start", #"{"activityId":"pct","taskName":"100% sure_thing"}"#)
        func ids(_ q: String) throws -> [String] {
            let r = try s.client.get("/v1/activities?q=" + q)
            XCTAssertEqual(r.status, 200, r.text)
            guard case .array(let a)? = r.json?["activities"] else { return [] }
            return a.compactMap { string($0["activityId"]) }.sorted()
        }
        XCTAssertEqual(try ids("BACKUP"), ["ci-4711"])
        XCTAssertEqual(try ids("Iso"), ["iso-1"])
        XCTAssertEqual(try ids("%25"), ["pct"], "% is a character, not a wildcard")
        XCTAssertEqual(try ids("_"), ["pct"])
        XCTAssertEqual(try ids("zzz"), [])
        XCTAssertEqual(try s.client.get("/v1/activities?q=").status, 400)
        XCTAssertEqual(try s.client.get("/v1/activities?q=a%0Ab").status, 400)
    }

    func testLiveActivityIsThePushForTheLatestChange() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        _ = try s.client.post("/v1/activities/start", #"{"activityId":"phone","taskName":"Debian 13 ISO","machine":"shodan","systemImage":"arrow.down.circle.fill","liveActivity":true,"status":"Starting"}"#)
        func push() throws -> JSONValue? {
            let r = try s.client.get("/v1/activities/phone/live-activity")
            XCTAssertEqual(r.status, 200, r.text)
            return r.json
        }
        var p = try push()
        XCTAssertEqual(p?["event"], .string("start"))
        XCTAssertEqual(p?["priority"], .number(10))
        XCTAssertEqual(p?["payload"]?["aps"]?["attributes"]?["taskName"], .string("Debian 13 ISO"))
        XCTAssertEqual(p?["payload"]?["aps"]?["content-state"]?["seq"], .number(1))
        try s.update("phone", #"{"progress":0.4,"status":"Downloading"}"#)
        p = try push()
        XCTAssertEqual(p?["event"], .string("update"))
        XCTAssertEqual(p?["priority"], .number(10), "queued to processing is a state change")
        try s.update("phone", #"{"progress":0.6}"#)
        p = try push()
        XCTAssertEqual(p?["priority"], .number(5), "progress only")
        XCTAssertEqual(p?["payload"]?["aps"]?["content-state"]?["progress"], .number(0.6))
        XCTAssertNil(p?["payload"]?["aps"]?["attributes"])
        try s.end("phone", #"{"state":"error","error":"disk full"}"#)
        p = try push()
        XCTAssertEqual(p?["event"], .string("end"))
        XCTAssertEqual(p?["priority"], .number(10))
        XCTAssertEqual(p?["payload"]?["aps"]?["alert"]?["body"], .string("disk full"))
        XCTAssertNotNil(p?["payload"]?["aps"]?["dismissal-date"])
        XCTAssertEqual(try s.client.get("/v1/activities/none/live-activity").status, 404)
        XCTAssertEqual(try HTTPClient(port: s.port).get("/v1/activities/phone/live-activity").status, 401)
    }
}

extension TestServer {
    /// SQL against this server's database (the session table's clock, counts).
    func sessionSQL(_ query: String, _ params: [String?] = []) throws -> [[String?]] {
        try TestPostgres.shared().sql(conninfo, query, params)
    }
}

/// The SHA-256 of a secret, as the server stores it.
enum SHA256Hex {
    static func of(_ s: String) -> String { SHA256.hex(Array(s.utf8)) }
}
