import CCurl

extension CurlClient {
    /// Settings shared by every request of one client. Webhooks want HTTP/1.1 to anyone public
    /// (`.webhooks`); APNs is `H2Client`'s.
    public struct Options: Sendable {
        /// Ask for HTTP/2 over TLS (ALPN), HTTP/1.1 for plain http (CURL_HTTP_VERSION_2TLS);
        /// false: HTTP/1.1 everywhere. Only for servers we trust: curl 7.88 busy-loops until
        /// the deadline when an HTTP/2 server answers before taking a body larger than its
        /// flow-control window (64 KiB by default, any size the server chooses).
        public var preferHTTP2 = true
        /// Run many requests as streams of one HTTP/2 connection (CURLPIPE_MULTIPLEX, and
        /// CURLOPT_PIPEWAIT so a burst waits for the first connection rather than opening more).
        public var multiplex = true
        /// Connections per host (CURLMOPT_MAX_HOST_CONNECTIONS); 0 = no limit.
        public var maxHostConnections = 0
        /// Connections in all (CURLMOPT_MAX_TOTAL_CONNECTIONS); 0 = no limit.
        public var maxTotalConnections = 0
        /// Streams curl runs at once on one HTTP/2 connection (curl's own default is 100);
        /// the server's SETTINGS_MAX_CONCURRENT_STREAMS still applies.
        public var maxConcurrentStreams = 1000
        /// Requests handed to curl at once; more wait in a queue here (0 = no limit). curl
        /// 7.88 spends time per waiting transfer on every step, so a burst of 10,000 cost three
        /// times as much CPU per request as 1,000 at a time.
        public var maxInFlight = 0
        /// A PEM file of extra trusted CAs (CURLOPT_CAINFO; the system's CA directory stays trusted).
        public var caFile: String?
        public var connectTimeout: Double = 5
        /// Whole seconds a connected request may go without receiving a byte (the answer's
        /// first one included) before it is given up (CURLOPT_LOW_SPEED_TIME at 1 byte/s);
        /// 0: only the request's whole deadline applies.
        public var stallTimeout = 0
        /// Seconds sent data may stay unacknowledged before the kernel drops the connection
        /// (TCP_USER_TIMEOUT); 0 leaves the kernel's default (about 15 minutes).
        public var tcpUserTimeout: Double = 20
        public var userAgent = "dispatch"
        /// false: refuse connections to loopback, private, link-local, CGNAT, multicast and
        /// reserved addresses, checked on the resolved address when the socket is opened.
        public var allowPrivateAddresses = false
        /// Bytes of an answer's body kept; the rest is read and discarded.
        public var maxResponseBytes = 4096
        /// Of the client's socket and timer events on the loop.
        public var priority = EventPriority.normal
        /// Seconds a connection may sit idle and still be reused (CURLOPT_MAXAGE_CONN), checked
        /// when a request comes. 0: curl's default (118 s).
        public var maxIdleSeconds = 0
        public init() {}

        /// Users' URLs: public addresses only, a few connections per host, HTTP/1.1 (a hostile
        /// HTTP/2 server could make curl 7.88 spin, see `preferHTTP2`; one request per
        /// delivery gains little from multiplexing).
        public static var webhooks: Options {
            var o = Options()
            o.preferHTTP2 = false
            o.multiplex = false
            o.maxHostConnections = 4
            o.maxTotalConnections = 256
            return o
        }
    }

    public struct Request: Sendable {
        public var method: String
        public var url: String
        public var headers: [(String, String)]
        public var body: [UInt8]
        /// Seconds for the whole attempt, connecting included (CURLOPT_TIMEOUT_MS).
        public var timeout: Double

        public init(url: String, method: String = "POST", headers: [(String, String)] = [],
                    body: [UInt8] = [], timeout: Double = 10) {
            self.url = url
            self.method = method
            self.headers = headers
            self.body = body
            self.timeout = timeout
        }
    }

    public struct Response: Sendable {
        public var status: Int
        /// "1.0", "1.1", "2" or "3": the protocol the answer came over.
        public var httpVersion: String
        /// Names lower-cased, in the order received.
        public var headers: [(String, String)]
        /// At most `Options.maxResponseBytes` bytes.
        public var body: [UInt8]
        /// The answer had more body than was kept.
        public var bodyTruncated: Bool

        public init(status: Int, httpVersion: String, headers: [(String, String)] = [], body: [UInt8] = [], bodyTruncated: Bool = false) {
            self.status = status
            self.httpVersion = httpVersion
            self.headers = headers
            self.body = body
            self.bodyTruncated = bodyTruncated
        }

        public func header(_ name: String) -> String? {
            let n = name.lowercased()
            return headers.first { $0.0 == n }?.1
        }
    }
}

/// Why a request got no answer. `kind` says what the caller can do about it.
public struct HTTPClientFailure: Error, Sendable, CustomStringConvertible {
    public enum Kind: String, Sendable {
        /// The connection or the request's HTTP/2 stream failed under it (GOAWAY, reset,
        /// closed early, HTTP/2 error, nothing received): send again. A dead connection is not
        /// reused (curl checks a cached connection before reusing it), so the resend gets a
        /// new one. The server may have processed the first attempt.
        case retryOnNewConnection
        /// The request's deadline passed (it may or may not have been processed).
        case timeout
        /// Could not resolve or connect.
        case connect
        /// The resolved address is not public and private addresses are not allowed.
        case refusedAddress
        case tls
        /// The URL, method or a header is not acceptable (never sent).
        case invalidRequest
        /// `close()` ended the request, or it was sent to a closed client.
        case cancelled
        case other
    }

    public let kind: Kind
    /// The CURLcode, 0 when the failure did not come from curl.
    public let curlCode: Int
    public let message: String

    public init(_ kind: Kind, curlCode: Int = 0, message: String) {
        self.kind = kind
        self.curlCode = curlCode
        self.message = message
    }

    public var description: String { "\(kind.rawValue) (curl \(curlCode)): \(message)" }

    /// What a curl result code means for the caller. `refused` says whether the SSRF check
    /// refused an address during this transfer (curl reports that as a failed connect).
    public static func kind(curlCode: Int, refused: Bool) -> Kind {
        let code = CURLcode(UInt32(truncatingIfNeeded: curlCode))
        switch code {
        case CURLE_HTTP2, CURLE_HTTP2_STREAM, CURLE_SEND_ERROR, CURLE_RECV_ERROR, CURLE_GOT_NOTHING,
             // The connection ended in the middle of the answer.
             CURLE_PARTIAL_FILE:
            return .retryOnNewConnection
        case CURLE_OPERATION_TIMEDOUT:
            return .timeout
        case CURLE_COULDNT_CONNECT:
            return refused ? .refusedAddress : .connect
        case CURLE_COULDNT_RESOLVE_HOST, CURLE_COULDNT_RESOLVE_PROXY:
            return .connect
        case CURLE_SSL_CONNECT_ERROR, CURLE_PEER_FAILED_VERIFICATION, CURLE_SSL_CERTPROBLEM,
             CURLE_SSL_CIPHER, CURLE_SSL_CACERT_BADFILE, CURLE_SSL_ISSUER_ERROR,
             CURLE_SSL_PINNEDPUBKEYNOTMATCH, CURLE_SSL_INVALIDCERTSTATUS, CURLE_SSL_CRL_BADFILE,
             CURLE_SSL_ENGINE_NOTFOUND, CURLE_SSL_ENGINE_SETFAILED, CURLE_SSL_ENGINE_INITFAILED,
             CURLE_SSL_SHUTDOWN_FAILED, CURLE_USE_SSL_FAILED:
            return .tls
        case CURLE_URL_MALFORMAT, CURLE_UNSUPPORTED_PROTOCOL:
            return .invalidRequest
        default:
            return .other
        }
    }
}
