import CCurl
@testable import DispatchIO
import Glibc
import XCTest

/// The SSRF classifier, one line per address.
final class AddressPolicyTests: XCTestCase {
    func testTable() {
        let table: [(String, AddressClass)] = [
            ("0.0.0.0", .unspecified),
            ("0.1.2.3", .reserved),
            ("127.0.0.1", .loopback),
            ("127.255.255.254", .loopback),
            ("10.0.0.1", .privateNetwork),
            ("10.255.255.255", .privateNetwork),
            ("172.15.255.255", .global),
            ("172.16.0.1", .privateNetwork),
            ("172.31.255.255", .privateNetwork),
            ("172.32.0.0", .global),
            ("192.168.1.1", .privateNetwork),
            ("192.169.0.1", .global),
            ("169.254.169.254", .linkLocal),
            ("100.63.255.255", .global),
            ("100.64.0.1", .sharedCGNAT),
            ("100.127.255.255", .sharedCGNAT),
            ("100.128.0.0", .global),
            ("224.0.0.1", .multicast),
            ("239.255.255.255", .multicast),
            ("240.0.0.1", .reserved),
            ("255.255.255.255", .reserved),
            ("192.0.0.8", .reserved),
            ("192.0.2.1", .reserved),
            ("198.18.0.1", .reserved),
            ("198.51.100.7", .reserved),
            ("203.0.113.9", .reserved),
            ("8.8.8.8", .global),
            ("1.1.1.1", .global),
            ("17.188.143.34", .global),
            ("::", .unspecified),
            ("::1", .loopback),
            ("::2", .reserved),                     // ::0.0.0.2, deprecated IPv4-compatible
            ("::ffff:127.0.0.1", .loopback),
            ("::ffff:10.1.2.3", .privateNetwork),
            ("::ffff:169.254.169.254", .linkLocal),
            ("::ffff:0.0.0.0", .unspecified),
            ("::ffff:8.8.8.8", .global),
            ("::127.0.0.1", .loopback),
            ("64:ff9b::7f00:1", .loopback),         // NAT64 of 127.0.0.1
            ("64:ff9b::808:808", .global),
            ("2002:c0a8:0101::1", .privateNetwork), // 6to4 of 192.168.1.1
            ("2002:0808:0808::1", .global),
            ("fc00::1", .privateNetwork),
            ("fd12:3456::1", .privateNetwork),
            ("fe80::1", .linkLocal),
            ("febf::1", .linkLocal),
            ("fec0::1", .privateNetwork),
            ("ff02::1", .multicast),
            ("2001:db8::1", .reserved),
            ("2001::1", .reserved),
            ("100::1", .reserved),
            ("2606:4700:4700::1111", .global),
            ("2a00:1450:4001:82b::200e", .global),
        ]
        for (text, expected) in table {
            guard let bytes = parse(text) else { XCTFail("cannot parse \(text)"); continue }
            XCTAssertEqual(AddressClass.classify(bytes), expected, text)
            XCTAssertEqual(AddressClass.classify(bytes).isPublic, expected == .global, text)
            XCTAssertEqual(CurlClient.format(bytes), canonical(text), text)
        }
        XCTAssertEqual(AddressClass.classify([1, 2, 3]), .reserved)
        XCTAssertEqual(AddressClass.classify([]), .reserved)
    }

    /// curl result codes to what the caller does next.
    func testFailureKinds() {
        let table: [(CURLcode, Bool, HTTPClientFailure.Kind)] = [
            (CURLE_HTTP2, false, .retryOnNewConnection),
            (CURLE_HTTP2_STREAM, false, .retryOnNewConnection),
            (CURLE_SEND_ERROR, false, .retryOnNewConnection),
            (CURLE_RECV_ERROR, false, .retryOnNewConnection),
            (CURLE_GOT_NOTHING, false, .retryOnNewConnection),
            (CURLE_PARTIAL_FILE, false, .retryOnNewConnection),
            (CURLE_OPERATION_TIMEDOUT, false, .timeout),
            (CURLE_COULDNT_CONNECT, false, .connect),
            (CURLE_COULDNT_CONNECT, true, .refusedAddress),
            (CURLE_COULDNT_RESOLVE_HOST, false, .connect),
            (CURLE_PEER_FAILED_VERIFICATION, false, .tls),
            (CURLE_SSL_CONNECT_ERROR, false, .tls),
            (CURLE_URL_MALFORMAT, false, .invalidRequest),
            (CURLE_UNSUPPORTED_PROTOCOL, false, .invalidRequest),
            (CURLE_OUT_OF_MEMORY, false, .other),
        ]
        for (code, refused, kind) in table {
            XCTAssertEqual(HTTPClientFailure.kind(curlCode: Int(code.rawValue), refused: refused), kind, "curl \(code.rawValue)")
        }
    }

    private func parse(_ text: String) -> [UInt8]? {
        var v4 = in_addr()
        if inet_pton(AF_INET, text, &v4) == 1 { return withUnsafeBytes(of: v4) { Array($0) } }
        var v6 = in6_addr()
        if inet_pton(AF_INET6, text, &v6) == 1 { return withUnsafeBytes(of: v6) { Array($0) } }
        return nil
    }

    private func canonical(_ text: String) -> String {
        guard let bytes = parse(text) else { return text }
        var out = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
        _ = bytes.withUnsafeBytes { inet_ntop(bytes.count == 4 ? AF_INET : AF_INET6, $0.baseAddress, &out, socklen_t(out.count)) }
        return out.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
    }
}
