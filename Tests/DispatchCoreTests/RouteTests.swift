@testable import DispatchCore
import XCTest

/// The pure route matcher, one line per request.
final class RouteTests: XCTestCase {
    func testRoutes() {
        let table: [(HTTPMethod?, String, Route.Match)] = [
            (.get, "/healthz", .route(.healthz)),
            (.get, "/readyz", .route(.readyz)),
            (.get, "/metrics", .route(.metrics)),
            (.head, "/healthz", .route(.healthz)),
            (.post, "/healthz", .methodNotAllowed(allow: [.get])),
            (.post, "/v1/activities/start", .route(.startActivity)),
            (.get, "/v1/activities/start", .methodNotAllowed(allow: [.post])),
            (.get, "/v1/activities", .route(.listActivities)),
            (.get, "/v1/activities/TEST-RTORRENT-01", .route(.activity("TEST-RTORRENT-01"))),
            (.post, "/v1/activities/a.b:c_d-e/update", .route(.update("a.b:c_d-e"))),
            (.post, "/v1/activities/x/end", .route(.end("x"))),
            (.get, "/v1/activities/x/events", .route(.events("x"))),
            (.get, "/v1/activities/x/status", .route(.status("x"))),
            (.head, "/v1/activities/x/status", .route(.status("x"))),
            (.get, "/v1/activities/x/update", .methodNotAllowed(allow: [.post])),
            (.put, "/v1/activities/x", .methodNotAllowed(allow: [.get])),
            (.get, "/v1/keys", .route(.keys)),
            (.post, "/v1/keys", .route(.keys)),
            (.put, "/v1/keys", .methodNotAllowed(allow: [.get, .post])),
            (.delete, "/v1/keys/ci", .route(.key("ci"))),
            (.post, "/v1/activities/bad id/update", .invalidActivityID),
            (.get, "/v1/activities//status", .invalidActivityID),
            (.get, "/v1/activities/\(String(repeating: "a", count: 129))", .invalidActivityID),
            (.get, "/v1/activities/x/nope", .notFound),
            (.get, "/nope", .notFound),
            (.get, "/", .route(.page("index.html"))),
            (.get, "/app.js", .route(.page("app.js"))),
            (.get, "/secret.txt", .notFound),
            (.get, "/openapi.json", .route(.openAPI)),
            (.get, "/v1/stream", .route(.feed)),
            (.post, "/v1/activities/x/cancel", .route(.cancel("x"))),
            (.post, "/v1/activities/x/touch", .route(.touch("x"))),
            (.get, "/v1/activities/x/cancel", .methodNotAllowed(allow: [.post])),
            (.post, "/v1/activity-tokens", .route(.registerTokens)),
            (.delete, "/v1/activity-tokens/abcd", .route(.forgetDevice("abcd"))),
            (.get, "/v2/activities", .notFound),
            (.get, "/v1/activities/x/status/more", .notFound),
            (.get, "/v1/activities/x/status/", .notFound),
            (.get, "/v1/activities/a/b/c/d/e/f/g", .notFound),
            (.get, "//v1/activities", .notFound),
            // Split on the bytes: a combining mark after `/` does not hide the separator.
            (.get, "/v1/activities/\u{301}x/status", .invalidActivityID),
            (.get, "/v1/activities/é/status", .invalidActivityID),
            (nil, "/v1/activities", .methodNotAllowed(allow: [.get])),
            // OPTIONS: a CORS preflight on any existing path, even one whose id breaks the rules
            // (a browser asks before it sends); unknown paths stay 404.
            (.options, "/v1/activities/start", .preflight(.startActivity)),
            (.options, "/v1/activities/x/status", .preflight(.status("x"))),
            (.options, "/v1/stream", .preflight(.feed)),
            (.options, "/v1/activities/bad id", .preflight(.activity("bad id"))),
            (.options, "/v1/nope", .notFound),
        ]
        for (method, path, want) in table {
            XCTAssertEqual(Route.match(method: method, path: path), want, "\(method?.rawValue ?? "?") \(path)")
        }
    }

    func testPatternsNeverContainIDs() {
        XCTAssertEqual(Route.status("secret-job").pattern, "/v1/activities/{id}/status")
        XCTAssertEqual(Route.key("ci").pattern, "/v1/keys/{name}")
    }
}
