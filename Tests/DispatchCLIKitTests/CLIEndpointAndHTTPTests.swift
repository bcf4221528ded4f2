import XCTest
import DispatchCore
import DispatchCLIKit

final class CLIEndpointAndHTTPTests: XCTestCase {
    func testEndpointParsing() throws {
        XCTAssertEqual(try CLIEndpoint.parse("http://127.0.0.1:8080"), CLIEndpoint(host: "127.0.0.1", port: 8080))
        XCTAssertEqual(try CLIEndpoint.parse("HTTP://Example.org/"), CLIEndpoint(host: "Example.org", port: 80))
        XCTAssertEqual(try CLIEndpoint.parse("http://[::1]:9/x/y"), CLIEndpoint(host: "::1", port: 9, basePath: "/x/y"))
        XCTAssertEqual(try CLIEndpoint.parse("http://[::1]:9").hostHeader, "[::1]:9")
        for bad in ["ftp://a", "a:80", "http://", "https://", "http://a:0", "http://a:70000", "http://a:x",
                    "http://u:p@a", "http://a/?q", "http://[::1", "http://a b", "https://a\\b"] {
            XCTAssertThrowsError(try CLIEndpoint.parse(bad), bad)
        }
        let secure = try CLIEndpoint.parse("https://dispatch.example/api/")
        XCTAssertEqual(secure, CLIEndpoint(host: "dispatch.example", port: 443, basePath: "/api", scheme: .https))
        XCTAssertEqual(secure.hostHeader, "dispatch.example")
        XCTAssertEqual(secure.display, "https://dispatch.example/api")
        XCTAssertEqual(secure.connectURL, "https://dispatch.example:443/")
        XCTAssertEqual(try CLIEndpoint.parse("HTTPS://[::1]:8443").connectURL, "https://[::1]:8443/")
        XCTAssertEqual(try CLIEndpoint.parse("https://h:443").hostHeader, "h")
        XCTAssertEqual(try CLIEndpoint.parse("https://h:80").hostHeader, "h:80")
    }

    /// A key goes over plain HTTP only to this machine, unless the user says the network is trusted.
    func testURLPolicy() throws {
        for url in ["http://127.0.0.1:8080", "http://127.3.4.5", "http://localhost:1", "http://LOCALHOST", "http://[::1]:80",
                    "http://[0:0:0:0:0:0:0:1]", "http://[::ffff:127.0.0.1]", "https://10.0.0.5", "https://example.org"] {
            XCTAssertNil(CLITransportPolicy.refusal(endpoint: try CLIEndpoint.parse(url), sendsKey: true, insecureHTTP: false), url)
        }
        for url in ["http://10.0.0.5:8080", "http://example.org", "http://128.0.0.1", "http://[::2]", "http://localhost.evil.example",
                    "http://127.0.0.1.nip.io", "http://[::ffff:10.0.0.1]", "http://0.0.0.0", "http://1270.0.0.1"] {
            let endpoint = try CLIEndpoint.parse(url)
            XCTAssertNotNil(CLITransportPolicy.refusal(endpoint: endpoint, sendsKey: true, insecureHTTP: false), url)
            XCTAssertNil(CLITransportPolicy.refusal(endpoint: endpoint, sendsKey: true, insecureHTTP: true), url)
            XCTAssertNil(CLITransportPolicy.refusal(endpoint: endpoint, sendsKey: false, insecureHTTP: false), "no key, nothing to leak: \(url)")
        }
        XCTAssertEqual(CLIAddress.ipv6("fe80::1%eth0"), [0xfe, 0x80] + [UInt8](repeating: 0, count: 13) + [1])
        XCTAssertNil(CLIAddress.ipv6("1::2::3"))
        XCTAssertNil(CLIAddress.ipv6("12345::"))
        XCTAssertNil(CLIAddress.ipv4("1.2.3"))

        // Through the parser: a usage error (exit 2) that says why and what to do.
        let refused = usageError(["progress", "--id", "a", "--url", "http://10.0.0.5:8080"], env: ["DISPATCH_TOKEN": "k"])
        XCTAssertEqual(refused?.command, "progress")
        XCTAssertTrue(refused?.message.contains("--insecure-http") == true, refused?.message ?? "")
        XCTAssertTrue(refused?.message.contains("https://") == true, refused?.message ?? "")
        XCTAssertNotNil(usageError(["progress", "--id", "a", "--url", "http://10.0.0.5"], env: ["DISPATCH_TOKEN_FILE": "/k"]))
        XCTAssertTrue(try command(["progress", "--id", "a", "--url", "http://10.0.0.5", "--insecure-http"], env: ["DISPATCH_TOKEN": "k"]).0.insecureHTTP)
        XCTAssertNoThrow(try command(["progress", "--id", "a", "--url", "http://10.0.0.5"], env: ["DISPATCH_TOKEN": "k", "DISPATCH_INSECURE_HTTP": "1"]))
        XCTAssertNoThrow(try command(["verify-webhook", "--secret", "s", "--signature", "t=1,v1=a", "--body", "-"],
                                     env: ["DISPATCH_TOKEN": "k", "DISPATCH_URL": "http://10.0.0.5"]), "verify-webhook sends nothing")
        // The CA for https: the flag, then DISPATCH_CA_FILE, then curl's CURL_CA_BUNDLE.
        XCTAssertEqual(try command(["touch", "--id", "a", "--cacert", "/flag.pem"], env: ["DISPATCH_CA_FILE": "/env.pem"]).0.caFile, "/flag.pem")
        XCTAssertEqual(try command(["touch", "--id", "a"], env: ["DISPATCH_CA_FILE": "/env.pem", "CURL_CA_BUNDLE": "/curl.pem"]).0.caFile, "/env.pem")
        XCTAssertEqual(try command(["touch", "--id", "a"], env: ["CURL_CA_BUNDLE": "/curl.pem"]).0.caFile, "/curl.pem")
        XCTAssertNil(try command(["touch", "--id", "a"]).0.caFile)
    }

    func testRequestEncodingAndHeaderInjection() {
        let bytes = CLIHTTP.encodeRequest(method: "POST", path: "/v1/activities/start",
                                          endpoint: CLIEndpoint(host: "h", port: 81, basePath: "/p"),
                                          headers: [("Authorization", "Bearer a\r\nX-Evil: 1")], body: Array("{}".utf8))
        XCTAssertEqual(String(decoding: bytes, as: UTF8.self),
                       "POST /p/v1/activities/start HTTP/1.1\r\nHost: h:81\r\nAuthorization: Bearer aX-Evil: 1\r\n"
                       + "Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
        XCTAssertEqual(CLIHTTP.encodeSegment("TEST-1.a_b:c~"), "TEST-1.a_b:c~")
        XCTAssertEqual(CLIHTTP.encodeSegment("a/b c?é"), "a%2Fb%20c%3F%C3%A9")
    }

    func testStatusToExitCode() {
        XCTAssertEqual(CLIHTTPDisposition.of(status: 409, body: Array(#"{"error":{"code":"concurrent_changes","message":"retry"}}"#.utf8)), .retry,
                       "a transient conflict is retried like a 503")
        XCTAssertEqual(CLIHTTPDisposition.of(status: 409, body: Array(#"{"error":{"code":"already_finished","message":"done"}}"#.utf8)), .fail(.conflict))
        XCTAssertEqual(CLIHTTPDisposition.of(status: 200), .success)
        XCTAssertEqual(CLIHTTPDisposition.of(status: 201), .success)
        XCTAssertEqual(CLIHTTPDisposition.of(status: 400), .fail(.rejected))
        XCTAssertEqual(CLIHTTPDisposition.of(status: 413), .fail(.rejected))
        XCTAssertEqual(CLIHTTPDisposition.of(status: 415), .fail(.rejected))
        XCTAssertEqual(CLIHTTPDisposition.of(status: 401), .fail(.auth))
        XCTAssertEqual(CLIHTTPDisposition.of(status: 403), .fail(.auth))
        XCTAssertEqual(CLIHTTPDisposition.of(status: 404), .fail(.notFound))
        XCTAssertEqual(CLIHTTPDisposition.of(status: 409), .fail(.conflict))
        XCTAssertEqual(CLIHTTPDisposition.of(status: 429), .retry)
        XCTAssertEqual(CLIHTTPDisposition.of(status: 500), .retry)
        XCTAssertEqual(CLIHTTPDisposition.of(status: 503), .retry)
        XCTAssertEqual(CLIHTTPDisposition.of(status: 302), .fail(.unavailable))
        XCTAssertEqual([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], CLIExitCode.allCases.map(\.rawValue))
    }

    func testServerErrorDescription() {
        let body = Array(#"{"error":{"code":"not_found","message":"no activity \u001b[2Jx"}}"#.utf8)
        XCTAssertEqual(CLIServerError.parse(body), CLIServerError(code: "not_found", message: "no activity \u{1B}[2Jx"))
        XCTAssertEqual(CLIServerError.describe(status: 404, body: body), "no activity  [2Jx (not_found, HTTP 404)")
        XCTAssertEqual(CLIServerError.describe(status: 502, body: Array("<html>".utf8)), "bad gateway (HTTP 502)")
    }
}
