#if canImport(Glibc)
import Glibc
#endif
// CCurlDynamic's header includes <sys/socket.h>; in whole-module (release) builds that module then
// owns SOCK_STREAM and friends, so every file that uses them imports it (see PortReservation.swift).
import CCurlDynamic
import DispatchCore
import DispatchSystem
import DispatchCLIKit

/// A failure below HTTP: the name, the connection, TLS or the bytes.
struct TransportError: Error {
    var message: String
    /// Worth a retry: refused, reset, timed out, cut short, name service temporarily failing.
    var transient: Bool
}

/// The bytes of one connection to the server, whatever carries them: a plain socket for
/// `http://`, a TLS connection made by libcurl for `https://`. HTTP itself (request encoding,
/// the answer's parsing, streaming) is the same code above either.
protocol ByteStream: AnyObject {
    func send(_ bytes: [UInt8], deadline: Double) throws(TransportError)
    /// Waits until `deadline` for bytes and reads what is there into `buffer`.
    func receive(into buffer: inout [UInt8], deadline: Double) throws(TransportError) -> Received
}

enum Received: Equatable {
    case bytes(Int)
    case timedOut
    case closed
}

enum WaitResult { case ready, timedOut, interrupted }

/// poll() for one fd until `deadline`; EINTR from a signal we handle ends the wait.
func waitFor(fd: Int32, events: Int16, deadline: Double) -> WaitResult {
    while true {
        let remaining = deadline - Clock.monotonic()
        if remaining <= 0 { return .timedOut }
        var pfd = pollfd(fd: fd, events: events, revents: 0)
        let n = poll(&pfd, 1, Int32(min(remaining * 1000, 1_000_000).rounded(.up)))
        if n > 0 { return .ready }
        if n == 0 { return .timedOut }
        if errno == EINTR {
            if System.interrupted() { return .interrupted }
            continue
        }
        return .ready  // let the following read/write report the error
    }
}

/// One HTTP/1.1 exchange (`Connection: close`) over a `ByteStream`. Every wait goes through
/// poll() with a deadline, so nothing blocks forever.
final class HTTPConnection {
    private let stream: ByteStream
    private var parser = HTTPResponseParser()
    private(set) var eof = false
    private var buffer = [UInt8](repeating: 0, count: 64 * 1024)

    private init(stream: ByteStream) { self.stream = stream }

    /// Connects to the server: a socket for http, libcurl's TLS connection (through a proxy if
    /// the environment names one) for https.
    static func connect(to endpoint: CLIEndpoint, caFile: String?, timeout: Double) throws(TransportError) -> HTTPConnection {
        switch endpoint.scheme {
        case .http: return HTTPConnection(stream: try SocketStream.connect(to: endpoint, timeout: timeout))
        case .https: return HTTPConnection(stream: try CurlStream.connect(to: endpoint, caFile: caFile, timeout: timeout))
        }
    }

    func send(_ bytes: [UInt8], deadline: Double) throws(TransportError) {
        try stream.send(bytes, deadline: deadline)
    }

    /// Waits at most until `deadline` for bytes and returns the parser's events: `nil` when the
    /// wait timed out with nothing new, `[]` when bytes arrived that completed nothing.
    func readEvents(until deadline: Double) throws(TransportError) -> [HTTPResponseEvent]? {
        if eof { return [] }
        let received = try stream.receive(into: &buffer, deadline: deadline)
        do {
            switch received {
            case .timedOut: return nil
            case .bytes(let n): return try parser.feed(buffer[..<n])
            case .closed:
                eof = true
                return try parser.finish()
            }
        } catch {
            throw TransportError(message: error.truncated ? error.message : "bad answer from the server: \(error.message)",
                                 transient: error.truncated)
        }
    }

    /// One complete request and its buffered answer, within `timeout` seconds.
    static func exchange(endpoint: CLIEndpoint, caFile: String?, request: [UInt8], timeout: Double) throws(TransportError) -> HTTPResponse {
        let deadline = Clock.monotonic() + timeout
        let conn = try connect(to: endpoint, caFile: caFile, timeout: timeout)
        try conn.send(request, deadline: deadline)
        var head: HTTPResponseHead?
        var body: [UInt8] = []
        while true {
            guard let events = try conn.readEvents(until: deadline) else {
                throw TransportError(message: "timed out waiting for the server's answer", transient: true)
            }
            for event in events {
                switch event {
                case .head(let h): head = h
                case .body(let b):
                    body.append(contentsOf: b)
                    if body.count > 4 * 1024 * 1024 { throw TransportError(message: "answer too large", transient: false) }
                case .end:
                    guard let head else { throw TransportError(message: "answer without a head", transient: true) }
                    return HTTPResponse(head: head, body: body)
                }
            }
            if conn.eof && events.isEmpty {
                throw TransportError(message: "connection closed before the answer was complete", transient: true)
            }
        }
    }
}

/// `http://`: a plain non-blocking POSIX socket.
final class SocketStream: ByteStream {
    private let fd: Int32

    private init(fd: Int32) { self.fd = fd }
    deinit { close(fd) }

    /// Resolves `endpoint.host` with getaddrinfo and connects to the first address that answers.
    static func connect(to endpoint: CLIEndpoint, timeout: Double) throws(TransportError) -> SocketStream {
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_flags = AI_ADDRCONFIG | AI_NUMERICSERV
        var list: UnsafeMutablePointer<addrinfo>?
        let rc = getaddrinfo(endpoint.host, String(endpoint.port), &hints, &list)
        guard rc == 0, let first = list else {
            let text = gai_strerror(rc).map { String(cString: $0) } ?? "error \(rc)"
            throw TransportError(message: "cannot resolve \(endpoint.host): \(text)", transient: rc == EAI_AGAIN)
        }
        defer { freeaddrinfo(first) }
        let deadline = Clock.monotonic() + timeout
        var lastError = "no address"
        var node: UnsafeMutablePointer<addrinfo>? = first
        while let ai = node {
            node = ai.pointee.ai_next
            let fd = socket(ai.pointee.ai_family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
            guard fd >= 0 else { lastError = System.errorText(errno); continue }
            var one: Int32 = 1
            setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
            if Glibc.connect(fd, ai.pointee.ai_addr, ai.pointee.ai_addrlen) == 0 {
                return SocketStream(fd: fd)
            }
            guard errno == EINPROGRESS else { lastError = System.errorText(errno); close(fd); continue }
            switch waitFor(fd: fd, events: Int16(POLLOUT), deadline: deadline) {
            case .ready:
                var err: Int32 = 0
                var len = socklen_t(MemoryLayout<Int32>.size)
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len)
                if err == 0 { return SocketStream(fd: fd) }
                lastError = System.errorText(err)
            case .timedOut:
                lastError = "connection timed out"
            case .interrupted:
                close(fd)
                throw TransportError(message: "interrupted", transient: false)
            }
            close(fd)
        }
        throw TransportError(message: "cannot connect to \(endpoint.display): \(lastError)", transient: true)
    }

    func send(_ bytes: [UInt8], deadline: Double) throws(TransportError) {
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { raw in
                Glibc.send(fd, raw.baseAddress! + offset, raw.count - offset, Int32(MSG_NOSIGNAL))
            }
            if n >= 0 { offset += n; continue }
            let e = errno
            if e == EINTR { continue }
            guard e == EAGAIN || e == EWOULDBLOCK else {
                throw TransportError(message: "send failed: \(System.errorText(e))", transient: true)
            }
            switch waitFor(fd: fd, events: Int16(POLLOUT), deadline: deadline) {
            case .ready: continue
            case .timedOut: throw TransportError(message: "timed out sending the request", transient: true)
            case .interrupted: throw TransportError(message: "interrupted", transient: false)
            }
        }
    }

    func receive(into buffer: inout [UInt8], deadline: Double) throws(TransportError) -> Received {
        switch waitFor(fd: fd, events: Int16(POLLIN), deadline: deadline) {
        case .ready: break
        case .timedOut: return .timedOut
        case .interrupted: throw TransportError(message: "interrupted", transient: false)
        }
        let n = buffer.withUnsafeMutableBytes { raw in recv(fd, raw.baseAddress!, raw.count, 0) }
        if n > 0 { return .bytes(n) }
        if n == 0 { return .closed }
        let e = errno
        if e == EINTR || e == EAGAIN || e == EWOULDBLOCK { return .bytes(0) }
        throw TransportError(message: "receive failed: \(System.errorText(e))", transient: true)
    }
}

/// `https://`: libcurl makes the connection (DNS, proxy tunnel from `https_proxy`/`NO_PROXY`,
/// TLS with certificate and host name verification) and stops there (CONNECT_ONLY); the CLI
/// then speaks HTTP/1.1 over it with `curl_easy_send`/`curl_easy_recv`, so requests, answers
/// and streams take the same path as over a plain socket. HTTP/1.1 only (ALPN offers nothing
/// else): one request per process has nothing to gain from HTTP/2's streams.
final class CurlStream: ByteStream {
    private let curl: LibCurl
    private let handle: LibCurl.Handle
    private let fd: Int32

    private init(curl: LibCurl, handle: LibCurl.Handle, fd: Int32) {
        self.curl = curl
        self.handle = handle
        self.fd = fd
    }

    deinit { curl.easyCleanup(handle) }

    /// Loads libcurl. Call it on the main thread before other threads start (curl_global_init
    /// is not thread-safe); nil when it is ready, else why not.
    static func load() -> String? {
        switch LibCurl.shared {
        case .success: return nil
        case .failure(let e): return e.message
        }
    }

    static func connect(to endpoint: CLIEndpoint, caFile: String?, timeout: Double) throws(TransportError) -> CurlStream {
        let curl: LibCurl
        switch LibCurl.shared {
        case .success(let loaded): curl = loaded
        case .failure(let e): throw TransportError(message: e.message, transient: false)
        }
        guard let raw = curl.easyInit() else { throw TransportError(message: "libcurl could not make a handle", transient: false) }
        var errorText = [CChar](repeating: 0, count: Int(CURL_ERROR_SIZE) + 1)
        let code: CURLcode = errorText.withUnsafeMutableBufferPointer { errorBuffer in
            _ = curl.set(raw, CURLOPT_ERRORBUFFER, pointer: UnsafeMutableRawPointer(errorBuffer.baseAddress))
            _ = curl.set(raw, CURLOPT_URL, endpoint.connectURL)
            _ = curl.set(raw, CURLOPT_PROTOCOLS_STR, "https")
            _ = curl.set(raw, CURLOPT_CONNECT_ONLY, 1)
            _ = curl.set(raw, CURLOPT_NOSIGNAL, 1)
            _ = curl.set(raw, CURLOPT_HTTP_VERSION, Int(CURL_HTTP_VERSION_1_1))
            _ = curl.set(raw, CURLOPT_HTTPPROXYTUNNEL, 1)
            _ = curl.set(raw, CURLOPT_CONNECTTIMEOUT_MS, Int(timeout * 1000))
            _ = curl.set(raw, CURLOPT_TIMEOUT_MS, Int(timeout * 1000))
            if let caFile {
                // Exactly this CA, as the help says: not the system's directory of CAs as well.
                _ = curl.set(raw, CURLOPT_CAINFO, caFile)
                _ = curl.set(raw, CURLOPT_CAPATH, nil as String?)
            }
            // Ctrl-C during a slow connect or handshake: curl asks this about once a second.
            _ = curl.set(raw, CURLOPT_NOPROGRESS, 0)
            _ = curl.setProgress(raw) { _, _, _, _, _ in System.interrupted() ? 1 : 0 }
            let code = curl.easyPerform(raw)
            _ = curl.set(raw, CURLOPT_ERRORBUFFER, pointer: nil)
            return code
        }
        let written = String(decoding: errorText.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        let detail = written.isEmpty ? curl.describe(code) : written
        guard code == CURLE_OK else {
            curl.easyCleanup(raw)
            throw connectError(code, detail: detail, endpoint: endpoint)
        }
        var socket = curl_socket_t(-1)
        guard curl.activeSocket(raw, &socket) == CURLE_OK, socket >= 0 else {
            curl.easyCleanup(raw)
            throw TransportError(message: "cannot connect to \(endpoint.display): no socket from libcurl", transient: true)
        }
        return CurlStream(curl: curl, handle: raw, fd: socket)
    }

    /// What a failed connect means for the user: worth a retry (refused, timed out, reset), or
    /// not (unknown host, a certificate nobody vouches for, not TLS at all).
    static func connectError(_ code: CURLcode, detail: String, endpoint: CLIEndpoint) -> TransportError {
        let text = CLIText.oneLine(detail)
        switch code {
        case CURLE_ABORTED_BY_CALLBACK:
            return TransportError(message: "interrupted", transient: false)
        case CURLE_COULDNT_RESOLVE_HOST:
            return TransportError(message: "cannot resolve \(endpoint.host): \(text)", transient: false)
        case CURLE_COULDNT_RESOLVE_PROXY:
            return TransportError(message: "cannot resolve the proxy: \(text)", transient: false)
        case CURLE_PEER_FAILED_VERIFICATION:
            return TransportError(message: "\(endpoint.display) is not trusted: \(text) (--cacert FILE names the CA that signed its certificate; the URL's host must be one the certificate names)",
                                  transient: false)
        case CURLE_SSL_CACERT_BADFILE:
            return TransportError(message: "cannot use the CA file: \(text)", transient: false)
        case CURLE_SSL_CONNECT_ERROR:
            return TransportError(message: "TLS handshake with \(endpoint.display) failed: \(text) (is it an https server?)", transient: false)
        case CURLE_COULDNT_CONNECT, CURLE_OPERATION_TIMEDOUT, CURLE_SEND_ERROR, CURLE_RECV_ERROR, CURLE_GOT_NOTHING:
            return TransportError(message: "cannot connect to \(endpoint.display): \(text)", transient: true)
        default:
            return TransportError(message: "cannot connect to \(endpoint.display): \(text)", transient: false)
        }
    }

    func send(_ bytes: [UInt8], deadline: Double) throws(TransportError) {
        var offset = 0
        while offset < bytes.count {
            var sent = 0
            let code = bytes.withUnsafeBytes { raw in
                curl.easySend(handle, raw.baseAddress! + offset, raw.count - offset, &sent)
            }
            offset += sent
            if code == CURLE_OK { continue }
            guard code == CURLE_AGAIN else {
                throw TransportError(message: "send failed: \(curl.describe(code))", transient: true)
            }
            switch waitFor(fd: fd, events: Int16(POLLOUT), deadline: deadline) {
            case .ready: continue
            case .timedOut: throw TransportError(message: "timed out sending the request", transient: true)
            case .interrupted: throw TransportError(message: "interrupted", transient: false)
            }
        }
    }

    /// TLS may hold decrypted bytes that poll() cannot see: read first, wait only when curl
    /// says there is nothing (CURLE_AGAIN).
    func receive(into buffer: inout [UInt8], deadline: Double) throws(TransportError) -> Received {
        while true {
            var received = 0
            let code = buffer.withUnsafeMutableBytes { raw in
                curl.easyRecv(handle, raw.baseAddress!, raw.count, &received)
            }
            if code == CURLE_OK { return received > 0 ? .bytes(received) : .closed }
            guard code == CURLE_AGAIN else {
                throw TransportError(message: "receive failed: \(curl.describe(code))", transient: true)
            }
            switch waitFor(fd: fd, events: Int16(POLLIN), deadline: deadline) {
            case .ready: continue
            case .timedOut: return .timedOut
            case .interrupted: throw TransportError(message: "interrupted", transient: false)
            }
        }
    }
}
