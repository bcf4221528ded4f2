import CLibevent
import Glibc

/// Every place Dispatch relies on libevent 2.1's layout of `struct evhttp_request`
/// (event2/http_struct.h, which libevent keeps only for compatibility) or on behaviour its API
/// does not promise. Nothing else in the tree reads or writes a field of a libevent struct.
///
/// These were checked against libevent 2.1 (2.1.12): a library of another major or minor
/// version may lay the request out differently or free what we free, so dispatchd refuses to
/// start on one (`refusal`), before any request is parsed.
public enum LibeventInternals {
    /// The major and minor version whose layout and behaviour this file was checked against.
    public static let checkedVersion: UInt32 = 0x0201_0000

    /// Why dispatchd must not start with the libevent it runs on (nil: it may).
    public static func refusal() -> String? {
        refusal(library: UInt32(event_get_version_number()), headers: UInt32(LIBEVENT_VERSION_NUMBER))
    }

    /// `library`: the version of the libevent loaded now; `headers`: the one compiled against.
    public static func refusal(library: UInt32, headers: UInt32) -> String? {
        let wanted = versionText(checkedVersion, minorOnly: true)
        if headers & 0xFFFF_0000 != checkedVersion {
            return "built against libevent \(versionText(headers)); its private layout is checked for \(wanted) only"
        }
        if library & 0xFFFF_0000 != checkedVersion {
            return "running on libevent \(versionText(library)); its private layout is checked for \(wanted) only"
        }
        return nil
    }

    static func versionText(_ v: UInt32, minorOnly: Bool = false) -> String {
        let major = v >> 24, minor = (v >> 16) & 0xFF, patch = (v >> 8) & 0xFF
        return minorOnly ? "\(major).\(minor).x" : "\(major).\(minor).\(patch)"
    }

    // MARK: - evhttp_request fields

    /// An HTTP/1.0 request: its answer cannot be chunked.
    static func isHTTP10(_ request: UnsafeMutablePointer<evhttp_request>) -> Bool {
        request.pointee.major == 1 && request.pointee.minor == 0
    }

    /// Whether evhttp chunks the reply it started (decided by `evhttp_send_reply_start`).
    static func isChunked(_ request: UnsafeMutablePointer<evhttp_request>) -> Bool {
        request.pointee.chunked != 0
    }

    /// A long-lived stream's status line and headers are on the wire: frees the parsed URI
    /// and the reason phrase it will never need again (tens of thousands of streams each hold
    /// one). `evhttp_request_free` frees only what is still set, so these are cleared.
    static func releaseWhatAStartedReplyNoLongerNeeds(_ request: UnsafeMutablePointer<evhttp_request>) {
        if let uri = request.pointee.uri_elems { evhttp_uri_free(uri); request.pointee.uri_elems = nil }
        if let uri = request.pointee.uri { free(uri); request.pointee.uri = nil }
        if let line = request.pointee.response_code_line { free(line); request.pointee.response_code_line = nil }
    }

    // MARK: - Behaviour the API does not promise

    /// evhttp 2.1 detaches a reply still in progress from its connection when the peer leaves,
    /// and then never frees it: frees it on a later loop turn, once libevent is done with it.
    static func freeReplyDetachedByPeerClose(_ request: UnsafeMutablePointer<evhttp_request>, loop: LoopScheduling) {
        guard evhttp_request_get_connection(request) == nil else { return }
        loop.soon { evhttp_request_free(request) }
    }

    /// evhttp dropped a connection that never completed a request (it sets no close callback
    /// before the first request, so the guard is not told): 2.1 clears the bufferevent's read
    /// callback when it does. True when `bev`'s connection is gone this way.
    static func evhttpDroppedConnection(_ bev: OpaquePointer) -> Bool {
        var readcb: bufferevent_data_cb?
        bufferevent_getcb(bev, &readcb, nil, nil, nil)
        return readcb == nil
    }
}
