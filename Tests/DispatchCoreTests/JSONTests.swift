import Foundation
import XCTest
@testable import DispatchCore

/// RFC 8259 corner cases for the strict parser, and the writer's escapes.
final class JSONTests: XCTestCase {
    func testValidDocuments() throws {
        let table: [(String, JSONValue)] = [
            ("null", .null), ("true", .bool(true)), ("false", .bool(false)),
            ("0", .number(0)), ("-0", .number(-0.0)), ("1.5", .number(1.5)), ("-1.5e10", .number(-1.5e10)),
            ("1E+2", .number(100)), ("1e-2", .number(0.01)), ("0.0", .number(0)), ("1e308", .number(1e308)),
            ("5e-324", .number(Double.leastNonzeroMagnitude)), ("1e-400", .number(0)), ("123456789012345678901234567890", .number(1.2345678901234568e29)),
            (" \t\r\n 7 \n", .number(7)),
            (#""""#, .string("")), (#""abc""#, .string("abc")), (#""日本 🚀""#, .string("日本 🚀")),
            (#""\"\\\/\b\f\n\r\t""#, .string("\"\\/\u{8}\u{C}\n\r\t")),
            (#""\u0041\u00e9\u00E9\u2028""#, .string("Aéé\u{2028}")),
            (#""\ud83d\ude80""#, .string("🚀")), (#""\uD83D\uDE80""#, .string("🚀")),
            (#""\u0000""#, .string("\u{0}")), (#""\uffff""#, .string("\u{FFFF}")),
            ("\"\u{7F}\"", .string("\u{7F}")),
            ("[]", .array([])), ("{}", .object([])), ("[ ]", .array([])), ("{ }", .object([])),
            ("[1,[2,[3]]]", .array([.number(1), .array([.number(2), .array([.number(3)])])])),
            (#"{"a":{"b":[null,true]},"c":"d"}"#, .object([("a", .object([("b", .array([.null, .bool(true)]))])), ("c", .string("d"))])),
            (#"{"a":1,"A":2}"#, .object([("a", .number(1)), ("A", .number(2))])),
            (#"{"":0}"#, .object([("", .number(0))])),
        ]
        for (input, want) in table {
            XCTAssertEqual(try JSONParser.parse(input), want, input)
        }
        XCTAssertEqual(try JSONParser.parse("-0"), .number(0), "-0 == 0")
        guard case .number(let negZero) = try JSONParser.parse("-0") else { return XCTFail() }
        XCTAssertEqual(negZero.sign, .minus)
    }

    func testInvalidDocuments() {
        let table: [String] = [
            "", " ", "\n",
            // numbers
            "01", "-01", "00", "1.", ".1", "+1", "1e", "1e+", "1E-", "-", "--1", "0x1", "1_000", "1.2.3", "NaN", "-NaN",
            "Infinity", "-Infinity", "1e309", "-1e309", "1e999999", "1" + String(repeating: "0", count: 70),
            // literals
            "tru", "nul", "True", "NULL", "falsey", "undefined",
            // strings
            #""abc"#, #"""#, #""\x""#, #""\u12""#, #""\u12g4""#, #""\U0041""#, #""\'""#,
            #""\ud800""#, #""\udc00""#, #""\ud800\u0041""#, #""\ud800x""#, #""\ud83d\ud83d""#, #""\ude80\ud83d""#,
            "\"a\u{1}b\"", "\"a\tb\"", "\"a\nb\"", "\"a\rb\"", "\"\u{0}\"", "\"\u{1F}\"",
            "'single'",
            // structure
            "[1,]", "[,1]", "[1,,2]", "[", "]", "[1", "[1 2]", "{,}", #"{"a":1,}"#, #"{"a"}"#, #"{"a" 1}"#,
            #"{"a":}"#, "{a:1}", "{1:1}", #"{"a":1"#, #"{"a":1 "b":2}"#, "[1] x", "1 2", #"{"a":1}{"#, "{}}",
            #"{"a":1,"a":2}"#, #"{"a":{"b":1,"b":1}}"#, #"{"k":1,"k":1}"#,
            "\u{C}1", "1\u{C}", "\u{A0}1", "/* c */1", "// c\n1",
        ]
        for input in table {
            XCTAssertThrowsError(try JSONParser.parse(input), String(reflecting: input))
        }
    }

    /// An object of many keys is checked for duplicates in linear time: 20,000 keys would take
    /// minutes with a scan per key. A duplicate anywhere among them is still refused, at its offset.
    func testManyKeysParseFastAndADuplicateAmongThemIsRefused() throws {
        let n = 20_000
        let members = (0..<n).map { #""key-\#($0)":\#($0)"# }
        guard case .object(let parsed) = try JSONParser.parse("{" + members.joined(separator: ",") + "}") else {
            return XCTFail("not an object")
        }
        XCTAssertEqual(parsed.count, n)
        XCTAssertEqual(parsed.last?.0, "key-\(n - 1)", "members keep their order")
        for duplicate in [#""key-0":0"#, #""key-12345":0"#, #""key-19999":0"#] {
            var withDuplicate = members
            withDuplicate.insert(duplicate, at: 15_000)
            let text = "{" + withDuplicate.joined(separator: ",") + "}"
            XCTAssertThrowsError(try JSONParser.parse(text), duplicate) { error in
                XCTAssertTrue((error as? JSONParseError)?.message.hasPrefix("duplicate key") == true, "\(error)")
            }
        }
        // Also with the duplicate among the first few members (the scan, before the set).
        XCTAssertThrowsError(try JSONParser.parse(#"{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"a":9}"#))
        XCTAssertThrowsError(try JSONParser.parse(#"{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9,"a":9}"#))
        XCTAssertThrowsError(try JSONParser.parse(#"{"a":1,"b":2,"b":3}"#))
    }

    func testInvalidUTF8() {
        let table: [[UInt8]] = [
            [0x22, 0xFF, 0x22],
            [0x22, 0xC0, 0x80, 0x22],
            [0x22, 0xED, 0xA0, 0x80, 0x22],
            [0x22, 0xE2, 0x82, 0x22],
            [0x22, 0x80, 0x22],
            [0x22, 0xF4, 0x90, 0x80, 0x80, 0x22],
            [0xEF, 0xBB, 0xBF, 0x31],
            [0x5B, 0x31, 0x00, 0x5D],
        ]
        for input in table { XCTAssertThrowsError(try JSONParser.parse(input), "\(input)") }
    }

    /// Nesting beyond the limit is refused (no stack overflow on hostile input).
    func testDepthLimit() throws {
        let max = JSONParser.defaultMaxDepth
        func arrays(_ n: Int) -> String { String(repeating: "[", count: n) + String(repeating: "]", count: n) }
        func objects(_ n: Int) -> String { String(repeating: #"{"a":"#, count: n) + "1" + String(repeating: "}", count: n) }
        XCTAssertNoThrow(try JSONParser.parse(arrays(max)))
        XCTAssertThrowsError(try JSONParser.parse(arrays(max + 1)))
        XCTAssertNoThrow(try JSONParser.parse(objects(max)))
        XCTAssertThrowsError(try JSONParser.parse(objects(max + 1)))
        XCTAssertNoThrow(try JSONParser.parse(arrays(3), maxDepth: 3))
        XCTAssertThrowsError(try JSONParser.parse(arrays(4), maxDepth: 3))
        XCTAssertThrowsError(try JSONParser.parse(String(repeating: "[", count: 200_000)))
        XCTAssertThrowsError(try JSONParser.parse(String(repeating: #"{"a":["#, count: 50_000)))
    }

    func testErrorsCarryAnOffset() {
        let table: [(String, Int)] = [("[1,]", 3), ("01", 1), (#"{"a":1,"a":2}"#, 10), ("tru", 0)]
        for (input, offset) in table {
            do throws(JSONParseError) {
                _ = try JSONParser.parse(input)
                XCTFail("accepted \(input)")
            } catch {
                XCTAssertEqual(error.offset, offset, "\(input): \(error.message)")
            }
        }
    }

    func testWriterEscapesByteForByte() {
        let table: [(String, String)] = [
            ("", #""""#),
            ("plain", #""plain""#),
            ("\"\\", #""\"\\""#),
            ("\n\r\t", #""\n\r\t""#),
            ("\u{0}\u{1}\u{8}\u{C}\u{1F}\u{7F}", #""\u0000\u0001\u0008\u000c\u001f\u007f""#),
            ("/</script>", #""/</script>""#),
            ("é日本🚀\u{2028}", "\"é日本🚀\u{2028}\""),
        ]
        for (input, want) in table { XCTAssertEqual(quoted(input), want, String(reflecting: input)) }
    }

    func testEscapesRoundTrip() throws {
        var all = ""
        for v in 0..<0x80 { all.unicodeScalars.append(Unicode.Scalar(UInt8(v))) }
        let samples = [all, "\u{80}\u{9F}\u{A0}\u{FEFF}\u{FFFF}\u{10000}\u{10FFFF}", "🚀👩‍👩‍👧", "\\u0041", "\"\\\"", "\r\n"]
        for s in samples {
            XCTAssertEqual(try JSONParser.parse(quoted(s)), .string(s), String(reflecting: s))
        }
    }

    func testWriterStructureAndNumbers() {
        var w = JSONWriter()
        w.beginObject()
        w.field("a", Int64(1))
        w.key("b")
        w.beginArray()
        w.int(-2); w.string("x"); w.null(); w.bool(false); w.number(0.5)
        w.beginObject(); w.endObject()
        w.beginArray(); w.endArray()
        w.endArray()
        w.field("c", true)
        w.field("d", nil as String?)
        w.field("e", nil as Double?)
        w.key("f")
        w.raw(bytes(#"{"r":1}"#))
        w.endObject()
        XCTAssertEqual(w.string, #"{"a":1,"b":[-2,"x",null,false,0.5,{},[]],"c":true,"d":null,"e":null,"f":{"r":1}}"#)

        let numbers: [(Double, String)] = [
            (0, "0"), (-0.0, "0"), (1, "1"), (-3, "-3"), (0.68, "0.68"), (0.1, "0.1"), (1e-7, "1e-07"),
            (123_456_789_012_345, "123456789012345"), (1e15, "1000000000000000.0"), (1e16, "1e+16"), (1.5e300, "1.5e+300"), (Double.leastNonzeroMagnitude, "5e-324"),
        ]
        for (d, want) in numbers {
            XCTAssertEqual(JSONWriter.formatNumber(d), want, "\(d)")
            XCTAssertEqual(try JSONParser.parse(want), .number(d), "\(want) parses back")
        }
    }

    /// A container written right after a key takes the key's place; the next bare value gets its comma.
    func testWriterContainersAfterKeys() throws {
        var w = JSONWriter()
        w.beginArray()
        w.beginObject(); w.key("k"); w.beginArray(); w.endArray(); w.endObject()
        w.string("x")
        w.beginObject(); w.key("o"); w.beginObject(); w.endObject(); w.endObject()
        w.int(1)
        w.endArray()
        XCTAssertEqual(w.string, #"[{"k":[]},"x",{"o":{}},1]"#)
        XCTAssertNoThrow(try JSONParser.parse(w.bytes))
    }

    func testSubscriptAndTypeNames() throws {
        let v = try JSONParser.parse(#"{"a":null,"b":[1],"c":{}}"#)
        XCTAssertEqual(v["a"], .null)
        XCTAssertNil(v["z"])
        XCTAssertNil(JSONValue.array([])["a"])
        XCTAssertEqual(["null", "boolean", "number", "string", "array", "object"],
                       [JSONValue.null, .bool(true), .number(1), .string(""), .array([]), .object([])].map(\.typeName))
        XCTAssertNotEqual(JSONValue.object([("a", .null), ("b", .null)]), .object([("b", .null), ("a", .null)]))
        XCTAssertNotEqual(JSONValue.number(1), .string("1"))
    }

    // MARK: - Activity snapshots

    static let full = Activity(activityId: "TEST-RTORRENT-01", taskName: "Debian 13 Trixie ISO",
                               systemImage: "arrow.down.circle.fill", machine: "shodan",
                               cancelURL: "https://actions.shodan.example/cancel", state: .processing, progress: 0.68,
                               status: "Downloading at 18.4 MB/s (68%)", attempt: 1, seq: 5, cancelRequested: false,
                               createdAt: 1_795_992_806_123, updatedAt: 1_795_992_901_004)

    func testSnapshotJSONMatchesTheContract() {
        XCTAssertEqual(text(Self.full.json()), #"{"activityId":"TEST-RTORRENT-01","taskName":"Debian 13 Trixie ISO","#
            + #""systemImage":"arrow.down.circle.fill","machine":"shodan","cancelURL":"https://actions.shodan.example/cancel","#
            + #""state":"processing","progress":0.68,"status":"Downloading at 18.4 MB/s (68%)","attempt":1,"seq":5,"#
            + #""cancelRequested":false,"liveActivity":false,"broadcast":false,"channelId":null,"createdAt":"2026-11-29T22:53:26.123Z","updatedAt":"2026-11-29T22:55:01.004Z","#
            + #""endedAt":null,"error":null}"#)
    }

    func testSnapshotRoundTrip() throws {
        var ended = Self.full
        ended.state = .error
        ended.endedAt = ended.updatedAt
        ended.error = "disk \"full\"\n at /dev/sda"
        ended.attempt = 3
        ended.cancelRequested = true
        let table: [Activity] = [
            Self.full,
            ended,
            Activity(activityId: "a", taskName: "n", state: .queued, createdAt: 0, updatedAt: 0),
            Activity(activityId: "b", taskName: "日本 🚀 \"q\" \\", state: .completed, progress: 1, status: "",
                     seq: 9_007_199_254_740_992, createdAt: -86_400_001, updatedAt: 253_402_300_799_999, endedAt: 253_402_300_799_999),
            Activity(activityId: "c", taskName: "n", state: .retrying, progress: 1e-9, createdAt: 1, updatedAt: 2),
        ]
        for a in table {
            let decoded = Activity.decode(try JSONParser.parse(a.json()))
            XCTAssertEqual(decoded, a)
        }
    }

    func testDecodeRefusesMalformedSnapshots() throws {
        let good = text(Self.full.json())
        let table: [(String, String)] = [
            (#""state":"processing""#, #""state":"paused""#),
            (#""seq":5"#, #""seq":"5""#),
            (#""seq":5"#, #""seq":1e300"#),
            (#""seq":5"#, #""seq":-1e300"#),
            (#""seq":5"#, #""seq":5.5"#),
            (#""attempt":1"#, #""attempt":1e19"#),
            (#""createdAt":"2026-11-29T22:53:26.123Z""#, #""createdAt":"yesterday""#),
            (#""progress":0.68"#, #""progress":"0.68""#),
            (#""cancelRequested":false"#, #""cancelRequested":0"#),
            (#""endedAt":null"#, #""endedAt":"never""#),
            (#""machine":"shodan""#, #""machine":5"#),
        ]
        for (from, to) in table {
            let broken = good.replacingOccurrences(of: from, with: to)
            XCTAssertNotEqual(broken, good)
            XCTAssertNil(Activity.decode(try JSONParser.parse(broken)), to)
        }
        XCTAssertNil(Activity.decode(.array([])))
        XCTAssertNil(Activity.decode(.object([])))
    }
}
