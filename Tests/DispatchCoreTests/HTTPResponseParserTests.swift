import DispatchCore
import XCTest

/// The one HTTP/1.1 response parser (the CLI, the benchmark and the tests read with it):
/// framings, interim answers, limits, and the line between truncated and malformed.
final class HTTPResponseParserTests: XCTestCase {
    /// Feeds `text` in pieces of `step` bytes through the collecting interface.
    private func parse(_ text: String, step: Int, closeAtEnd: Bool = false, isHeadRequest: Bool = false) throws -> (HTTPResponseHead?, String, Bool) {
        var p = HTTPResponseParser(isHeadRequest: isHeadRequest)
        var head: HTTPResponseHead?
        var body: [UInt8] = []
        var ended = false
        let bytes = Array(text.utf8)
        var i = 0
        func take(_ events: [HTTPResponseEvent]) {
            for e in events {
                switch e {
                case .head(let h): head = h
                case .body(let b): body += b
                case .end: ended = true
                }
            }
        }
        while i < bytes.count {
            take(try p.feed(bytes[i..<min(i + step, bytes.count)]))
            i += step
        }
        if closeAtEnd { take(try p.finish()) }
        return (head, String(decoding: body, as: UTF8.self), ended)
    }

    /// What the zero-copy interface hands out for `pieces`, as text ("H200", body bytes, "E"),
    /// and how many bytes of the last piece the response used.
    private func parts(_ pieces: [[UInt8]], isHeadRequest: Bool = false, close: Bool = false) throws -> (String, Int) {
        var p = HTTPResponseParser(isHeadRequest: isHeadRequest)
        var out = ""
        var used = 0
        func take(_ part: HTTPResponseParser.Part) {
            switch part {
            case .head(let h): out += "H\(h.status)|"
            case .body(let b): out += String(decoding: b, as: UTF8.self)
            case .end: out += "|E"
            }
        }
        for piece in pieces {
            used = try piece.withUnsafeBytes { raw in try p.feed(raw, take) }
        }
        if close { try p.finish(take) }
        return (out, used)
    }

    func testResponseParserFramings() throws {
        let fixed = "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"a\":\"bcd\"}"
        let chunked = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n"
        for step in [1, 2, 7, 1000] {
            let (h1, b1, e1) = try parse(fixed, step: step)
            XCTAssertEqual(h1?.status, 201)
            XCTAssertEqual(h1?.header("CONTENT-TYPE"), "application/json")
            XCTAssertEqual(b1, "{\"a\":\"bcd\"}")
            XCTAssertTrue(e1)
            let (h2, b2, e2) = try parse(chunked, step: step)
            XCTAssertEqual(h2?.status, 200)
            XCTAssertEqual(b2, "hello world")
            XCTAssertTrue(e2)
        }
        let (h3, b3, e3) = try parse("HTTP/1.0 200 OK\r\n\r\nuntil close", step: 3, closeAtEnd: true)
        XCTAssertEqual(h3?.status, 200)
        XCTAssertEqual(b3, "until close")
        XCTAssertTrue(e3)
        let (h4, b4, e4) = try parse("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n", step: 5)
        XCTAssertEqual(h4?.status, 204)
        XCTAssertEqual(b4, "")
        XCTAssertTrue(e4)
    }

    func testResponseParserErrors() {
        var p = HTTPResponseParser()
        XCTAssertThrowsError(try p.feed(Array("SSH-2.0-OpenSSH\r\n\r\n".utf8))) { XCTAssertFalse(($0 as! HTTPParseError).truncated) }
        var q = HTTPResponseParser()
        XCTAssertNoThrow(try q.feed(Array("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc".utf8)))
        XCTAssertThrowsError(try q.finish()) { XCTAssertTrue(($0 as! HTTPParseError).truncated) }
        var r = HTTPResponseParser()
        XCTAssertThrowsError(try r.feed(Array("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n".utf8)))
        var s = HTTPResponseParser()
        XCTAssertThrowsError(try s.feed(Array("HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n".utf8)))
    }

    /// The head: status line, reason, version, names lower-cased and values trimmed in order,
    /// obs-fold joined, bare LF line ends, keep-alive by version and `Connection`.
    func testHead() throws {
        let (h, _, _) = try parse("HTTP/1.1 404 Not Found Here\r\nX-A:  one \t\r\nx-a: two\r\nX-Fold: a\r\n  b\r\nContent-Length: 0\r\n\r\n", step: 1)
        let head = try XCTUnwrap(h)
        XCTAssertEqual(head.status, 404)
        XCTAssertEqual(head.reason, "Not Found Here")
        XCTAssertEqual(head.minorVersion, 1)
        XCTAssertEqual(head.headers.map(\.0), ["x-a", "x-a", "x-fold", "content-length"])
        XCTAssertEqual(head.headers.map(\.1), ["one", "two", "a b", "0"])
        XCTAssertEqual(head.header("X-A"), "one")
        XCTAssertTrue(head.keepAlive)
        let (bare, body, ended) = try parse("HTTP/1.1 200\nContent-Length: 2\n\nok", step: 1)
        XCTAssertEqual(bare?.status, 200)
        XCTAssertEqual(bare?.reason, "")
        XCTAssertEqual(body, "ok")
        XCTAssertTrue(ended)
        let (mixed, _, _) = try parse("HTTP/1.1 200 OK\r\nA: 1\n\r\n", step: 2)
        XCTAssertEqual(mixed?.header("a"), "1")

        XCTAssertFalse(HTTPResponseHead(status: 200, headers: [("connection", "close")]).keepAlive)
        XCTAssertFalse(HTTPResponseHead(status: 200, headers: [("connection", "Upgrade, Close")]).keepAlive)
        XCTAssertFalse(HTTPResponseHead(status: 200, minorVersion: 0).keepAlive)
        XCTAssertTrue(HTTPResponseHead(status: 200, minorVersion: 0, headers: [("connection", "Keep-Alive")]).keepAlive)
    }

    /// No body after HEAD, 204 and 304, whatever their headers say; several 1xx are skipped.
    func testResponsesWithoutABody() throws {
        let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 50\r\n\r\n"
        XCTAssertEqual(try parts([Array(head.utf8)], isHeadRequest: true).0, "H200||E")
        XCTAssertEqual(try parts([Array("HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n".utf8)]).0, "H304||E")
        XCTAssertEqual(try parts([Array("HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n".utf8)]).0, "H204||E")
        let interim = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
        XCTAssertEqual(try parts([Array(interim.utf8)]).0, "H200|ok|E")
    }

    /// A response ends where its framing says; what follows (a kept-alive connection's next
    /// answer, a pipelined one) is left for the next parser, whichever way it is read.
    func testBytesAfterTheResponseAreLeftForTheNext() throws {
        let first = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
        let second = "HTTP/1.1 404 Not Found\r\nContent-Length: 3\r\nConnection: close\r\n\r\nnop"
        let both = Array((first + second).utf8)
        let (afterHead, used) = try parts([both], isHeadRequest: true)
        XCTAssertEqual(afterHead, "H200||E")
        XCTAssertEqual(used, first.utf8.count)
        let (a, rest) = try HTTPResponseParser.response(in: both[...], isHeadRequest: true)
        XCTAssertEqual(a.head.status, 200)
        XCTAssertEqual(a.body, [])
        let (b, tail) = try HTTPResponseParser.response(in: rest)
        XCTAssertEqual(b.head.status, 404)
        XCTAssertEqual(b.head.keepAlive, false)
        XCTAssertEqual(String(decoding: b.body, as: UTF8.self), "nop")
        XCTAssertTrue(tail.isEmpty)
        // Without HEAD, the first answer has no length: its body runs to the close.
        let (c, none) = try HTTPResponseParser.response(in: both[...])
        XCTAssertEqual(String(decoding: c.body, as: UTF8.self), second)
        XCTAssertTrue(none.isEmpty)
        // The collecting form ignores what follows the end.
        var p = HTTPResponseParser()
        XCTAssertEqual(try p.feed(Array("HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nxHTTP/1.1 500 ".utf8)),
                       [.head(HTTPResponseHead(status: 200, reason: "OK", headers: [("content-length", "1")])), .body([0x78]), .end])
        XCTAssertTrue(p.isComplete)
        XCTAssertEqual(try p.finish(), [])
        // Chunked: the response ends after the trailers' blank line.
        let chunked = Array("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\nT: 1\r\n\r\nNEXT".utf8)
        let (d, more) = try HTTPResponseParser.response(in: chunked[...])
        XCTAssertEqual(String(decoding: d.body, as: UTF8.self), "abc")
        XCTAssertEqual(String(decoding: more, as: UTF8.self), "NEXT")
    }

    /// An SSE stream in chunks, as dispatchd and nchan send it: the same parts at every split
    /// point, byte by byte, and through the zero-copy and collecting interfaces.
    func testEverySplitPointGivesTheSameParts() throws {
        let stream = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            + "12\r\nretry: 3000\n\n: hi\n\r\n"
            + "2a ; name=\"value\"\r\nid: 5\nevent: processing\ndata: {\"seq\":5,\"st\r\n"
            + "13\r\natus\":\"t=123456\"}\n\n\r\n"
            + "0\r\nX-Checksum: abc\r\n\r\n"
        let bytes = Array(stream.utf8)
        let (whole, used) = try parts([bytes])
        XCTAssertEqual(whole, "H200|retry: 3000\n\n: hi\nid: 5\nevent: processing\ndata: {\"seq\":5,\"status\":\"t=123456\"}\n\n|E")
        XCTAssertEqual(used, bytes.count)
        for cut in 1..<bytes.count {
            XCTAssertEqual(try parts([Array(bytes[..<cut]), Array(bytes[cut...])]).0, whole, "split at \(cut)")
            let (h, body, ended) = try parse(stream, step: cut)
            XCTAssertEqual(h?.status, 200, "step \(cut)")
            XCTAssertEqual("H200|" + body + "|E", whole, "step \(cut)")
            XCTAssertTrue(ended, "step \(cut)")
        }
        XCTAssertEqual(try parts(bytes.map { [$0] }).0, whole, "one byte at a time")
    }

    /// Only a body read until close ends well at the close; anything else unfinished is truncated.
    func testTruncatedInEveryState() throws {
        let unfinished = [
            "", "HTTP/1.1 200 OK\r\n", "HTTP/1.1 100 Continue\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nabc",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nT: 1\r\n",
        ]
        for text in unfinished {
            var p = HTTPResponseParser()
            XCTAssertNoThrow(try p.feed(Array(text.utf8)), text.debugDescription)
            XCTAssertFalse(p.isComplete)
            XCTAssertThrowsError(try p.finish(), text.debugDescription) {
                XCTAssertEqual(($0 as? HTTPParseError)?.kind, .truncated, text.debugDescription)
                XCTAssertEqual(($0 as? HTTPParseError)?.message, "connection closed before the response was complete")
            }
        }
        var open = HTTPResponseParser()
        XCTAssertEqual(try open.feed(Array("HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\n\r\nab".utf8)).count, 2)
        XCTAssertEqual(try open.finish(), [.end], "a body that is not chunked and has no length runs to the close")
        XCTAssertThrowsError(try HTTPResponseParser.response(in: Array("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nab".utf8)[...])) {
            XCTAssertTrue(($0 as! HTTPParseError).truncated)
        }
    }

    /// What is not HTTP is malformed, never a trap; a refused parser stays refused.
    func testMalformed() {
        let table: [(String, String)] = [
            ("HTTP/2 200 OK\r\n\r\n", "not an HTTP response"),
            ("HTTP/1.1 20 OK\r\n\r\n", "not an HTTP response"),
            ("HTTP/1.1 2000 OK\r\n\r\n", "not an HTTP response"),
            ("HTTP/1.1 099 Low\r\n\r\n", "not an HTTP response"),
            ("HTTP/1.1 600 High\r\n\r\n", "not an HTTP response"),
            ("HTTP/1.1  200 OK\r\n\r\n", "not an HTTP response"),
            ("http/1.1 200 OK\r\n\r\n", "not an HTTP response"),
            ("\r\nHTTP/1.1 200 OK\r\n\r\n", "empty response"),
            ("HTTP/1.1 200 OK\r\nno colon\r\n\r\n", "bad header line"),
            ("HTTP/1.1 200 OK\r\n: empty name\r\n\r\n", "bad header line"),
            ("HTTP/1.1 200 OK\r\nName : space\r\n\r\n", "bad header line"),
            ("HTTP/1.1 200 OK\r\n folded first\r\n\r\n", "bad header line"),
            ("HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n", "bad Content-Length"),
            ("HTTP/1.1 200 OK\r\nContent-Length: +1\r\n\r\n", "bad Content-Length"),
            ("HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n", "bad Content-Length"),
            ("HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", "bad Content-Length"),
            ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\r\n", "bad chunk size"),
            ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n 5\r\n", "bad chunk size"),
            ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5 5\r\n", "bad chunk size"),
            ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\n", "bad chunk size"),
            ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n;x\r\n", "bad chunk size"),
            ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1000000000000000\r\n", "bad chunk size"),
            ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;" + String(repeating: "x", count: 1100) + "\r\n", "chunk size line too long"),
            ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n", "missing CRLF after chunk"),
            ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\rx", "missing CRLF after chunk"),
        ]
        for (text, message) in table {
            var p = HTTPResponseParser()
            XCTAssertThrowsError(try p.feed(Array(text.utf8)), text.debugDescription) {
                XCTAssertEqual($0 as? HTTPParseError, HTTPParseError(.malformed, message), text.debugDescription)
            }
            XCTAssertThrowsError(try p.feed(Array("HTTP/1.1 200 OK\r\n\r\n".utf8)), "still refused") {
                XCTAssertEqual(($0 as? HTTPParseError)?.kind, .malformed)
            }
            XCTAssertThrowsError(try p.finish()) { XCTAssertEqual(($0 as? HTTPParseError)?.kind, .malformed) }
        }
    }

    /// The head and the trailers are held to the limit, however they arrive.
    func testHeadAndTrailerLimits() throws {
        let big = "HTTP/1.1 200 OK\r\nX-Big: " + String(repeating: "b", count: 200) + "\r\nContent-Length: 0\r\n\r\n"
        for step in [1, 50, 10_000] {
            var small = HTTPResponseParser(maxHeadBytes: 128)
            let bytes = Array(big.utf8)
            XCTAssertThrowsError(try stride(from: 0, to: bytes.count, by: step).forEach {
                _ = try small.feed(bytes[$0..<min($0 + step, bytes.count)])
            }) { XCTAssertEqual($0 as? HTTPParseError, HTTPParseError(.malformed, "response head too large")) }
            var roomy = HTTPResponseParser(maxHeadBytes: bytes.count)
            XCTAssertEqual(try stride(from: 0, to: bytes.count, by: step).flatMap {
                try roomy.feed(bytes[$0..<min($0 + step, bytes.count)])
            }.last, .end)
        }
        var endless = HTTPResponseParser()
        let line = Array(("X-Junk: " + String(repeating: "j", count: 1000) + "\r\n").utf8)
        XCTAssertThrowsError(try {
            _ = try endless.feed(Array("HTTP/1.1 200 OK\r\n".utf8))
            for _ in 0..<100 { _ = try endless.feed(line) }
        }()) { XCTAssertEqual(($0 as? HTTPParseError)?.message, "response head too large") }
        var trailers = HTTPResponseParser(maxHeadBytes: 256)
        XCTAssertThrowsError(try trailers.feed(Array(("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nT: "
            + String(repeating: "t", count: 300) + "\r\n\r\n").utf8))) {
            XCTAssertEqual($0 as? HTTPParseError, HTTPParseError(.malformed, "trailers too large"))
        }
    }

    /// A large body streams through in pieces that point into the fed buffer.
    func testBodyPiecesPointIntoTheFedBuffer() throws {
        let head = Array("HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n".utf8)
        let body = (0..<100_000).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        var p = HTTPResponseParser()
        var received: [UInt8] = []
        var index = 0
        try head.withUnsafeBytes { raw in
            guard case .head(let h)? = try p.next(in: raw, at: &index) else { return XCTFail("no head") }
            XCTAssertEqual(h.status, 200)
            XCTAssertNil(try p.next(in: raw, at: &index))
            XCTAssertEqual(index, raw.count)
        }
        for start in stride(from: 0, to: body.count, by: 65_536) {
            let piece = Array(body[start..<min(start + 65_536, body.count)])
            try piece.withUnsafeBytes { raw in
                var i = 0
                while let part = try p.next(in: raw, at: &i) {
                    switch part {
                    case .body(let b):
                        XCTAssertEqual(b.baseAddress, raw.baseAddress! + (i - b.count), "a view of the input, not a copy")
                        received += b
                    case .end: XCTAssertEqual(i, raw.count)
                    case .head: XCTFail("a second head")
                    }
                }
            }
        }
        XCTAssertEqual(received, body)
        XCTAssertTrue(p.isComplete)
    }
}
