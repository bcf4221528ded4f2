import XCTest
@testable import DispatchCore

/// `HTTP2RequestHead`: the header block the APNs client hands to nghttp2, and what it refuses.
final class HTTP2RequestHeadTests: XCTestCase {
    typealias F = HTTP2RequestHead.Field

    func head(_ url: String, method: String = "POST", _ headers: [(String, String)] = [], body: Int = 2) -> Result<HTTP2RequestHead, HTTP2RequestHead.Invalid> {
        HTTP2RequestHead.make(method: method, url: url, headers: headers, bodyLength: body)
    }

    func testURLs() throws {
        let cases: [(String, String, Int, String, String)] = [
            // url, host, port, authority, path
            ("https://api.push.apple.com/3/device/ab", "api.push.apple.com", 443, "api.push.apple.com", "/3/device/ab"),
            ("https://127.0.0.1:8443/3/device/ab", "127.0.0.1", 8443, "127.0.0.1:8443", "/3/device/ab"),
            ("https://[::1]:2197/x?y=1", "::1", 2197, "[::1]:2197", "/x?y=1"),
            ("https://API.Example.com", "api.example.com", 443, "api.example.com", "/"),
            ("https://h:1?q", "h", 1, "h:1", "/?q"),
            ("https://h/p#frag", "h", 443, "h", "/p"),
        ]
        for (url, host, port, authority, path) in cases {
            let h = try head(url).get()
            XCTAssertEqual(h.host, host, url)
            XCTAssertEqual(h.port, port, url)
            XCTAssertEqual(h.authority, authority, url)
            XCTAssertEqual(h.path, path, url)
        }
    }

    func testFieldsPseudoHeadersFirstNamesLowerCasedLengthAdded() throws {
        let h = try head("https://h:9/3/device/ab", [("Authorization", "bearer x"), ("apns-priority", "5"), ("X-Empty", "")]).get()
        XCTAssertEqual(h.fields, [F(":method", "POST"), F(":scheme", "https"), F(":authority", "h:9"), F(":path", "/3/device/ab"),
                                  F("authorization", "bearer x"), F("apns-priority", "5"), F("x-empty", ""), F("content-length", "2")])
        let get = try head("https://h/1/apps/b/channels", method: "GET", [("apns-channel-id", "c")], body: 0).get()
        XCTAssertEqual(get.fields.last, F("apns-channel-id", "c"), "no content-length on a GET without a body")
        let delete = try head("https://h/x", method: "DELETE", body: 0).get()
        XCTAssertFalse(delete.fields.contains { $0.name == "content-length" })
        let post = try head("https://h/x", body: 0).get()
        XCTAssertEqual(post.fields.last, F("content-length", "0"))
        let given = try head("https://h/x", [("Content-Length", "2")]).get()
        XCTAssertEqual(given.fields.filter { $0.name == "content-length" }.count, 1)
    }

    func testRefused() {
        let refused: [(String, String, [(String, String)], Int)] = [
            ("plain http", "http://h/x", [], 0),
            ("no host", "https:///x", [], 0),
            ("user info", "https://u@h/x", [], 0),
            ("bad port", "https://h:0/x", [], 0),
            ("port too big", "https://h:70000/x", [], 0),
            ("port not a number", "https://h:ab/x", [], 0),
            ("unclosed IPv6", "https://[::1/x", [], 0),
            ("space in path", "https://h/a b", [], 0),
            ("space in host", "https://h h/x", [], 0),
            ("CR in a value", "https://h/x", [("a", "b\r\nc: d")], 0),
            ("NUL in a value", "https://h/x", [("a", "b\u{0}")], 0),
            ("bad name", "https://h/x", [("a b", "c")], 0),
            ("empty name", "https://h/x", [("", "c")], 0),
            ("connection header", "https://h/x", [("Connection", "close")], 0),
            ("host header", "https://h/x", [("Host", "other")], 0),
            ("transfer-encoding", "https://h/x", [("transfer-encoding", "chunked")], 0),
            ("wrong content-length", "https://h/x", [("content-length", "5")], 2),
        ]
        for (name, url, headers, body) in refused {
            if case .success = head(url, headers, body: body) { XCTFail("accepted: \(name)") }
        }
        if case .success = head("https://h/x", method: "PO ST") { XCTFail("accepted a bad method") }
    }
}
