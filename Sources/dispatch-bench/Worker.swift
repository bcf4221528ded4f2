// Long on purpose: every role (subscriber, publisher, terminal, batch) shares one compact
// connection table and one set of libevent callbacks, so a process can hold ~18k sockets;
// split by role, that shared state would be spread over files that all mutate it.
import CLibevent
import DispatchCore
import DispatchSystem
import DispatchBenchKit
#if canImport(Glibc)
import Glibc
#endif

/// The one worker of this process; C callbacks find it here (one thread per process).
nonisolated(unsafe) var currentWorker: Worker?

/// A load-generator process: one libevent loop holding up to ~18k raw sockets, driven by
/// JSON-line commands on stdin and answering with JSON-line events on stdout.
///
/// Commands (`cmd`): `subscribe`, `verify`, `report`, `reset`, `close`, `publish`,
/// `batch`, `terminal`, `stop` (publishers finish now), `storm` (reconnect figures),
/// `progress` (replay readers), `exit`. See `Orchestrator` for how they are combined.
///
/// Subscribers opened with `reconnect` behave like a browser's EventSource: they keep the
/// last event id and the `retry:` time, and when the stream ends, fails or the connection
/// is refused they wait that long and reconnect with `Last-Event-ID`.
final class Worker {
    enum Role: UInt8 { case subscriber, publisher, batch, terminal }
    enum Phase: UInt8 {
        case free, connecting, waiting, ready, closed
        /// Reconnecting streams: waiting for their retry time, then for a connect slot.
        case sleeping, queued
    }

    /// Per-connection state, kept compact: tens of thousands of these live in one array.
    struct Conn {
        var fd: Int32 = -1
        var ev: OpaquePointer?
        var parser = BenchStreamParser()
        var role: Role = .subscriber
        var phase: Phase = .free
        var writing = false
        var sawEvent = false
        var channel: Int32 = 0
        var lastSeq: Int64 = -1
        var sentAt: Int64 = 0
        var status: Int16 = 0
        var pendingOut: [UInt8] = []
        /// Index into `ports` (several servers: the nodes scenario).
        var node: UInt8 = 0
        /// A stream that never reads (replay storm).
        var stalled = false
        /// A stream whose client went away for a while around a restart (`away` command).
        var away = false
        /// A reconnect attempt is in flight (holds one of `reconMax` connect slots).
        var reconnecting = false
        /// Successful opens of this stream (0: the first attempt is still going).
        var opens: Int32 = 0
        /// EventSource's reconnection time, from `retry:` (ms).
        var retryMs: Int32 = 3000
        /// Invalidates reconnect timers of an earlier sleep.
        var token: UInt32 = 0
        /// The last event id: numeric, or nchan's `A:B` packed (`BenchEvent.pairID`).
        var lastID: Int64 = -1
        var lastPairID: Int64 = -1
        /// Wall-clock ns of the last successful (re)open.
        var openedAt: Int64 = 0
        /// When the stream had every event published before it reopened (0: not yet known).
        var caughtUpAt: Int64 = 0
        /// Receipt time of the newest event published before `openedAt`.
        var lastBeforeOpen: Int64 = 0
        /// When the stream reached `subUntilSeq` (replay readers).
        var doneAt: Int64 = 0
    }

    let base: OpaquePointer
    var conns: [Conn] = []
    var freeSlots: [Int] = []
    var out: [BenchParseOutput] = []
    let readBuffer = UnsafeMutableRawPointer.allocate(byteCount: 65536, alignment: 16)
    var stdinBuffer: [UInt8] = []
    var stdinEvent: OpaquePointer?
    var tickEvent: OpaquePointer?

    // Targets.
    var addrs: [in_addr_t] = []
    var port: UInt16 = 0
    /// Several servers (nodes): a connection goes to `ports[conn.node]`.
    var ports: [UInt16] = []
    var nextAddr = 0

    // Subscribers.
    var subTotal = 0, subStarted = 0, subInflight = 0, subReady = 0, subFailed = 0
    var subMaxInflight = 500
    var subPathTemplate = ""
    var subChannels = 1
    var subFirst = 0
    var subNeedFirstEvent = false
    var subSeqAtSubscribe: Int64 = 0
    var subStart: Int64 = 0
    var subReportedDone = true
    var trackSeqs = false
    var fan: [Int64: (count: Int, first: Int64, last: Int64)] = [:]
    var deliveries = 0
    var hist = BenchHistogram()
    var gaps: Int64 = 0, dups: Int64 = 0, lostAtStart: Int64 = 0
    /// The same, for streams that were away (`away` command).
    var awayGaps: Int64 = 0, awayDups: Int64 = 0
    var serverClosed = 0
    var firstError = ""
    /// EventSource-like streams (see the type's comment).
    var subReconnect = false
    var subLastEventID = ""
    /// Every `subStalledMod`-th stream (by index) never reads; 0: none.
    var subStalledMod = 0
    var subStalledRcvbuf: Int32 = 0
    var subUntilSeq: Int64 = -1
    /// Spread streams over `ports`: stream j goes to node (j / channels) % ports.
    var subSpreadNodes = false
    var reconQueue: [Int] = []
    var reconQueueHead = 0
    var reconInflight = 0
    var reconMax = 256
    var reconAttempts = 0, reconRefused = 0, reconHTTPErrors = 0, reconOpened = 0, reconStopped = 0

    // Publishers, batches and terminal streams.
    var reqTarget = "dispatch"
    var reqAuth = ""
    var reqDeadline: Int64 = 0
    var reqActive = 0
    var reqCount = 0
    var reqErrors = 0
    var reqStart: Int64 = 0
    var reqMode: Role = .publisher
    var reqDone = true
    var pubChannelNames: [String] = []
    var pubCursor: [Int] = []
    var pubFinal: [Int64] = []
    var pubNextSeq: [Int64] = []
    var pubAckHist = BenchHistogram()
    /// Per slot: the channel whose publish is outstanding (resent as is after a failure), or -1.
    var pubPending: [Int] = []
    /// Publishes acknowledged per channel; with `pubLimit` > 0 a channel stops at that count.
    var pubAcked: [Int] = []
    var pubLimit = 0
    /// > 0: a failed publish (refused, cut, non-2xx) is retried after this many ns instead of
    /// counting as an error (publishing through a server restart).
    var pubRetryDelay: Int64 = 0
    var pubIdempotent = false
    var pubRetries = 0
    /// Open-loop publishing (`rate`): each connection sends one request per `pubInterval` ns,
    /// waiting when an answer comes early, so the server sees a steady rate (0: closed loop).
    var pubInterval: Int64 = 0
    var pubNextAt: [Int64] = []
    /// Connections waiting to send their next request: their `token` then.
    var pacedFD: [Int: UInt32] = [:]
    var batchRequests: [(method: String, path: String, body: String)] = []
    var batchNext = 0
    var batchStatus: [Int: Int] = [:]
    var termPaths: [String] = []
    var termCursor = 0
    var termExpectTerminal = true

    init() {
        guard let b = event_base_new() else { fatalError("event_base_new failed") }
        base = b
    }

    // MARK: - Loop and commands

    func run() {
        signal(SIGPIPE, SIG_IGN)
        _ = fcntl(0, F_SETFL, fcntl(0, F_GETFL) | O_NONBLOCK)
        stdinEvent = event_new(base, 0, Int16(EV_READ | EV_PERSIST), { _, _, _ in currentWorker?.onStdin() }, nil)
        event_add(stdinEvent, nil)
        tickEvent = event_new(base, -1, Int16(EV_PERSIST), { _, _, _ in currentWorker?.onTick() }, nil)
        var tv = timeval(tv_sec: 0, tv_usec: 100_000)
        event_add(tickEvent, &tv)
        event_base_dispatch(base)
    }

    func onStdin() {
        var buf = [UInt8](repeating: 0, count: 65536)
        while true {
            let r = buf.withUnsafeMutableBytes { read(0, $0.baseAddress, 65536) }
            if r > 0 {
                stdinBuffer.append(contentsOf: buf[0..<r])
                continue
            }
            if r == 0 { exitNow() }
            break
        }
        while let nl = stdinBuffer.firstIndex(of: 0x0A) {
            let line = Array(stdinBuffer[..<nl])
            stdinBuffer.removeSubrange(...nl)
            if line.isEmpty { continue }
            do {
                let v = try JSONParser.parse(line)
                command(v)
            } catch {
                emit { $0.field("ev", "error"); $0.field("message", "bad command: \(error.message)") }
            }
        }
    }

    func exitNow() -> Never {
        for i in conns.indices where conns[i].fd >= 0 { Glibc.close(conns[i].fd) }
        exit(0)
    }

    func command(_ v: JSONValue) {
        guard case .string(let cmd)? = v["cmd"] else { return }
        if case .array(let a)? = v["addrs"] {
            addrs = a.compactMap { if case .string(let s) = $0 { return inet_addr(s) } else { return nil } }
        }
        if let p = v.int("port") { port = UInt16(p) }
        if case .array(let a)? = v["ports"] {
            ports = a.compactMap { if case .number(let d) = $0 { return UInt16(d) } else { return nil } }
        } else if v["port"] != nil {
            ports = []
        }
        switch cmd {
        case "subscribe": startSubscribe(v)
        case "verify": verify(v)
        case "report": report()
        case "reset":
            deliveries = 0
            hist.reset()
            fan = [:]
            emit { $0.field("ev", "reset") }
        case "close":
            closeAll()
            emit { $0.field("ev", "closed") }
        case "publish", "batch", "terminal": startRequests(cmd, v)
        case "stop":
            // Publishers finish the request they are in (and retries of it), then report.
            reqDeadline = min(reqDeadline, Clock.wallNanoseconds())
        case "acked":
            // The seqs acknowledged so far, by channel, while publishing goes on (the carrier
            // outage measures catch-up to what was acknowledged when the carrier came back).
            let acked = pubFinal
            emit { w in
                w.field("ev", "acked")
                w.key("finals"); w.beginArray(); for f in acked { w.int(f) }; w.endArray()
            }
        case "storm": stormReport(since: Int64(v.double("since") ?? 0))
        case "progress": progress()
        case "away": goAway(every: max(1, v.int("every") ?? 20), ms: v.int("ms") ?? 4000)
        case "exit": exitNow()
        default:
            emit { $0.field("ev", "error"); $0.field("message", "unknown command \(cmd)") }
        }
    }

    func emit(_ body: (inout JSONWriter) -> Void) {
        var w = JSONWriter()
        w.beginObject()
        body(&w)
        w.endObject()
        w.bytes.append(0x0A)
        w.bytes.withUnsafeBytes { p in
            var off = 0
            while off < p.count {
                let r = write(1, p.baseAddress! + off, p.count - off)
                if r > 0 { off += r } else if errno != EINTR && errno != EAGAIN { exit(1) }
            }
        }
    }

    func onTick() {
        let now = Clock.wallNanoseconds()
        if !reqDone, reqMode != .batch, now > reqDeadline + 15_000_000_000 {
            // Requests that never answered: give up on them rather than hang the run.
            for i in conns.indices where conns[i].role == reqMode && conns[i].phase != .free {
                reqErrors += 1
                close(i)
            }
            reqActive = 0
            finishRequests()
        }
    }

    // MARK: - Connections

    func allocate(role: Role) -> Int {
        if let i = freeSlots.popLast() {
            conns[i].role = role
            return i
        }
        var c = Conn()
        c.role = role
        conns.append(c)
        return conns.count - 1
    }

    /// Opens a non-blocking socket to the next loopback address; false if that failed at once.
    func connect(_ i: Int) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        if fd < 0 {
            noteError("socket: \(String(cString: strerror(errno)))")
            return false
        }
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        if conns[i].stalled && subStalledRcvbuf > 0 {
            // Before connect, so the window the server sees is this small from the start.
            var size = subStalledRcvbuf
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
        var sa = sockaddr_in()
        sa.sin_family = sa_family_t(AF_INET)
        let node = Int(conns[i].node)
        sa.sin_port = (ports.isEmpty ? port : ports[node % ports.count]).bigEndian
        sa.sin_addr.s_addr = addrs.isEmpty ? inet_addr("127.0.0.1") : addrs[nextAddr % addrs.count]
        nextAddr &+= 1
        let r = withUnsafePointer(to: &sa) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        if r < 0 && errno != EINPROGRESS {
            noteError("connect: \(String(cString: strerror(errno)))")
            Glibc.close(fd)
            return false
        }
        conns[i].fd = fd
        conns[i].token &+= 1
        conns[i].phase = .connecting
        conns[i].parser = BenchStreamParser()
        watch(i, write: true)
        return true
    }

    func watch(_ i: Int, write: Bool) {
        let flags = write ? Int16(EV_WRITE | EV_READ | EV_PERSIST) : Int16(EV_READ | EV_PERSIST)
        let arg = UnsafeMutableRawPointer(bitPattern: i + 1)
        let cb: event_callback_fn = { _, what, arg in currentWorker?.onSocket(Int(bitPattern: arg) - 1, what) }
        if let ev = conns[i].ev {
            event_del(ev)
            event_assign(ev, base, conns[i].fd, flags, cb, arg)
        } else {
            conns[i].ev = event_new(base, conns[i].fd, flags, cb, arg)
        }
        conns[i].writing = write
        event_add(conns[i].ev, nil)
    }

    func close(_ i: Int) {
        guard conns[i].phase != .free else { return }
        if conns[i].reconnecting { conns[i].reconnecting = false; reconInflight -= 1 }
        if let ev = conns[i].ev { event_del(ev) }
        if conns[i].fd >= 0 { Glibc.close(conns[i].fd) }
        conns[i].fd = -1
        conns[i].token &+= 1
        conns[i].phase = .free
        conns[i].parser = BenchStreamParser()
        conns[i].pendingOut = []
        freeSlots.append(i)
    }

    func closeAll() {
        for i in conns.indices where conns[i].phase != .free && conns[i].role == .subscriber { close(i) }
        reconQueue.removeAll()
        reconQueueHead = 0
        reconInflight = 0
        subReconnect = false
        subReportedDone = true
        subTotal = 0
    }

    func send(_ i: Int, _ bytes: [UInt8]) {
        conns[i].pendingOut.append(contentsOf: bytes)
        flush(i)
    }

    func flush(_ i: Int) {
        let fd = conns[i].fd
        var pending = conns[i].pendingOut
        while !pending.isEmpty {
            let r = pending.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if r > 0 {
                pending.removeFirst(r)
            } else if r < 0 && (errno == EAGAIN || errno == EINTR) {
                break
            } else {
                conns[i].pendingOut = []
                failed(i, "send: \(String(cString: strerror(errno)))")
                return
            }
        }
        conns[i].pendingOut = pending
        let needWrite = !pending.isEmpty
        if needWrite != conns[i].writing { watch(i, write: needWrite) }
    }

    func onSocket(_ i: Int, _ what: Int16) {
        guard i >= 0, i < conns.count, conns[i].phase != .free, conns[i].fd >= 0 else { return }
        if conns[i].phase == .connecting {
            guard Int32(what) & EV_WRITE != 0 || Int32(what) & EV_READ != 0 else { return }
            var err: Int32 = 0
            var len = socklen_t(MemoryLayout<Int32>.size)
            getsockopt(conns[i].fd, SOL_SOCKET, SO_ERROR, &err, &len)
            if err != 0 {
                if err == ECONNREFUSED && conns[i].role == .subscriber && conns[i].opens > 0 { reconRefused += 1 }
                failed(i, "connect: \(String(cString: strerror(err)))")
                return
            }
            conns[i].phase = .waiting
            watch(i, write: false)
            connected(i)
            return
        }
        let gen = conns[i].token
        if Int32(what) & EV_WRITE != 0 && !conns[i].pendingOut.isEmpty { flush(i) }
        if Int32(what) & EV_READ != 0 && conns[i].token == gen { readable(i) }
    }

    func readable(_ i: Int) {
        var now: Int64 = 0
        // `token` changes when the connection is closed or replaced while its bytes are handled.
        let gen = conns[i].token
        while conns[i].token == gen && conns[i].phase != .free {
            let r = recv(conns[i].fd, readBuffer, 65536, 0)
            if r > 0 {
                if now == 0 { now = Clock.wallNanoseconds() }
                out.removeAll(keepingCapacity: true)
                conns[i].parser.feed(UnsafeRawBufferPointer(start: readBuffer, count: r), into: &out)
                handle(i, now)
                if r < 65536 { return }
            } else if r == 0 {
                out.removeAll(keepingCapacity: true)
                conns[i].parser.finish(into: &out)
                if now == 0 { now = Clock.wallNanoseconds() }
                handle(i, now)
                if conns[i].token == gen && conns[i].phase != .free { closedByPeer(i) }
                return
            } else {
                if errno == EAGAIN || errno == EINTR { return }
                failed(i, "recv: \(String(cString: strerror(errno)))")
                return
            }
        }
    }

    func handle(_ i: Int, _ now: Int64) {
        let gen = conns[i].token
        for o in out {
            guard conns[i].token == gen, conns[i].phase != .free else { return }
            switch conns[i].role {
            case .subscriber: subscriberOutput(i, o, now)
            case .publisher, .batch, .terminal: requestOutput(i, o, now)
            }
        }
    }

    func noteError(_ s: String) {
        if firstError.isEmpty { firstError = s }
    }

    /// Every way a connection fails reaches here once.
    func failed(_ i: Int, _ reason: String) {
        let role = conns[i].role
        if role == .subscriber && subReconnect && conns[i].opens > 0 { return lost(i) }
        if role == .publisher && pubRetryDelay > 0 { return publisherRetry(i, reopen: true) }
        noteError(reason)
        let phase = conns[i].phase
        close(i)
        switch role {
        case .subscriber:
            if phase == .ready { serverClosed += 1 } else { subscriberSettled(ready: false) }
        case .publisher, .batch, .terminal:
            reqErrors += 1
            reqActive -= 1
            restartRequester(slot: Int(conns[i].channel))
        }
    }

    func closedByPeer(_ i: Int) {
        switch conns[i].role {
        case .subscriber:
            if subReconnect && conns[i].opens > 0 { return lost(i) }
            if conns[i].phase == .ready {
                serverClosed += 1
                close(i)
            } else {
                failed(i, "closed by server before ready")
            }
        case .publisher, .batch, .terminal:
            let busy = conns[i].phase == .waiting && conns[i].sentAt != 0
            if busy && conns[i].role == .publisher && pubRetryDelay > 0 { return publisherRetry(i, reopen: true) }
            let slot = Int(conns[i].channel)
            close(i)
            if busy { reqErrors += 1; noteError("closed by server mid-request") }
            reqActive -= 1
            restartRequester(slot: slot)
        }
    }

    func connected(_ i: Int) {
        switch conns[i].role {
        case .subscriber:
            let path = subPathTemplate.replacing("{ch}", with: String(conns[i].channel))
            // As an EventSource: the last event id it saw, if any (or the one it was given).
            var lastEventID = subLastEventID
            if conns[i].lastID >= 0 {
                lastEventID = String(conns[i].lastID)
            } else if conns[i].lastPairID >= 0 {
                lastEventID = BenchEvent.pairText(conns[i].lastPairID)
            }
            var headers = [("Accept", "text/event-stream"), ("Cache-Control", "no-cache")]
            if !lastEventID.isEmpty { headers.append(("Last-Event-ID", lastEventID)) }
            send(i, HTTPRequestEncoder.encode(method: "GET", target: path, host: "bench", headers: headers, close: false))
            if conns[i].stalled, conns[i].phase == .waiting, conns[i].pendingOut.isEmpty {
                // Never reads: not even the headers. Counted as open once its request is out.
                if let ev = conns[i].ev { event_del(ev) }
                conns[i].phase = .ready
                subscriberSettled(ready: true)
            }
        case .publisher, .batch, .terminal:
            nextRequest(i)
        }
    }

    // MARK: - Subscribers

    func startSubscribe(_ v: JSONValue) {
        subTotal = v.int("count") ?? 0
        subStarted = 0
        subInflight = 0
        subReady = 0
        subFailed = 0
        subMaxInflight = v.int("inflight") ?? 500
        subPathTemplate = v.string("path") ?? "/"
        subChannels = max(1, v.int("channels") ?? 1)
        subFirst = v.int("first") ?? 0
        subNeedFirstEvent = v.bool("needFirstEvent") ?? false
        subSeqAtSubscribe = Int64(v.int("seqAtSubscribe") ?? 0)
        trackSeqs = v.bool("trackSeqs") ?? false
        subReconnect = v.bool("reconnect") ?? false
        subLastEventID = v.string("lastEventID") ?? ""
        subStalledMod = max(0, v.int("stalledMod") ?? 0)
        subStalledRcvbuf = Int32(v.int("stalledRcvbuf") ?? 0)
        subUntilSeq = Int64(v.int("untilSeq") ?? -1)
        subSpreadNodes = v.bool("spreadNodes") ?? false
        reconMax = max(1, v.int("reconnectInflight") ?? 256)
        reconAttempts = 0; reconRefused = 0; reconHTTPErrors = 0; reconOpened = 0; reconStopped = 0
        deliveries = 0
        hist.reset()
        fan = [:]
        gaps = 0; dups = 0; lostAtStart = 0; serverClosed = 0; awayGaps = 0; awayDups = 0
        firstError = ""
        subStart = Clock.wallNanoseconds()
        subReportedDone = false
        conns.reserveCapacity(conns.count + subTotal + 64)
        startMoreSubscribers()
        if subTotal == 0 { subscriberSettled(ready: true) }
    }

    func startMoreSubscribers() {
        while subStarted < subTotal && subInflight < subMaxInflight {
            let i = allocate(role: .subscriber)
            let index = subFirst + subStarted
            conns[i].channel = Int32(index % subChannels)
            conns[i].node = UInt8(subSpreadNodes && !ports.isEmpty ? (index / subChannels) % ports.count : 0)
            conns[i].stalled = subStalledMod > 0 && index % subStalledMod == subStalledMod - 1
            conns[i].sawEvent = false
            conns[i].lastSeq = -1
            conns[i].opens = 0
            conns[i].retryMs = 3000
            conns[i].lastID = -1
            conns[i].lastPairID = -1
            conns[i].openedAt = 0
            conns[i].caughtUpAt = 0
            conns[i].lastBeforeOpen = 0
            conns[i].doneAt = 0
            conns[i].away = false
            subStarted += 1
            subInflight += 1
            if !connect(i) {
                close(i)
                subFailed += 1
                subInflight -= 1
            }
        }
        checkSubscribed()
    }

    func subscriberSettled(ready: Bool) {
        subInflight -= 1
        if ready { subReady += 1 } else { subFailed += 1 }
        startMoreSubscribers()
    }

    func checkSubscribed() {
        guard !subReportedDone, subReady + subFailed >= subTotal else { return }
        subReportedDone = true
        let elapsed = Double(Clock.wallNanoseconds() - subStart) / 1e9
        emit {
            $0.field("ev", "subscribed")
            $0.field("ready", Int64(subReady))
            $0.field("failed", Int64(subFailed))
            $0.field("elapsed", elapsed)
            $0.field("error", firstError)
        }
    }

    func subscriberOutput(_ i: Int, _ o: BenchParseOutput, _ now: Int64) {
        switch o {
        case .headers(let status, let eventStream):
            let reopening = subReconnect && conns[i].opens > 0
            if reopening && status == 204 {
                // EventSource stops for good on 204 (the activity is finished).
                reconStopped += 1
                close(i)
                return
            }
            if status != 200 || !eventStream {
                if reopening { reconHTTPErrors += 1; noteError("reconnect answered \(status)") }
                failed(i, "subscribe answered \(status)\(eventStream ? "" : " (not text/event-stream)")")
                return
            }
            conns[i].opens += 1
            conns[i].openedAt = now
            conns[i].caughtUpAt = 0
            conns[i].status = 0
            if reopening {
                conns[i].phase = .ready
                reconOpened += 1
                if conns[i].reconnecting {
                    conns[i].reconnecting = false
                    reconInflight -= 1
                    drainReconnects()
                }
            } else if !subNeedFirstEvent && conns[i].phase == .waiting {
                conns[i].phase = .ready
                subscriberSettled(ready: true)
            }
        case .retry(let ms):
            conns[i].retryMs = Int32(clamping: ms)
        case .event(let e):
            if e.kind == .notFound {
                failed(i, "stream answered not_found")
                return
            }
            if e.id >= 0 {
                conns[i].lastID = e.id
                conns[i].lastPairID = -1
            } else if e.pairID >= 0 {
                conns[i].lastPairID = e.pairID
                conns[i].lastID = -1
            }
            if e.kind == .terminal { conns[i].status = 1 }
            let seq = e.seq >= 0 ? e.seq : e.id
            if seq < 0 { return }
            if !conns[i].sawEvent {
                conns[i].sawEvent = true
                let expectedFirst = subSeqAtSubscribe + 1
                if seq > expectedFirst {
                    if conns[i].away { awayGaps += seq - expectedFirst } else { lostAtStart += seq - expectedFirst }
                }
            } else if seq <= conns[i].lastSeq {
                if conns[i].away { awayDups += 1 } else { dups += 1 }
            } else if seq > conns[i].lastSeq + 1 {
                if conns[i].away { awayGaps += seq - conns[i].lastSeq - 1 } else { gaps += seq - conns[i].lastSeq - 1 }
            }
            conns[i].lastSeq = max(conns[i].lastSeq, seq)
            if subUntilSeq >= 0 && conns[i].doneAt == 0 && conns[i].lastSeq >= subUntilSeq { conns[i].doneAt = now }
            if conns[i].phase == .waiting {
                conns[i].phase = .ready
                subscriberSettled(ready: true)
            }
            if subReconnect && conns[i].opens > 1 && conns[i].caughtUpAt == 0 && e.t > 0 {
                // Caught up = it has every event published before it reopened: known once an
                // event published after the reopen arrives (order is checked separately).
                if e.t < conns[i].openedAt {
                    conns[i].lastBeforeOpen = now
                } else {
                    conns[i].caughtUpAt = max(conns[i].lastBeforeOpen, conns[i].openedAt)
                }
            }
            if seq > subSeqAtSubscribe && e.t > 0 {
                deliveries += 1
                hist.record(now - e.t)
                if trackSeqs {
                    var f = fan[seq] ?? (0, Int64.max, 0)
                    f.count += 1
                    f.first = min(f.first, now)
                    f.last = max(f.last, now)
                    fan[seq] = f
                    if f.count == subReady {
                        emit {
                            $0.field("ev", "fan")
                            $0.field("seq", seq)
                            $0.field("n", Int64(f.count))
                            $0.field("first", f.first)
                            $0.field("last", f.last)
                        }
                    }
                }
            }
        case .end:
            // A Dispatch stream ends after the terminal event; nothing more will come. An
            // EventSource reconnects when a stream ends otherwise (a server stopping).
            if subReconnect && conns[i].opens > 0 && conns[i].status != 1 { return lost(i) }
            if conns[i].phase == .ready { serverClosed += 1; close(i) } else { failed(i, "stream ended before ready") }
        case .malformed:
            failed(i, "malformed response")
        }
    }

    // MARK: - Reconnecting like an EventSource

    /// A reconnecting stream's connection ended (closed, reset, refused, or an error answer):
    /// keep its state, sleep its `retry:` time, then queue for a connect slot.
    func lost(_ i: Int) {
        if conns[i].reconnecting { conns[i].reconnecting = false; reconInflight -= 1 }
        if let ev = conns[i].ev { event_del(ev) }
        if conns[i].fd >= 0 { Glibc.close(conns[i].fd) }
        conns[i].fd = -1
        conns[i].token &+= 1
        conns[i].parser = BenchStreamParser()
        conns[i].pendingOut = []
        conns[i].phase = .sleeping
        let ms = Int(max(0, conns[i].retryMs))
        var tv = timeval(tv_sec: ms / 1000, tv_usec: (ms % 1000) * 1000)
        let arg = UnsafeMutableRawPointer(bitPattern: UInt(i + 1) | UInt(conns[i].token) << 32)
        event_base_once(base, -1, Int16(EV_TIMEOUT), { _, _, arg in
            let v = UInt(bitPattern: Int(bitPattern: arg))
            currentWorker?.retryDue(Int(v & 0xFFFF_FFFF) - 1, token: UInt32(truncatingIfNeeded: v >> 32))
        }, arg, &tv)
        drainReconnects()
    }

    /// Every `every`-th open reconnecting stream loses its connection now and comes back after
    /// `ms` (a phone changing networks): it reconnects with Last-Event-ID like the others.
    func goAway(every: Int, ms: Int) {
        var n = 0
        for i in conns.indices where conns[i].role == .subscriber && conns[i].phase == .ready && conns[i].opens > 0 && i % every == 0 {
            conns[i].away = true
            conns[i].retryMs = Int32(ms)
            lost(i)
            n += 1
        }
        emit { $0.field("ev", "away"); $0.field("count", Int64(n)) }
    }

    func retryDue(_ i: Int, token: UInt32) {
        guard i >= 0, i < conns.count, conns[i].phase == .sleeping, conns[i].token == token else { return }
        if conns[i].away && conns[i].retryMs > 3000 { conns[i].retryMs = 3000 }  // back to EventSource's default
        conns[i].phase = .queued
        reconQueue.append(i)
        drainReconnects()
    }

    /// At most `reconMax` reconnects in flight per process, as for first connects (the
    /// kernel's accept backlog); the rest wait their turn in order.
    func drainReconnects() {
        while reconInflight < reconMax && reconQueueHead < reconQueue.count {
            let i = reconQueue[reconQueueHead]
            reconQueueHead += 1
            guard conns[i].phase == .queued else { continue }
            reconAttempts += 1
            if connect(i) {
                conns[i].reconnecting = true
                reconInflight += 1
            } else {
                conns[i].phase = .ready  // so lost() sees a live stream to put back to sleep
                lost(i)
            }
        }
        if reconQueueHead == reconQueue.count { reconQueue.removeAll(keepingCapacity: true); reconQueueHead = 0 }
    }

    /// Restart figures since `since` (wall ns): when each stream reopened and caught up.
    func stormReport(since: Int64) {
        var reopen = BenchHistogram(), caught = BenchHistogram()
        var streams = 0, resumed = 0, caughtUp = 0, open = 0
        var lastResumed: Int64 = 0, lastCaught: Int64 = 0
        var away = 0, awayResumed = 0
        for c in conns where c.role == .subscriber && c.phase != .free {
            if c.away {
                away += 1
                if c.phase == .ready && c.openedAt > since { awayResumed += 1 }
                continue
            }
            streams += 1
            if c.phase == .ready { open += 1 }
            guard c.openedAt > since, c.opens > 1 else { continue }
            if c.phase == .ready {
                resumed += 1
                reopen.record(c.openedAt - since)
                lastResumed = max(lastResumed, c.openedAt)
            }
            if c.caughtUpAt > 0 {
                caughtUp += 1
                caught.record(c.caughtUpAt - since)
                lastCaught = max(lastCaught, c.caughtUpAt)
            }
        }
        emit {
            $0.field("ev", "storm")
            $0.field("streams", Int64(streams))
            $0.field("open", Int64(open))
            $0.field("resumed", Int64(resumed))
            $0.field("caughtUp", Int64(caughtUp))
            $0.field("lastResumed", lastResumed)
            $0.field("lastCaughtUp", lastCaught)
            $0.field("attempts", Int64(reconAttempts))
            $0.field("refused", Int64(reconRefused))
            $0.field("httpErrors", Int64(reconHTTPErrors))
            $0.field("stopped", Int64(reconStopped))
            $0.field("away", Int64(away))
            $0.field("awayResumed", Int64(awayResumed))
            $0.field("error", firstError)
            writeHistogram(&$0, "reopen", reopen)
            writeHistogram(&$0, "caught", caught)
        }
    }

    /// Replay readers: how many have reached `untilSeq`, and when the last did.
    func progress() {
        var readers = 0, done = 0, open = 0, stalled = 0
        var last: Int64 = 0
        for c in conns where c.role == .subscriber && c.phase != .free {
            if c.stalled { stalled += 1; continue }
            readers += 1
            if c.phase == .ready { open += 1 }
            if c.doneAt > 0 { done += 1; last = max(last, c.doneAt) }
        }
        emit {
            $0.field("ev", "progress")
            $0.field("readers", Int64(readers))
            $0.field("open", Int64(open))
            $0.field("done", Int64(done))
            $0.field("stalled", Int64(stalled))
            $0.field("lastDone", last)
            $0.field("serverClosed", Int64(serverClosed))
            $0.field("error", firstError)
        }
    }

    func verify(_ v: JSONValue) {
        var finals: [Int64] = []
        if case .array(let a)? = v["finals"] {
            finals = a.map { if case .number(let d) = $0 { return Int64(d) } else { return 0 } }
        }
        var missing: Int64 = 0
        var extra: Int64 = 0
        var checked = 0
        var notOpen = 0
        var awayMissing: Int64 = 0, awayExtra: Int64 = 0
        for c in conns where c.role == .subscriber && !c.stalled && c.phase != .free {
            guard c.phase == .ready else { notOpen += 1; continue }
            let ch = Int(c.channel)
            guard ch < finals.count else { continue }
            checked += 1
            let short = c.lastSeq < finals[ch] ? finals[ch] - max(c.lastSeq, subSeqAtSubscribe) : 0
            let over = c.lastSeq > finals[ch] ? c.lastSeq - finals[ch] : 0
            if c.away { awayMissing += short; awayExtra += over } else { missing += short; extra += over }
        }
        emit {
            $0.field("ev", "verify")
            $0.field("missing", missing)
            $0.field("extra", extra)
            $0.field("checked", Int64(checked))
            $0.field("notOpen", Int64(notOpen))
            $0.field("awayLost", awayMissing + awayGaps)
            $0.field("awayDuplicated", awayExtra + awayDups)
            $0.field("gaps", gaps)
            $0.field("dups", dups)
            $0.field("lostAtStart", lostAtStart)
            $0.field("serverClosed", Int64(serverClosed))
        }
    }

    func report() {
        emit {
            $0.field("ev", "report")
            $0.field("deliveries", Int64(deliveries))
            $0.field("open", Int64(conns.reduce(0) { $0 + ($1.phase == .ready && $1.role == .subscriber ? 1 : 0) }))
            $0.field("gaps", gaps)
            $0.field("dups", dups)
            $0.field("lostAtStart", lostAtStart)
            $0.field("serverClosed", Int64(serverClosed))
            $0.field("error", firstError)
            writeHistogram(&$0, "hist", hist)
        }
    }

    // MARK: - Requests: closed-loop publishers, setup batches, terminal streams

    func startRequests(_ cmd: String, _ v: JSONValue) {
        reqMode = cmd == "publish" ? .publisher : cmd == "batch" ? .batch : .terminal
        reqTarget = v.string("target") ?? "dispatch"
        reqAuth = v.string("auth") ?? ""
        reqStart = Clock.wallNanoseconds()
        reqDeadline = reqStart + Int64((v.double("duration") ?? 0) * 1e9)
        reqCount = 0
        reqErrors = 0
        reqDone = false
        firstError = ""
        pubAckHist.reset()
        pubRetryDelay = 0
        pubRetries = 0
        pubLimit = 0
        pubIdempotent = false
        let connsWanted = max(1, v.int("conns") ?? 1)
        switch reqMode {
        case .publisher:
            let k = max(1, v.int("channels") ?? 1)
            let template = v.string("name") ?? "c-{ch}"
            pubChannelNames = (0..<k).map { template.replacing("{ch}", with: String($0)) }
            let start = Int64(v.int("seqAtSubscribe") ?? 0)
            pubFinal = Array(repeating: start, count: k)
            pubNextSeq = Array(repeating: start + 1, count: k)
            pubCursor = Array(0..<connsWanted)
            let rate = v.double("rate") ?? 0
            pubInterval = rate > 0 ? Int64(Double(connsWanted) / rate * 1e9) : 0
            pubNextAt = (0..<connsWanted).map { reqStart + Int64($0) * pubInterval / Int64(connsWanted) }
            pubPending = Array(repeating: -1, count: connsWanted)
            pubAcked = Array(repeating: 0, count: k)
            pubLimit = max(0, v.int("perChannel") ?? 0)
            pubRetryDelay = Int64((v.double("retryDelay") ?? 0) * 1e9)
            pubIdempotent = v.bool("idempotent") ?? false
        case .batch:
            batchRequests = []
            if case .array(let list)? = v["requests"] {
                for r in list {
                    batchRequests.append((r.string("method") ?? "POST", r.string("path") ?? "/", r.string("body") ?? ""))
                }
            }
            batchNext = 0
            batchStatus = [:]
        case .terminal:
            termPaths = []
            if case .array(let list)? = v["paths"] {
                termPaths = list.compactMap { if case .string(let s) = $0 { return s } else { return nil } }
            }
            termCursor = Int.random(in: 0..<max(1, termPaths.count))
            termExpectTerminal = v.bool("expectTerminal") ?? true
        case .subscriber:
            break
        }
        reqActive = 0
        let n = reqMode == .batch ? min(connsWanted, batchRequests.count) : connsWanted
        for j in 0..<n { openRequester(slot: j) }
        if reqActive == 0 { finishRequests() }
    }

    func openRequester(slot: Int) {
        let i = allocate(role: reqMode)
        conns[i].channel = Int32(slot)
        conns[i].sentAt = 0
        conns[i].node = UInt8(ports.isEmpty ? 0 : slot % ports.count)
        if connect(i) {
            reqActive += 1
        } else if reqMode == .publisher && pubRetryDelay > 0 {
            close(i)
            scheduleReopen(slot: slot)
        } else {
            close(i)
            reqErrors += 1
        }
    }

    /// A publish whose connection failed (refused while the server restarts, cut by its stop):
    /// the same publish goes again on a new connection after `pubRetryDelay`. With
    /// `idempotent` it carries the same Idempotency-Key, so a publish that was committed but
    /// not answered is answered with its first outcome instead of being applied twice.
    func publisherRetry(_ i: Int, reopen: Bool) {
        let slot = Int(conns[i].channel)
        pubRetries += 1
        close(i)
        reqActive -= 1
        scheduleReopen(slot: slot)
    }

    func scheduleReopen(slot: Int) {
        reqActive += 1  // the slot stays active while it waits
        let ns = pubRetryDelay
        var tv = timeval(tv_sec: Int(ns / 1_000_000_000), tv_usec: Int(ns % 1_000_000_000 / 1000))
        event_base_once(base, -1, Int16(EV_TIMEOUT), { _, _, arg in currentWorker?.reopen(slot: Int(bitPattern: arg) - 1) },
                        UnsafeMutableRawPointer(bitPattern: slot + 1), &tv)
    }

    func reopen(slot: Int) {
        guard !reqDone, reqMode == .publisher else { return }
        reqActive -= 1
        if slotHasWork(slot) { openRequester(slot: slot) }
        if reqActive <= 0 { finishRequests() }
    }

    /// A publisher slot goes on until the deadline; one with a publish outstanding (being
    /// retried) goes on up to 15 s longer to settle it.
    func slotHasWork(_ slot: Int) -> Bool {
        let now = Clock.wallNanoseconds()
        if slot < pubPending.count, pubPending[slot] >= 0 {
            return now < reqDeadline + (pubRetryDelay > 0 ? 15_000_000_000 : 0)
        }
        if pubLimit > 0 { return !pubChannels(of: slot).allSatisfy { pubAcked[$0] >= pubLimit } }
        return now < reqDeadline
    }

    /// The channels a publisher slot owns: slot, slot + conns, ...
    func pubChannels(of slot: Int) -> StrideTo<Int> {
        stride(from: slot, to: pubChannelNames.count, by: max(1, pubCursor.count))
    }

    /// After a requester connection closed: open a new one while there is work left.
    /// `slot`: the publisher slot whose connection closed (it owns its channels: the new
    /// connection takes it over, so no channel is left without its publisher or gets two).
    func restartRequester(slot: Int) {
        if (reqMode == .publisher ? slotHasWork(slot) : hasMoreWork()) && reqActive < 4096 && !reqDone {
            openRequester(slot: reqMode == .publisher ? slot : 0)
        }
        if reqActive <= 0 { finishRequests() }
    }

    func hasMoreWork() -> Bool {
        switch reqMode {
        case .batch: return batchNext < batchRequests.count
        case .publisher, .terminal: return Clock.wallNanoseconds() < reqDeadline
        case .subscriber: return false
        }
    }

    func nextRequest(_ i: Int) {
        guard reqMode == .publisher ? slotHasWork(Int(conns[i].channel)) : hasMoreWork() else {
            close(i)
            reqActive -= 1
            if reqActive <= 0 { finishRequests() }
            return
        }
        let now = Clock.wallNanoseconds()
        var req: [UInt8]
        switch reqMode {
        case .publisher:
            let slot = Int(conns[i].channel)
            var ch = slot < pubPending.count ? pubPending[slot] : -1
            if ch < 0 {
                if pubInterval > 0, slot < pubNextAt.count {
                    if now < pubNextAt[slot] { return pace(i, until: pubNextAt[slot], now: now) }
                    pubNextAt[slot] += pubInterval
                }
                let nConns = pubCursor.count
                // A slot owns channels slot, slot + nConns, ...; it publishes to them in turn,
                // so each channel has one publisher and its order is well defined.
                for _ in 0..<max(1, pubChannelNames.count / max(1, nConns) + 1) {
                    ch = pubCursor[slot]
                    if ch >= pubChannelNames.count { ch = slot % max(1, pubChannelNames.count) }
                    var next = ch + nConns
                    if next >= pubChannelNames.count { next = slot % max(1, pubChannelNames.count) }
                    pubCursor[slot] = next
                    if pubLimit == 0 || pubAcked[ch] < pubLimit { break }
                }
                if slot < pubPending.count { pubPending[slot] = ch }
            }
            conns[i].lastSeq = Int64(ch)
            let name = pubChannelNames[ch]
            if reqTarget == "nchan" {
                let seq = pubNextSeq[ch]
                let body = Self.nchanMessage(id: name, seq: seq, t: now)
                req = Self.request("POST", "/pub/\(name)", body: body, auth: "")
            } else {
                // The key names this publish (the channel's n-th), the same on every retry of it.
                let idem = pubIdempotent ? [("Idempotency-Key", "\(name)-\(pubNextSeq[ch])")] : []
                req = Self.request("POST", "/v1/activities/\(name)/update",
                                   body: "{\"progress\":0.5,\"status\":\"t=\(now)\"}", auth: reqAuth, extraHeaders: idem)
            }
        case .batch:
            let r = batchRequests[batchNext]
            conns[i].lastSeq = Int64(batchNext)
            batchNext += 1
            req = Self.request(r.method, r.path, body: r.body, auth: reqAuth)
        case .terminal:
            let path = termPaths.isEmpty ? "/" : termPaths[termCursor % termPaths.count]
            termCursor &+= 1
            let accept = reqTarget == "nchan" ? [] : [("Accept", "text/event-stream")]
            req = HTTPRequestEncoder.encode(method: "GET", target: path, host: "bench", headers: accept, close: false)
        case .subscriber:
            return
        }
        conns[i].sentAt = now
        conns[i].sawEvent = false
        conns[i].phase = .waiting
        send(i, req)
    }

    /// Sends connection `i`'s next request at `until` (open-loop publishing).
    func pace(_ i: Int, until: Int64, now: Int64) {
        pacedFD[i] = conns[i].token
        var tv = timeval(tv_sec: Int((until - now) / 1_000_000_000), tv_usec: Int((until - now) % 1_000_000_000 / 1000))
        event_base_once(base, -1, Int16(EV_TIMEOUT), { _, _, arg in currentWorker?.paced(Int(bitPattern: arg) - 1) },
                        UnsafeMutableRawPointer(bitPattern: i + 1), &tv)
    }

    func paced(_ i: Int) {
        guard let token = pacedFD.removeValue(forKey: i), i < conns.count, conns[i].token == token, conns[i].phase != .free else { return }
        nextRequest(i)
    }

    /// A kept-alive request (a JSON body on POST or when there is one).
    static func request(_ method: String, _ path: String, body: String, auth: String, extraHeaders: [(String, String)] = []) -> [UInt8] {
        var headers: [(String, String)] = auth.isEmpty ? [] : [("Authorization", "Bearer \(auth)")]
        headers += extraHeaders
        let hasBody = method == "POST" || !body.isEmpty
        if hasBody { headers.append(("Content-Type", "application/json")) }
        return HTTPRequestEncoder.encode(method: method, target: path, host: "bench", headers: headers, body: hasBody ? body : nil, close: false)
    }

    /// The nchan message: shaped and sized like a Dispatch snapshot so both servers move the same bytes.
    static func nchanMessage(id: String, seq: Int64, t: Int64) -> String {
        "{\"activityId\":\"\(id)\",\"taskName\":\"bench\",\"systemImage\":null,\"machine\":null,\"cancelURL\":null,"
            + "\"state\":\"processing\",\"progress\":0.5,\"status\":\"t=\(t)\",\"attempt\":1,\"seq\":\(seq),"
            + "\"cancelRequested\":false,\"createdAt\":\"2026-01-01T00:00:00.000Z\","
            + "\"updatedAt\":\"2026-01-01T00:00:00.000Z\",\"endedAt\":null}"
    }

    func requestOutput(_ i: Int, _ o: BenchParseOutput, _ now: Int64) {
        switch o {
        case .headers(let status, _):
            conns[i].status = Int16(clamping: status)
        case .retry:
            break
        case .event(let e):
            conns[i].sawEvent = true
            switch reqMode {
            case .publisher:
                let ch = Int(conns[i].lastSeq)
                if reqTarget != "nchan", e.seq > 0, (200...299).contains(Int(conns[i].status)) {
                    pubFinal[ch] = max(pubFinal[ch], e.seq)
                }
            case .terminal:
                let ok = termExpectTerminal ? (e.kind == .terminal) : (e.seq > 0)
                if !ok { termBad += 1 }
            case .batch, .subscriber:
                break
            }
        case .end(let keepAlive):
            let status = Int(conns[i].status)
            conns[i].status = 0
            let ok = (200...299).contains(status)
            switch reqMode {
            case .publisher:
                let ch = Int(conns[i].lastSeq)
                let slot = Int(conns[i].channel)
                if ok {
                    reqCount += 1
                    pubAckHist.record(now - conns[i].sentAt)
                    if reqTarget == "nchan" { pubFinal[ch] = pubNextSeq[ch] }
                    pubNextSeq[ch] += 1
                    pubAcked[ch] += 1
                    if slot < pubPending.count { pubPending[slot] = -1 }
                } else if pubRetryDelay > 0 {
                    // Refused by a server that is stopping or starting: the same publish again.
                    pubRetries += 1
                    conns[i].sentAt = 0
                    if keepAlive { return pace(i, until: now + pubRetryDelay, now: now) }
                    return publisherRetry(i, reopen: true)
                } else {
                    reqErrors += 1
                    if slot < pubPending.count { pubPending[slot] = -1 }
                    noteError("publish answered \(status)")
                }
            case .batch:
                batchStatus[status, default: 0] += 1
                if ok { reqCount += 1 } else { reqErrors += 1; noteError("batch request answered \(status)") }
            case .terminal:
                if ok && conns[i].sawEvent { reqCount += 1 } else { reqErrors += 1; noteError("terminal stream answered \(status)") }
            case .subscriber:
                break
            }
            conns[i].sentAt = 0
            if keepAlive {
                nextRequest(i)
            } else {
                let slot = Int(conns[i].channel)
                close(i)
                reqActive -= 1
                restartRequester(slot: slot)
            }
        case .malformed:
            failed(i, "malformed response")
        }
    }

    var termBad = 0

    func finishRequests() {
        guard !reqDone else { return }
        reqDone = true
        let elapsed = Double(Clock.wallNanoseconds() - reqStart) / 1e9
        let mode = reqMode
        emit {
            $0.field("ev", mode == .publisher ? "published" : mode == .batch ? "batch" : "terminal")
            $0.field("count", Int64(reqCount))
            $0.field("errors", Int64(reqErrors))
            $0.field("elapsed", elapsed)
            $0.field("error", firstError)
            if mode == .publisher {
                $0.key("finals")
                $0.beginArray()
                for f in pubFinal { $0.int(f) }
                $0.endArray()
                writeHistogram(&$0, "ackHist", pubAckHist)
                $0.field("retries", Int64(pubRetries))
            }
            if mode == .terminal { $0.field("wrongEvent", Int64(termBad)) }
        }
        termBad = 0
    }

    func writeHistogram(_ w: inout JSONWriter, _ key: String, _ h: BenchHistogram) {
        w.key(key)
        w.beginArray()
        for (i, c) in h.sparse {
            w.beginArray()
            w.int(Int64(i))
            w.int(Int64(c))
            w.endArray()
        }
        w.endArray()
    }
}

extension JSONValue {
    func int(_ key: String) -> Int? {
        if case .number(let d)? = self[key] { return Int(d) }
        return nil
    }
    func double(_ key: String) -> Double? {
        if case .number(let d)? = self[key] { return d }
        return nil
    }
    func string(_ key: String) -> String? {
        if case .string(let s)? = self[key] { return s }
        return nil
    }
    func bool(_ key: String) -> Bool? {
        if case .bool(let b)? = self[key] { return b }
        return nil
    }
}
