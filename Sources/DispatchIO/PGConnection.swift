import DispatchSystem
import Glibc
@_exported import PGCore

/// An asynchronous libpq connection in pipeline mode, driven by the event loop.
///
/// The decisions (when to connect, what to send, which batch a result belongs to, what fails
/// when the connection is lost) are `PGConnectionMachine`'s; libpq and its socket are the
/// driver's (`PGDriver`: `LibpqDriver` in dispatchd, a scripted one in tests); this class
/// drives the driver and performs the machine's actions in one exhaustive switch. Owners must
/// `close()` it before letting it go: the driver's callbacks point at it.
public final class PGConnection {
    public typealias Completion = (Result<[PGResult], PGError>) -> Void

    public let name: String
    private let loop: LoopScheduling
    private let driver: PGDriver
    private let conninfo: String
    private let log: Logger
    private var machine: PGConnectionMachine<Completion>
    private var reconnectTimer: Timer?
    /// Calls the machine's `tick` a few times a second, from `start()` to `close()`.
    private var deadlineTimer: Timer?

    public var onReady: (() -> Void)?
    public var onLost: ((String) -> Void)?
    public var onNotify: ((String, String) -> Void)?
    /// Observes each batch's round-trip time in seconds (metrics).
    public var onRoundTrip: ((Double) -> Void)?
    /// A round trip or a connection attempt went past its deadline (metrics).
    public var onDeadlineMissed: (() -> Void)?

    public var isReady: Bool { machine.isReady }
    public var pendingBatches: Int { machine.queue.inFlightBatches }
    /// Whether a round trip is past its deadline right now.
    public var isOverdue: Bool { machine.isOverdue(now: loop.now) }
    public var timeout: Double { machine.timeout }

    /// `timeout`: seconds a caller waits for its batch (unless it passes its own) and a
    /// connection attempt may take.
    /// `priority`: of the session's socket events, so of the callbacks its results run in.
    public convenience init(loop: EventLoop, conninfo: String, name: String, log: Logger, timeout: Double = 5,
                            priority: EventPriority = .normal) {
        self.init(loop: loop, driver: LibpqDriver(loop: loop, priority: priority), conninfo: conninfo, name: name, log: log, timeout: timeout)
    }

    /// On any loop and driver: a test passes a manual loop and a scripted driver.
    public init(loop: LoopScheduling, driver: PGDriver, conninfo: String, name: String, log: Logger, timeout: Double = 5) {
        self.loop = loop
        self.driver = driver
        self.conninfo = conninfo
        self.name = name
        self.log = log
        machine = PGConnectionMachine(timeout: timeout)
    }

    deinit {
        precondition(machine.state == .idle || machine.state == .closed, "PGConnection \(name) released without close()")
    }

    public func start() {
        if deadlineTimer == nil {
            deadlineTimer = loop.timer(after: min(0.5, max(0.05, machine.timeout / 10)), repeating: true) { [weak self] in
                guard let self else { return }
                let actions = self.machine.tick(now: self.loop.now)
                if !actions.isEmpty { self.onDeadlineMissed?() }
                self.perform(actions)
            }
        }
        perform(machine.start(now: loop.now))
    }

    public func close() {
        reconnectTimer?.cancel()
        reconnectTimer = nil
        deadlineTimer?.cancel()
        deadlineTimer = nil
        perform(machine.close())
    }

    /// Drops the connection as if it were lost, for a session that is connected but no longer
    /// does its job (a LISTEN session whose notifications stopped): batches in flight fail,
    /// `onLost` runs, and it reconnects as after any loss.
    public func reset(_ reason: String) {
        guard machine.isReady else { return }
        perform(machine.connectionLost(reason))
    }

    /// Sends the statements as one pipeline batch; `completion` runs once, never inside this
    /// call, with a failure when no answer came within `timeout` seconds (the connection's own
    /// when nil).
    public func execute(_ queries: [PGQuery], timeout: Double? = nil, completion: @escaping Completion) {
        perform(machine.execute(queries, completion: completion, now: loop.now, timeout: timeout))
    }

    // MARK: - Performing the machine's actions

    private func perform(_ actions: [PGConnectionMachine<Completion>.Action]) {
        for action in actions {
            switch action {
            case .connect:
                connect()
            case .becomeReady:
                becomeReady()
            case .send(let commands):
                send(commands)
            case .complete(let completion, let results, let elapsed):
                onRoundTrip?(elapsed)
                completion(.success(results))
            case .fail(let completions, let error):
                // Later, outside whatever call brought us here (execute, a read, close).
                loop.soon { for c in completions { c(.failure(error)) } }
            case .closeConnection:
                closeConnection()
            case .reportLost(let reason):
                onLost?(reason)
            case .scheduleReconnect(let delay, let reason):
                log.warning("postgres.reconnect", [("conn", name), ("in_s", delay), ("error", reason.trimmingNewlines)])
                reconnectTimer = loop.timer(after: delay) { [weak self] in
                    guard let self else { return }
                    self.perform(self.machine.reconnectDue(now: self.loop.now))
                }
            }
        }
    }

    // MARK: - Driving the driver

    private func connect() {
        // application_name tells operators (and tests) which process and connection a backend serves.
        poll(driver.connect(conninfo: conninfo, applicationName: "dispatchd-\(getpid())-\(name)"))
    }

    private func poll(_ status: PGPollStatus) {
        switch status {
        case .connected:
            perform(machine.connected())
        case .failed(let reason):
            perform(machine.connectFailed(reason))
        case .reading, .writing:
            // The machine's connect deadline (tick) gives up on a server that never answers.
            driver.awaitSocket(status) { [unowned self] in
                guard self.driver.isOpen else { return }
                self.poll(self.driver.continueConnecting())
            }
        }
    }

    private func becomeReady() {
        guard driver.isOpen else { return }
        let entered = driver.enterPipelineMode { [unowned self] text in
            self.log.info("postgres.notice", [("conn", self.name), ("notice", text.trimmingNewlines)])
        }
        guard entered else {
            log.error("postgres.pipeline_failed", [("conn", name)])
            return perform(machine.connectionLost("cannot enter pipeline mode"))
        }
        driver.watchReadable { [unowned self] in self.readable() }
        log.info("postgres.connected", [("conn", name)])
        onReady?()
    }

    private func send(_ commands: [PGCommand]) {
        guard driver.isOpen else { return perform(machine.connectionLost("no connection")) }
        for command in commands {
            // The pipeline's state is unknown now: start over on a fresh connection.
            guard driver.send(command) else { return perform(machine.connectionLost("send failed: \(driver.errorMessage)")) }
        }
        flush()
    }

    private func flush() {
        guard driver.isOpen else { return }
        switch driver.flush() {
        case .done: break
        case .more: driver.awaitWritable { [unowned self] in self.flush() }
        case .failed: perform(machine.connectionLost(driver.errorMessage))
        }
    }

    /// The socket has input. libpq may hold only part of a result after reading it: results
    /// are taken while it is not busy, and the rest waits for the next readable socket.
    private func readable() {
        guard driver.isOpen else { return }
        guard driver.consumeInput() else { return perform(machine.connectionLost(driver.errorMessage)) }
        while driver.isOpen, machine.isReady, machine.queue.awaitingResults, !driver.isBusy {
            perform(machine.received(driver.nextResult(), now: loop.now))
        }
        guard driver.isOpen else { return }
        while let n = driver.nextNotification() {
            onNotify?(n.channel, n.payload)
            if !driver.isOpen { return }
        }
    }

    private func closeConnection() {
        driver.finish()
    }
}
