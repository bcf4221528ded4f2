import XCTest
@testable import DispatchCore

/// SSE framing byte for byte (WHATWG HTML §9.2), and the client-side parser.
final class SSETests: XCTestCase {
    func testEncodeByteForByte() {
        let table: [(String?, String?, String, String)] = [
            ("5", "processing", #"{"a":1}"#, "id: 5\nevent: processing\ndata: {\"a\":1}\n\n"),
            (nil, nil, "x", "data: x\n\n"),
            ("1", nil, "x", "id: 1\ndata: x\n\n"),
            (nil, "not_found", "x", "event: not_found\ndata: x\n\n"),
            (nil, nil, "", "data: \n\n"),
            (nil, nil, "a\nb", "data: a\ndata: b\n\n"),
            (nil, nil, "a\rb", "data: a\ndata: b\n\n"),
            (nil, nil, "a\r\nb", "data: a\ndata: b\n\n"),
            (nil, nil, "a\n\nb", "data: a\ndata: \ndata: b\n\n"),
            (nil, nil, "a\r\rb", "data: a\ndata: \ndata: b\n\n"),
            (nil, nil, "a\n\rb", "data: a\ndata: \ndata: b\n\n"),
            (nil, nil, "a\r\n\r\nb", "data: a\ndata: \ndata: b\n\n"),
            (nil, nil, "\n", "data: \ndata: \n\n"),
            (nil, nil, "\r\n", "data: \ndata: \n\n"),
            (nil, nil, "a\r", "data: a\ndata: \n\n"),
            (nil, nil, "\ra", "data: \ndata: a\n\n"),
            (nil, nil, " lead", "data:  lead\n\n"),
            (nil, nil, ": not a comment", "data: : not a comment\n\n"),
            (nil, nil, "日本\u{2028}🚀", "data: 日本\u{2028}🚀\n\n"),
            ("1\r\n2", nil, "x", "id: 12\ndata: x\n\n"),
            ("1\n", "a\rb\nc", "x", "id: 1\nevent: abc\ndata: x\n\n"),
            ("7\u{0}", nil, "x", "id: 7\ndata: x\n\n"),
            ("", "", "x", "id: \nevent: \ndata: x\n\n"),
        ]
        for (id, event, data, want) in table {
            XCTAssertEqual(text(SSE.encode(id: id, event: event, data: data)), want, "\(String(reflecting: data))")
        }
    }

    func testCommentsAndRetry() {
        let table: [([UInt8], String)] = [
            (SSE.heartbeat, ": heartbeat\n\n"),
            (SSE.comment(""), ": \n\n"),
            (SSE.comment("a\nb\rc"), ": abc\n\n"),
            (SSE.retry(milliseconds: 3000), "retry: 3000\n\n"),
            (SSE.retry(milliseconds: 0), "retry: 0\n\n"),
        ]
        for (got, want) in table { XCTAssertEqual(text(got), want) }
    }

    /// The contract's example stream, parsed whole.
    func testParsesTheContractExample() {
        let stream = "retry: 3000\n\nid: 5\nevent: processing\ndata: {\"state\":\"processing\"}\n\n: heartbeat\n\n"
            + "id: 6\nevent: completed\ndata: {\"state\":\"completed\"}\n\n"
        var p = SSEParser()
        let events = p.feed(bytes(stream))
        XCTAssertEqual(events, [
            SSEEvent(id: "5", event: "processing", data: #"{"state":"processing"}"#),
            SSEEvent(id: "6", event: "completed", data: #"{"state":"completed"}"#),
        ])
        XCTAssertEqual(p.retryMilliseconds, 3000)
        XCTAssertEqual(p.commentCount, 1)
        XCTAssertEqual(p.lastEventID, "6")
    }

    func testParserTable() {
        let table: [(String, [SSEEvent])] = [
            ("data: x\n\n", [SSEEvent(id: nil, event: "message", data: "x")]),
            ("data: x\r\n\r\n", [SSEEvent(id: nil, event: "message", data: "x")]),
            ("data: x\r\r", [SSEEvent(id: nil, event: "message", data: "x")]),
            ("id: 1\r\nevent: e\r\ndata: a\r\ndata: b\r\n\r\n", [SSEEvent(id: "1", event: "e", data: "a\nb")]),
            ("id: 1\revent: e\rdata: a\rdata: b\r\r", [SSEEvent(id: "1", event: "e", data: "a\nb")]),
            ("data: a\ndata: b\ndata: c\n\n", [SSEEvent(id: nil, event: "message", data: "a\nb\nc")]),
            ("data:x\n\n", [SSEEvent(id: nil, event: "message", data: "x")]),
            ("data:  x\n\n", [SSEEvent(id: nil, event: "message", data: " x")]),
            ("data\n\n", [SSEEvent(id: nil, event: "message", data: "")]),
            ("data:\n\n", [SSEEvent(id: nil, event: "message", data: "")]),
            ("data: a:b\n\n", [SSEEvent(id: nil, event: "message", data: "a:b")]),
            ("data: x\n", []),
            ("event: e\n\n", []),
            ("event: e\n\ndata: x\n\n", [SSEEvent(id: nil, event: "message", data: "x")]),
            ("id: 3\ndata: a\n\ndata: b\n\n", [SSEEvent(id: "3", event: "message", data: "a"), SSEEvent(id: "3", event: "message", data: "b")]),
            ("id: 3\n\ndata: b\n\n", [SSEEvent(id: "3", event: "message", data: "b")]),
            ("id: 3\nid: 4\u{0}\ndata: b\n\n", [SSEEvent(id: "3", event: "message", data: "b")]),
            ("id\ndata: b\n\n", [SSEEvent(id: "", event: "message", data: "b")]),
            (": comment\ndata: x\n\n", [SSEEvent(id: nil, event: "message", data: "x")]),
            ("foo: bar\ndata: x\n\n", [SSEEvent(id: nil, event: "message", data: "x")]),
            ("Data: x\n\n", []),
            ("\n\n\n", []),
            ("event: a\nevent: b\ndata: x\n\n", [SSEEvent(id: nil, event: "b", data: "x")]),
            ("data: 日本🚀\n\n", [SSEEvent(id: nil, event: "message", data: "日本🚀")]),
        ]
        for (input, want) in table {
            var whole = SSEParser()
            XCTAssertEqual(whole.feed(bytes(input)), want, String(reflecting: input))
            var trickle = SSEParser()
            XCTAssertEqual(bytes(input).flatMap { trickle.feed([$0]) }, want, "byte by byte: \(String(reflecting: input))")
        }
    }

    func testRetryAndComments() {
        let table: [(String, Int?, Int)] = [
            ("retry: 3000\n", 3000, 0),
            ("retry:15\n", 15, 0),
            ("retry: 3x\n", nil, 0),
            ("retry: -1\n", nil, 0),
            ("retry:\n", nil, 0),
            ("retry: 10\nretry: oops\n", 10, 0),
            (": heartbeat\n\n: heartbeat\r\n:\r", nil, 3),
            (":x\n:y\n:z\n\n", nil, 3),
        ]
        for (input, retry, comments) in table {
            var p = SSEParser()
            XCTAssertEqual(p.feed(bytes(input)), [], input)
            XCTAssertEqual(p.retryMilliseconds, retry, String(reflecting: input))
            XCTAssertEqual(p.commentCount, comments, String(reflecting: input))
        }
    }

    /// A CR at the end of one read and the LF at the start of the next are one line end.
    func testCRLFSplitAcrossFeeds() {
        var p = SSEParser()
        XCTAssertEqual(p.feed(bytes("data: a\r")), [])
        XCTAssertEqual(p.feed(bytes("\ndata: b\r")), [])
        XCTAssertEqual(p.feed(bytes("\n\r")), [SSEEvent(id: nil, event: "message", data: "a\nb")])
        XCTAssertEqual(p.feed(bytes("\n")), [], "the LF after a CR is not a second blank line")
        XCTAssertEqual(p.feed(bytes("data: c\n\n")), [SSEEvent(id: nil, event: "message", data: "c")])
    }

    /// What the encoder writes, the parser reads back, at every split point.
    func testEncoderRoundTripsAtEverySplit() {
        let frames: [(String?, String?, String)] = [
            ("1", "queued", #"{"activityId":"A","state":"queued"}"#),
            ("2", "processing", "multi\nline\r\ndata\rhere"),
            ("3", "retrying", ""),
            (nil, nil, "\r\n"),
            ("4", "completed", "ünïcödé 🚀"),
        ]
        var stream = SSE.retry(milliseconds: 3000)
        for (id, event, data) in frames { stream += SSE.encode(id: id, event: event, data: data) + SSE.heartbeat }
        let want = [
            SSEEvent(id: "1", event: "queued", data: #"{"activityId":"A","state":"queued"}"#),
            SSEEvent(id: "2", event: "processing", data: "multi\nline\ndata\nhere"),
            SSEEvent(id: "3", event: "retrying", data: ""),
            SSEEvent(id: "3", event: "message", data: "\n"),
            SSEEvent(id: "4", event: "completed", data: "ünïcödé 🚀"),
        ]
        for split in 0...stream.count {
            var p = SSEParser()
            let got = p.feed(stream[..<split]) + p.feed(stream[split...])
            XCTAssertEqual(got, want, "split at \(split)")
            XCTAssertEqual(p.commentCount, frames.count)
            XCTAssertEqual(p.retryMilliseconds, 3000)
        }
        var trickle = SSEParser()
        XCTAssertEqual(stream.flatMap { trickle.feed([$0]) }, want)
    }

    /// A line (or an event) past the limit stops the parser instead of growing its buffer.
    func testAnEndlessLineIsCutOff() {
        var p = SSEParser(maxEventBytes: 1000)
        XCTAssertEqual(p.feed(Array("data: ok\n\n".utf8)).map(\.data), ["ok"])
        XCTAssertTrue(p.feed([UInt8](repeating: UInt8(ascii: "x"), count: 5000)).isEmpty)
        XCTAssertTrue(p.overflowed)
        XCTAssertTrue(p.feed(Array("\n\ndata: late\n\n".utf8)).isEmpty, "nothing after an overflow")
        var q = SSEParser(maxEventBytes: 1000)
        var events: [SSEEvent] = []
        for _ in 0..<20 { events += q.feed(Array("data: \(String(repeating: "y", count: 100))\n".utf8)) }
        XCTAssertTrue(q.overflowed, "an event of many data lines counts too")
        XCTAssertTrue(events.isEmpty)
    }
}
