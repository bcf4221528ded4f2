// CCurl, CLibevent: their shims include <sys/socket.h> textually, which in whole-module (release) builds makes
// that module the owner of SOCK_STREAM and friends; without this import they are not found.
import CCurl
import CLibevent
import DispatchSystem
import Glibc

/// An IPv4 or IPv6 literal and a port, as a `sockaddr`.
public struct SocketAddress: Sendable {
    var storage = sockaddr_storage()
    public private(set) var length: socklen_t = 0

    public init(host: String, port: Int) throws(SystemError) {
        var in4 = sockaddr_in()
        var in6 = sockaddr_in6()
        let bare = host.hasPrefix("[") && host.hasSuffix("]") ? String(host.dropFirst().dropLast()) : host
        if inet_pton(AF_INET, bare, &in4.sin_addr) == 1 {
            in4.sin_family = sa_family_t(AF_INET)
            in4.sin_port = in_port_t(UInt16(port).bigEndian)
            withUnsafeBytes(of: in4) { src in withUnsafeMutableBytes(of: &storage) { $0.copyMemory(from: src) } }
            length = socklen_t(MemoryLayout<sockaddr_in>.size)
        } else if inet_pton(AF_INET6, bare, &in6.sin6_addr) == 1 {
            in6.sin6_family = sa_family_t(AF_INET6)
            in6.sin6_port = in_port_t(UInt16(port).bigEndian)
            withUnsafeBytes(of: in6) { src in withUnsafeMutableBytes(of: &storage) { $0.copyMemory(from: src) } }
            length = socklen_t(MemoryLayout<sockaddr_in6>.size)
        } else {
            throw SystemError("listen address \(host) is not an IP address")
        }
    }

    var family: Int32 { Int32(storage.ss_family) }

    public func withSockaddr<R>(_ body: (UnsafePointer<sockaddr>, socklen_t) -> R) -> R {
        withUnsafePointer(to: storage) { p in p.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, length) } }
    }
}

/// Keeps a listen address for the workers of one server. The workers share the port with
/// SO_REUSEPORT, and the kernel would let any other process of the same user join them and
/// take half the connections (a second dispatchd with another database: split brain). So
/// before any worker binds, this checks that nothing holds the address (a bind without
/// SO_REUSEPORT fails if anything does) and then holds a bound, non-listening SO_REUSEPORT
/// socket for the server's life: the workers can join it; a later check by anyone fails.
public final class PortReservation {
    public let host: String
    /// The port reserved (the one the kernel chose when asked for port 0).
    public let port: Int
    private var fd: Int32

    public init(host: String, port: Int) throws(SystemError) {
        let address = try SocketAddress(host: host, port: port)
        let probe = socket(address.family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard probe >= 0 else { throw SystemError("cannot create a socket", errno: errno) }
        // SO_REUSEADDR: connections of a previous run in TIME_WAIT do not count, a listener does.
        var one: Int32 = 1
        setsockopt(probe, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        guard address.withSockaddr({ bind(probe, $0, $1) }) == 0 else {
            let e = errno
            close(probe)
            throw SystemError(e == EADDRINUSE ? "address in use: \(host):\(port) (another server or program listens there)"
                                              : "cannot listen on \(host):\(port)", errno: e)
        }
        var chosen = port
        if port == 0 { chosen = PortReservation.boundPort(probe) ?? 0 }
        close(probe)
        let held = socket(address.family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        setsockopt(held, SOL_SOCKET, SO_REUSEPORT, &one, socklen_t(MemoryLayout<Int32>.size))
        setsockopt(held, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        let again = try SocketAddress(host: host, port: chosen)
        guard held >= 0, again.withSockaddr({ bind(held, $0, $1) }) == 0 else {
            let e = errno
            if held >= 0 { close(held) }
            throw SystemError("address in use: \(host):\(chosen)", errno: e)
        }
        self.host = host
        self.port = chosen
        fd = held
    }

    deinit { if fd >= 0 { close(fd) } }

    static func boundPort(_ fd: Int32) -> Int? {
        var storage = sockaddr_storage()
        var len = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let r = withUnsafeMutablePointer(to: &storage) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) } }
        guard r == 0 else { return nil }
        if storage.ss_family == sa_family_t(AF_INET) {
            return withUnsafeBytes(of: storage) { Int(UInt16(bigEndian: $0.load(as: sockaddr_in.self).sin_port)) }
        }
        return withUnsafeBytes(of: storage) { Int(UInt16(bigEndian: $0.load(as: sockaddr_in6.self).sin6_port)) }
    }

    /// Raises this process's open-file limit to its hard limit; returns the limit now in force.
    @discardableResult
    public static func raiseOpenFileLimit() -> Int {
        var limit = rlimit()
        getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        if limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max
            setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
            getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        }
        return Int(limit.rlim_cur)
    }
}
