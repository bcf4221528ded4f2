#if canImport(Glibc)
import Glibc
#endif
// CCurlDynamic's header includes <sys/socket.h>; in whole-module (release) builds that module then
// owns SOCK_STREAM and friends, so every file that uses them imports it (see PortReservation.swift).
import CCurlDynamic
import DispatchCore
import DispatchSystem
import DispatchCLIKit
import DispatchBlockingHTTP

/// poll() for one fd until `deadline`; EINTR from a signal we handle (Ctrl-C) ends the wait.
func waitFor(fd: Int32, events: Int16, deadline: Double) -> WaitResult {
    DispatchBlockingHTTP.waitFor(fd: fd, events: events, deadline: deadline, interrupted: System.interrupted)
}

/// The CLI's exchanges (`Connection: close`): over a plain socket for http, over libcurl's TLS
/// connection (through a proxy if the environment names one) for https.
extension HTTP1Connection {
    static func connect(to endpoint: CLIEndpoint, caFile: String?, timeout: Double) throws(TransportError) -> HTTP1Connection {
        switch endpoint.scheme {
        case .http:
            return HTTP1Connection(stream: try TCPStream.connect(host: endpoint.host, port: endpoint.port, timeout: timeout,
                                                                 display: endpoint.display, interrupted: System.interrupted))
        case .https:
            return HTTP1Connection(stream: try CurlStream.connect(to: endpoint, caFile: caFile, timeout: timeout))
        }
    }

    /// One complete request and its buffered answer, within `timeout` seconds; the connection
    /// within `CLIHTTP.connectTimeout` of them.
    static func exchange(endpoint: CLIEndpoint, caFile: String?, request: [UInt8], timeout: Double) throws(TransportError) -> HTTPResponse {
        let deadline = Clock.monotonic() + timeout
        let conn = try connect(to: endpoint, caFile: caFile, timeout: min(timeout, CLIHTTP.connectTimeout))
        try conn.send(request, deadline: deadline)
        return try conn.response(by: deadline)
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
