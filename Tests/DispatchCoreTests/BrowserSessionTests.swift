@testable import DispatchCore
import XCTest

/// Browser sessions' decisions (contract §7), one line per case: the cookie read from a
/// header, the cookie written, which cookie requests may change anything, trusted proxies.
final class BrowserSessionTests: XCTestCase {
    func testCookieHeader() {
        XCTAssertEqual(BrowserSession.secret(cookieHeader: "dispatch_session=dss_abc"), "dss_abc")
        XCTAssertEqual(BrowserSession.secret(cookieHeader: "theme=dark; dispatch_session=dss_abc ; x=1"), "dss_abc")
        XCTAssertEqual(BrowserSession.secret(cookieHeader: "xdispatch_session=1; dispatch_session=2"), "2", "whole name only")
        XCTAssertNil(BrowserSession.secret(cookieHeader: "dispatch_session="))
        XCTAssertNil(BrowserSession.secret(cookieHeader: "other=1"))
        XCTAssertNil(BrowserSession.secret(cookieHeader: nil))
        XCTAssertNil(BrowserSession.secret(cookieHeader: "dispatch_session=" + String(repeating: "a", count: 129)), "too long")
        XCTAssertNil(BrowserSession.secret(cookieHeader: "dispatch_session=a\u{7F}b"))
    }

    func testTheCookieNamedTwiceIsRefused() {
        let cases: [([String], BrowserSession.CookieRead)] = [
            ([], .none),
            (["theme=dark"], .none),
            (["dispatch_session=a"], .one("a")),
            (["x=1", "dispatch_session=a"], .one("a")),
            (["dispatch_session=a; dispatch_session=b"], .duplicate),
            (["dispatch_session=a; dispatch_session=a"], .duplicate),
            (["dispatch_session=a", "dispatch_session=b"], .duplicate),
            (["dispatch_session=; dispatch_session=b"], .duplicate),
            (["dispatch_session=a\u{7F}"], .none),
            (["xdispatch_session=1; dispatch_session=2"], .one("2")),
        ]
        for (headers, want) in cases { XCTAssertEqual(BrowserSession.read(cookieHeaders: headers), want, "\(headers)") }
        XCTAssertNil(BrowserSession.secret(cookieHeader: "dispatch_session=a; dispatch_session=b"))
    }

    func testForwardedProtoIsTrimmed() {
        for (header, https) in [("https", true), (" https ", true), ("HTTPS\t", true), ("https, http", true), ("\thttps,http", true),
                                ("http", false), ("http, https", false), ("httpsx", false), ("", false), (",https", false)] as [(String, Bool)] {
            XCTAssertEqual(BrowserSession.forwardedHTTPS(header), https, "'\(header)'")
        }
        XCTAssertFalse(BrowserSession.forwardedHTTPS(nil))
    }

    func testPerClientRateIsBoundedInClientsAndTime() {
        var r = PerClientRate(rate: 1.0 / 15, burst: 4, maxClients: 3)
        for _ in 0..<4 { XCTAssertNil(r.take("a", now: 0)) }
        XCTAssertEqual(r.take("a", now: 0)!, 15, accuracy: 0.001, "a minute's 4 are spent: one more in 15 s")
        XCTAssertNil(r.take("b", now: 0), "another client has its own")
        XCTAssertNil(r.take("a", now: 15))
        for c in ["c", "d", "e", "f"] { _ = r.take(c, now: 16) }
        XCTAssertLessThanOrEqual(r.clients, 3, "memory is bounded whatever the number of addresses")
        var unlimited = PerClientRate(rate: 0, burst: 1)
        for _ in 0..<10 { XCTAssertNil(unlimited.take("x", now: 0), "0: no limit") }
    }

    func testSetCookie() {
        XCTAssertEqual(BrowserSession.setCookie("s", secure: false), "dispatch_session=s; HttpOnly; SameSite=Strict; Path=/")
        XCTAssertEqual(BrowserSession.setCookie("s", secure: true), "dispatch_session=s; HttpOnly; SameSite=Strict; Path=/; Secure")
        XCTAssertTrue(BrowserSession.clearCookie(secure: false).contains("Max-Age=0"))
    }

    func testOnlyOurOwnOriginMayChangeThroughTheCookie() {
        let may = { (m: HTTPMethod?, o: String?, https: Bool) in
            BrowserSession.mayUseCookie(method: m, origin: o, host: "dispatch.example:8080", https: https)
        }
        XCTAssertTrue(may(.get, nil, false), "reads need no Origin")
        XCTAssertTrue(may(.head, "https://evil.example", false))
        XCTAssertTrue(may(.post, "http://dispatch.example:8080", false))
        XCTAssertTrue(may(.delete, "HTTP://Dispatch.Example:8080", false), "origins compare without case")
        XCTAssertTrue(may(.post, "https://dispatch.example:8080", true))
        XCTAssertFalse(may(.post, nil, false), "a change without Origin")
        XCTAssertFalse(may(.post, "null", false))
        XCTAssertFalse(may(.post, "https://dispatch.example:8080", false), "another scheme")
        XCTAssertFalse(may(.post, "http://dispatch.example:8080", true))
        XCTAssertFalse(may(.post, "http://dispatch.example", false), "another port")
        XCTAssertFalse(may(.patch, "http://app.dispatch.example:8080", false), "a sibling subdomain")
        XCTAssertFalse(may(.put, "http://dispatch.example:8080.evil.example", false))
        XCTAssertFalse(BrowserSession.mayUseCookie(method: .post, origin: "http://", host: "", https: false), "no Host")
    }

    func testTrustedProxies() throws {
        guard case .success(let p) = TrustedProxies.parse("10.0.0.0/8, 127.0.0.1, fd00::/8, ::1/128") else { return XCTFail() }
        XCTAssertTrue(p.contains("10.1.2.3"))
        XCTAssertFalse(p.contains("11.0.0.1"))
        XCTAssertTrue(p.contains("127.0.0.1"))
        XCTAssertFalse(p.contains("127.0.0.2"), "a bare address is a /32")
        XCTAssertTrue(p.contains("::ffff:10.9.9.9"), "IPv4-mapped IPv6 is IPv4")
        XCTAssertTrue(p.contains("fd12:3456::1"))
        XCTAssertTrue(p.contains("::1"))
        XCTAssertFalse(p.contains("::2"))
        XCTAssertFalse(p.contains("fe80::1"))
        XCTAssertFalse(p.contains(nil))
        XCTAssertFalse(p.contains("not an address"))
        XCTAssertFalse(TrustedProxies.none.contains("127.0.0.1"))
        guard case .success(let odd) = TrustedProxies.parse("192.168.1.128/25") else { return XCTFail() }
        XCTAssertTrue(odd.contains("192.168.1.200"))
        XCTAssertFalse(odd.contains("192.168.1.100"))
        for bad in ["10.0.0.0/33", "10.0.0", "1.2.3.4.5", "256.0.0.1", "::1/129", "1:::2", "example.com", "10.0.0.0/x"] {
            if case .success = TrustedProxies.parse(bad) { XCTFail(bad) }
        }
        XCTAssertEqual(IPAddress.parse("2001:db8::8a2e:370:7334"), [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0x8a, 0x2e, 0x03, 0x70, 0x73, 0x34])
        XCTAssertEqual(IPAddress.parse("::"), [UInt8](repeating: 0, count: 16))
        XCTAssertNil(IPAddress.parse("1:2:3:4:5:6:7:8:9"))
    }
}
