import XCTest
@testable import DispatchCore

/// The contract's field table (§1) and call bodies (§2), one line per rule.
final class ValidationTests: XCTestCase {
    func r(_ c: Character, _ n: Int) -> String { String(repeating: c, count: n) }

    /// `Content-Type` of a JSON body, read as bytes: one line per case, and each agrees with
    /// the string reading it replaced (split at `;`, trim blanks, lowercase, compare).
    func testJSONContentType() {
        let table: [(String?, Bool)] = [
            ("application/json", true),
            ("Application/JSON", true),
            ("APPLICATION/JSON", true),
            ("application/json; charset=utf-8", true),
            ("application/json;charset=UTF-8", true),
            ("application/json ; charset=utf-8", true),
            (" \tapplication/json\t ", true),
            ("application/json;", true),
            ("application/json;;", true),
            (nil, false),
            ("", false),
            (" ", false),
            (";", false),
            ("application/jso", false),
            ("application/jsonx", false),
            ("application/json x", false),
            ("application/json-seq", false),
            ("application/problem+json", false),
            ("text/json", false),
            ("application /json", false),
            ("application/ json", false),
            ("xapplication/json", false),
            ("application\u{2215}json", false),
            ("application/json\u{0}", false),
            ("; application/json", false),
            ("text/plain; a=application/json", false),
            ("application/jsoN", true),
        ]
        func stringReading(_ h: String?) -> Bool {
            let value = (h ?? "").split(separator: ";", maxSplits: 1, omittingEmptySubsequences: false)[0]
            let type = value.drop { $0 == " " || $0 == "\t" }.reversed().drop { $0 == " " || $0 == "\t" }.reversed()
            return String(type).lowercased() == "application/json"
        }
        for (value, want) in table {
            XCTAssertEqual(Validation.isJSONContentType(value?.utf8), want, "\(value.debugDescription)")
            XCTAssertEqual(stringReading(value), want, "the string reading of \(value.debugDescription)")
        }
        XCTAssertTrue(Validation.isJSONContentType(Array("application/json".utf8)[...]), "any byte collection")
    }

    func testActivityID() {
        let table: [(String, String?)] = [
            (#"{"taskName":"x","activityId":"TEST-RTORRENT-01"}"#, nil),
            (#"{"taskName":"x","activityId":"a"}"#, nil),
            (#"{"taskName":"x","activityId":"Aa0.b_c:d-e"}"#, nil),
            (#"{"taskName":"x","activityId":"\#(r("A", 128))"}"#, nil),
            (#"{"taskName":"x","activityId":null}"#, nil),
            (#"{"taskName":"x","activityId":"\#(r("A", 129))"}"#, "invalid_field"),
            (#"{"taskName":"x","activityId":""}"#, "invalid_field"),
            (#"{"taskName":"x","activityId":"a b"}"#, "invalid_field"),
            (#"{"taskName":"x","activityId":"a/b"}"#, "invalid_field"),
            (#"{"taskName":"x","activityId":"a?b"}"#, "invalid_field"),
            (#"{"taskName":"x","activityId":"é"}"#, "invalid_field"),
            (#"{"taskName":"x","activityId":"a\nb"}"#, "invalid_field"),
            (#"{"taskName":"x","activityId":"a\u0000"}"#, "invalid_field"),
            (#"{"taskName":"x","activityId":42}"#, "invalid_field"),
            (#"{"taskName":"x","activityId":["a"]}"#, "invalid_field"),
        ]
        for (body, code) in table { assertValidation(.start, body, code) }
        XCTAssertEqual(try Validation.start(bytes(#"{"taskName":"x","activityId":"Aa0.b_c:d-e"}"#)).activityId, "Aa0.b_c:d-e")
        XCTAssertNil(try Validation.start(bytes(#"{"taskName":"x"}"#)).activityId, "omitted: the server generates one")
        XCTAssertEqual(try Validation.activityID("ok.1"), "ok.1")
        XCTAssertThrowsError(try Validation.activityID(""))
    }

    func testTaskName() throws {
        let table: [(String, String?)] = [
            (#"{"taskName":"Debian 13 Trixie ISO"}"#, nil),
            (#"{"taskName":"\#(r("n", 200))"}"#, nil),
            (#"{"taskName":"  \#(r("n", 200)) \t"}"#, nil),
            (#"{"taskName":"\#(r("é", 200))"}"#, nil),
            (#"{"taskName":"日本語 🚀"}"#, nil),
            (#"{"taskName":"\#(r("n", 201))"}"#, "invalid_field"),
            // One character (an extended grapheme cluster) of 10 KB: within 200 characters, over 800 bytes.
            (#"{"taskName":"e\#(r("\u{0301}", 5000))"}"#, "invalid_field"),
            (#"{"taskName":"\#(r("🚀", 200))"}"#, nil),
            (#"{"taskName":""}"#, "invalid_field"),
            (#"{"taskName":"   "}"#, "invalid_field"),
            (#"{"taskName":"\t\n"}"#, "invalid_field"),
            (#"{"taskName":"a\nb"}"#, "invalid_field"),
            (#"{"taskName":"a\rb"}"#, "invalid_field"),
            (#"{"taskName":"a\tb"}"#, "invalid_field"),
            (#"{"taskName":"a\u0000b"}"#, "invalid_field"),
            (#"{"taskName":"a\u001bb"}"#, "invalid_field"),
            (#"{"taskName":"a\u007fb"}"#, "invalid_field"),
            (#"{"taskName":"a\u0085b"}"#, "invalid_field"),
            (#"{"taskName":"a\u2028b"}"#, "invalid_field"),
            (#"{"taskName":42}"#, "invalid_field"),
            (#"{"taskName":true}"#, "invalid_field"),
            (#"{"taskName":{}}"#, "invalid_field"),
            (#"{"taskName":null}"#, "missing_field"),
            (#"{}"#, "missing_field"),
            (#"{"machine":"m"}"#, "missing_field"),
        ]
        for (body, code) in table { assertValidation(.start, body, code) }
        XCTAssertEqual(try Validation.start(bytes(#"{"taskName":" \t Debian ISO \n "}"#)).taskName, "Debian ISO")
    }

    func testSystemImage() {
        let table: [(String, String?)] = [
            ("arrow.down.circle.fill", nil),
            ("0.9", nil),
            (r("a", 100), nil),
            (r("a", 101), "invalid_field"),
            ("", "invalid_field"),
            ("Arrow.down", "invalid_field"),
            ("arrow-down", "invalid_field"),
            ("arrow_down", "invalid_field"),
            ("arrow down", "invalid_field"),
            ("é", "invalid_field"),
        ]
        for (value, code) in table { assertValidation(.start, #"{"taskName":"x","systemImage":\#(quoted(value))}"#, code) }
        assertValidation(.start, #"{"taskName":"x","systemImage":null}"#, nil)
        assertValidation(.start, #"{"taskName":"x","systemImage":1}"#, "invalid_field")
    }

    func testMachine() {
        let table: [(String, String?)] = [
            ("shodan", nil),
            ("Xerxes_01.lan-2", nil),
            (r("m", 64), nil),
            (r("m", 65), "invalid_field"),
            ("", "invalid_field"),
            ("a:b", "invalid_field"),
            ("a b", "invalid_field"),
            ("a/b", "invalid_field"),
            ("ñ", "invalid_field"),
        ]
        for (value, code) in table { assertValidation(.start, #"{"taskName":"x","machine":\#(quoted(value))}"#, code) }
        assertValidation(.start, #"{"taskName":"x","machine":null}"#, nil)
        assertValidation(.start, #"{"taskName":"x","machine":false}"#, "invalid_field")
    }

    /// One alphabet for key names, machines and activity ids (ids also allow `:` and 128 bytes).
    func testTagAlphabet() {
        for ok in ["a", "Xerxes_01.lan-2", r("m", 64)] {
            XCTAssertTrue(Validation.isTag(ok), ok)
            XCTAssertTrue(Validation.isValidActivityID(ok), ok)
        }
        for bad in ["", r("m", 65), "a:b", "a b", "a/b", "ñ", "a\u{0}"] { XCTAssertFalse(Validation.isTag(bad), bad) }
        XCTAssertTrue(Validation.isTag("a:b", colon: true))
        XCTAssertTrue(Validation.isValidActivityID("a:b"))
        XCTAssertTrue(Validation.isValidActivityID(r("A", 128)))
        XCTAssertFalse(Validation.isValidActivityID(r("A", 129)))
        XCTAssertThrowsError(try KeySpec(name: "a:b", scopes: [.read], machine: nil))
        XCTAssertThrowsError(try KeySpec(name: "ok", scopes: [.read], machine: "a:b"))
        XCTAssertNoThrow(try KeySpec(name: "Key_1.a-b", scopes: [.read], machine: "Xerxes_01.lan-2"))
    }

    func testCancelURL() {
        let long = "https://x.example/" + r("a", 2048 - 18)
        XCTAssertEqual(long.utf8.count, 2048)
        let table: [(String, String?)] = [
            ("https://actions.shodan.example/cancel", nil),
            ("http://x", nil),
            ("HTTPS://X.EXAMPLE/Path?q=1#f", nil),
            ("https://[::1]:8443/cancel", nil),
            ("http://user:pw@host:8080/x", nil),
            ("https://host?x", nil),
            (long, nil),
            (long + "a", "invalid_field"),
            ("ftp://x.example/", "invalid_field"),
            ("/relative/path", "invalid_field"),
            ("x.example/cancel", "invalid_field"),
            ("https://", "invalid_field"),
            ("https:///path", "invalid_field"),
            ("http://:80/", "invalid_field"),
            ("http://user@/", "invalid_field"),
            ("https://a b.example/", "invalid_field"),
            ("https://é.example/", "invalid_field"),
            ("javascript:alert(1)", "invalid_field"),
            ("mailto:ops@example.com", "invalid_field"),
            ("https://x.example/\n", "invalid_field"),
            ("", "invalid_field"),
        ]
        for (value, code) in table { assertValidation(.start, #"{"taskName":"x","cancelURL":\#(quoted(value))}"#, code) }
        assertValidation(.start, #"{"taskName":"x","cancelURL":null}"#, nil)
        assertValidation(.start, #"{"taskName":"x","cancelURL":{"u":1}}"#, "invalid_field")
    }

    /// `initialProgress` at start, `progress` at update and end: finite in [0, 1], or null.
    func testProgress() throws {
        let table: [(String, String?)] = [
            ("0", nil), ("1", nil), ("0.5", nil), ("1.0", nil), ("-0", nil), ("0e5", nil), ("1e-400", nil), ("null", nil),
            ("-0.1", "invalid_field"), ("1.0000001", "invalid_field"), ("2", "invalid_field"), ("-1e-300", "invalid_field"),
            ("\"0.5\"", "invalid_field"), ("true", "invalid_field"), ("[0.5]", "invalid_field"),
            ("1e400", "invalid_json"), ("NaN", "invalid_json"), ("Infinity", "invalid_json"), (".5", "invalid_json"),
        ]
        for (value, code) in table {
            assertValidation(.start, #"{"taskName":"x","initialProgress":\#(value)}"#, code)
            assertValidation(.update, #"{"progress":\#(value)}"#, code)
            assertValidation(.end, #"{"progress":\#(value)}"#, code)
        }
        XCTAssertEqual(try Validation.start(bytes(#"{"taskName":"x","initialProgress":0.68}"#)).initialProgress, 0.68)
        XCTAssertEqual(try Validation.update(bytes(#"{"progress":0.5}"#)).progress, .set(0.5))
        XCTAssertEqual(try Validation.update(bytes(#"{"progress":null}"#)).progress, .set(nil))
        XCTAssertEqual(try Validation.update(bytes(#"{}"#)).progress, .keep)
        XCTAssertEqual(try Validation.end(bytes(#"{"progress":null}"#)).progress, .set(nil))
    }

    func testStatus() throws {
        let table: [(String, String?)] = [
            ("Downloading at 18.4 MB/s (68%)", nil),
            ("", nil),
            (r("s", 200), nil),
            (r("é", 200), nil),
            ("🚀 launch", nil),
            (r("s", 201), "invalid_field"),
            ("e" + r("\u{0301}", 5000), "invalid_field"),
            (r("🚀", 200), nil),
            ("line\nbreak", "invalid_field"),
            ("line\rbreak", "invalid_field"),
            ("line\r\nbreak", "invalid_field"),
            ("trailing\n", "invalid_field"),
            ("tab\there", "invalid_field"),
            ("nul\u{0}", "invalid_field"),
            ("esc\u{1B}[31m", "invalid_field"),
            ("del\u{7F}", "invalid_field"),
            ("nel\u{85}", "invalid_field"),
            ("ls\u{2028}", "invalid_field"),
            ("ps\u{2029}", "invalid_field"),
        ]
        for (value, code) in table {
            assertValidation(.start, #"{"taskName":"x","status":\#(quoted(value))}"#, code)
            assertValidation(.update, #"{"status":\#(quoted(value))}"#, code)
            assertValidation(.end, #"{"status":\#(quoted(value))}"#, code)
        }
        for call in [PublishCall.start, .update, .end] {
            let prefix = call == .start ? #""taskName":"x","# : ""
            assertValidation(call, "{\(prefix)\"status\":null}", nil)
            assertValidation(call, "{\(prefix)\"status\":5}", "invalid_field")
        }
        XCTAssertEqual(try Validation.update(bytes(#"{"status":null}"#)).status, .set(nil))
        XCTAssertEqual(try Validation.update(bytes(#"{"status":"s"}"#)).status, .set("s"))
        XCTAssertEqual(try Validation.update(bytes(#"{}"#)).status, .keep)
    }

    func testEndError() throws {
        let table: [(String, String?)] = [
            (#"{"state":"error","error":"disk full"}"#, nil),
            (#"{"error":"\#(r("e", 500))"}"#, nil),
            (#"{"error":null}"#, nil),
            (#"{"error":"\#(r("e", 501))"}"#, "invalid_field"),
            (#"{"error":"e\#(r("\u{0301}", 1000))"}"#, "invalid_field"),
            (#"{"error":"a\nb"}"#, "invalid_field"),
            (#"{"error":5}"#, "invalid_field"),
        ]
        for (body, code) in table { assertValidation(.end, body, code) }
        XCTAssertEqual(try Validation.end(bytes(#"{"state":"error","error":"disk full"}"#)).error, "disk full")
        assertValidation(.update, #"{"error":"x"}"#, "unknown_field")
        assertValidation(.start, #"{"taskName":"x","error":"x"}"#, "unknown_field")
    }

    /// Which states each call accepts, and its default.
    func testStatePerCall() throws {
        let table: [(PublishCall, String, String?)] = [
            (.start, "queued", nil), (.start, "processing", nil), (.start, "retrying", "invalid_field"),
            (.start, "completed", "invalid_field"), (.start, "error", "invalid_field"), (.start, "cancelled", "invalid_field"),
            (.update, "processing", nil), (.update, "queued", nil), (.update, "retrying", nil),
            (.update, "completed", "invalid_field"), (.update, "error", "invalid_field"), (.update, "cancelled", "invalid_field"),
            (.end, "completed", nil), (.end, "error", nil), (.end, "cancelled", nil),
            (.end, "queued", "invalid_field"), (.end, "processing", "invalid_field"), (.end, "retrying", "invalid_field"),
            (.start, "idle", "invalid_field"), (.start, "rejected", "invalid_field"),
            (.update, "idle", nil), (.update, "rejected", "invalid_field"),
            (.end, "rejected", nil), (.end, "idle", "invalid_field"),
            (.start, "Queued", "invalid_field"), (.update, "PROCESSING", "invalid_field"), (.end, "done", "invalid_field"),
            (.update, "", "invalid_field"), (.end, "cancel_requested", "invalid_field"),
        ]
        for (call, state, code) in table {
            let prefix = call == .start ? #""taskName":"x","# : ""
            assertValidation(call, "{\(prefix)\"state\":\"\(state)\"}", code)
        }
        for call in [PublishCall.start, .update, .end] {
            let prefix = call == .start ? #""taskName":"x","# : ""
            assertValidation(call, "{\(prefix)\"state\":1}", "invalid_field")
            assertValidation(call, "{\(prefix)\"state\":null}", nil)
        }
        XCTAssertEqual(try Validation.start(bytes(#"{"taskName":"x"}"#)).state, .queued)
        XCTAssertEqual(try Validation.update(bytes("{}")).state, .processing)
        XCTAssertEqual(try Validation.end(bytes("{}")).state, .completed)
        XCTAssertEqual(try Validation.update(bytes(#"{"state":"retrying"}"#)).state, .retrying)
    }

    func testUnknownFields() {
        let table: [(PublishCall, String)] = [
            (.start, #"{"taskName":"x","foo":1}"#),
            (.start, #"{"taskName":"x","progress":0.5}"#),
            (.start, #"{"taskName":"x","TaskName":"y"}"#),
            (.start, #"{"taskName":"x","seq":3}"#),
            (.update, #"{"taskName":"x"}"#),
            (.update, #"{"initialProgress":0.5}"#),
            (.update, #"{"attempt":2}"#),
            (.end, #"{"machine":"m"}"#),
            (.end, #"{"":1}"#),
        ]
        for (call, body) in table { assertValidation(call, body, "unknown_field") }
    }

    func testBodiesThatAreNotAJSONObject() {
        let table: [String] = [
            "", " ", "{", "}", "[]", "[{}]", #""x""#, "null", "1", "true",
            #"{"taskName":"x",}"#, #"{'taskName':'x'}"#, #"{taskName:"x"}"#, #"{"taskName":"x"} {}"#,
            #"{"taskName":"x""#, #"{"taskName" "x"}"#, #"{"taskName":"x\q"}"#,
            #"{"taskName":"x","taskName":"y"}"#, #"{"taskName":"x","taskName":"x"}"#,
            #"{"status":"a","status":"a"}"#,
        ]
        for call in [PublishCall.start, .update, .end] {
            for body in table { assertValidation(call, body, "invalid_json") }
            assertValidation(call, [0x7B, 0x22, 0xFF, 0x22, 0x3A, 0x31, 0x7D], "invalid_json", label: "invalid UTF-8 key")
            assertValidation(call, [0xEF, 0xBB, 0xBF] + bytes("{}"), "invalid_json", label: "byte order mark")
        }
    }

    func testBodySize() {
        let base = #"{"taskName":"x"}"#
        let max = Validation.maxBodyBytes
        XCTAssertEqual(max, 16 * 1024)
        assertValidation(.start, base + r(" ", max - base.utf8.count), nil)
        assertValidation(.start, base + r(" ", max - base.utf8.count + 1), "body_too_large")
        assertValidation(.update, #"{"status":"\#(r("s", 20_000))"}"#, "body_too_large")
        assertValidation(.end, r("[", 100_000), "body_too_large")
        assertValidation(.start, #"{"taskName":"x","status":"\#(r("s", 16_000))"}"#, "invalid_field")
    }

    func testWholeCommands() throws {
        let start = try Validation.start(bytes(#"""
            {"activityId":"TEST-RTORRENT-01","taskName":"Debian 13 Trixie ISO","systemImage":"arrow.down.circle.fill",
             "machine":"shodan","cancelURL":"https://actions.shodan.example/cancel","initialProgress":0,
             "status":"Queued","state":"processing"}
            """#))
        XCTAssertEqual(start, StartCommand(activityId: "TEST-RTORRENT-01", taskName: "Debian 13 Trixie ISO",
                                           systemImage: "arrow.down.circle.fill", machine: "shodan",
                                           cancelURL: "https://actions.shodan.example/cancel", initialProgress: 0,
                                           status: "Queued", state: .processing))
        XCTAssertEqual(try Validation.update(bytes(#"{"progress":0.68,"status":"Downloading","state":"retrying"}"#)),
                       UpdateCommand(progress: .set(0.68), status: .set("Downloading"), state: .retrying))
        XCTAssertEqual(try Validation.end(bytes(#"{"progress":1,"status":"Done","state":"error","error":"e"}"#)),
                       EndCommand(progress: .set(1), status: .set("Done"), state: .error, error: "e"))
    }

    func testLastEventIDAndQueryIntegers() throws {
        let ids: [(String?, Int64?)] = [
            ("5", 5), ("0", 0), ("9223372036854775807", .max), (nil, nil), ("", nil), ("-1", nil), ("5 ", nil),
            ("abc", nil), ("99999999999999999999", nil), ("9223372036854775808", nil), ("+5", nil),
        ]
        for (header, want) in ids { XCTAssertEqual(Validation.lastEventID(header), want, "\(header ?? "nil")") }
        let ints: [(String?, Int64?)] = [
            (nil, 50), ("1", 1), ("1000", 1000), ("0", nil), ("1001", nil), ("-1", nil), ("", nil), ("1e3", nil),
            ("99999999999999999999", nil),
        ]
        for (q, want) in ints {
            do throws(DispatchError) {
                let v = try Validation.integer(q, name: "limit", range: 1...1000, default: 50)
                XCTAssertEqual(v, want, "\(q ?? "nil")")
            } catch {
                XCTAssertNil(want, "\(q ?? "nil")")
                XCTAssertEqual(error.code, .invalidQuery)
                XCTAssertEqual(error.httpStatus, 400)
            }
        }
    }
}
