import DispatchCore
import XCTest

/// The HTTP layer's framing and limit rules, as a table: each row is a head's relevant parts
/// and what must be decided.
final class HTTPFramingTests: XCTestCase {
    typealias R = Result<HTTPFraming.Head, HTTPFraming.Refusal>
    let limits = HTTPFraming.Limits(maxHeadBytes: 8192, maxTargetBytes: 4096, maxBodyBytes: 65536)

    func head(_ body: HTTPFraming.Body, keepAlive: Bool = true, expect: Bool = false) -> R {
        .success(HTTPFraming.Head(body: body, keepAlive: keepAlive, expectContinue: expect))
    }

    func testDecisionsFromTheHead() {
        let rows: [(String, Int, [String], [String], [String], [String], R)] = [
            // what, minor, Content-Length, Transfer-Encoding, Connection, Expect, decision
            ("a GET", 1, [], [], [], [], head(.none)),
            ("a sized body", 1, ["12"], [], [], [], head(.length(12))),
            ("a zero length", 1, ["0"], [], [], [], head(.none)),
            ("identical duplicates are one length", 1, ["12", "12"], [], [], [], head(.length(12))),
            ("a list of identical lengths", 1, ["12, 12"], [], [], [], head(.length(12))),
            ("conflicting lengths", 1, ["12", "5"], [], [], [], .failure(.malformed("conflicting Content-Length headers"))),
            ("conflicting in a list", 1, ["12,5"], [], [], [], .failure(.malformed("conflicting Content-Length headers"))),
            ("a negative length", 1, ["-5"], [], [], [], .failure(.malformed("invalid Content-Length"))),
            ("a signed length", 1, ["+5"], [], [], [], .failure(.malformed("invalid Content-Length"))),
            ("an empty length", 1, [""], [], [], [], .failure(.malformed("invalid Content-Length"))),
            ("a huge length", 1, ["99999999999999999999"], [], [], [], .failure(.malformed("invalid Content-Length"))),
            ("a length above the limit", 1, ["65537"], [], [], [], .failure(.bodyTooLarge)),
            ("a length at the limit", 1, ["65536"], [], [], [], head(.length(65536))),
            ("chunked", 1, [], ["chunked"], [], [], head(.chunked)),
            ("chunked in another case", 1, [], [" Chunked "], [], [], head(.chunked)),
            ("both framings (smuggling)", 1, ["5"], ["chunked"], [], [], .failure(.malformed("both Content-Length and Transfer-Encoding"))),
            ("chunked not last", 1, [], ["chunked, gzip"], [], [], .failure(.malformed("Transfer-Encoding must end with chunked"))),
            ("an unknown coding only", 1, [], ["gzip"], [], [], .failure(.malformed("Transfer-Encoding must end with chunked"))),
            ("another coding before chunked", 1, [], ["gzip", "chunked"], [], [], .failure(.notImplemented("only Transfer-Encoding: chunked is supported"))),
            ("chunked twice", 1, [], ["chunked", "chunked"], [], [], .failure(.notImplemented("only Transfer-Encoding: chunked is supported"))),
            ("Transfer-Encoding in HTTP/1.0", 0, [], ["chunked"], [], [], .failure(.malformed("Transfer-Encoding in an HTTP/1.0 request"))),
            ("HTTP/1.1 closes when asked", 1, [], [], ["close"], [], head(.none, keepAlive: false)),
            ("Connection tokens in a list", 1, [], [], ["TE, Close"], [], head(.none, keepAlive: false)),
            ("HTTP/1.0 closes by default", 0, [], [], [], [], head(.none, keepAlive: false)),
            ("HTTP/1.0 keep-alive", 0, [], [], ["Keep-Alive"], [], head(.none, keepAlive: true)),
            ("100-continue with a body", 1, ["5"], [], [], ["100-continue"], head(.length(5), expect: true)),
            ("100-continue without a body", 1, [], [], [], ["100-Continue"], head(.none)),
            ("100-continue in HTTP/1.0", 0, ["5"], [], [], ["100-continue"], head(.length(5), keepAlive: false)),
            ("another expectation", 1, ["5"], [], [], ["200-ok"], .failure(.expectationFailed)),
            ("HTTP/1.2", 2, [], [], [], [], .failure(.malformed("only HTTP/1.0 and HTTP/1.1 are spoken"))),
        ]
        for (what, minor, cl, te, conn, expect, want) in rows {
            let got = HTTPFraming.decide(minorVersion: minor, headBytes: 100, targetBytes: 10, contentLength: cl, transferEncoding: te,
                                         connection: conn, expect: expect, limits: limits)
            XCTAssertEqual(got, want, what)
        }
    }

    func testHeadAndTargetLimits() {
        let ok = HTTPFraming.decide(minorVersion: 1, headBytes: 8192, targetBytes: 4096, contentLength: [], transferEncoding: [],
                                    connection: [], expect: [], limits: limits)
        XCTAssertEqual(ok, head(.none), "at the limits")
        XCTAssertEqual(HTTPFraming.decide(minorVersion: 1, headBytes: 8193, targetBytes: 10, contentLength: [], transferEncoding: [],
                                          connection: [], expect: [], limits: limits), .failure(.headersTooLarge))
        XCTAssertEqual(HTTPFraming.decide(minorVersion: 1, headBytes: 5000, targetBytes: 4097, contentLength: [], transferEncoding: [],
                                          connection: [], expect: [], limits: limits), .failure(.targetTooLong))
        let incomplete: [(Int, Bool, HTTPFraming.Refusal?)] = [
            (8192, false, nil), (8192, true, nil), (8193, true, .headersTooLarge), (8193, false, .targetTooLong), (100_000, true, .headersTooLarge),
        ]
        for (buffered, lineEnded, want) in incomplete {
            XCTAssertEqual(HTTPFraming.incompleteHead(buffered: buffered, firstLineEnded: lineEnded, limits: limits), want, "\(buffered) \(lineEnded)")
        }
    }

    func testAPathMayTakeALargerBodyThanTheDefault() {
        let limits = HTTPFraming.Limits(maxBodyBytes: 64 * 1024, largeBodies: ["/v1/changes": 2 << 20])
        XCTAssertEqual(limits.forTarget(bytes: "/v1/changes".utf8).maxBodyBytes, 2 << 20)
        XCTAssertEqual(limits.forTarget(bytes: "/v1/changes?x=1".utf8).maxBodyBytes, 2 << 20, "the query does not change the path")
        XCTAssertEqual(limits.forTarget(bytes: "/v1/changes/".utf8).maxBodyBytes, 64 * 1024)
        XCTAssertEqual(limits.forTarget(bytes: "/v1/change".utf8).maxBodyBytes, 64 * 1024, "a prefix of the path is another path")
        XCTAssertEqual(limits.forTarget(bytes: "/v1/changesX?x".utf8).maxBodyBytes, 64 * 1024)
        XCTAssertEqual(limits.forTarget(bytes: "/v1/activities/start".utf8).maxBodyBytes, 64 * 1024)
        XCTAssertEqual(limits.forTarget(bytes: Array("/v1/changes?x=1".utf8)).maxBodyBytes, 2 << 20, "the connection's raw bytes")
        XCTAssertEqual(limits.forTarget(bytes: Array("/v1/changes/".utf8)).maxBodyBytes, 64 * 1024)
        func decide(_ target: Substring, length: Int) -> Result<HTTPFraming.Head, HTTPFraming.Refusal> {
            HTTPFraming.decide(minorVersion: 1, headBytes: 100, targetBytes: target.utf8.count, contentLength: [String(length)],
                               transferEncoding: [], connection: [], expect: [], limits: limits.forTarget(bytes: target.utf8))
        }
        XCTAssertEqual(decide("/v1/changes", length: 1 << 20), .success(.init(body: .length(1 << 20), keepAlive: true, expectContinue: false)))
        XCTAssertEqual(decide("/v1/activities/start", length: 1 << 20), .failure(.bodyTooLarge))
        XCTAssertEqual(decide("/v1/changes", length: (2 << 20) + 1), .failure(.bodyTooLarge))
    }

    func testMethodsHTTPDoesNotDefineAreNotImplemented() {
        for m in ["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"] { XCTAssertNil(HTTPFraming.methodRefusal(m), m) }
        for m in ["BREW", "QUERY", "get", "PROPFIND"] { XCTAssertEqual(HTTPFraming.methodRefusal(m)?.status, 501, m) }
    }

    func testRefusalsAreTheContractsJSONWithTheirStatus() {
        let rows: [(HTTPFraming.Refusal, Int, String)] = [
            (.malformed("x"), 400, "invalid_request"), (.headersTooLarge, 431, "headers_too_large"), (.targetTooLong, 414, "uri_too_long"),
            (.bodyTooLarge, 413, "body_too_large"), (.expectationFailed, 417, "expectation_failed"), (.notImplemented("y"), 501, "not_implemented"),
        ]
        for (r, status, code) in rows {
            XCTAssertEqual(r.status, status)
            let text = String(decoding: r.jsonBody, as: UTF8.self)
            XCTAssertTrue(text.hasPrefix(#"{"error":{"code":"\#(code)","message":""#), text)
        }
    }
}
