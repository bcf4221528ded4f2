#if canImport(Glibc)
import Glibc
#endif
import DispatchCore
import DispatchSystem
import DispatchCLIKit
import DispatchBlockingHTTP

/// `dispatch watch`: follows `GET /v1/activities/{id}/status` until the activity ends,
/// reconnecting with `Last-Event-ID` across dropped connections and server restarts.
/// Decisions come from `CLIWatchState`; this struct only does the IO and the drawing.
struct WatchCommand {
    let options: CLIWatchOptions
    let client: Client

    /// A stream silent for this long is presumed dead (the server sends a heartbeat every 15 s).
    static let idleTimeout = 90.0

    private enum StreamEnd {
        case finished(CLIExitCode)
        /// `--wait`: the activity does not exist yet; connect again after the pause.
        case awaitActivity(milliseconds: Int)
        /// Reconnect; `connected` says whether this attempt got a 200 (it resets the outage clock).
        case reconnect(connected: Bool, afterMilliseconds: Int?, reason: String)
    }

    func run() -> Int32 {
        installInterruptHandlers()
        let live = System.isTerminal(1) && !options.plain && !client.global.json
        let renderer = LiveRenderer(enabled: live)
        let wait: CLIWatchState.WaitForStart = !options.wait ? .no : options.waitTimeout.map { .until(Clock.monotonic() + $0) } ?? .forever
        var state = CLIWatchState(activityID: options.activityID, waitForStart: wait)
        var outageStarted: Double?
        var failures = 0
        /// A `retrying…` note went out for the outage under way (plain output only: on a
        /// terminal the live line says "reconnecting…").
        var outageNoted = false

        while true {
            if System.interrupted() { return interruptedExit(renderer) }
            let end = connectOnce(state: &state, renderer: renderer) {
                if outageNoted { Notes.show("watch", "reconnected") }
                outageNoted = false
            }
            switch end {
            case .finished(let code):
                renderer.finish()
                return code.rawValue
            case .awaitActivity(let pause):
                let limit = options.waitTimeout.map { " up to \(CLIProgress.duration($0))" } ?? ""
                Notes.once("wait", "watch", "activity \(CLIText.oneLine(options.activityID)) does not exist yet; waiting\(limit) for it to start…")
                outageStarted = nil  // the server answered: no outage under way
                failures = 0
                let wakeAt = Clock.monotonic() + Double(pause) / 1000
                while Clock.monotonic() < wakeAt && !System.interrupted() {
                    Clock.sleep(seconds: min(0.25, wakeAt - Clock.monotonic()), interrupted: System.interrupted)
                }
            case .reconnect(let connected, let pause, let reason):
                if System.interrupted() { return interruptedExit(renderer) }
                if connected || outageStarted == nil {
                    outageStarted = Clock.monotonic()
                    failures = 0
                }
                failures += 1
                let retry = Double(pause ?? state.retryMilliseconds) / 1000
                let policy = CLIRetryPolicy(budget: client.global.retryFor, initialDelay: retry, maxDelay: max(retry, 0.001))
                let elapsed = Clock.monotonic() - outageStarted!
                guard let delay = policy.delay(failures: failures, elapsed: elapsed) else {
                    renderer.finish()
                    Output.fail("watch", "\(reason) (gave up after \(CLIProgress.duration(elapsed)))")
                    return CLIExitCode.unavailable.rawValue
                }
                if !connected && !outageNoted && !renderer.enabled {
                    Notes.show("watch", CLIFeedback.retrying(reason, budget: client.global.retryFor))
                    outageNoted = true
                }
                renderer.note = "reconnecting…"
                let wakeAt = Clock.monotonic() + delay
                while Clock.monotonic() < wakeAt && !System.interrupted() {
                    renderer.tick()
                    Clock.sleep(seconds: min(0.25, wakeAt - Clock.monotonic()), interrupted: System.interrupted)
                }
            }
        }
    }

    private func interruptedExit(_ renderer: LiveRenderer) -> Int32 {
        renderer.finish()
        return 128 + System.interruptSignal
    }

    /// One connection: request, answer, events until it ends.
    /// `onConnected` runs when the server answers with the stream.
    private func connectOnce(state: inout CLIWatchState, renderer: LiveRenderer, onConnected: () -> Void) -> StreamEnd {
        var headers = client.headers(idempotencyKey: nil, accept: "text/event-stream")
        headers.append(("Cache-Control", "no-cache"))
        if let last = state.lastEventID { headers.append(("Last-Event-ID", last)) }
        let request = CLIHTTP.encodeRequest(method: "GET", path: Client.activityPath(options.activityID, "/status"),
                                            endpoint: client.global.endpoint, headers: headers, body: nil)
        let conn: HTTP1Connection
        do {
            conn = try HTTP1Connection.connect(to: client.global.endpoint, caFile: client.global.caFile, timeout: 10)
            try conn.send(request, deadline: Clock.monotonic() + 10)
        } catch {
            if !error.transient && !System.interrupted() {
                Output.fail("watch", error.message)
                return .finished(.unavailable)
            }
            return .reconnect(connected: false, afterMilliseconds: nil, reason: error.message)
        }

        var sse = SSEParser()
        var status: Int?
        var errorBody: [UInt8] = []
        var connected = false
        /// Bytes arrived on this stream: only then does a later drop start a new outage, so a
        /// server that accepts and hangs up at once cannot keep the watch looping forever.
        var streamed = false
        var lastActivity = Clock.monotonic()
        let tick = renderer.enabled ? 0.25 : WatchCommand.idleTimeout

        while true {
            let events: [HTTPResponseEvent]?
            do {
                events = try conn.readEvents(until: Clock.monotonic() + tick)
            } catch {
                return .reconnect(connected: streamed, afterMilliseconds: nil, reason: error.message)
            }
            guard let events else {
                renderer.tick()
                if Clock.monotonic() - lastActivity > WatchCommand.idleTimeout {
                    return .reconnect(connected: streamed, afterMilliseconds: 0, reason: "the stream went silent")
                }
                continue
            }
            lastActivity = Clock.monotonic()
            for event in events {
                switch event {
                case .head(let head):
                    status = head.status
                    switch state.answered(status: head.status) {
                    case .readStream:
                        guard head.header("content-type")?.lowercased().hasPrefix("text/event-stream") == true else {
                            renderer.finish()
                            Output.fail("watch", "the server did not answer with an event stream (Content-Type: \(CLIText.oneLine(head.header("content-type") ?? "none")))")
                            return .finished(.unavailable)
                        }
                        connected = true
                        renderer.note = nil
                        onConnected()
                    case .fetchSnapshot:
                        return fetchFinalSnapshot(state: &state, renderer: renderer)
                    case .retryConnect, .finish, .display, .reconnect, .awaitActivity:
                        break  // decided once the error body is read
                    }
                case .body(let bytes):
                    if connected {
                        streamed = true
                        for sseEvent in sse.feed(bytes) {
                            if let r = sse.retryMilliseconds { state.retryAdvised(milliseconds: r) }
                            if let end = perform(state.received(sseEvent, now: Clock.monotonic()), raw: sseEvent.data, renderer: renderer) { return end }
                        }
                        if sse.overflowed {
                            renderer.finish()
                            Output.fail("watch", "the server sent an event larger than \(sse.maxEventBytes >> 20) MiB; this is not a Dispatch stream")
                            return .finished(.unavailable)
                        }
                        if let r = sse.retryMilliseconds { state.retryAdvised(milliseconds: r) }
                    } else if errorBody.count < 64 * 1024 {
                        errorBody.append(contentsOf: bytes)
                    }
                case .end:
                    if connected {
                        return .reconnect(connected: streamed, afterMilliseconds: nil, reason: "the stream ended early")
                    }
                    let s = status ?? 0
                    let message = CLIServerError.describe(status: s, body: errorBody)
                    switch state.answered(status: s) {
                    case .finish(let code):
                        renderer.finish()
                        Output.fail("watch", message)
                        if client.global.json, !errorBody.isEmpty { client.printBody(errorBody) }
                        return .finished(code)
                    case .retryConnect, .readStream, .fetchSnapshot, .display, .reconnect, .awaitActivity:
                        return .reconnect(connected: false, afterMilliseconds: nil, reason: message)
                    }
                }
            }
        }
    }

    /// Shows what the state machine decided; returns how this connection ends when it does.
    /// `raw` is the event's data as the server sent it, which `--json` prints unchanged.
    private func perform(_ actions: [CLIWatchState.Action], raw: String, renderer: LiveRenderer) -> StreamEnd? {
        for action in actions {
            switch action {
            case .display(let event, let view):
                if client.global.json {
                    Output.out(CLIText.oneLine(raw))
                } else if renderer.enabled {
                    if event != "not_found" { renderer.show(view) }
                } else {
                    Output.out(CLIProgress.plainLine(event: event, view: view))
                }
                if event == "not_found" {
                    Output.fail("watch", "activity \(CLIText.oneLine(view.activityID)) not found (not_found)")
                }
            case .finish(let code):
                return .finished(code)
            case .awaitActivity(let pause):
                return .awaitActivity(milliseconds: pause)
            case .readStream, .reconnect, .retryConnect, .fetchSnapshot:
                break
            }
        }
        return nil
    }

    /// `204 No Content`: the stream is over although its end was not seen here.
    private func fetchFinalSnapshot(state: inout CLIWatchState, renderer: LiveRenderer) -> StreamEnd {
        switch client.call(method: "GET", path: Client.activityPath(options.activityID), body: nil) {
        case .failed(let code, let message):
            renderer.finish()
            Output.fail("watch", message)
            return .finished(code)
        case .answered(let response):
            guard response.head.status == 200, let value = try? JSONParser.parse(response.body),
                  let view = CLIActivityView(json: value) else {
                renderer.finish()
                Output.fail("watch", CLIServerError.describe(status: response.head.status, body: response.body))
                if case .fail(let code) = CLIHTTPDisposition.of(status: response.head.status, body: response.body) { return .finished(code) }
                return .finished(.unavailable)
            }
            let actions = state.snapshotFetched(view)
            if let end = perform(actions, raw: String(decoding: response.body, as: UTF8.self), renderer: renderer) { return end }
            return .reconnect(connected: false, afterMilliseconds: nil, reason: "the activity is still running")
        }
    }

    private func installInterruptHandlers() {
        var action = sigaction()
        action.__sigaction_handler.sa_handler = { sig in System.interruptSignal = sig }
        sigemptyset(&action.sa_mask)
        action.sa_flags = 0  // no SA_RESTART: poll() and nanosleep() return EINTR
        sigaction(SIGINT, &action, nil)
        sigaction(SIGTERM, &action, nil)
        sigaction(SIGHUP, &action, nil)
    }
}

/// Draws the live line on a terminal: `\r`, clear the line, the line; redrawn on every event
/// and every tick (spinner and elapsed time). Does nothing when disabled.
final class LiveRenderer {
    let enabled: Bool
    private var view: CLIActivityView?
    private var frame = 0
    private var drawn = false
    var note: String? {
        didSet { if note != oldValue { draw() } }
    }

    init(enabled: Bool) { self.enabled = enabled }

    func show(_ view: CLIActivityView) {
        self.view = view
        draw()
    }

    func tick() {
        frame += 1
        draw()
    }

    private func draw() {
        guard enabled, var v = view else { return }
        if let note, !v.isTerminal { v.status = (v.status.map { $0 + " " } ?? "") + "(\(note))" }
        let line = CLIProgress.liveLine(view: v, width: System.terminalWidth() - 1, now: Clock.wallSeconds(), frame: frame)
        Output.outRaw("\r\u{1B}[2K" + line)
        drawn = true
    }

    /// Leaves the last line on screen and moves below it.
    func finish() {
        guard enabled, drawn else { return }
        draw()
        Output.outRaw("\n")
        drawn = false
    }
}
