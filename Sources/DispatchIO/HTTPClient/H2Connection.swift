import DispatchCore
import DispatchSystem
import CTLS
import CNghttp2
import Glibc

/// One HTTP/2 connection of `H2Client`: a TLS bufferevent (libevent resolves, connects and
/// runs OpenSSL without blocking) carrying an nghttp2 client session. nghttp2's callbacks only
/// record (answers, closed streams, GOAWAY, PING ACKs); the client acts on them once nghttp2
/// has returned, so nothing is freed or re-entered inside a callback.
final class H2Connection {
    enum State { case connecting, open, closed }

    unowned let client: H2Client
    unowned let pool: H2Client.Pool
    private(set) var state = State.connecting
    let connectDeadline: Double
    private var bev: OpaquePointer?
    private var ssl: OpaquePointer?
    private var session: OpaquePointer?
    /// Requests on a stream of this connection, by stream id.
    private(set) var streams: [Int32: H2Exchange] = [:]
    /// A GOAWAY came (or the connection is being given up): no new streams.
    private(set) var draining = false
    /// Streams above this one were not processed by the server (GOAWAY's last stream id).
    private(set) var goawayLastStream = Int32.max
    var upkeep: ConnectionUpkeep

    /// Output bytes past which nghttp2 is not asked for more until the socket drains.
    static let outputHigh = 256 * 1024

    init(client: H2Client, pool: H2Client.Pool, now: Double) {
        self.client = client
        self.pool = pool
        connectDeadline = now + client.options.connectTimeout
        upkeep = ConnectionUpkeep(pingInterval: client.options.pingIdleSeconds, answerTimeout: client.options.pingAnswerSeconds, now: now)
    }

    /// Room for one more stream: open, no GOAWAY, below the server's limit and ours.
    var canTake: Bool {
        guard state == .open, !draining, let session else { return false }
        let peer = Int(nghttp2_session_get_remote_settings(session, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS))
        return streams.count < min(peer, client.options.maxConcurrentStreams)
    }

    // MARK: - Connecting

    /// Starts resolving and connecting; a failure that is known at once is returned.
    func start() -> HTTPClientFailure? {
        guard let ctx = client.tls, let s = SSL_new(ctx) else { return HTTPClientFailure(.tls, message: "SSL_new failed") }
        ssl = s
        let host = pool.host
        if isIPLiteral(host) {
            _ = X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(s), host)
        } else {
            _ = dispatch_ssl_set_sni(s, host)
            _ = SSL_set1_host(s, host)
        }
        let options = Int32(BEV_OPT_CLOSE_ON_FREE.rawValue | BEV_OPT_DEFER_CALLBACKS.rawValue)
        guard let b = bufferevent_openssl_socket_new(client.loop.base, -1, s, BUFFEREVENT_SSL_CONNECTING, options) else {
            SSL_free(s)
            ssl = nil
            return HTTPClientFailure(.other, message: "bufferevent_openssl_socket_new failed")
        }
        bev = b
        bufferevent_openssl_set_allow_dirty_shutdown(b, 1)
        _ = bufferevent_priority_set(b, client.options.priority.rawValue)
        bufferevent_setcb(b, { _, arg in
            Unmanaged<H2Connection>.fromOpaque(arg!).takeUnretainedValue().readable()
        }, { _, arg in
            Unmanaged<H2Connection>.fromOpaque(arg!).takeUnretainedValue().writable()
        }, { _, what, arg in
            Unmanaged<H2Connection>.fromOpaque(arg!).takeUnretainedValue().event(what)
        }, Unmanaged.passUnretained(self).toOpaque())
        _ = bufferevent_enable(b, Int16(EV_READ | EV_WRITE))
        // On an immediate failure libevent also reports the error to the event callback.
        _ = bufferevent_socket_connect_hostname(b, client.dns, AF_UNSPEC, host, Int32(pool.port))
        return nil
    }

    private func isIPLiteral(_ host: String) -> Bool {
        var buf = [UInt8](repeating: 0, count: 16)
        return inet_pton(AF_INET, host, &buf) == 1 || inet_pton(AF_INET6, host, &buf) == 1
    }

    private func event(_ what: Int16) {
        guard state != .closed else { return }
        let errorNumber = errno
        if Int32(what) & BEV_EVENT_CONNECTED != 0 {
            connected()
        } else if state == .connecting {
            client.connectionFailed(self, connectFailure(what, errorNumber: errorNumber))
        } else {
            let why = Int32(what) & BEV_EVENT_EOF != 0 ? "the server closed the connection" : "connection error: " + String(cString: strerror(errorNumber))
            client.connectionLost(self, why)
        }
        client.afterIO()
    }

    /// TLS is up: check ALPN, start the HTTP/2 session.
    private func connected() {
        guard let bev, let ssl else { return }
        var proto: UnsafePointer<UInt8>?
        var length: UInt32 = 0
        SSL_get0_alpn_selected(ssl, &proto, &length)
        guard let proto, length == 2, proto[0] == 0x68, proto[1] == 0x32 else {
            return client.connectionFailed(self, HTTPClientFailure(.tls, message: "\(pool.host):\(pool.port) did not agree to HTTP/2 (ALPN h2)"))
        }
        let fd = bufferevent_getfd(bev)
        var one: Int32 = 1
        _ = setsockopt(fd, Int32(6) /* IPPROTO_TCP */, TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        if client.options.tcpUserTimeout > 0 {
            var ms = UInt32(client.options.tcpUserTimeout * 1000)
            _ = setsockopt(fd, Int32(6) /* IPPROTO_TCP */, TCP_USER_TIMEOUT, &ms, socklen_t(MemoryLayout<UInt32>.size))
        }
        var option: OpaquePointer?
        nghttp2_option_new(&option)
        // Until the server's SETTINGS arrive, one stream (APNs allows one before a request
        // has authenticated, and refuses the others).
        nghttp2_option_set_peer_max_concurrent_streams(option, 1)
        var s: OpaquePointer?
        let rv = nghttp2_session_client_new2(&s, client.callbacks, Unmanaged.passUnretained(self).toOpaque(), option)
        nghttp2_option_del(option)
        guard rv == 0, let s else {
            return client.connectionFailed(self, HTTPClientFailure(.other, message: "nghttp2_session_client_new2 failed"))
        }
        session = s
        var settings = [nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_ENABLE_PUSH.rawValue), value: 0)]
        _ = nghttp2_submit_settings(s, UInt8(NGHTTP2_FLAG_NONE.rawValue), &settings, 1)
        state = .open
        upkeep.idle(now: Clock.monotonic())
        flush()
    }

    /// Why connecting failed, as the caller can act on it.
    private func connectFailure(_ what: Int16, errorNumber: Int32) -> HTTPClientFailure {
        let target = "\(pool.host):\(pool.port)"
        guard let bev else { return HTTPClientFailure(.connect, message: "could not connect to \(target)") }
        let dnsError = bufferevent_socket_get_dns_error(bev)
        if dnsError != 0 {
            return HTTPClientFailure(.connect, message: "could not resolve \(pool.host): " + String(cString: evutil_gai_strerror(dnsError)))
        }
        // TCP never connected (refused, unreachable): libevent reports it through OpenSSL as a
        // failed handshake, so ask the socket.
        let fd = bufferevent_getfd(bev)
        var peer = sockaddr_storage()
        var peerLength = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let tcpConnected = fd >= 0 && withUnsafeMutablePointer(to: &peer) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getpeername(fd, $0, &peerLength) == 0 }
        }
        if !tcpConnected {
            var soError: Int32 = 0
            var soLength = socklen_t(MemoryLayout<Int32>.size)
            if fd >= 0 { _ = getsockopt(fd, SOL_SOCKET, SO_ERROR, &soError, &soLength) }
            let code = soError != 0 ? soError : errorNumber
            let why = code != 0 ? String(cString: strerror(code)) : "connection refused or unreachable"
            return HTTPClientFailure(.connect, message: "could not connect to \(target): \(why)")
        }
        var tlsErrors: [String] = []
        while case let e = bufferevent_get_openssl_error(bev), e != 0 {
            // libevent also records SSL_get_error's codes (SSL_ERROR_SYSCALL for a refused or
            // reset connection); OpenSSL's own errors carry a library number.
            guard ERR_GET_LIB(e) != 0 else { continue }
            tlsErrors.append(ERR_reason_error_string(e).map { String(cString: $0) } ?? "OpenSSL error \(e)")
        }
        if let ssl {
            let verify = SSL_get_verify_result(ssl)
            if verify != Int(X509_V_OK) {
                let reason = String(cString: X509_verify_cert_error_string(verify))
                return HTTPClientFailure(.tls, message: "TLS: certificate of \(target) not trusted: \(reason)")
            }
        }
        if !tlsErrors.isEmpty {
            return HTTPClientFailure(.tls, message: "TLS handshake with \(target) failed: " + tlsErrors.joined(separator: "; "))
        }
        if Int32(what) & BEV_EVENT_EOF != 0 {
            return HTTPClientFailure(.tls, message: "\(target) closed the connection during the TLS handshake")
        }
        if errorNumber == 0 { return HTTPClientFailure(.connect, message: "could not connect to \(target)") }
        return HTTPClientFailure(.connect, message: "could not connect to \(target): " + String(cString: strerror(errorNumber)))
    }

    // MARK: - Reading and writing

    private func readable() {
        guard state == .open, let bev, let session else { return }
        let input = bufferevent_get_input(bev)
        let length = evbuffer_get_length(input)
        if length > 0, let bytes = evbuffer_pullup(input, -1) {
            let rv = nghttp2_session_mem_recv(session, bytes, length)
            evbuffer_drain(input, length)
            if rv < 0 {
                client.connectionLost(self, "HTTP/2 error: " + String(cString: nghttp2_strerror(Int32(rv))))
                return client.afterIO()
            }
        }
        flush()
        client.afterIO()
    }

    private func writable() {
        guard state == .open else { return }
        flush()
        client.afterIO()
    }

    /// Writes what nghttp2 has to send (frames, answers to PINGs and SETTINGS, window updates),
    /// up to `outputHigh` buffered; the write callback asks again once the socket drained.
    /// Closes a connection that has nothing more to do (GOAWAY and no stream left).
    func flush() {
        guard state == .open, let bev, let session else { return }
        let output = bufferevent_get_output(bev)
        while evbuffer_get_length(output) < H2Connection.outputHigh {
            var data: UnsafePointer<UInt8>?
            let n = nghttp2_session_mem_send(session, &data)
            if n < 0 {
                return client.connectionLost(self, "HTTP/2 error: " + String(cString: nghttp2_strerror(Int32(n))))
            }
            guard n > 0, let data else { break }
            _ = bufferevent_write(bev, data, n)
        }
        if draining && streams.isEmpty && evbuffer_get_length(output) == 0 {
            client.connectionLost(self, "closed after GOAWAY")
        } else if nghttp2_session_want_read(session) == 0 && nghttp2_session_want_write(session) == 0 {
            client.connectionLost(self, "the HTTP/2 session ended")
        }
    }

    // MARK: - Streams

    /// Opens a stream for `exchange` (sent by the next `flush`); false if nghttp2 refused it.
    func submit(_ exchange: H2Exchange) -> Bool {
        guard let session else { return false }
        let fields = exchange.head.fields
        var storage: [UInt8] = []
        storage.reserveCapacity(fields.reduce(0) { $0 + $1.name.utf8.count + $1.value.utf8.count })
        for f in fields {
            storage.append(contentsOf: f.name.utf8)
            storage.append(contentsOf: f.value.utf8)
        }
        let me = Unmanaged.passUnretained(exchange).toOpaque()
        let id: Int32 = storage.withUnsafeMutableBufferPointer { buf in
            var offset = 0
            var nva: [nghttp2_nv] = []
            nva.reserveCapacity(fields.count)
            for f in fields {
                let n = f.name.utf8.count, v = f.value.utf8.count
                nva.append(nghttp2_nv(name: buf.baseAddress! + offset, value: buf.baseAddress! + offset + n,
                                      namelen: n, valuelen: v, flags: UInt8(NGHTTP2_NV_FLAG_NONE.rawValue)))
                offset += n + v
            }
            if exchange.request.body.isEmpty {
                return nghttp2_submit_request(session, nil, nva, nva.count, nil, me)
            }
            var provider = nghttp2_data_provider()
            provider.source.ptr = me
            provider.read_callback = { _, _, buf, length, flags, source, _ in
                let x = Unmanaged<H2Exchange>.fromOpaque(source!.pointee.ptr!).takeUnretainedValue()
                let n = min(length, x.request.body.count - x.sent)
                x.request.body.withUnsafeBytes { body in
                    if n > 0 { buf!.update(from: body.baseAddress!.assumingMemoryBound(to: UInt8.self) + x.sent, count: n) }
                }
                x.sent += n
                if x.sent == x.request.body.count { flags!.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue }
                return n
            }
            return nghttp2_submit_request(session, nil, nva, nva.count, &provider, me)
        }
        guard id > 0 else { return false }
        exchange.streamID = id
        streams[id] = exchange
        upkeep.busy()
        return true
    }

    /// Resets the stream of a request given up (timed out); nghttp2 closes it once sent.
    func cancel(_ exchange: H2Exchange) {
        guard let session, exchange.streamID > 0 else { return }
        _ = nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), exchange.streamID, NGHTTP2_CANCEL.rawValue)
    }

    func ping() {
        guard let session else { return }
        if nghttp2_submit_ping(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), nil) == 0 { client.pingsSent += 1 }
    }

    /// The one teardown path: frees the session and the bufferevent (which closes the socket
    /// and frees the SSL object) and returns the requests still on a stream. Safe twice.
    func close() -> [H2Exchange] {
        guard state != .closed else { return [] }
        state = .closed
        draining = true
        if let bev {
            bufferevent_setcb(bev, nil, nil, nil, nil)
            // Freeing a bufferevent inside its own callback is fine: libevent defers it.
            bufferevent_free(bev)
        } else if let ssl {
            SSL_free(ssl)
        }
        bev = nil
        ssl = nil
        if let session { nghttp2_session_del(session) }
        session = nil
        let left = streams.sorted { $0.key < $1.key }.map(\.value)
        streams.removeAll()
        return left
    }

    // MARK: - nghttp2's callbacks (record only)

    static func connection(_ user: UnsafeMutableRawPointer?) -> H2Connection {
        Unmanaged<H2Connection>.fromOpaque(user!).takeUnretainedValue()
    }

    static func exchange(_ session: OpaquePointer?, _ stream: Int32) -> H2Exchange? {
        guard let p = nghttp2_session_get_stream_user_data(session, stream) else { return nil }
        return Unmanaged<H2Exchange>.fromOpaque(p).takeUnretainedValue()
    }

    /// The callbacks every session of a client shares.
    static func makeCallbacks() -> OpaquePointer? {
        var cbs: OpaquePointer?
        guard nghttp2_session_callbacks_new(&cbs) == 0, let cbs else { return nil }
        nghttp2_session_callbacks_set_on_header_callback(cbs) { session, frame, name, namelen, value, valuelen, _, _ in
            guard let frame, frame.pointee.hd.type == UInt8(NGHTTP2_HEADERS.rawValue),
                  let x = H2Connection.exchange(session, frame.pointee.hd.stream_id) else { return 0 }
            x.header(name: String(decoding: UnsafeBufferPointer(start: name, count: namelen), as: UTF8.self),
                     value: String(decoding: UnsafeBufferPointer(start: value, count: valuelen), as: UTF8.self))
            return 0
        }
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs) { session, _, stream, data, length, user in
            guard let x = H2Connection.exchange(session, stream) else { return 0 }
            x.receive(UnsafeBufferPointer(start: data, count: length), limit: H2Connection.connection(user).client.options.maxResponseBytes)
            return 0
        }
        nghttp2_session_callbacks_set_on_frame_recv_callback(cbs) { _, frame, user in
            guard let frame else { return 0 }
            let conn = H2Connection.connection(user)
            switch UInt32(frame.pointee.hd.type) {
            case NGHTTP2_GOAWAY.rawValue:
                conn.draining = true
                conn.goawayLastStream = min(conn.goawayLastStream, frame.pointee.goaway.last_stream_id)
                conn.client.goaways += 1
            case NGHTTP2_PING.rawValue where frame.pointee.hd.flags & UInt8(NGHTTP2_FLAG_ACK.rawValue) != 0:
                conn.upkeep.acknowledged()
            default:
                break
            }
            return 0
        }
        nghttp2_session_callbacks_set_on_stream_close_callback(cbs) { _, stream, code, user in
            H2Connection.connection(user).streamClosed(stream, code: code)
            return 0
        }
        return cbs
    }

    private func streamClosed(_ stream: Int32, code: UInt32) {
        guard let x = streams.removeValue(forKey: stream) else { return }
        if streams.isEmpty { upkeep.idle(now: Clock.monotonic()) }
        if x.done { return }
        if code == NGHTTP2_NO_ERROR.rawValue && x.status > 0 {
            client.complete(x, .success(x.response))
        } else if code == NGHTTP2_REFUSED_STREAM.rawValue && x.status == 0 {
            // Not processed (refused, above a GOAWAY's last stream, never sent): send again.
            client.resend(x, why: "stream refused by the server")
        } else {
            let name = String(cString: nghttp2_http2_strerror(code))
            client.complete(x, .failure(HTTPClientFailure(.retryOnNewConnection, message: "stream \(stream) ended without an answer (\(name))")))
        }
    }
}
