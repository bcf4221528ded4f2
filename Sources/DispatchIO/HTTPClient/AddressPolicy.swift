/// Which kind of network an IP address belongs to, for refusing webhook connections that
/// would reach our own machine or network (SSRF). Pure: bytes in, class out.
public enum AddressClass: String, Sendable, CaseIterable {
    case global
    case loopback
    case privateNetwork = "private"
    case linkLocal = "link-local"
    case unspecified
    case sharedCGNAT = "cgnat"
    case multicast
    /// Broadcast, documentation, benchmarking, reserved and protocol-assignment ranges:
    /// nothing a webhook receiver lives on.
    case reserved

    /// Whether a webhook may connect to an address of this class.
    public var isPublic: Bool { self == .global }

    /// Classifies an IPv4 (4 bytes) or IPv6 (16 bytes) address in network byte order.
    /// Anything else is `.reserved`. IPv6 forms that carry an IPv4 address (mapped,
    /// compatible, NAT64, 6to4) are classified by the IPv4 address they carry.
    public static func classify(_ bytes: [UInt8]) -> AddressClass {
        switch bytes.count {
        case 4: return classifyV4(bytes[0], bytes[1], bytes[2], bytes[3])
        case 16: return classifyV6(bytes)
        default: return .reserved
        }
    }

    static func classifyV4(_ a: UInt8, _ b: UInt8, _ c: UInt8, _ d: UInt8) -> AddressClass {
        switch (a, b, c) {
        case (0, 0, 0) where d == 0: return .unspecified
        case (0, _, _): return .reserved                            // 0/8 "this network"
        case (127, _, _): return .loopback                          // 127/8
        case (10, _, _): return .privateNetwork                     // 10/8
        case (172, 16...31, _): return .privateNetwork              // 172.16/12
        case (192, 168, _): return .privateNetwork                  // 192.168/16
        case (169, 254, _): return .linkLocal                       // 169.254/16
        case (100, 64...127, _): return .sharedCGNAT                // 100.64/10
        case (224...239, _, _): return .multicast                   // 224/4
        case (240...255, _, _): return .reserved                    // 240/4 and 255.255.255.255
        case (192, 0, 0), (192, 0, 2): return .reserved             // protocol assignments, TEST-NET-1
        case (198, 18...19, _): return .reserved                    // benchmarking 198.18/15
        case (198, 51, 100), (203, 0, 113): return .reserved        // TEST-NET-2, TEST-NET-3
        default: return .global
        }
    }

    static func classifyV6(_ b: [UInt8]) -> AddressClass {
        let firstTen = b[0..<10].allSatisfy { $0 == 0 }
        if firstTen && b[10] == 0xff && b[11] == 0xff {             // ::ffff:a.b.c.d (mapped)
            return classifyV4(b[12], b[13], b[14], b[15])
        }
        if firstTen && b[10] == 0 && b[11] == 0 {
            if b[12...14].allSatisfy({ $0 == 0 }) {
                if b[15] == 0 { return .unspecified }               // ::
                if b[15] == 1 { return .loopback }                  // ::1
            }
            return classifyV4(b[12], b[13], b[14], b[15])           // ::a.b.c.d (deprecated compatible)
        }
        if b[0] == 0x00 && b[1] == 0x64 && b[2] == 0xff && b[3] == 0x9b && b[4...11].allSatisfy({ $0 == 0 }) {
            return classifyV4(b[12], b[13], b[14], b[15])           // 64:ff9b::/96 NAT64
        }
        if b[0] == 0x20 && b[1] == 0x02 {                           // 2002::/16 6to4
            return classifyV4(b[2], b[3], b[4], b[5])
        }
        if b[0] & 0xfe == 0xfc { return .privateNetwork }           // fc00::/7 unique local
        if b[0] == 0xfe && b[1] & 0xc0 == 0x80 { return .linkLocal } // fe80::/10
        if b[0] == 0xfe && b[1] & 0xc0 == 0xc0 { return .privateNetwork } // fec0::/10 old site-local
        if b[0] == 0xff { return .multicast }                       // ff00::/8
        if b[0] == 0x20 && b[1] == 0x01 && b[2] == 0x0d && b[3] == 0xb8 { return .reserved } // 2001:db8::/32 documentation
        if b[0] == 0x20 && b[1] == 0x01 && b[2] == 0x00 && b[3] == 0x00 { return .reserved } // 2001::/32 Teredo tunnels
        if b[0] == 0x01 && b[1] == 0x00 && b[2...7].allSatisfy({ $0 == 0 }) { return .reserved } // 100::/64 discard
        return .global
    }
}
