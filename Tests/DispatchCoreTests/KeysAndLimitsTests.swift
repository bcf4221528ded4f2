@testable import DispatchCore
import XCTest

/// Rate limits, scopes, key specs and list cursors.
final class KeysAndLimitsTests: XCTestCase {
    // MARK: - Rate limiting

    func testTokenBucketWithInjectedTime() {
        var b = TokenBucket(rate: 2, burst: 3, now: 100)
        // (time, expected wait: nil = allowed)
        let table: [(Double, Double?)] = [
            (100, nil), (100, nil), (100, nil), (100, 0.5),
            (100.25, 0.25), (100.5, nil), (100.5, 0.5),
            (110, nil), (110, nil), (110, nil), (110, 0.5),  // refills to the burst, no more
            (109, 0.5),  // a clock that steps back adds nothing
        ]
        for (now, wait) in table {
            let got = b.take(now: now)
            if let wait, let got { XCTAssertEqual(got, wait, accuracy: 1e-9, "at \(now)") } else { XCTAssertEqual(got, wait, "at \(now)") }
        }
    }

    func testScopes() {
        let table: [(String, Set<Scope>?)] = [
            ("publish", [.publish]), ("read,device", [.read, .device]), ("admin,admin", [.admin]),
            ("publish,read,device,admin", Set(Scope.allCases)), ("", nil), ("root", nil), ("read,", [.read]), ("Read", nil),
        ]
        for (text, want) in table { XCTAssertEqual(Scope.parseList(text), want, text) }
    }

    // MARK: - Keys and cursors

    func testKeySpecParse() throws {
        let table: [(String, String?)] = [
            (#"{"name":"ci-runner.1","scopes":["publish"]}"#, nil),
            (#"{"name":"n","scopes":["read","device","admin"],"machine":"shodan"}"#, nil),
            (#"{"name":"n","scopes":["read"],"machine":null}"#, nil),
            (#"{"scopes":["read"]}"#, "missing_field"),
            (#"{"name":"n"}"#, "missing_field"),
            (#"{"name":"n","scopes":[]}"#, "invalid_field"),
            (#"{"name":"n","scopes":["root"]}"#, "invalid_field"),
            (#"{"name":"n","scopes":[1]}"#, "invalid_field"),
            (#"{"name":"","scopes":["read"]}"#, "invalid_field"),
            (#"{"name":"a b","scopes":["read"]}"#, "invalid_field"),
            (#"{"name":"\#(String(repeating: "k", count: 65))","scopes":["read"]}"#, "invalid_field"),
            (#"{"name":"n","scopes":["read"],"machine":""}"#, "invalid_field"),
            (#"{"name":"n","scopes":["read"],"machine":5}"#, "invalid_field"),
            (#"{"name":"n","scopes":["read"],"extra":1}"#, "unknown_field"),
            (#"{"name":"n","name":"m","scopes":["read"]}"#, "invalid_json"),
            ("[]", "invalid_json"),
        ]
        for (body, code) in table {
            do throws(DispatchError) {
                _ = try KeySpec.parse(bytes(body))
                XCTAssertNil(code, body)
            } catch {
                XCTAssertEqual(error.code.rawValue, code, "\(body): \(error.message)")
                XCTAssertEqual(error.httpStatus, 400)
            }
        }
        let spec = try KeySpec.parse(bytes(#"{"name":"n","scopes":["read","device","read"],"machine":"shodan"}"#))
        XCTAssertEqual(spec, try KeySpec(name: "n", scopes: [.read, .device], machine: "shodan"))
    }

    func testListCursor() {
        let cursors = [
            ListCursor(createdAt: 1_795_992_806_123, activityId: "TEST-RTORRENT-01"),
            ListCursor(createdAt: 0, activityId: "a_b_c"),
            ListCursor(createdAt: -5, activityId: "x:y.z"),
            ListCursor(createdAt: .max, activityId: String(repeating: "z", count: 128)),
        ]
        for c in cursors { XCTAssertEqual(ListCursor.decode(c.encode()), c, c.encode()) }
        XCTAssertEqual(cursors[0].encode(), "1795992806123_TEST-RTORRENT-01")
        for bad in ["", "_", "12", "12_", "_abc", "x_abc", "1.5_abc", "12_a b", "12_a/b", "99999999999999999999_a"] {
            XCTAssertNil(ListCursor.decode(bad), bad)
        }
    }
}

final class PerKeyRateTests: XCTestCase {
    func testEachKeyHasItsOwnBucketOfTwiceTheRate() {
        var r = PerKeyRate(rate: 2)
        for _ in 0..<4 { XCTAssertNil(r.take(1, now: 0), "a burst of twice the rate") }
        XCTAssertEqual(r.take(1, now: 0) ?? -1, 0.5, accuracy: 1e-9, "then one every 1/rate s")
        XCTAssertNil(r.take(2, now: 0), "another key is not slowed")
        XCTAssertNil(r.take(1, now: 0.5))
    }
}
