import DispatchIO

/// A `PGDriver` that plays the server from a test's script, with no database and no socket.
///
/// It models what matters of libpq's reading: bytes the server sent sit on the socket until
/// `consumeInput`; a result is returned only once whole, so a read that ends inside one
/// leaves the connection busy (`PQisBusy`) until the next read brings the rest. A call libpq
/// would answer by blocking or by misbehaving (a result taken while busy, a read after
/// `finish`) is recorded in `violations`, which a test expects empty.
public final class ScriptedPGDriver: PGDriver {
    /// What a test lets the server send on the socket.
    public enum Wire {
        case input(PGInput)
        /// Part of a result: libpq holds it until the rest arrives.
        case partialResult
        case notification(channel: String, payload: String)
    }

    public private(set) var isOpen = false
    public private(set) var errorMessage = "no connection"
    /// Every command sent, on every connection, in order.
    public private(set) var sent: [PGCommand] = []
    /// Calls a well-behaved shell never makes.
    public private(set) var violations: [String] = []
    public private(set) var connects = 0
    public private(set) var finishes = 0

    /// How the next attempts go, one entry each (`continueConnecting`); when empty, an attempt
    /// connects at its first poll.
    public var connectScript: [PGPollStatus] = []
    public var refusePipelineMode = false
    /// The next `send` calls fail (libpq refused the command) while positive.
    public var failingSends = 0
    /// What the next `flush` calls return, in order; `.done` when empty.
    public var flushScript: [PGFlushStatus] = []

    private var onSocket: (() -> Void)?
    private var onReadable: (() -> Void)?
    private var onWritable: (() -> Void)?
    private var onNotice: ((String) -> Void)?
    /// Sent by the server, not yet read into libpq.
    private var socket: [Wire] = []
    /// Read into libpq.
    private var buffered: [Wire] = []
    private var brokenReason: String?

    public init() {}

    // MARK: - What a test does

    /// Whether the shell waits on the socket for its connection attempt.
    public var awaitingSocket: Bool { onSocket != nil }
    public var watchingReads: Bool { onReadable != nil }
    public var awaitingWritable: Bool { onWritable != nil }

    /// The connection attempt's socket became ready.
    public func socketReady() {
        guard let ready = onSocket else { return violation("socket ready with no attempt waiting") }
        onSocket = nil
        ready()
    }

    /// The server sends `wire`; the socket becomes readable (unless `readable` is false).
    public func arrive(_ wire: [Wire], readable: Bool = true) {
        socket += wire
        if readable { fireReadable() }
    }

    /// The socket reports input (a read callback from the loop).
    public func fireReadable() {
        onReadable?()
    }

    /// The socket can take output again.
    public func fireWritable() {
        guard let writable = onWritable else { return }
        onWritable = nil
        writable()
    }

    /// The connection breaks: the next read fails with `reason`; the socket reports it.
    public func breakConnection(_ reason: String = "server closed the connection unexpectedly") {
        brokenReason = reason
        fireReadable()
    }

    /// A server notice, as libpq's notice processor passes it.
    public func notice(_ text: String) { onNotice?(text) }

    // MARK: - PGDriver

    public func connect(conninfo: String, applicationName: String) -> PGPollStatus {
        if isOpen { violation("connect while a connection is open") }
        connects += 1
        isOpen = true
        brokenReason = nil
        socket = []
        buffered = []
        errorMessage = ""
        return .writing
    }

    public func continueConnecting() -> PGPollStatus {
        guard isOpen else { violation("connect poll after finish"); return .failed("no connection") }
        let status = connectScript.isEmpty ? .connected : connectScript.removeFirst()
        if case .failed(let reason) = status { errorMessage = reason }
        return status
    }

    public func awaitSocket(_ status: PGPollStatus, _ ready: @escaping () -> Void) {
        guard isOpen else { return violation("socket wait after finish") }
        onSocket = ready
    }

    public func enterPipelineMode(notice: @escaping (String) -> Void) -> Bool {
        onNotice = notice
        return !refusePipelineMode
    }

    public func watchReadable(_ readable: @escaping () -> Void) {
        guard isOpen else { return violation("read watch after finish") }
        onReadable = readable
    }

    public func send(_ command: PGCommand) -> Bool {
        guard isOpen else { violation("send after finish"); return false }
        if failingSends > 0 {
            failingSends -= 1
            errorMessage = "another command is already in progress"
            return false
        }
        sent.append(command)
        return true
    }

    public func flush() -> PGFlushStatus {
        guard isOpen else { violation("flush after finish"); return .failed }
        let status = flushScript.isEmpty ? .done : flushScript.removeFirst()
        if status == .failed { errorMessage = "could not send data to server: Broken pipe" }
        return status
    }

    public func awaitWritable(_ writable: @escaping () -> Void) {
        onWritable = writable
    }

    public func consumeInput() -> Bool {
        guard isOpen else { violation("read after finish"); return false }
        if let reason = brokenReason {
            errorMessage = reason
            return false
        }
        // A partial result already buffered is completed by what arrives now: drop its marker.
        if buffered.last.map(isPartial) == true, !socket.isEmpty { buffered.removeLast() }
        buffered += socket
        socket = []
        return true
    }

    /// Nothing whole to return: libpq would wait for more input (the shell asks only while
    /// the pipeline awaits an answer), or a result is only partly read.
    public var isBusy: Bool {
        guard let first = buffered.first(where: { !isNotification($0) }) else { return true }
        return isPartial(first)
    }

    public func nextResult() -> PGInput {
        guard isOpen else { violation("result taken after finish"); return .endOfQuery }
        guard let i = buffered.firstIndex(where: { !isNotification($0) }), case .input(let input) = buffered[i] else {
            // libpq would block the loop here. Answer with an error result, which the
            // pipeline rejects as out of place, so a broken shell fails its test, not hangs.
            violation("result taken while busy (libpq would block)")
            return .result(.failure("scripted driver: result taken while busy", sqlState: nil))
        }
        buffered.remove(at: i)
        return input
    }

    public func nextNotification() -> (channel: String, payload: String)? {
        guard let i = buffered.firstIndex(where: isNotification), case .notification(let c, let p) = buffered[i] else { return nil }
        buffered.remove(at: i)
        return (c, p)
    }

    public func finish() {
        finishes += 1
        isOpen = false
        onSocket = nil
        onReadable = nil
        onWritable = nil
        onNotice = nil
        socket = []
        buffered = []
    }

    // MARK: -

    private func isPartial(_ w: Wire) -> Bool {
        if case .partialResult = w { return true }
        return false
    }

    private func isNotification(_ w: Wire) -> Bool {
        if case .notification = w { return true }
        return false
    }

    private func violation(_ what: String) { violations.append(what) }
}
