// One shared server for every credential and hostile-input case (starting one per case would
// triple the suite's time); the helpers are in AuthKit.swift.
import DispatchSystem
import DispatchCore
import DispatchCrypto
import DispatchIO
import DispatchServer
import DispatchTestSupport
import Glibc
import XCTest

/// Issue 4: credentials, scopes and hostile input, end to end over real sockets against a real
/// dispatchd and PostgreSQL. Helpers are in AuthKit (other suites add their own).
final class AuthAndHostileInputTests: SharedServerTestCase {
    // MARK: - 401 and 403

    func testMissingBadOrMalformedCredentialsAre401() throws {
        let s = try server()
        let anon = HTTPClient(port: s.port)
        try AuthKit.start(s.client, "AUTH-401")
        let calls: [(String, String, String?)] = [
            ("GET", "/v1/activities", nil),
            ("GET", "/v1/activities/AUTH-401", nil),
            ("GET", "/v1/activities/AUTH-401/events", nil),
            ("POST", "/v1/activities/start", #"{"taskName":"x"}"#),
            ("POST", "/v1/activities/AUTH-401/update", #"{"progress":0.1}"#),
            ("POST", "/v1/activities/AUTH-401/end", "{}"),
            ("GET", "/v1/keys", nil),
            ("POST", "/v1/keys", #"{"name":"x","scopes":["admin"]}"#),
            ("DELETE", "/v1/keys/bootstrap", nil),
        ]
        let badHeaders: [[String: String]] = [
            [:],
            ["Authorization": "Bearer dsp_not_a_real_key_0123456789"],
            ["Authorization": "Bearer"],
            ["Authorization": "Bearer "],
            ["Authorization": "Basic dGVzdDp0ZXN0"],
            ["Authorization": s.adminKey],  // no scheme
            ["Authorization": "Token \(s.adminKey)"],
            ["Authorization": "Bearer " + String(repeating: "k", count: 2000)],
        ]
        for (method, path, body) in calls {
            for h in badHeaders {
                let r = try anon.request(method, path, json: body, headers: h)
                AuthKit.assertError(r, 401, "unauthorized", "\(method) \(path) \(h)")
                XCTAssertEqual(r.headers["www-authenticate"], "Bearer", "\(method) \(path)")
            }
        }
        // Nothing was changed by the refused publishes.
        XCTAssertEqual(AuthKit.number(try s.client.get("/v1/activities/AUTH-401").json?["seq"]), 1)
        // A status stream without a key, or with a bad one, is refused before any streaming.
        AuthKit.assertError(try anon.get("/v1/activities/AUTH-401/status"), 401, "unauthorized")
        AuthKit.assertError(try anon.get("/v1/activities/AUTH-401/status?access_token=nope-nope-nope"), 401, "unauthorized")
        // Health and metrics need no key.
        XCTAssertEqual(try anon.get("/healthz").status, 200)
        XCTAssertEqual(try anon.get("/readyz").status, 200)
        XCTAssertEqual(try anon.get("/metrics").status, 200)
        // The scheme name is case-insensitive (RFC 9110 §11.1).
        XCTAssertEqual(try anon.get("/v1/activities/AUTH-401", headers: ["Authorization": "bearer \(s.adminKey)"]).status, 200)
    }

    func testScopesReadPublishDeviceAdmin() throws {
        let s = try server()
        let admin = s.client
        let read = try AuthKit.createKey(s, "scope-read", ["read"])
        let publish = try AuthKit.createKey(s, "scope-publish", ["publish"])
        let device = try AuthKit.createKey(s, "scope-device", ["device"])
        let readC = HTTPClient(port: s.port, token: read), pubC = HTTPClient(port: s.port, token: publish)
        let devC = HTTPClient(port: s.port, token: device)
        try AuthKit.start(admin, "SCOPE-1")

        // A read key may read but never publish.
        XCTAssertEqual(try readC.get("/v1/activities/SCOPE-1").status, 200)
        XCTAssertEqual(try readC.get("/v1/activities").status, 200)
        XCTAssertEqual(try readC.get("/v1/activities/SCOPE-1/events").status, 200)
        AuthKit.assertError(try readC.post("/v1/activities/start", #"{"activityId":"SCOPE-R","taskName":"x"}"#), 403, "forbidden")
        AuthKit.assertError(try readC.post("/v1/activities/SCOPE-1/update", #"{"progress":0.3}"#), 403, "forbidden")
        AuthKit.assertError(try readC.post("/v1/activities/SCOPE-1/end", "{}"), 403, "forbidden")
        XCTAssertEqual(try admin.get("/v1/activities/SCOPE-R").status, 404, "a refused start stores nothing")

        // A device key may not read activities (nor publish).
        AuthKit.assertError(try devC.get("/v1/activities/SCOPE-1"), 403, "forbidden")
        AuthKit.assertError(try devC.get("/v1/activities"), 403, "forbidden")
        AuthKit.assertError(try devC.get("/v1/activities/SCOPE-1/events"), 403, "forbidden")
        AuthKit.assertError(try devC.get("/v1/activities/SCOPE-1/status"), 403, "forbidden")
        AuthKit.assertError(try HTTPClient(port: s.port).get("/v1/activities/SCOPE-1/status?access_token=\(device)"), 403, "forbidden")
        AuthKit.assertError(try devC.post("/v1/activities/start", #"{"taskName":"x"}"#), 403, "forbidden")

        // A publish key publishes and reads.
        XCTAssertEqual(try pubC.post("/v1/activities/start", #"{"activityId":"SCOPE-P","taskName":"x"}"#).status, 201)
        XCTAssertEqual(try pubC.get("/v1/activities/SCOPE-P").status, 200)

        // Only admin manages keys.
        for c in [readC, pubC, devC] {
            AuthKit.assertError(try c.get("/v1/keys"), 403, "forbidden")
            AuthKit.assertError(try c.post("/v1/keys", #"{"name":"sneaky","scopes":["admin"]}"#), 403, "forbidden")
            AuthKit.assertError(try c.request("DELETE", "/v1/keys/scope-read"), 403, "forbidden")
        }
        XCTAssertEqual(try readC.get("/v1/activities/SCOPE-1").status, 200, "the read key was not revoked")

        // Admin may do everything, including changing an activity another key started.
        XCTAssertEqual(try admin.post("/v1/activities/SCOPE-P/update", #"{"progress":0.5}"#).status, 200)
        XCTAssertEqual(try admin.post("/v1/activities/SCOPE-P/end", "{}").status, 200)
        XCTAssertEqual(try admin.get("/v1/activities/SCOPE-P/events").status, 200)
        XCTAssertEqual(try admin.get("/v1/keys").status, 200)
        let sse = try SSEClient(port: s.port, path: "/v1/activities/SCOPE-1/status", token: s.adminKey)
        defer { sse.close() }
        XCTAssertEqual(try sse.waitForEvents(1).count, 1)
        XCTAssertEqual(sse.status, 200)
    }

    // MARK: - Keys

    func testKeysOverHTTPAreHashedListedWithoutSecretsAndRevocable() throws {
        let s = try server()
        let admin = s.client
        let r = try admin.post("/v1/keys", #"{"name":"http-key","scopes":["publish","read"],"machine":"xerxes"}"#)
        XCTAssertEqual(r.status, 201, r.text)
        let secret = try XCTUnwrap(AuthKit.string(r.json?["secret"]), r.text)
        XCTAssertEqual(AuthKit.string(r.json?["name"]), "http-key")
        XCTAssertEqual(AuthKit.string(r.json?["machine"]), "xerxes")
        XCTAssertEqual(r.json?["scopes"], .array([.string("publish"), .string("read")]))
        XCTAssertGreaterThanOrEqual(secret.utf8.count, 32)

        // The secret works at once, with its scopes.
        let keyC = HTTPClient(port: s.port, token: secret)
        XCTAssertEqual(try keyC.post("/v1/activities/start", #"{"activityId":"KEYS-1","taskName":"x"}"#).status, 201)

        // The list never shows secrets or hashes.
        let list = try admin.get("/v1/keys")
        XCTAssertEqual(list.status, 200)
        let hash = SHA256.hex(Array(secret.utf8))
        XCTAssertFalse(list.text.contains(secret))
        XCTAssertFalse(list.text.contains(hash))
        XCTAssertFalse(list.text.contains(SHA256.hex(Array(s.adminKey.utf8))))
        XCTAssertFalse(list.text.lowercased().contains("secret"), list.text)
        XCTAssertFalse(list.text.lowercased().contains("hash"), list.text)
        guard case .array(let keys)? = list.json?["keys"] else { return XCTFail(list.text) }
        let entry = try XCTUnwrap(keys.first { AuthKit.string($0["name"]) == "http-key" }, list.text)
        XCTAssertEqual(AuthKit.string(entry["machine"]), "xerxes")
        XCTAssertEqual(entry["revokedAt"], .null)

        // Stored hashed: no column of any row holds the secret.
        let pg = try TestPostgres.shared()
        let rows = try pg.sql(s.conninfo, "SELECT row_to_json(k)::text, secret_hash FROM api_keys k WHERE name = 'http-key'")
        XCTAssertEqual(rows.count, 1)
        XCTAssertFalse((rows.first?[0] ?? "").contains(secret))
        XCTAssertEqual(rows.first?[1], hash)
        let leaked = try pg.sql(s.conninfo, "SELECT count(*) FROM api_keys k WHERE strpos(row_to_json(k)::text, $1) > 0 OR strpos(row_to_json(k)::text, $2) > 0",
                                [secret, s.adminKey])
        XCTAssertEqual(leaked.first?[0], "0")

        // Bad requests: a duplicate name, bad scopes, missing fields, unknown fields, not JSON.
        AuthKit.assertError(try admin.post("/v1/keys", #"{"name":"http-key","scopes":["read"]}"#), 409, "conflict")
        AuthKit.assertError(try admin.post("/v1/keys", #"{"name":"k2","scopes":["root"]}"#), 400, "invalid_field")
        AuthKit.assertError(try admin.post("/v1/keys", #"{"name":"k2","scopes":[]}"#), 400, "invalid_field")
        AuthKit.assertError(try admin.post("/v1/keys", #"{"name":"k2"}"#), 400, "missing_field")
        AuthKit.assertError(try admin.post("/v1/keys", #"{"scopes":["read"]}"#), 400, "missing_field")
        AuthKit.assertError(try admin.post("/v1/keys", #"{"name":"k 2","scopes":["read"]}"#), 400, "invalid_field")
        AuthKit.assertError(try admin.post("/v1/keys", #"{"name":"k2","scopes":["read"],"secret":"mine"}"#), 400, "unknown_field")
        AuthKit.assertError(try admin.post("/v1/keys", #"{"name":"k2","scopes":["publish"],"machine":"bad machine!"}"#), 400, "invalid_field")
        AuthKit.assertError(try admin.post("/v1/keys", "name=k2"), 400, "invalid_json")
        AuthKit.assertError(try admin.post("/v1/keys", #"{"name":"k2","scopes":["read"]}"#, headers: ["Content-Type": "text/plain"]), 415, "unsupported_media_type")
        AuthKit.assertError(try admin.request("PUT", "/v1/keys", json: "{}"), 405, "method_not_allowed")
        XCTAssertEqual(try pg.sql(s.conninfo, "SELECT count(*) FROM api_keys WHERE name = 'k2'").first?[0], "0")

        // Revocation: the key stops working, the list shows when, a second revoke is 404.
        let del = try admin.request("DELETE", "/v1/keys/http-key")
        XCTAssertEqual(del.status, 200, del.text)
        AuthKit.assertError(try keyC.get("/v1/activities/KEYS-1"), 401, "unauthorized")
        AuthKit.assertError(try admin.request("DELETE", "/v1/keys/http-key"), 404, "not_found")
        AuthKit.assertError(try admin.request("DELETE", "/v1/keys/no-such-key"), 404, "not_found")
        let after = try admin.get("/v1/keys")
        guard case .array(let keys2)? = after.json?["keys"] else { return XCTFail(after.text) }
        let revoked = try XCTUnwrap(keys2.first { AuthKit.string($0["name"]) == "http-key" })
        XCTAssertNotNil(AuthKit.string(revoked["revokedAt"]), after.text)
    }

    func testKeysCommandCreateListRevoke() throws {
        let s = try server()
        let r = AuthKit.keysCommand(s, ["create", "--name", "cli-pub", "--scope", "publish,read", "--machine", "shodan"])
        XCTAssertEqual(r.status, 0, r.output)
        let secret = r.output.split(separator: "\n").last.map(String.init) ?? ""
        XCTAssertTrue(secret.hasPrefix("dsp_"), r.output)

        let c = HTTPClient(port: s.port, token: secret)
        let started = try c.post("/v1/activities/start", #"{"activityId":"CLI-KEY-1","taskName":"x"}"#)
        XCTAssertEqual(started.status, 201, started.text)
        XCTAssertEqual(AuthKit.string(started.json?["machine"]), "shodan")

        let list = AuthKit.keysCommand(s, ["list"])
        XCTAssertEqual(list.status, 0, list.output)
        let line = list.output.split(separator: "\n").first { $0.hasPrefix("cli-pub\t") }.map(String.init) ?? ""
        XCTAssertTrue(line.contains("publish,read") && line.contains("shodan") && line.hasSuffix("active"), list.output)
        XCTAssertFalse(list.output.contains(secret))
        XCTAssertFalse(list.output.contains(SHA256.hex(Array(secret.utf8))))
        let pg = try TestPostgres.shared()
        XCTAssertEqual(try pg.sql(s.conninfo, "SELECT secret_hash FROM api_keys WHERE name = 'cli-pub'").first?[0], SHA256.hex(Array(secret.utf8)))

        // Mistakes: a duplicate name, an unknown scope, a missing value, an unknown key.
        XCTAssertEqual(AuthKit.keysCommand(s, ["create", "--name", "cli-pub", "--scope", "read"]).status, 5)
        XCTAssertEqual(AuthKit.keysCommand(s, ["create", "--name", "cli-x", "--scope", "root"]).status, 2)
        XCTAssertEqual(AuthKit.keysCommand(s, ["create", "--name", "cli-x", "--scope"]).status, 2)
        XCTAssertEqual(AuthKit.keysCommand(s, ["create", "--name", "cli-x", "--scope", "publish", "--machine", "no spaces"]).status, 2)
        XCTAssertEqual(AuthKit.keysCommand(s, ["revoke", "nobody"]).status, 3)

        // Revoking through the command reaches the running server (NOTIFY clears its key cache,
        // which held the key: it was just used).
        XCTAssertEqual(try c.get("/v1/activities/CLI-KEY-1").status, 200)
        let rv = AuthKit.keysCommand(s, ["revoke", "cli-pub"])
        XCTAssertEqual(rv.status, 0, rv.output)
        XCTAssertTrue(AuthKit.eventually(8) { (try? c.get("/v1/activities/CLI-KEY-1").status) == 401 }, "the revoked key still works")
        XCTAssertTrue(AuthKit.keysCommand(s, ["list"]).output.contains("revoked"))
    }

    // MARK: - Ownership and machines

    func testPublishKeyChangesOnlyItsOwnActivities() throws {
        let s = try server()
        let admin = s.client
        let a = HTTPClient(port: s.port, token: try AuthKit.createKey(s, "owner-a", ["publish"]))
        let b = HTTPClient(port: s.port, token: try AuthKit.createKey(s, "owner-b", ["publish"]))
        XCTAssertEqual(try a.post("/v1/activities/start", #"{"activityId":"OWN-A","taskName":"a's job"}"#).status, 201)
        try AuthKit.start(admin, "OWN-ADMIN")

        AuthKit.assertError(try b.post("/v1/activities/OWN-A/update", #"{"progress":0.9}"#), 403, "forbidden")
        AuthKit.assertError(try b.post("/v1/activities/OWN-A/end", #"{"state":"cancelled"}"#), 403, "forbidden")
        AuthKit.assertError(try b.post("/v1/activities/start", #"{"activityId":"OWN-A","taskName":"a's job"}"#), 403, "forbidden")
        AuthKit.assertError(try a.post("/v1/activities/OWN-ADMIN/update", #"{"progress":0.9}"#), 403, "forbidden")
        AuthKit.assertError(try a.post("/v1/activities/OWN-ADMIN/end", "{}"), 403, "forbidden")
        // Refusals wrote nothing.
        XCTAssertEqual(AuthKit.number(try admin.get("/v1/activities/OWN-A").json?["seq"]), 1)
        XCTAssertEqual(AuthKit.number(try admin.get("/v1/activities/OWN-ADMIN").json?["seq"]), 1)
        // b may still read what a started (publish implies read).
        XCTAssertEqual(try b.get("/v1/activities/OWN-A").status, 200)

        // The owner and admin may.
        XCTAssertEqual(try a.post("/v1/activities/OWN-A/update", #"{"progress":0.5}"#).status, 200)
        XCTAssertEqual(try admin.post("/v1/activities/OWN-A/update", #"{"progress":0.6}"#).status, 200)
        let end = try a.post("/v1/activities/OWN-A/end", "{}")
        XCTAssertEqual(end.status, 200, end.text)
        XCTAssertEqual(AuthKit.number(end.json?["seq"]), 4)
        // Once ended, another key is still refused as not the owner (not told it is finished).
        AuthKit.assertError(try b.post("/v1/activities/OWN-A/end", "{}"), 403, "forbidden")
        XCTAssertEqual(try admin.post("/v1/activities/OWN-ADMIN/end", "{}").status, 200)
    }

    func testMachineBoundKey() throws {
        let s = try server()
        let bound = HTTPClient(port: s.port, token: try AuthKit.createKey(s, "bound-shodan", ["publish"], machine: "shodan"))
        AuthKit.assertError(try bound.post("/v1/activities/start", #"{"activityId":"MB-1","taskName":"x","machine":"xerxes"}"#), 403, "forbidden")
        XCTAssertEqual(try s.client.get("/v1/activities/MB-1").status, 404)

        let omitted = try bound.post("/v1/activities/start", #"{"activityId":"MB-2","taskName":"x"}"#)
        XCTAssertEqual(omitted.status, 201, omitted.text)
        XCTAssertEqual(AuthKit.string(omitted.json?["machine"]), "shodan")
        let same = try bound.post("/v1/activities/start", #"{"activityId":"MB-3","taskName":"x","machine":"shodan"}"#)
        XCTAssertEqual(same.status, 201, same.text)
        XCTAssertEqual(AuthKit.string(same.json?["machine"]), "shodan")
        let listed = try s.client.get("/v1/activities?machine=shodan")
        XCTAssertTrue(listed.text.contains("MB-2") && listed.text.contains("MB-3"), listed.text)
        XCTAssertEqual(try bound.post("/v1/activities/MB-2/update", #"{"progress":0.2}"#).status, 200)

        // A machine-bound admin key is not held to the machine.
        let boundAdmin = HTTPClient(port: s.port, token: try AuthKit.createKey(s, "bound-admin", ["admin"], machine: "shodan"))
        let other = try boundAdmin.post("/v1/activities/start", #"{"activityId":"MB-4","taskName":"x","machine":"xerxes"}"#)
        XCTAssertEqual(other.status, 201, other.text)
        XCTAssertEqual(AuthKit.string(other.json?["machine"]), "xerxes")
    }

    // MARK: - Revocation across processes

    func testRevocationReachesAnotherServerProcessOnTheSameDatabase() throws {
        let first = try TestServer.start()
        defer { first.stop() }
        let second = try TestServer.start(conninfo: first.conninfo)
        defer { second.stop() }
        let secret = try AuthKit.createKey(first, "two-servers", ["publish"])
        let on1 = HTTPClient(port: first.port, token: secret), on2 = HTTPClient(port: second.port, token: secret)
        XCTAssertEqual(try on1.post("/v1/activities/start", #"{"activityId":"REV-1","taskName":"x"}"#).status, 201)
        // Used on the second server too, so its key cache holds the key as valid.
        XCTAssertEqual(try on2.post("/v1/activities/REV-1/update", #"{"progress":0.1}"#).status, 200)
        XCTAssertEqual(try on2.get("/v1/activities/REV-1").status, 200)

        XCTAssertEqual(try first.client.request("DELETE", "/v1/keys/two-servers").status, 200)
        AuthKit.assertError(try on1.get("/v1/activities/REV-1"), 401, "unauthorized")
        // The second server learns through NOTIFY, well before its 10 s cache would expire.
        XCTAssertTrue(AuthKit.eventually(8) { (try? on2.get("/v1/activities/REV-1").status) == 401 }, "the second server still accepts a revoked key")
        AuthKit.assertError(try on2.post("/v1/activities/REV-1/update", #"{"progress":0.2}"#), 401, "unauthorized")
        XCTAssertEqual(AuthKit.number(try second.client.get("/v1/activities/REV-1").json?["seq"]), 2)
    }

    /// A key lookup that fails in the database is a 503 for that request, not an "invalid key"
    /// remembered for the cache's 10 s.
    func testFailedKeyLookupIsUnavailableNotCachedAsUnauthorized() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        XCTAssertEqual(try s.client.get("/v1/activities").status, 200)  // the lookup statement is prepared
        let secret = try AuthKit.createKey(s, "lookup-fails", ["read"])
        let c = HTTPClient(port: s.port, token: secret)
        let pg = try TestPostgres.shared()
        _ = try pg.sql(s.conninfo, "ALTER TABLE api_keys RENAME COLUMN revoked_at TO revoked_at_moved")
        let during = try c.get("/v1/activities")
        _ = try pg.sql(s.conninfo, "ALTER TABLE api_keys RENAME COLUMN revoked_at_moved TO revoked_at")
        AuthKit.assertError(during, 503, "database_unavailable")
        let after = try c.get("/v1/activities")
        XCTAssertEqual(after.status, 200, after.text)
    }

    // MARK: - Status stream credentials

    func testStatusStreamAcceptsAccessTokenQuery() throws {
        let s = try server()
        try AuthKit.start(s.client, "SSE-TOKEN")
        let reader = try AuthKit.createKey(s, "sse-reader", ["read"])
        let sse = try SSEClient(port: s.port, path: "/v1/activities/SSE-TOKEN/status?access_token=\(reader)", token: nil)
        defer { sse.close() }
        let events = try sse.waitForEvents(1)
        XCTAssertEqual(sse.status, 200)
        XCTAssertEqual(sse.headers["content-type"], "text/event-stream")
        XCTAssertEqual(events.first?.id, "1")

        let anon = HTTPClient(port: s.port)
        AuthKit.assertError(try anon.get("/v1/activities/SSE-TOKEN/status"), 401, "unauthorized")
        AuthKit.assertError(try anon.get("/v1/activities/SSE-TOKEN/status?access_token="), 401, "unauthorized")
        AuthKit.assertError(try anon.get("/v1/activities/SSE-TOKEN/status?access_token=dsp_wrong"), 401, "unauthorized")
        // Only the stream takes a key in the URL (it would end up in logs elsewhere too, but an
        // EventSource has no other way).
        AuthKit.assertError(try anon.get("/v1/activities/SSE-TOKEN?access_token=\(reader)"), 401, "unauthorized")
        AuthKit.assertError(try anon.get("/v1/activities?access_token=\(reader)"), 401, "unauthorized")
        // HEAD answers the stream's headers and no body (and holds no stream).
        let head = AuthKit.exchange(port: s.port, Array("HEAD /v1/activities/SSE-TOKEN/status?access_token=\(reader) HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".utf8), timeout: 10)
        XCTAssertEqual(head.status, 200)
        XCTAssertTrue(head.closed)
        let headText = String(decoding: head.raw, as: UTF8.self)
        XCTAssertTrue(headText.lowercased().contains("content-type: text/event-stream"), headText)
        XCTAssertTrue(headText.hasSuffix("\r\n\r\n") && !headText.contains("retry:"), "a body after HEAD: \(headText.debugDescription)")
        let headRefused = AuthKit.exchange(port: s.port, Array("HEAD /v1/activities/SSE-TOKEN/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".utf8), timeout: 10)
        XCTAssertEqual(headRefused.status, 401)
        XCTAssertTrue(String(decoding: headRefused.raw, as: UTF8.self).hasSuffix("\r\n\r\n"), "a body after HEAD")
        // On a kept-alive connection, the answer after a HEAD is read correctly (no stray body).
        let sock = try TestSocket.connect(port: s.port)
        defer { sock.close() }
        try sock.send("HEAD /v1/activities/SSE-TOKEN HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(reader)\r\n\r\n"
            + "GET /v1/activities/nope HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(reader)\r\nConnection: close\r\n\r\n")
        let pipelined = try sock.readAll(timeout: 10)
        XCTAssertTrue(String(decoding: pipelined, as: UTF8.self).hasPrefix("HTTP/1.1 200 "), String(decoding: pipelined, as: UTF8.self))
        let (afterHead, rest) = try HTTPResponseParser.response(in: pipelined[...], isHeadRequest: true)
        XCTAssertEqual(afterHead.head.status, 200)
        let second = String(decoding: rest, as: UTF8.self)
        XCTAssertTrue(second.hasPrefix("HTTP/1.1 404 "), "the answer after HEAD: \(second.prefix(200).debugDescription)")
        XCTAssertEqual(try HTTPResponseParser.response(in: rest).response.head.status, 404, second)
        // A change still reaches the token-authenticated stream.
        XCTAssertEqual(try s.client.post("/v1/activities/SSE-TOKEN/update", #"{"progress":0.4}"#).status, 200)
        XCTAssertEqual(try sse.waitForEvents(2).map(\.id), ["1", "2"])
    }

    // MARK: - Limits

    func testPublishRateLimitPerKey() throws {
        let s = try TestServer.start(environment: ["DISPATCH_PUBLISH_RATE": "5"])
        defer { s.stop() }
        let p = HTTPClient(port: s.port, token: try AuthKit.createKey(s, "rate-p", ["publish"]))
        let q = HTTPClient(port: s.port, token: try AuthKit.createKey(s, "rate-q", ["publish"]))

        var accepted = 0
        var refusal: HTTPClient.Response?
        for i in 0..<60 {
            let r = try p.post("/v1/activities/start", #"{"activityId":"RATE-P-\#(i)","taskName":"x"}"#)
            if r.status == 429 { refusal = r; break }
            XCTAssertEqual(r.status, 201, r.text)
            accepted += 1
        }
        let r = try XCTUnwrap(refusal, "no 429 after \(accepted) publishes at a rate of 5/s")
        AuthKit.assertError(r, 429, "rate_limited")
        let retryAfter = try XCTUnwrap(r.headers["retry-after"].flatMap { Int($0) }, "\(r.headers)")
        XCTAssertGreaterThanOrEqual(retryAfter, 1)
        XCTAssertGreaterThanOrEqual(accepted, 5, "the burst allows at least a second's worth")

        // Another key is unaffected; admin is never limited.
        XCTAssertEqual(try q.post("/v1/activities/start", #"{"activityId":"RATE-Q","taskName":"x"}"#).status, 201)
        try AuthKit.start(s.client, "RATE-ADMIN")
        for i in 0..<40 {
            let u = try s.client.post("/v1/activities/RATE-ADMIN/update", #"{"progress":\#(Double(i) / 100)}"#)
            XCTAssertEqual(u.status, 200, u.text)
            if u.status != 200 { break }
        }
        // Reads are not publishes.
        XCTAssertEqual(try p.get("/v1/activities/RATE-Q").status, 200)
        // After Retry-After, the limited key publishes again.
        usleep(UInt32(retryAfter) * 1_000_000 + 200_000)
        XCTAssertEqual(try p.post("/v1/activities/start", #"{"activityId":"RATE-P-again","taskName":"x"}"#).status, 201)
    }

    func testConcurrentStreamLimitPerKey() throws {
        let s = try TestServer.start(environment: ["DISPATCH_MAX_STREAMS_PER_KEY": "3"])
        defer { s.stop() }
        try AuthKit.start(s.client, "STREAMS-1")
        let key = try AuthKit.createKey(s, "streamer", ["read"])
        var open: [SSEClient] = []
        defer { for c in open { c.close() } }
        for _ in 0..<3 {
            let c = try SSEClient(port: s.port, path: "/v1/activities/STREAMS-1/status", token: key)
            open.append(c)
            XCTAssertEqual(try c.waitForEvents(1).count, 1)
            XCTAssertEqual(c.status, 200)
        }
        let fourth = try HTTPClient(port: s.port, token: key).get("/v1/activities/STREAMS-1/status")
        AuthKit.assertError(fourth, 429, "too_many_streams")
        // The query-token form counts against the same key.
        AuthKit.assertError(try HTTPClient(port: s.port).get("/v1/activities/STREAMS-1/status?access_token=\(key)"), 429, "too_many_streams")
        // Another key is unaffected.
        let other = try SSEClient(port: s.port, path: "/v1/activities/STREAMS-1/status", token: s.adminKey)
        open.append(other)
        XCTAssertEqual(try other.waitForEvents(1).count, 1)

        // Closing one frees a slot (once the server has seen the close).
        open.removeFirst().close()
        var replacement: SSEClient?
        let freed = AuthKit.eventually(10) {
            guard let c = try? SSEClient(port: s.port, path: "/v1/activities/STREAMS-1/status", token: key) else { return false }
            _ = try? c.pump(timeout: 5) { $0.status != 0 }
            if c.status == 200 { replacement = c; return true }
            c.close()
            return false
        }
        XCTAssertTrue(freed, "closing a stream did not free its slot")
        if let replacement {
            open.append(replacement)
            XCTAssertEqual(try replacement.waitForEvents(1).count, 1)
        }
    }

    // MARK: - Hostile input

    func testMalformedRequestsAreRefusedAndTheServerStaysUp() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        let admin = s.client
        try AuthKit.start(admin, "HOSTILE-1")
        let pid = s.pid
        let baseline = try XCTUnwrap(AuthKit.residentKB(pid))

        func stillServing(_ what: String, file: StaticString = #filePath, line: UInt = #line) {
            XCTAssertTrue(AuthKit.alive(pid), "dispatchd died after \(what): \(s.log())", file: file, line: line)
            let r = try? admin.get("/v1/activities/HOSTILE-1")
            XCTAssertEqual(r?.status, 200, "a normal request after \(what)", file: file, line: line)
        }

        // Garbage at the HTTP layer: answered with a 4xx (or 501 for an unknown method) and the
        // connection closed, never a crash or a 2xx. These answers come from the HTTP layer
        // itself (HTTPConnection: 400, 413, 431, 501, a JSON body); the route-level refusals
        // below are checked for their JSON error body.
        let junk: [(String, [UInt8])] = [
            ("garbage request line", Array("HELLO WORLD\r\n\r\n".utf8)),
            ("no version", Array("GET /healthz\r\n\r\n".utf8)),
            ("unknown method", Array("BREW /v1/activities HTTP/1.1\r\nHost: x\r\n\r\n".utf8)),
            ("header without colon", Array("GET /healthz HTTP/1.1\r\nHost x\r\nnonsense\r\n\r\n".utf8)),
            ("bad content length", Array("POST /v1/activities/start HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n".utf8)),
            ("huge content length", Array("POST /v1/activities/start HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n".utf8)),
            ("binary junk", AuthKit.randomBytes(64 * 1024)),
            ("NUL bytes", [UInt8](repeating: 0, count: 16 * 1024)),
            ("100 KB request line", Array(("GET /" + String(repeating: "a", count: 100 * 1024) + " HTTP/1.1\r\nHost: x\r\n\r\n").utf8)),
            ("200 KB of headers", Array(("GET /healthz HTTP/1.1\r\nHost: x\r\n" + (0..<2000).map { "X-Junk-\($0): " + String(repeating: "j", count: 90) + "\r\n" }.joined() + "\r\n").utf8)),
            ("one 200 KB header", Array(("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + String(repeating: "b", count: 200 * 1024) + "\r\n\r\n").utf8)),
            ("100 KB body", Array("POST /v1/activities/start HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(s.adminKey)\r\nContent-Type: application/json\r\nContent-Length: 102400\r\n\r\n".utf8)
                + Array(repeating: UInt8(ascii: " "), count: 102_400)),
        ]
        for (what, bytes) in junk {
            let answer = AuthKit.exchange(port: s.port, bytes)
            if let status = answer.status {
                XCTAssertTrue((400..<600).contains(status), "\(what): \(status)")
                XCTAssertNotEqual(status, 500, what)
            }
            XCTAssertTrue(answer.closed, "\(what): the server kept the connection open")
            stillServing(what)
        }

        // Route-level refusals are JSON with a fitting status; none changes stored state.
        let start = "/v1/activities/start"
        for type in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/jsonp", ""] {
            let r = try admin.post(start, #"{"activityId":"HOSTILE-CT","taskName":"x"}"#, headers: ["Content-Type": type])
            AuthKit.assertError(r, 415, "unsupported_media_type", "Content-Type \(type)")
        }
        XCTAssertEqual(try admin.post(start, #"{"activityId":"HOSTILE-CT","taskName":"x"}"#, headers: ["Content-Type": "application/json; charset=utf-8"]).status, 201)
        // Bodies every publish call refuses the same way.
        let badBodies: [(String, String, Int, String)] = [
            ("not JSON", "taskName=hello", 400, "invalid_json"),
            ("empty", "", 400, "invalid_json"),
            ("truncated JSON", #"{"taskName":"#, 400, "invalid_json"),
            ("a JSON array", #"["taskName"]"#, 400, "invalid_json"),
            ("duplicate keys", #"{"status":"a","status":"b"}"#, 400, "invalid_json"),
            ("deep nesting", String(repeating: "[", count: 5000) + String(repeating: "]", count: 5000), 400, "invalid_json"),
            ("unpaired surrogate", #"{"status":"\ud800"}"#, 400, "invalid_json"),
            ("huge number", #"{"progress":1e999}"#, 400, "invalid_json"),
            ("trailing garbage", #"{"status":"a"} {"#, 400, "invalid_json"),
            ("control characters", #"{"status":"a\nb"}"#, 400, "invalid_field"),
            ("progress out of range", #"{"progress":2}"#, 400, "invalid_field"),
            ("unknown field", #"{"stauts":"typo"}"#, 400, "unknown_field"),
            ("20 KB body", #"{"status":""# + String(repeating: "x", count: 20 * 1024) + #""}"#, 413, "body_too_large"),
        ]
        for (what, body, status, code) in badBodies {
            AuthKit.assertError(try admin.post("/v1/activities/HOSTILE-1/update", body), status, code, "update: \(what)")
            AuthKit.assertError(try admin.post("/v1/activities/HOSTILE-1/end", body), status, code, "end: \(what)")
        }
        AuthKit.assertError(try admin.post(start, #"{"taskName":"   "}"#), 400, "invalid_field", "blank taskName")
        AuthKit.assertError(try admin.post(start, #"{"taskName":"x","cancelURL":"javascript:alert(1)"}"#), 400, "invalid_field", "cancelURL")
        AuthKit.assertError(try admin.post(start, #"{"taskName":"x","activityId":"../etc"}"#), 400, "invalid_field", "activityId")
        AuthKit.assertError(try admin.post(start, #"{"taskName":""# + String(repeating: "x", count: 20 * 1024) + #""}"#), 413, "body_too_large", "start: 20 KB")
        // A chunked body is held to the same limits as a sized one.
        let chunk = Array(#"{"taskName":""#.utf8) + [UInt8](repeating: UInt8(ascii: "x"), count: 30 * 1024) + Array(#""}"#.utf8)
        let chunkedHead = "POST \(start) HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer \(s.adminKey)\r\n"
            + "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        let chunked = AuthKit.exchange(port: s.port, Array(chunkedHead.utf8) + Array((String(chunk.count, radix: 16) + "\r\n").utf8) + chunk + Array("\r\n0\r\n\r\n".utf8))
        AuthKit.assertError(try HTTPClient.parse(chunked.raw), 413, "body_too_large", "30 KB chunked body")
        let bigChunk = [UInt8](repeating: UInt8(ascii: " "), count: 100 * 1024)
        let tooBig = AuthKit.exchange(port: s.port, Array(chunkedHead.utf8) + Array((String(bigChunk.count, radix: 16) + "\r\n").utf8) + bigChunk + Array("\r\n0\r\n\r\n".utf8))
        XCTAssertTrue(tooBig.status == 413 || (tooBig.status == nil && tooBig.closed), "100 KB chunked body: \(tooBig.status ?? 0)")
        stillServing("chunked bodies")
        // Invalid UTF-8 bytes in a body, and NUL and junk in the path.
        var rawBody = Array(#"{"taskName":""#.utf8) + [0xC3, 0x28, 0xFF] + Array(#""}"#.utf8)
        AuthKit.assertError(try AuthKit.post(s, start, rawBody), 400, "invalid_json", "invalid UTF-8")
        rawBody = Array(#"{"taskName":"a"#.utf8) + [0] + Array(#"b"}"#.utf8)
        AuthKit.assertError(try AuthKit.post(s, start, rawBody), 400, "invalid_json", "raw NUL in a string")
        AuthKit.assertError(try admin.get("/v1/activities/HOSTILE%001"), 400, "invalid_field")
        AuthKit.assertError(try admin.get("/v1/activities/%FF%FE"), 400, "invalid_field")
        AuthKit.assertError(try admin.get("/v1/activities/" + String(repeating: "x", count: 129)), 400, "invalid_field")
        let traversal = try admin.get("/v1/activities/a%2F..%2Fkeys")
        XCTAssertTrue([400, 404].contains(traversal.status), traversal.text)
        XCTAssertEqual(traversal.headers["content-type"], "application/json")
        AuthKit.assertError(try admin.request("PUT", start, json: "{}"), 405, "method_not_allowed")
        AuthKit.assertError(try admin.get("/v1/activities?limit=99999999999999999999999"), 400, "invalid_query")
        XCTAssertEqual(AuthKit.number(try admin.get("/v1/activities/HOSTILE-1").json?["seq"]), 1, "bad input changed stored state")
        XCTAssertEqual(try TestPostgres.shared().sql(s.conninfo, "SELECT count(*) FROM activities").first?[0], "2")
        stillServing("route-level refusals")

        XCTAssertTrue(AuthKit.eventually(10) { (AuthKit.residentKB(pid) ?? .max) < baseline + 20 * 1024 },
                      "RSS \(AuthKit.residentKB(pid) ?? -1) kB vs baseline \(baseline) kB")
    }

    func testTruncatedBodiesAndHalfOpenConnectionsAreCutOffByTheReadDeadline() throws {
        let s = try TestServer.start()
        defer { s.stop() }
        let admin = s.client
        try AuthKit.start(admin, "SLOW-1")
        let pid = s.pid
        for _ in 0..<20 { _ = try admin.get("/v1/activities/SLOW-1") }
        let baseline = try XCTUnwrap(AuthKit.residentKB(pid))

        // A body shorter than its Content-Length, then silence.
        let truncated = try TestSocket.connect(port: s.port)
        defer { truncated.close() }
        try truncated.send("POST /v1/activities/start HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(s.adminKey)\r\n"
            + "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n" + #"{"activityId":"SLOW-TRUNC","taskName":"#)

        // 200 connections that send half a request and stall (half of them mid-body).
        var stalled: [TestSocket] = [truncated]
        defer { for c in stalled { c.close() } }
        for i in 0..<200 {
            let c = try TestSocket.connect(port: s.port)
            stalled.append(c)
            if i % 2 == 0 {
                try c.send("POST /v1/activities/start HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(s.adminKey)\r\nContent-Le")
            } else {
                try c.send("POST /v1/activities/start HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 4000\r\n\r\n{\"task")
            }
        }
        // The server keeps serving others meanwhile.
        XCTAssertTrue(AuthKit.alive(pid))
        XCTAssertEqual(try HTTPClient(port: s.port).get("/healthz").status, 200)
        let during = try admin.post("/v1/activities/SLOW-1/update", #"{"progress":0.5}"#)
        XCTAssertEqual(during.status, 200, during.text)
        let sse = try SSEClient(port: s.port, path: "/v1/activities/SLOW-1/status", token: s.adminKey)
        defer { sse.close() }
        XCTAssertEqual(try sse.waitForEvents(1).first?.id, "2")

        // The read deadline (10 s of silence) closes every one of them, without an answer that
        // claims success; the bounded wait leaves room for a loaded machine.
        let closedAll = AuthKit.waitForClose(stalled, timeout: 40)
        XCTAssertEqual(closedAll.stillOpen, 0, "connections the server never closed")
        XCTAssertFalse(closedAll.sawSuccess, "a stalled request was answered 2xx")
        XCTAssertEqual(try admin.get("/v1/activities/SLOW-TRUNC").status, 404, "a truncated body was stored")
        XCTAssertTrue(AuthKit.alive(pid), s.log())
        XCTAssertEqual(try admin.get("/v1/activities/SLOW-1").status, 200)
        XCTAssertTrue(AuthKit.eventually(10) { (AuthKit.residentKB(pid) ?? .max) < baseline + 20 * 1024 },
                      "RSS \(AuthKit.residentKB(pid) ?? -1) kB vs baseline \(baseline) kB")
        // The stream was not caught by the request deadline: it lives on past 10 s of quiet.
        XCTAssertEqual(try admin.post("/v1/activities/SLOW-1/end", "{}").status, 200)
        XCTAssertEqual(try sse.waitForEvents(2).last?.event, "completed")
    }
}
