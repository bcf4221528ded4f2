import DispatchBenchKit
import XCTest

/// The benchmark's client-side parser: if it miscounts, every figure is wrong.
final class BenchParserTests: XCTestCase {
    func parse(_ chunks: [String]) -> [BenchParseOutput] {
        var p = BenchStreamParser()
        var out: [BenchParseOutput] = []
        for c in chunks {
            let bytes = Array(c.utf8)
            bytes.withUnsafeBytes { p.feed($0, into: &out) }
        }
        p.finish(into: &out)
        return out
    }

    let chunkedSSE = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        + "12\r\nretry: 3000\n\n: hi\n\r\n"
        + "2a\r\nid: 5\nevent: processing\ndata: {\"seq\":5,\"st\r\n"
        + "13\r\natus\":\"t=123456\"}\n\n\r\n"
        + "0\r\n\r\n"

    func testChunkedSSEInOneRead() {
        XCTAssertEqual(parse([chunkedSSE]), [
            .headers(status: 200, eventStream: true),
            .retry(3000),
            .event(BenchEvent(id: 5, seq: 5, t: 123456, kind: .message)),
            .end(keepAlive: true),
        ])
    }

    func testEverySplitPointGivesTheSameResult() {
        let whole = parse([chunkedSSE])
        let s = Array(chunkedSSE.utf8)
        for cut in 1..<s.count {
            let a = String(decoding: s[..<cut], as: UTF8.self)
            let b = String(decoding: s[cut...], as: UTF8.self)
            XCTAssertEqual(parse([a, b]), whole, "split at \(cut)")
        }
        XCTAssertEqual(parse(chunkedSSE.map { String($0) }), whole, "one byte at a time")
    }

    func testCRAndCRLFLineEndsAndTerminalEvent() {
        let text = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nConnection: close\r\n\r\n"
            + "id: 7\revent: completed\rdata: {\"seq\":7}\r\r"
            + "id: 8\r\nevent: not_found\r\ndata: {}\r\n\r\n"
        XCTAssertEqual(parse([text]), [
            .headers(status: 200, eventStream: true),
            .event(BenchEvent(id: 7, seq: 7, t: -1, kind: .terminal)),
            .event(BenchEvent(id: 8, seq: -1, t: -1, kind: .notFound)),
            .end(keepAlive: false),
        ])
    }

    func testNchanStyleIdAndPlainBodies() {
        let sse = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n"
            + "31\r\nid: 1700000000:0\ndata: {\"seq\":3,\"status\":\"t=9\"}\n\n\r\n"
        XCTAssertEqual(parse([sse]), [
            .headers(status: 200, eventStream: true),
            .event(BenchEvent(id: -1, seq: 3, t: 9, kind: .message, pairID: 1_700_000_000 << 24)),
        ])
        if case .event(let e)? = parse([sse]).last { XCTAssertEqual(e.idText, "1700000000:0") } else { XCTFail() }
        let two = "HTTP/1.1 201 Created\r\nContent-Length: 9\r\n\r\n{\"seq\":2}"
            + "HTTP/1.1 409 Conflict\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        XCTAssertEqual(parse([two]), [
            .headers(status: 201, eventStream: false),
            .event(BenchEvent(seq: 2, kind: .body)),
            .end(keepAlive: true),
            .headers(status: 409, eventStream: false),
            .event(BenchEvent(kind: .body)),
            .end(keepAlive: false),
        ])
    }

    /// What an EventSource keeps across reconnects: the reconnection time (`retry:`, digits
    /// only) and the last event id, numeric or nchan's `<time>:<tag>`.
    func testRetryFieldAndIdsForReconnecting() {
        let text = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
            + "retry: 2750\n\nretry: soon\n\nretry:125\r\n\r\n"
            + "id: 1764547200:17\ndata: {\"seq\":4}\n\n"
            + "id: 12\ndata: {\"seq\":12}\n\n"
        let out = parse([text])
        XCTAssertEqual(out, [
            .headers(status: 200, eventStream: true),
            .retry(2750),
            .retry(125),
            .event(BenchEvent(id: -1, seq: 4, kind: .message, pairID: 1_764_547_200 << 24 | 17)),
            .event(BenchEvent(id: 12, seq: 12, kind: .message)),
            .end(keepAlive: false),  // read until close
        ])
        XCTAssertEqual(BenchEvent(pairID: 1_764_547_200 << 24 | 17).idText, "1764547200:17")
        XCTAssertEqual(BenchEvent(id: 12).idText, "12")
        XCTAssertNil(BenchEvent().idText)
    }

    func testGarbageIsMalformedNotACrash() {
        XCTAssertEqual(parse(["SSH-2.0-OpenSSH\r\n\r\n"]), [.malformed])
        XCTAssertEqual(parse(["HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"]),
                       [.headers(status: 200, eventStream: false), .malformed])
    }

    func testHistogramPercentilesWithinTwoPercent() {
        var h = BenchHistogram()
        for v in 1...100_000 { h.record(Int64(v) * 1000) }
        for p in [0.5, 0.9, 0.99] {
            let got = Double(h.percentile(p)!)
            let want = p * 100_000_000
            XCTAssertLessThan(abs(got - want) / want, 0.02, "p\(p)")
        }
        var copy = BenchHistogram()
        for (i, c) in h.sparse { copy.add(bucket: i, count: c) }
        var merged = BenchHistogram()
        merged.merge(copy)
        XCTAssertEqual(merged.total, 100_000)
        XCTAssertEqual(merged.percentile(0.5), h.percentile(0.5))
        XCTAssertEqual(BenchStats.median([3, 1, 2, 10]), 2.5)
    }
}
