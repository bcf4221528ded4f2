/// Why a stream ended: one teardown path takes it, metrics count it, logs show it.
public enum StreamCloseReason: String, CaseIterable, Sendable {
    /// The client disconnected (FIN, RST, write timeout).
    case clientClosed = "client_closed"
    /// The activity's final event was sent.
    case terminal
    /// The activity does not exist (`not_found` event sent).
    case notFound = "not_found"
    /// `204 No Content`: the client already had the final event.
    case noContent = "no_content"
    /// The client read too slowly: its backlog passed the cap.
    case slowClient = "slow_client"
    /// A write to the socket failed.
    case writeFailed = "write_failed"
    /// The server is stopping.
    case shutdown
    /// The database could not answer a read this stream needed.
    case database
    /// The key the stream was opened with was revoked.
    case revoked
}

/// Why the fan-out gave up on a subscriber.
public enum DropReason: Equatable, Sendable {
    /// More events waited for it than the hub buffers.
    case tooFarBehind
    /// A read it needed failed.
    case readFailed

    public var closeReason: StreamCloseReason {
        switch self {
        case .tooFarBehind: return .slowClient
        case .readFailed: return .database
        }
    }
}
