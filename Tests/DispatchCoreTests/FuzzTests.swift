import Foundation
import XCTest
@testable import DispatchCore

/// Seeded fuzzing of everything that reads bytes from the network (issue 4): random and
/// mutated inputs must never crash, and whatever is accepted must satisfy every field rule.
///
/// Knob: `DISPATCH_FUZZ_ITERATIONS` (default 4000 per test, well under a second each in a debug build);
/// raise it for a longer soak, e.g. `DISPATCH_FUZZ_ITERATIONS=200000 swift test --filter FuzzTests`.
/// `DISPATCH_FUZZ_SEED` changes the seed (default 4).
final class FuzzTests: XCTestCase {
    var iterations: Int { environmentInt("DISPATCH_FUZZ_ITERATIONS", default: 4000) }
    var seed: UInt64 { UInt64(environmentInt("DISPATCH_FUZZ_SEED", default: 4)) }

    static let corpus: [String] = [
        #"{"taskName":"Debian 13 Trixie ISO"}"#,
        #"{"activityId":"TEST-RTORRENT-01","taskName":"Debian 13 Trixie ISO","systemImage":"arrow.down.circle.fill","machine":"shodan","cancelURL":"https://actions.shodan.example/cancel","initialProgress":0.25,"status":"Queued","state":"processing"}"#,
        #"{"progress":0.68,"status":"Downloading at 18.4 MB/s (68%)","state":"processing"}"#,
        #"{"progress":null,"status":null,"state":"retrying"}"#,
        #"{"state":"error","error":"disk full","progress":1,"status":"Failed"}"#,
        #"{"state":"cancelled"}"#,
        #"{}"#,
        #"[1,2.5e3,-0,"\u00e9\ud83d\ude80",{"a":[true,false,null]}]"#,
    ]

    static let tokens: [[UInt8]] = [
        "\"", "\\", "\\u0000", "\\n", "\\r", "\\t", "\\ud800", "\\udc00", "\\u2028", "\\u0085", "1e999", "1e300", "-1e300",
        "-0", "0.5", "1.5", "01", "2", "-", ".", "e", "null", "true", "false", "{", "}", "[", "]", ",", ":", " ", "\n", "\r\n",
        "\"taskName\":", "\"state\":", "\"progress\":", "\"status\":", "\"error\":", "\"activityId\":", "\"machine\":",
        "\"cancelURL\":", "\"systemImage\":", "\"bogus\":", "\"processing\"", "\"completed\"", "\"retrying\"", "\"queued\"",
        "\"http://x\"", "\"https://[::1]/\"", "\"ftp://x\"", "é", "🚀", "\u{85}", "\u{2028}",
        String(repeating: "a", count: 130), String(repeating: "b", count: 210), String(repeating: "c", count: 510),
    ].map { Array($0.utf8) } + [[0xFF], [0xC3], [0xED, 0xA0, 0x80], [0x00], [0x7F], [0x1B]]

    func mutate(_ input: [UInt8], _ g: inout SeededGenerator) -> [UInt8] {
        var b = input
        for _ in 0..<Int.random(in: 1...4, using: &g) {
            let at = Int.random(in: 0...b.count, using: &g)
            switch Int.random(in: 0..<6, using: &g) {
            case 0 where !b.isEmpty: b[min(at, b.count - 1)] = UInt8.random(in: 0...255, using: &g)
            case 1: b.insert(contentsOf: Self.tokens.randomElement(using: &g)!, at: at)
            case 2 where at < b.count: b.removeSubrange(at..<min(b.count, at + Int.random(in: 1...8, using: &g)))
            case 3 where at < b.count:
                let chunk = b[at..<min(b.count, at + Int.random(in: 1...16, using: &g))]
                b.insert(contentsOf: chunk, at: Int.random(in: 0...b.count, using: &g))
            case 4: b = Array(b.prefix(at))
            default:
                if at < b.count, let t = Self.tokens.randomElement(using: &g) {
                    b.replaceSubrange(at..<min(b.count, at + t.count), with: t)
                }
            }
        }
        return b
    }

    func randomBytes(_ g: inout SeededGenerator) -> [UInt8] {
        var out: [UInt8] = []
        for _ in 0..<Int.random(in: 0...48, using: &g) {
            if Bool.random(using: &g) { out += Self.tokens.randomElement(using: &g)! } else { out.append(UInt8.random(in: 0...255, using: &g)) }
        }
        return out
    }

    /// An input for this iteration: mostly mutated corpus entries, some pure noise.
    func input(_ g: inout SeededGenerator) -> [UInt8] {
        Int.random(in: 0..<4, using: &g) == 0 ? randomBytes(&g) : mutate(Array(Self.corpus.randomElement(using: &g)!.utf8), &g)
    }

    // MARK: - JSON

    func testJSONParserNeverCrashesAndRoundTripsWhatItAccepts() throws {
        var g = SeededGenerator(seed: seed)
        var accepted = 0
        for i in 0..<iterations {
            let doc = input(&g)
            guard let value = try? JSONParser.parse(doc) else { continue }
            accepted += 1
            let again = try JSONParser.parse(Self.write(value))
            XCTAssertEqual(again, value, "iteration \(i): \(text(doc))")
        }
        XCTAssertGreaterThan(accepted, 0)
    }

    static func write(_ v: JSONValue) -> [UInt8] {
        var w = JSONWriter()
        func go(_ v: JSONValue) {
            switch v {
            case .null: w.null()
            case .bool(let b): w.bool(b)
            case .number(let d): w.number(d)
            case .string(let s): w.string(s)
            case .array(let items): w.beginArray(); items.forEach(go); w.endArray()
            case .object(let members):
                w.beginObject()
                for (k, v) in members { w.key(k); go(v) }
                w.endObject()
            }
        }
        go(v)
        return w.bytes
    }

    /// Snapshots come back from NOTIFY and stored history: decoding garbage must not trap.
    func testActivityDecodeNeverCrashes() throws {
        var g = SeededGenerator(seed: seed &+ 1)
        let snapshot = Array(JSONTests.full.json())
        var decoded = 0
        for _ in 0..<iterations {
            guard let value = try? JSONParser.parse(mutate(snapshot, &g)) else { continue }
            if let a = Activity.decode(value) {
                decoded += 1
                XCTAssertEqual(Activity.decode(try JSONParser.parse(a.json())), a)
            }
        }
        XCTAssertGreaterThan(decoded, 0)
    }

    // MARK: - Validation

    func testValidationAcceptsOnlyWhatTheRulesAllow() {
        var g = SeededGenerator(seed: seed &+ 2)
        var accepted = [PublishCall.start: 0, .update: 0, .end: 0]
        for i in 0..<iterations {
            let body = Int.random(in: 0..<3, using: &g) == 0 ? randomObject(&g) : input(&g)
            for call in [PublishCall.start, .update, .end] {
                guard validationError(call, body) == nil else { continue }
                accepted[call]! += 1
                let problems = Self.violations(call, body)
                XCTAssertEqual(problems, [], "iteration \(i) \(call): \(text(body))")
            }
        }
        XCTAssertTrue(accepted.values.allSatisfy { $0 > 0 }, "\(accepted)")
    }

    /// A JSON object of random known and unknown fields with random values.
    func randomObject(_ g: inout SeededGenerator) -> [UInt8] {
        let keys = ["activityId", "taskName", "systemImage", "machine", "cancelURL", "initialProgress", "status", "state",
                    "progress", "error", "taskName", "bogus"]
        let values = [
            "null", "true", "0", "1", "0.5", "-0.5", "1.01", "2", "\"\"", "\" x \"", "\"queued\"", "\"processing\"",
            "\"retrying\"", "\"completed\"", "\"error\"", "\"cancelled\"", "\"a.b-c_d:e\"", "\"arrow.down\"", "\"Shodan-1\"",
            "\"https://x.example/c\"", "\"http://[::1]:80\"", "\"ftp://x\"", "\"a\\nb\"", "\"a\\u0000b\"", "\"a\\u2028\"",
            "\"\(String(repeating: "z", count: 129))\"", "\"\(String(repeating: "z", count: 201))\"", "[]", "{}", "\"é🚀\"",
        ]
        var w = "{"
        var used = Set<String>()
        for _ in 0..<Int.random(in: 0...5, using: &g) {
            let k = keys.randomElement(using: &g)!
            guard used.insert(k).inserted else { continue }
            if w.count > 1 { w += "," }
            w += "\"\(k)\":" + values.randomElement(using: &g)!
        }
        return Array((w + "}").utf8)
    }

    /// Every field rule, checked independently of `Validation` on the accepted body's fields.
    static func violations(_ call: PublishCall, _ body: [UInt8]) -> [String] {
        var out: [String] = []
        guard body.count <= 16 * 1024, case .object(let members)? = try? JSONParser.parse(body) else { return ["not a small JSON object"] }
        let allowed: Set<String> = switch call {
        case .start: ["activityId", "taskName", "systemImage", "machine", "cancelURL", "initialProgress", "status", "state"]
        case .update: ["progress", "status", "state"]
        case .end: ["progress", "status", "state", "error"]
        }
        let states: [String] = switch call {
        case .start: ["queued", "processing"]
        case .update: ["processing", "queued", "retrying"]
        case .end: ["completed", "error", "cancelled"]
        }
        func control(_ s: String) -> Bool {
            s.unicodeScalars.contains { $0.value < 0x20 || (0x7F...0x9F).contains($0.value) || $0.value == 0x2028 || $0.value == 0x2029 }
        }
        func only(_ s: String, _ ok: (UInt8) -> Bool) -> Bool { s.utf8.allSatisfy(ok) }
        func alnum(_ b: UInt8) -> Bool { (0x30...0x39).contains(b) || (0x41...0x5A).contains(b) || (0x61...0x7A).contains(b) }
        if call == .start, members.first(where: { $0.0 == "taskName" }) == nil { out.append("taskName missing") }
        for (k, v) in members {
            guard allowed.contains(k) else { out.append("unknown \(k)"); continue }
            if case .null = v, k != "taskName" { continue }
            switch (k, v) {
            case ("activityId", .string(let s)):
                if !(1...128).contains(s.utf8.count) || !only(s, { alnum($0) || $0 == 0x2E || $0 == 0x5F || $0 == 0x3A || $0 == 0x2D }) { out.append(k) }
            case ("taskName", .string(let s)):
                let t = s.trimmingCharacters(in: .whitespacesAndNewlines)
                if !(1...200).contains(t.count) || control(t) { out.append(k) }
            case ("systemImage", .string(let s)):
                if !(1...100).contains(s.utf8.count) || !only(s, { (0x61...0x7A).contains($0) || (0x30...0x39).contains($0) || $0 == 0x2E }) { out.append(k) }
            case ("machine", .string(let s)):
                if !(1...64).contains(s.utf8.count) || !only(s, { alnum($0) || $0 == 0x2E || $0 == 0x5F || $0 == 0x2D }) { out.append(k) }
            case ("cancelURL", .string(let s)):
                let lower = s.lowercased()
                if s.utf8.count > 2048 || !(lower.hasPrefix("http://") || lower.hasPrefix("https://")) || !only(s, { (0x21...0x7E).contains($0) }) {
                    out.append(k)
                }
            case ("initialProgress", .number(let d)), ("progress", .number(let d)):
                if !d.isFinite || d < 0 || d > 1 { out.append(k) }
            case ("status", .string(let s)):
                if s.count > 200 || control(s) { out.append(k) }
            case ("error", .string(let s)):
                if s.count > 500 || control(s) { out.append(k) }
            case ("state", .string(let s)):
                if !states.contains(s) { out.append(k) }
            default:
                out.append("\(k) has the wrong type \(v.typeName)")
            }
        }
        return out
    }

    // MARK: - SSE

    func testSSERoundTripsRandomData() {
        var g = SeededGenerator(seed: seed &+ 3)
        let pieces = ["a", "b", " ", ":", "\r", "\n", "\r\n", "\n\r", "é", "🚀", "data: x", "id: 9", "\u{2028}", "\u{0}", "{\"k\":1}"]
        func randomText(_ n: Int, _ g: inout SeededGenerator) -> String {
            (0..<Int.random(in: 0...n, using: &g)).map { _ in pieces.randomElement(using: &g)! }.joined()
        }
        for i in 0..<iterations {
            let data = randomText(12, &g)
            let id: String? = Bool.random(using: &g) ? randomText(3, &g) : nil
            let event: String? = Bool.random(using: &g) ? randomText(3, &g) : nil
            var stream = SSE.encode(id: id, event: event, data: data)
            if Bool.random(using: &g) { stream = SSE.heartbeat + stream }
            let split = Int.random(in: 0...stream.count, using: &g)
            var p = SSEParser()
            let events = p.feed(stream[..<split]) + p.feed(stream[split...])
            let wantData = data.replacingOccurrences(of: "\r\n", with: "\n").replacingOccurrences(of: "\r", with: "\n")
            let wantID = id.map { String($0.unicodeScalars.filter { $0 != "\r" && $0 != "\n" && $0 != "\u{0}" }) }
            let wantEvent = event.map { String($0.unicodeScalars.filter { $0 != "\r" && $0 != "\n" }) } ?? ""
            XCTAssertEqual(events, [SSEEvent(id: wantID, event: wantEvent.isEmpty ? "message" : wantEvent, data: wantData)],
                           "iteration \(i): \(String(reflecting: text(stream)))")
        }
    }

    func testSSEParserNeverCrashesOnNoise() {
        var g = SeededGenerator(seed: seed &+ 4)
        for _ in 0..<iterations {
            var p = SSEParser()
            let n = Int.random(in: 0...9, using: &g)
            // Two line ends close whatever the noise left open; then one known event.
            let noise = randomBytes(&g) + Array("\n\ndata: \(n)\n\n".utf8)
            var events: [SSEEvent] = []
            var rest = noise[...]
            while !rest.isEmpty {
                let take = Int.random(in: 1...max(1, rest.count), using: &g)
                events += p.feed(rest.prefix(take))
                rest = rest.dropFirst(take)
            }
            XCTAssertEqual(events.last?.data, "\(n)", "the trailing event always arrives")
            XCTAssertEqual(events.last?.event, "message")
        }
    }
}
