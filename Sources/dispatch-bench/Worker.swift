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
/// `batch`, `terminal`, `exit`. See `Orchestrator` for how they are combined.
final class Worker {
    enum Role: UInt8 { case subscriber, publisher, batch, terminal }
    enum Phase: UInt8 { case free, connecting, waiting, ready, closed }

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
    var serverClosed = 0
    var firstError = ""

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
    /// Open-loop publishing (`rate`): each connection sends one request per `pubInterval` ns,
    /// waiting when an answer comes early, so the server sees a steady rate (0: closed loop).
    var pubInterval: Int64 = 0
    var pubNextAt: [Int64] = []
    var pacedFD: [Int: Int32] = [:]
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
        var sa = sockaddr_in()
        sa.sin_family = sa_family_t(AF_INET)
        sa.sin_port = port.bigEndian
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
        conns[i].phase = .connecting
        conns[i].parser = BenchStreamParser()
        conns[i].sawEvent = false
        conns[i].lastSeq = -1
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
        if let ev = conns[i].ev { event_del(ev) }
        if conns[i].fd >= 0 { Glibc.close(conns[i].fd) }
        conns[i].fd = -1
        conns[i].phase = .free
        conns[i].parser = BenchStreamParser()
        conns[i].pendingOut = []
        freeSlots.append(i)
    }

    func closeAll() {
        for i in conns.indices where conns[i].phase != .free && conns[i].role == .subscriber { close(i) }
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
        guard i >= 0, i < conns.count, conns[i].phase != .free else { return }
        if conns[i].phase == .connecting {
            guard Int32(what) & EV_WRITE != 0 || Int32(what) & EV_READ != 0 else { return }
            var err: Int32 = 0
            var len = socklen_t(MemoryLayout<Int32>.size)
            getsockopt(conns[i].fd, SOL_SOCKET, SO_ERROR, &err, &len)
            if err != 0 {
                failed(i, "connect: \(String(cString: strerror(err)))")
                return
            }
            conns[i].phase = .waiting
            watch(i, write: false)
            connected(i)
            return
        }
        if Int32(what) & EV_WRITE != 0 && !conns[i].pendingOut.isEmpty { flush(i) }
        if Int32(what) & EV_READ != 0 { readable(i) }
    }

    func readable(_ i: Int) {
        var now: Int64 = 0
        while conns[i].phase != .free {
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
                if conns[i].phase != .free { closedByPeer(i) }
                return
            } else {
                if errno == EAGAIN || errno == EINTR { return }
                failed(i, "recv: \(String(cString: strerror(errno)))")
                return
            }
        }
    }

    func handle(_ i: Int, _ now: Int64) {
        for o in out {
            guard conns[i].phase != .free else { return }
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
        noteError(reason)
        let role = conns[i].role
        let phase = conns[i].phase
        close(i)
        switch role {
        case .subscriber:
            if phase == .ready { serverClosed += 1 } else { subscriberSettled(ready: false) }
        case .publisher, .batch, .terminal:
            reqErrors += 1
            reqActive -= 1
            restartRequester()
        }
    }

    func closedByPeer(_ i: Int) {
        switch conns[i].role {
        case .subscriber:
            if conns[i].phase == .ready {
                serverClosed += 1
                close(i)
            } else {
                failed(i, "closed by server before ready")
            }
        case .publisher, .batch, .terminal:
            let busy = conns[i].phase == .waiting && conns[i].sentAt != 0
            close(i)
            if busy { reqErrors += 1; noteError("closed by server mid-request") }
            reqActive -= 1
            restartRequester()
        }
    }

    func connected(_ i: Int) {
        switch conns[i].role {
        case .subscriber:
            let path = subPathTemplate.replacing("{ch}", with: String(conns[i].channel))
            send(i, Array("GET \(path) HTTP/1.1\r\nHost: bench\r\nAccept: text/event-stream\r\nCache-Control: no-cache\r\n\r\n".utf8))
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
        deliveries = 0
        hist.reset()
        fan = [:]
        gaps = 0; dups = 0; lostAtStart = 0; serverClosed = 0
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
            conns[i].channel = Int32((subFirst + subStarted) % subChannels)
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
            if status != 200 || !eventStream {
                failed(i, "subscribe answered \(status)\(eventStream ? "" : " (not text/event-stream)")")
                return
            }
            if !subNeedFirstEvent && conns[i].phase == .waiting {
                conns[i].phase = .ready
                subscriberSettled(ready: true)
            }
        case .event(let e):
            if e.kind == .notFound {
                failed(i, "stream answered not_found")
                return
            }
            let seq = e.seq >= 0 ? e.seq : e.id
            if seq < 0 { return }
            if !conns[i].sawEvent {
                conns[i].sawEvent = true
                let expectedFirst = subSeqAtSubscribe + 1
                if seq > expectedFirst { lostAtStart += seq - expectedFirst }
            } else if seq <= conns[i].lastSeq {
                dups += 1
            } else if seq > conns[i].lastSeq + 1 {
                gaps += seq - conns[i].lastSeq - 1
            }
            conns[i].lastSeq = max(conns[i].lastSeq, seq)
            if conns[i].phase == .waiting {
                conns[i].phase = .ready
                subscriberSettled(ready: true)
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
            // A Dispatch stream ends after the terminal event; nothing more will come.
            if conns[i].phase == .ready { serverClosed += 1; close(i) } else { failed(i, "stream ended before ready") }
        case .malformed:
            failed(i, "malformed response")
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
        for c in conns where c.role == .subscriber && c.phase == .ready {
            let ch = Int(c.channel)
            guard ch < finals.count else { continue }
            checked += 1
            if c.lastSeq < finals[ch] { missing += finals[ch] - max(c.lastSeq, subSeqAtSubscribe) }
            if c.lastSeq > finals[ch] { extra += c.lastSeq - finals[ch] }
        }
        emit {
            $0.field("ev", "verify")
            $0.field("missing", missing)
            $0.field("extra", extra)
            $0.field("checked", Int64(checked))
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
            $0.field("open", Int64(conns.reduce(0) { $0 + ($1.phase == .ready ? 1 : 0) }))
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
        if connect(i) { reqActive += 1 } else { close(i); reqErrors += 1 }
    }

    /// After a requester connection closed: open a new one while there is work left.
    func restartRequester() {
        if hasMoreWork() && reqActive < 4096 && !reqDone {
            let slot = freeSlotForRestart()
            openRequester(slot: slot)
        }
        if reqActive <= 0 { finishRequests() }
    }

    func freeSlotForRestart() -> Int {
        // Publisher slots own channels; reuse the first slot no live connection holds.
        guard reqMode == .publisher else { return 0 }
        var used = Set<Int32>()
        for c in conns where c.role == .publisher && c.phase != .free { used.insert(c.channel) }
        for s in 0..<pubCursor.count where !used.contains(Int32(s)) { return s }
        return 0
    }

    func hasMoreWork() -> Bool {
        switch reqMode {
        case .batch: return batchNext < batchRequests.count
        case .publisher, .terminal: return Clock.wallNanoseconds() < reqDeadline
        case .subscriber: return false
        }
    }

    func nextRequest(_ i: Int) {
        guard hasMoreWork() else {
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
            if pubInterval > 0, slot < pubNextAt.count {
                if now < pubNextAt[slot] { return pace(i, until: pubNextAt[slot], now: now) }
                pubNextAt[slot] += pubInterval
            }
            let nConns = pubCursor.count
            // A slot owns channels slot, slot + nConns, ...; it publishes to them in turn,
            // so each channel has one publisher and its order is well defined.
            var ch = pubCursor[slot]
            if ch >= pubChannelNames.count { ch = slot % max(1, pubChannelNames.count) }
            var next = ch + nConns
            if next >= pubChannelNames.count { next = slot % max(1, pubChannelNames.count) }
            pubCursor[slot] = next
            conns[i].lastSeq = Int64(ch)
            let name = pubChannelNames[ch]
            if reqTarget == "nchan" {
                let seq = pubNextSeq[ch]
                let body = Self.nchanMessage(id: name, seq: seq, t: now)
                req = Self.request("POST", "/pub/\(name)", body: body, auth: "")
            } else {
                req = Self.request("POST", "/v1/activities/\(name)/update",
                                   body: "{\"progress\":0.5,\"status\":\"t=\(now)\"}", auth: reqAuth)
            }
        case .batch:
            let r = batchRequests[batchNext]
            conns[i].lastSeq = Int64(batchNext)
            batchNext += 1
            req = Self.request(r.method, r.path, body: r.body, auth: reqAuth)
        case .terminal:
            let path = termPaths.isEmpty ? "/" : termPaths[termCursor % termPaths.count]
            termCursor &+= 1
            req = Array("GET \(path) HTTP/1.1\r\nHost: bench\r\nAccept: text/event-stream\r\n\r\n".utf8)
            if reqTarget == "nchan" {
                req = Array("GET \(path) HTTP/1.1\r\nHost: bench\r\n\r\n".utf8)
            }
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
        pacedFD[i] = conns[i].fd
        var tv = timeval(tv_sec: Int((until - now) / 1_000_000_000), tv_usec: Int((until - now) % 1_000_000_000 / 1000))
        event_base_once(base, -1, Int16(EV_TIMEOUT), { _, _, arg in currentWorker?.paced(Int(bitPattern: arg) - 1) },
                        UnsafeMutableRawPointer(bitPattern: i + 1), &tv)
    }

    func paced(_ i: Int) {
        guard let fd = pacedFD.removeValue(forKey: i), i < conns.count, conns[i].fd == fd, conns[i].phase != .free else { return }
        nextRequest(i)
    }

    static func request(_ method: String, _ path: String, body: String, auth: String) -> [UInt8] {
        var s = "\(method) \(path) HTTP/1.1\r\nHost: bench\r\n"
        if !auth.isEmpty { s += "Authorization: Bearer \(auth)\r\n" }
        if method == "POST" || !body.isEmpty {
            s += "Content-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n"
        }
        s += "\r\n"
        s += body
        return Array(s.utf8)
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
        case .event(let e):
            conns[i].sawEvent = true
            switch reqMode {
            case .publisher:
                let ch = Int(conns[i].lastSeq)
                if reqTarget == "nchan" {
                    pubFinal[ch] = pubNextSeq[ch]
                } else if e.seq > 0 {
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
                if ok {
                    reqCount += 1
                    pubAckHist.record(now - conns[i].sentAt)
                    if reqTarget == "nchan" { pubNextSeq[Int(conns[i].lastSeq)] += 1 }
                } else {
                    reqErrors += 1
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
                close(i)
                reqActive -= 1
                restartRequester()
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
