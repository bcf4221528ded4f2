import DispatchSystem
import Glibc

/// systemd's readiness protocol (`Type=notify`): one datagram to `$NOTIFY_SOCKET`. Nothing to
/// link: the protocol is a line of text on a Unix socket.
enum SystemdNotify {
    static func send(_ state: String) {
        guard let path = Subprocess.environment("NOTIFY_SOCKET"), !path.isEmpty else { return }
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return }
        defer { close(fd) }
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        var bytes = Array(path.utf8)
        let abstract = bytes.first == UInt8(ascii: "@")
        if abstract { bytes[0] = 0 }  // an abstract socket's name starts with NUL
        guard bytes.count < MemoryLayout.size(ofValue: addr.sun_path) else { return }
        withUnsafeMutableBytes(of: &addr.sun_path) { raw in
            for (i, b) in bytes.enumerated() { raw[i] = b }
        }
        let length = socklen_t(MemoryLayout<sa_family_t>.size + bytes.count + (abstract ? 0 : 1))
        _ = state.withCString { text in
            withUnsafePointer(to: &addr) { p in
                p.withMemoryRebound(to: sockaddr.self, capacity: 1) { sendto(fd, text, strlen(text), Int32(MSG_NOSIGNAL), $0, length) }
            }
        }
    }
}
