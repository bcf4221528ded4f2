// Every role (subscriber, publisher, terminal, batch) shares one compact connection table and
// one set of libevent callbacks, so a process can hold ~18k sockets: that state is declared
// here, with the command loop; the work is split by concern into WorkerConnections,
// WorkerSubscribers and WorkerRequests.
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
    /// The stream path around its `{ch}` (split once: replacing per connect cost the client
    /// more than the server's whole accept).
    var subPath: (head: String, tail: String?) = ("/", nil)
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
    /// Changes per request through `POST /v1/changes` (0: one single update per request).
    var pubBatch = 0
    /// Per slot, the channels its request in flight changes (batch mode).
    var pubBatchChannels: [[Int]] = []
    /// Connections waiting to send their next request: their `token` then.
    var pacedFD: [Int: UInt32] = [:]
    var batchRequests: [(method: String, path: String, body: String)] = []
    var batchNext = 0
    var batchStatus: [Int: Int] = [:]
    var termPaths: [String] = []
    var termCursor = 0
    var termExpectTerminal = true
    /// Terminal streams whose last event was not the terminal one.
    var termBad = 0

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
