import CCurl
import Glibc

/// One request in flight: its easy handle and what curl's callbacks collected for it.
/// Owned by `CurlClient.transfers`; curl's callbacks reach it through an unretained pointer
/// that is valid while the easy handle is in the multi handle.
final class CurlTransfer {
    let easy: UnsafeMutableRawPointer
    unowned let client: CurlClient
    let completion: CurlClient.Completion
    private var headerList: UnsafeMutablePointer<curl_slist>?
    private let errorBuffer: UnsafeMutablePointer<CChar>
    private var released = false

    private var headers: [(String, String)] = []
    private var headerBytes = 0
    private var body: [UInt8] = []
    private var bodyTruncated = false
    /// Addresses the SSRF check refused while connecting this transfer.
    var refused: [String] = []

    /// Header bytes kept per answer; a server can send any number of them.
    static let maxHeaderBytes = 32 * 1024

    init(easy: UnsafeMutableRawPointer, client: CurlClient, completion: @escaping CurlClient.Completion) {
        self.easy = easy
        self.client = client
        self.completion = completion
        errorBuffer = .allocate(capacity: Int(CURL_ERROR_SIZE))
        errorBuffer.initialize(repeating: 0, count: Int(CURL_ERROR_SIZE))
    }

    deinit {
        release()
        errorBuffer.deallocate()
    }

    /// Frees the easy handle; the caller has removed it from the multi handle first.
    func release() {
        guard !released else { return }
        released = true
        curl_easy_cleanup(easy)
        if let list = headerList { curl_slist_free_all(list) }
        headerList = nil
    }

    /// Sets every option of the request; nil on success, else why the request cannot be sent.
    func configure(_ request: CurlClient.Request, options: CurlClient.Options) -> HTTPClientFailure? {
        if let problem = CurlTransfer.validate(request) { return HTTPClientFailure(.invalidRequest, message: problem) }
        let me = Unmanaged.passUnretained(self).toOpaque()
        let owner = Unmanaged.passUnretained(client).toOpaque()
        var failed: CURLcode = CURLE_OK
        func set(_ code: CURLcode) { if code != CURLE_OK && failed == CURLE_OK { failed = code } }
        func long(_ o: CURLoption, _ v: Int) { set(dispatch_curl_easy_setopt_long(easy, o, v)) }
        func str(_ o: CURLoption, _ v: String) { set(dispatch_curl_easy_setopt_str(easy, o, v)) }

        str(CURLOPT_URL, request.url)
        long(CURLOPT_NOSIGNAL, 1)
        // A stalled DNS lookup must not block close(): detach its thread instead of joining it.
        long(CURLOPT_QUICK_EXIT, 1)
        str(CURLOPT_PROTOCOLS_STR, "http,https")
        str(CURLOPT_REDIR_PROTOCOLS_STR, "http,https")
        long(CURLOPT_FOLLOWLOCATION, 0)
        // Ignore http_proxy and friends from the environment: the SSRF check must see the
        // address we really connect to.
        str(CURLOPT_PROXY, "")
        long(CURLOPT_HTTP_VERSION, Int(options.preferHTTP2 ? CURL_HTTP_VERSION_2TLS : CURL_HTTP_VERSION_1_1))
        if options.multiplex { long(CURLOPT_PIPEWAIT, 1) }
        long(CURLOPT_CONNECTTIMEOUT_MS, Int(options.connectTimeout * 1000))
        long(CURLOPT_TIMEOUT_MS, max(1, Int(request.timeout * 1000)))
        if options.stallTimeout > 0 {
            long(CURLOPT_LOW_SPEED_LIMIT, 1)
            long(CURLOPT_LOW_SPEED_TIME, options.stallTimeout)
        }
        // Probe idle connections so a dead peer is noticed before the next request needs it.
        long(CURLOPT_TCP_KEEPALIVE, 1)
        long(CURLOPT_TCP_KEEPIDLE, 30)
        long(CURLOPT_TCP_KEEPINTVL, 10)
        if options.maxIdleSeconds > 0 { long(CURLOPT_MAXAGE_CONN, options.maxIdleSeconds) }
        str(CURLOPT_USERAGENT, options.userAgent)
        if let ca = options.caFile { str(CURLOPT_CAINFO, ca) }
        set(dispatch_curl_easy_setopt_ptr(easy, CURLOPT_ERRORBUFFER, errorBuffer))

        switch request.method {
        case "GET":
            long(CURLOPT_HTTPGET, 1)
        case "HEAD":
            long(CURLOPT_NOBODY, 1)
        default:
            // COPYPOSTFIELDS copies the body, so the request's array need not outlive this call.
            set(dispatch_curl_easy_setopt_off(easy, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(request.body.count)))
            if request.body.isEmpty {
                str(CURLOPT_COPYPOSTFIELDS, "")
            } else {
                request.body.withUnsafeBytes { raw in
                    set(dispatch_curl_easy_setopt_ptr(easy, CURLOPT_COPYPOSTFIELDS, UnsafeMutableRawPointer(mutating: raw.baseAddress)))
                }
            }
            if request.method != "POST" { str(CURLOPT_CUSTOMREQUEST, request.method) }
        }

        var list: UnsafeMutablePointer<curl_slist>?
        var hasExpect = false
        for (name, value) in request.headers {
            if name.lowercased() == "expect" { hasExpect = true }
            // "Name;" is curl's way to send a header with an empty value.
            let line = value.isEmpty ? name + ";" : name + ": " + value
            list = curl_slist_append(list, line)
        }
        // No "Expect: 100-continue" round trip before a body.
        if !hasExpect { list = curl_slist_append(list, "Expect:") }
        headerList = list
        set(dispatch_curl_easy_setopt_slist(easy, CURLOPT_HTTPHEADER, list))

        set(dispatch_curl_easy_setopt_write(easy, CURLOPT_WRITEFUNCTION) { data, size, count, arg in
            let t = Unmanaged<CurlTransfer>.fromOpaque(arg!).takeUnretainedValue()
            let n = size * count
            t.receiveBody(UnsafeRawBufferPointer(start: data, count: n))
            return n
        })
        set(dispatch_curl_easy_setopt_ptr(easy, CURLOPT_WRITEDATA, me))
        set(dispatch_curl_easy_setopt_write(easy, CURLOPT_HEADERFUNCTION) { data, size, count, arg in
            let t = Unmanaged<CurlTransfer>.fromOpaque(arg!).takeUnretainedValue()
            let n = size * count
            t.receiveHeader(UnsafeRawBufferPointer(start: data, count: n))
            return n
        })
        set(dispatch_curl_easy_setopt_ptr(easy, CURLOPT_HEADERDATA, me))

        // Sockets: the SSRF check and connection accounting. Opening is per transfer (to
        // record which one was refused); closing may happen after the transfer is gone, when
        // curl drops the connection from its cache, so its data is the client.
        set(dispatch_curl_easy_setopt_opensocket(easy) { arg, purpose, address in
            let t = Unmanaged<CurlTransfer>.fromOpaque(arg!).takeUnretainedValue()
            return t.client.openSocket(for: t, address!)
        })
        set(dispatch_curl_easy_setopt_ptr(easy, CURLOPT_OPENSOCKETDATA, me))
        set(dispatch_curl_easy_setopt_closesocket(easy) { arg, fd in
            Unmanaged<CurlClient>.fromOpaque(arg!).takeUnretainedValue().closeSocket(fd)
        })
        set(dispatch_curl_easy_setopt_ptr(easy, CURLOPT_CLOSESOCKETDATA, owner))

        guard failed == CURLE_OK else {
            return HTTPClientFailure(.other, curlCode: Int(failed.rawValue), message: "setting up the request: " + String(cString: curl_easy_strerror(failed)))
        }
        return nil
    }

    /// Why a request must not be handed to curl (a header injecting lines, a bad method).
    static func validate(_ request: CurlClient.Request) -> String? {
        func isToken(_ s: String) -> Bool {
            !s.isEmpty && s.utf8.allSatisfy { c in
                (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A) || "!#$%&'*+-.^_`|~".utf8.contains(c)
            }
        }
        guard isToken(request.method) else { return "bad method" }
        for (name, value) in request.headers {
            guard isToken(name) else { return "bad header name \(name)" }
            guard !value.utf8.contains(where: { $0 == 0x0D || $0 == 0x0A || $0 == 0 }) else { return "header \(name) contains CR, LF or NUL" }
        }
        return nil
    }

    private func receiveBody(_ bytes: UnsafeRawBufferPointer) {
        let room = client.options.maxResponseBytes - body.count
        if bytes.count > room { bodyTruncated = true }
        if room > 0 { body.append(contentsOf: bytes.prefix(room)) }
    }

    private func receiveHeader(_ bytes: UnsafeRawBufferPointer) {
        // A status line starts a new answer (after a 100 Continue, say): forget the last one.
        if bytes.starts(with: "HTTP/".utf8) {
            headers.removeAll()
            headerBytes = 0
            return
        }
        var line = bytes[...]
        while let last = line.last, last == 0x0A || last == 0x0D { line = line.dropLast() }
        guard let colon = line.firstIndex(of: 0x3A), headerBytes + line.count <= CurlTransfer.maxHeaderBytes else { return }
        headerBytes += line.count
        let name = String(decoding: line[..<colon], as: UTF8.self).lowercased()
        var value = line[(colon + 1)...]
        while let first = value.first, first == 0x20 || first == 0x09 { value = value.dropFirst() }
        while let last = value.last, last == 0x20 || last == 0x09 { value = value.dropLast() }
        headers.append((name, String(decoding: value, as: UTF8.self)))
    }

    /// The request's result once curl reports it done with `code`. Reads the easy handle, so
    /// call it before `release()`.
    func outcome(_ code: CURLcode) -> Result<CurlClient.Response, HTTPClientFailure> {
        guard code == CURLE_OK else {
            var message = String(cString: errorBuffer)
            if message.isEmpty { message = String(cString: curl_easy_strerror(code)) }
            let kind = HTTPClientFailure.kind(curlCode: Int(code.rawValue), refused: !refused.isEmpty)
            if kind == .refusedAddress { message = "refused address " + refused.joined(separator: ", ") }
            return .failure(HTTPClientFailure(kind, curlCode: Int(code.rawValue), message: message))
        }
        var status = 0
        var version = 0
        _ = dispatch_curl_easy_getinfo_long(easy, CURLINFO_RESPONSE_CODE, &status)
        _ = dispatch_curl_easy_getinfo_long(easy, CURLINFO_HTTP_VERSION, &version)
        let name: String
        switch version {
        case Int(CURL_HTTP_VERSION_1_0): name = "1.0"
        case Int(CURL_HTTP_VERSION_2_0): name = "2"
        case Int(CURL_HTTP_VERSION_3): name = "3"
        default: name = "1.1"
        }
        return .success(CurlClient.Response(status: status, httpVersion: name, headers: headers,
                                            body: body, bodyTruncated: bodyTruncated))
    }
}
