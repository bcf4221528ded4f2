import DispatchCore
import DispatchSystem
import DispatchCLIKit
import DispatchBlockingHTTP

/// The Dispatch API as the CLI uses it: authenticated requests with bounded retries.
struct Client {
    let global: CLIGlobalOptions
    /// The command, for messages (`dispatch progress: ...`).
    var command = "dispatch"
    /// Seconds one attempt may take (connect, send, answer).
    var attemptTimeout = 10.0
    /// Say `retrying…` after the first failure of a call that will be retried (run's background
    /// publisher says it its own way).
    var notesRetries = true

    enum Outcome {
        /// The server answered (any status; the caller maps it).
        case answered(HTTPResponse)
        /// No usable answer within the retry budget, or a failure not worth retrying.
        case failed(CLIExitCode, String)
    }

    func headers(idempotencyKey: String?, accept: String = "application/json") -> [(String, String)] {
        var h: [(String, String)] = [("User-Agent", "dispatch-cli/0.1"), ("Accept", accept)]
        if let token = global.token { h.append(("Authorization", "Bearer \(token)")) }
        if let idempotencyKey { h.append(("Idempotency-Key", idempotencyKey)) }
        return h
    }

    /// What one attempt came to, for callers that schedule their own retries (`run`'s publisher).
    enum Attempt {
        case success(HTTPResponse)
        /// Worth another try later: unreachable, timed out, 5xx, 429, a transient 409.
        case transient(String)
        /// Refused for good (4xx, an unknown host, an untrusted certificate), with the answer if any.
        case refused(String, HTTPResponse?)
    }

    /// One attempt, no retry. `idempotencyKey` is the caller's, so its own retries of the same
    /// publish carry the same key.
    func attempt(method: String, path: String, body: [UInt8]?, idempotencyKey: String?) -> Attempt {
        let request = CLIHTTP.encodeRequest(method: method, path: path, endpoint: global.endpoint,
                                            headers: headers(idempotencyKey: idempotencyKey), body: body)
        do {
            let response = try HTTP1Connection.exchange(endpoint: global.endpoint, caFile: global.caFile, request: request, timeout: attemptTimeout)
            switch CLIHTTPDisposition.of(status: response.head.status, body: response.body) {
            case .success: return .success(response)
            case .retry: return .transient(CLIServerError.describe(status: response.head.status, body: response.body))
            case .fail: return .refused(CLIServerError.describe(status: response.head.status, body: response.body), response)
            }
        } catch {
            return error.transient ? .transient(error.message) : .refused(error.message, nil)
        }
    }

    /// Sends a request, retrying transient failures for `retryFor` seconds. A request with a
    /// body is a publish: it gets one Idempotency-Key, reused by every retry, so the server
    /// applies it at most once even when an earlier attempt's answer was lost.
    ///
    /// With a `deadline` (`progress`), the whole call, retries included, ends by then: each
    /// attempt gets what is left, nothing says `retrying…`, and running out exits `deadline`.
    func call(method: String, path: String, body: [UInt8]?, retryFor: Double? = nil, deadline: Double? = nil) -> Outcome {
        let key = body == nil ? nil : System.randomKey()
        let request = CLIHTTP.encodeRequest(method: method, path: path, endpoint: global.endpoint,
                                            headers: headers(idempotencyKey: key), body: body)
        let policy = CLIRetryPolicy(budget: deadline ?? retryFor ?? global.retryFor)
        let started = Clock.monotonic()
        var failures = 0
        while true {
            var lastError: String
            var retryAfter: Double?
            var timeout = attemptTimeout
            if let deadline {
                guard let t = CLIRetryPolicy.attemptTimeout(deadline: deadline, elapsed: Clock.monotonic() - started, cap: attemptTimeout) else {
                    return .failed(.deadline, CLIRetryPolicy.deadlineMessage("out of time", deadline: deadline, attempts: failures))
                }
                timeout = t
            }
            do {
                let response = try HTTP1Connection.exchange(endpoint: global.endpoint, caFile: global.caFile, request: request, timeout: timeout)
                switch CLIHTTPDisposition.of(status: response.head.status, body: response.body) {
                case .success, .fail:
                    return .answered(response)
                case .retry:
                    lastError = CLIServerError.describe(status: response.head.status, body: response.body)
                    retryAfter = CLIRetryPolicy.parseRetryAfter(response.head.header("retry-after"))
                }
            } catch {
                guard error.transient else { return .failed(.unavailable, error.message) }
                lastError = error.message
            }
            if System.interrupted() { return .failed(.unavailable, "\(lastError) (interrupted)") }
            failures += 1
            let elapsed = Clock.monotonic() - started
            let delay = policy.delay(failures: failures, elapsed: elapsed, retryAfter: retryAfter)
            if let deadline, delay.map({ elapsed + $0 + 0.05 >= deadline }) ?? true {
                return .failed(.deadline, CLIRetryPolicy.deadlineMessage(lastError, deadline: deadline, attempts: failures))
            }
            guard let delay else {
                let tries = failures == 1 ? "1 attempt" : "\(failures) attempts"
                return .failed(.unavailable, "\(lastError) (gave up after \(tries) in \(CLIProgress.duration(elapsed)))")
            }
            if failures == 1 && notesRetries && deadline == nil { Notes.once("retrying", command, CLIFeedback.retrying(lastError, budget: policy.budget)) }
            Clock.sleep(seconds: delay, interrupted: System.interrupted)
        }
    }

    /// Runs one publish command end to end and returns the exit code; prints the id/snapshot
    /// on success and one stderr line on failure.
    func publish(command: String, path: String, body: [UInt8], deadline: Double? = nil, onSuccess: (HTTPResponse) -> Void) -> CLIExitCode {
        switch call(method: "POST", path: path, body: body, deadline: deadline) {
        case .failed(let code, let message):
            Output.fail(command, message)
            return code
        case .answered(let response):
            switch CLIHTTPDisposition.of(status: response.head.status, body: response.body) {
            case .success:
                onSuccess(response)
                return .success
            case .fail(let code):
                Output.fail(command, CLIServerError.describe(status: response.head.status, body: response.body))
                if global.json, !response.body.isEmpty { printBody(response.body) }
                return code
            case .retry:  // call() only returns answers that are final
                Output.fail(command, CLIServerError.describe(status: response.head.status, body: response.body))
                return .unavailable
            }
        }
    }

    func printBody(_ body: [UInt8]) {
        var bytes = body
        if bytes.last != 0x0A { bytes.append(0x0A) }
        Output.write(1, bytes)
    }

    static func activityPath(_ id: String, _ suffix: String = "") -> String {
        "/v1/activities/\(CLIHTTP.encodeSegment(id))\(suffix)"
    }
}

enum PublishCommands {
    static func start(_ o: CLIStartOptions, client: Client) -> CLIExitCode {
        client.publish(command: "start", path: "/v1/activities/start", body: CLIRequestBody.start(o)) { response in
            if client.global.json { client.printBody(response.body); return }
            if let value = try? JSONParser.parse(response.body), case .string(let id)? = value["activityId"] {
                Output.out(id)
            } else if let id = o.activityID {
                Output.out(id)
            }
        }
    }

    static func progress(_ o: CLIUpdateOptions, client: Client) -> CLIExitCode {
        client.publish(command: "progress", path: Client.activityPath(o.activityID, "/update"), body: CLIRequestBody.update(o),
                       deadline: o.deadline) { response in
            if client.global.json { client.printBody(response.body) }
        }
    }

    static func end(_ o: CLIEndOptions, client: Client) -> CLIExitCode {
        client.publish(command: "end", path: Client.activityPath(o.activityID, "/end"), body: CLIRequestBody.end(o)) { response in
            if client.global.json { client.printBody(response.body) }
        }
    }
}

/// `dispatch list`: pages of `GET /v1/activities` until the limit or the last page.
enum ListCommand {
    static func run(_ o: CLIListOptions, client: Client) -> CLIExitCode {
        var items: [JSONValue] = []
        var cursor: String?
        repeat {
            let path = CLIList.path(o, remaining: o.limit - items.count, cursor: cursor)
            switch client.call(method: "GET", path: path, body: nil) {
            case .failed(let code, let message):
                Output.fail("list", message)
                return code
            case .answered(let response):
                guard case .success = CLIHTTPDisposition.of(status: response.head.status, body: response.body) else {
                    Output.fail("list", CLIServerError.describe(status: response.head.status, body: response.body))
                    if client.global.json, !response.body.isEmpty { client.printBody(response.body) }
                    if case .fail(let code) = CLIHTTPDisposition.of(status: response.head.status, body: response.body) { return code }
                    return .unavailable
                }
                guard let page = CLIList.page(response.body) else {
                    Output.fail("list", "the server's answer is not a list of activities")
                    return .unavailable
                }
                items += page.activities.prefix(o.limit - items.count)
                cursor = page.next
            }
        } while cursor != nil && items.count < o.limit

        if client.global.json {
            for item in items { Output.out(CLIJSON.encode(item)) }
            return .success
        }
        let views = items.compactMap(CLIActivityView.init(json:))
        if System.isTerminal(1) {
            if views.isEmpty { Output.err(CLIList.emptyNote(o)); return .success }
            for line in CLIList.table(views, width: System.terminalWidth(), now: Clock.wallSeconds()) { Output.out(line) }
        } else {
            for view in views { Output.out(CLIList.plainLine(view)) }
        }
        return .success
    }
}
