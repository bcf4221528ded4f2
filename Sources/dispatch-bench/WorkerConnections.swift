import CLibevent
import DispatchCore
import DispatchSystem
import DispatchBenchKit
#if canImport(Glibc)
import Glibc
#endif

/// The load generator's sockets: non-blocking connects spread over the loopback addresses,
/// libevent watches, buffered writes, reads into the parser, and how a connection ends.
extension Worker {
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
            let path = subPath.tail.map { subPath.head + String(conns[i].channel) + $0 } ?? subPath.head
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
}
