import CLibevent
import DispatchCore
import DispatchSystem
import Glibc

/// One HTTP request as evhttp parsed it.
public final class HTTPRequest {
    public let raw: UnsafeMutablePointer<evhttp_request>
    /// The server that received it: a stream taking over the connection tells it.
    unowned let server: HTTPServer
    /// When it arrived whole (monotonic seconds), for the request log.
    public let received: Double
    /// What the request log shows of it once known: the route's pattern and the key's name.
    public var route: String?
    public var keyName: String?

    init(_ raw: UnsafeMutablePointer<evhttp_request>, server: HTTPServer) {
        self.raw = raw
        self.server = server
        received = Clock.monotonic()
    }

    /// The request's method; nil for one the API does not speak.
    public var method: HTTPMethod? {
        switch evhttp_request_get_command(raw) {
        case EVHTTP_REQ_GET: return .get
        case EVHTTP_REQ_POST: return .post
        case EVHTTP_REQ_HEAD: return .head
        case EVHTTP_REQ_PUT: return .put
        case EVHTTP_REQ_DELETE: return .delete
        case EVHTTP_REQ_OPTIONS: return .options
        case EVHTTP_REQ_PATCH: return .patch
        default: return nil
        }
    }

    /// The path, percent-decoded, or nil if it decodes to something with NUL or invalid UTF-8.
    public lazy var path: String? = {
        guard let uri = evhttp_request_get_evhttp_uri(raw), let p = evhttp_uri_get_path(uri) else { return "/" }
        var size = 0
        guard let decoded = evhttp_uridecode(p, 0, &size) else { return nil }
        defer { free(decoded) }
        let bytes = UnsafeRawBufferPointer(start: decoded, count: size)
        guard !bytes.contains(0) else { return nil }
        return String(validating: bytes, as: UTF8.self)
    }()

    /// Query parameters, decoded; the first value wins for repeated names.
    public lazy var query: [String: String] = {
        guard let uri = evhttp_request_get_evhttp_uri(raw), let q = evhttp_uri_get_query(uri) else { return [:] }
        var headers = evkeyvalq()
        headers.tqh_first = nil
        headers.tqh_last = withUnsafeMutablePointer(to: &headers.tqh_first) { $0 }
        guard evhttp_parse_query_str(q, &headers) == 0 else { evhttp_clear_headers(&headers); return [:] }
        var out: [String: String] = [:]
        var item = headers.tqh_first
        while let kv = item {
            let k = String(cString: kv.pointee.key), v = String(cString: kv.pointee.value)
            if out[k] == nil { out[k] = v }
            item = kv.pointee.next.tqe_next
        }
        evhttp_clear_headers(&headers)
        return out
    }()

    /// The address of the connection's other end (a proxy, when there is one), as text.
    public var peerAddress: String? {
        guard let evcon = evhttp_request_get_connection(raw) else { return nil }
        var address: UnsafeMutablePointer<CChar>?
        var port: UInt16 = 0
        evhttp_connection_get_peer(evcon, &address, &port)
        return address.map { String(cString: $0) }
    }

    public func header(_ name: String) -> String? {
        guard let h = evhttp_find_header(evhttp_request_get_input_headers(raw), name) else { return nil }
        return String(cString: h)
    }

    /// Every value of a header the request carries, in order.
    public func headerValues(_ name: String) -> [String] {
        var out: [String] = []
        var item = evhttp_request_get_input_headers(raw).pointee.tqh_first
        while let kv = item {
            if strcasecmp(kv.pointee.key, name) == 0 { out.append(String(cString: kv.pointee.value)) }
            item = kv.pointee.next.tqe_next
        }
        return out
    }

    public func body() -> [UInt8] {
        guard let buf = evhttp_request_get_input_buffer(raw) else { return [] }
        let n = evbuffer_get_length(buf)
        guard n > 0 else { return [] }
        var out = [UInt8](repeating: 0, count: n)
        _ = out.withUnsafeMutableBytes { evbuffer_copyout(buf, $0.baseAddress, n) }
        return out
    }

    public func respond(status: Int, headers: [(String, String)] = [], body: [UInt8]) {
        let out = evhttp_request_get_output_headers(raw)
        if let evcon = evhttp_request_get_connection(raw) { server.guardian.answered(evcon) }
        for (k, v) in headers { evhttp_add_header(out, k, v) }
        let buf = evbuffer_new()
        // evhttp 2.1 sends a body even after HEAD, which a keep-alive client would read as the
        // start of the next answer: HEAD gets the headers only.
        if !body.isEmpty && evhttp_request_get_command(raw) != EVHTTP_REQ_HEAD {
            body.withUnsafeBytes { _ = evbuffer_add(buf, $0.baseAddress, $0.count) }
        }
        evhttp_send_reply(raw, Int32(status), HTTPRequest.reason(status), buf)
        evbuffer_free(buf)
    }

    public static func reason(_ status: Int) -> String {
        switch status {
        case 200: return "OK"
        case 201: return "Created"
        case 202: return "Accepted"
        case 204: return "No Content"
        case 400: return "Bad Request"
        case 401: return "Unauthorized"
        case 403: return "Forbidden"
        case 404: return "Not Found"
        case 405: return "Method Not Allowed"
        case 409: return "Conflict"
        case 413: return "Payload Too Large"
        case 415: return "Unsupported Media Type"
        case 429: return "Too Many Requests"
        case 500: return "Internal Server Error"
        case 503: return "Service Unavailable"
        default: return "Status"
        }
    }
}
