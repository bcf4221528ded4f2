import DispatchCore
import XCTest

final class HTTPRequestEncoderTests: XCTestCase {
    private func text(_ bytes: [UInt8]) -> String { String(decoding: bytes, as: UTF8.self) }

    func testRequestsAsTheyGoOnTheWire() {
        // (method, target, headers, body, close, bytes)
        let table: [(String, String, [(String, String)], String?, Bool, String)] = [
            ("GET", "/healthz", [], nil, true, "GET /healthz HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"),
            ("GET", "/v1/stream", [("Accept", "text/event-stream"), ("Last-Event-ID", "7")], nil, false,
             "GET /v1/stream HTTP/1.1\r\nHost: h\r\nAccept: text/event-stream\r\nLast-Event-ID: 7\r\n\r\n"),
            ("POST", "/v1/keys", [("Content-Type", "application/json")], "{\"a\":1}", true,
             "POST /v1/keys HTTP/1.1\r\nHost: h\r\nContent-Type: application/json\r\nContent-Length: 7\r\nConnection: close\r\n\r\n{\"a\":1}"),
            ("POST", "/x", [], "", false, "POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n"),
            ("GET", "/é", [("X-Name", "naïve")], nil, false, "GET /é HTTP/1.1\r\nHost: h\r\nX-Name: naïve\r\n\r\n"),
        ]
        for (method, target, headers, body, close, wire) in table {
            XCTAssertEqual(text(HTTPRequestEncoder.encode(method: method, target: target, host: "h", headers: headers, body: body, close: close)),
                           wire, "\(method) \(target)")
        }
    }

    func testLineBreaksInAnyPartCannotAddAHeaderOrARequest() {
        let bytes = HTTPRequestEncoder.encode(method: "GET", target: "/a\r\nGET /b HTTP/1.1", host: "h\r\nX: 1",
                                              headers: [("Authorization\n", "Bearer a\r\nX-Evil: 1")], body: nil as [UInt8]?, close: false)
        XCTAssertEqual(text(bytes), "GET /aGET /b HTTP/1.1 HTTP/1.1\r\nHost: hX: 1\r\nAuthorization: Bearer aX-Evil: 1\r\n\r\n")
        XCTAssertEqual(text(bytes).components(separatedBy: "\r\n").count, 5, "three lines, the blank one, nothing after")
    }
}
