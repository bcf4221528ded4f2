import CLibevent
import DispatchCore
import DispatchSystem
import DispatchBenchKit
#if canImport(Glibc)
import Glibc
#endif

/// The load generator's subscribers: opening streams at a bounded pace, checking every event
/// (order, gaps, duplicates, latency), reconnecting like an EventSource, and their reports.
extension Worker {
    func startSubscribe(_ v: JSONValue) {
        subTotal = v.int("count") ?? 0
        subStarted = 0
        subInflight = 0
        subReady = 0
        subFailed = 0
        subMaxInflight = v.int("inflight") ?? 500
        let template = v.string("path") ?? "/"
        if let ch = template.firstRange(of: "{ch}") {
            subPath = (String(template[..<ch.lowerBound]), String(template[ch.upperBound...]))
        } else {
            subPath = (template, nil)
        }
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
}
