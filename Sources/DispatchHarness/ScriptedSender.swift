import DispatchIO

/// An HTTP client (a webhook or APNs sender's) that keeps each request until the test
/// answers it.
public final class ScriptedSender: HTTPRequestSending {
    public init() {}

    public private(set) var requests: [CurlClient.Request] = []
    private var completions: [CurlClient.Completion] = []
    public private(set) var closed = false

    public func send(_ request: CurlClient.Request, completion: @escaping CurlClient.Completion) {
        requests.append(request)
        completions.append(completion)
    }

    /// Answers the oldest unanswered request.
    public func answer(_ result: Result<CurlClient.Response, HTTPClientFailure>) {
        completions.removeFirst()(result)
    }

    public var unanswered: Int { completions.count }

    /// As CurlClient does: every unanswered request completes as cancelled.
    public func close() {
        closed = true
        let pending = completions
        completions = []
        for c in pending { c(.failure(HTTPClientFailure(.cancelled, message: "client closed"))) }
    }
}
