import CLibevent
import DispatchCore
import DispatchSystem
import DispatchBenchKit
#if canImport(Glibc)
import Glibc
#endif

/// The load generator's requesters: closed-loop publishers (paced, retried, idempotent), setup
/// batches and terminal streams, and their report.
extension Worker {
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
            pubBatch = reqTarget == "nchan" ? 0 : max(0, v.int("batch") ?? 0)
            pubBatchChannels = Array(repeating: [], count: connsWanted)
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
            if pubBatch > 0 {
                // This channel and the slot's next ones, pubBatch in all (a slot owns at least
                // that many: the runner sizes the connections so), one change each.
                var chs = [ch]
                while chs.count < pubBatch {
                    var c = pubCursor[slot]
                    if c >= pubChannelNames.count { c = slot % max(1, pubChannelNames.count) }
                    var next = c + pubCursor.count
                    if next >= pubChannelNames.count { next = slot % max(1, pubChannelNames.count) }
                    pubCursor[slot] = next
                    if chs.contains(c) { break }
                    chs.append(c)
                }
                pubBatchChannels[slot] = chs
                var body = "{\"changes\":["
                for (j, c) in chs.enumerated() {
                    if j > 0 { body += "," }
                    body += "{\"op\":\"update\",\"activityId\":\"\(pubChannelNames[c])\",\"progress\":0.5,\"status\":\"t=\(now)\"}"
                }
                body += "]}"
                req = Self.request("POST", "/v1/changes", body: body, auth: reqAuth)
            } else if reqTarget == "nchan" {
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
                if reqTarget != "nchan", pubBatch == 0, e.seq > 0, (200...299).contains(Int(conns[i].status)) {
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
                if ok && pubBatch > 0 && slot < pubBatchChannels.count {
                    // Every change of the batch is taken as applied: a refused one shows up as
                    // events the subscribers never get (lost).
                    pubAckHist.record(now - conns[i].sentAt)
                    for c in pubBatchChannels[slot] {
                        reqCount += 1
                        pubFinal[c] = pubNextSeq[c]
                        pubNextSeq[c] += 1
                        pubAcked[c] += 1
                    }
                    pubBatchChannels[slot] = []
                    if slot < pubPending.count { pubPending[slot] = -1 }
                } else if ok {
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
