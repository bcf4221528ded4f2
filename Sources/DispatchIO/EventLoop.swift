import CLibevent
import DispatchSystem
import Glibc

/// What a shell needs of its loop: the time, work deferred to a later turn, and timers.
/// `EventLoop` is the one dispatchd runs; a test steps DispatchHarness's `ManualLoop` instead,
/// with a clock that moves only when told.
public protocol LoopScheduling: AnyObject {
    /// Monotonic seconds.
    var now: Double { get }
    /// Runs `body` on a later turn of the loop, outside whatever callback is running now.
    func soon(_ body: @escaping () -> Void)
    /// `soon` at a priority (`.background`: on a turn when nothing of `.normal` is ready).
    func soon(_ priority: EventPriority, _ body: @escaping () -> Void)
    func timer(after seconds: Double, repeating: Bool, _ body: @escaping () -> Void) -> Timer
}

extension LoopScheduling {
    /// A loop without priorities (a test's manual loop) runs it as any deferred work, in order.
    public func soon(_ priority: EventPriority, _ body: @escaping () -> Void) { soon(body) }

    @discardableResult
    public func timer(after seconds: Double, _ body: @escaping () -> Void) -> Timer {
        timer(after: seconds, repeating: false, body)
    }
}

/// Which of the loop's ready events run first. libevent runs the ready callbacks of the most
/// urgent priority that has any, then looks at the sockets again: an event of `.background`
/// runs only on a turn when nothing of `.normal` is ready. Bulk transfers (a feed's initial set)
/// take `.background`, so requests and live changes never wait behind their pages.
public enum EventPriority: Int32, Sendable {
    /// Latency-bound I/O whose own callbacks are short (the APNs connection's answers).
    case urgent = 0
    case normal = 1
    case background = 2
    /// Priorities the base is made with; an event gets the middle one (`.normal`) by default.
    static let count: Int32 = 3
}

/// One libevent loop: timers, deferred work and signals, with Swift closures. Everything that
/// registers an event on it holds the loop, so the base is freed only after the last event.
public final class EventLoop: LoopScheduling {
    let base: OpaquePointer

    public init() {
        guard let base = event_base_new() else { fatalError("event_base_new failed") }
        // Before any event is added: every event made after it defaults to `.normal`.
        guard event_base_priority_init(base, EventPriority.count) == 0 else { fatalError("event_base_priority_init failed") }
        self.base = base
    }

    deinit { event_base_free(base) }

    public var now: Double { Clock.monotonic() }

    public func run() { event_base_dispatch(base) }
    public func stop() { event_base_loopbreak(base) }

    /// Runs `body` on a later turn of the loop, outside whatever callback is running now.
    public func soon(_ body: @escaping () -> Void) {
        let box = Unmanaged.passRetained(ClosureBox(body)).toOpaque()
        var zero = timeval(tv_sec: 0, tv_usec: 0)
        event_base_once(base, -1, Int16(EV_TIMEOUT), { _, _, arg in
            let box = Unmanaged<ClosureBox>.fromOpaque(arg!).takeRetainedValue()
            box.body()
        }, box, &zero)
    }

    /// `soon` at a priority: with `.background`, on a turn when nothing of `.normal` is ready.
    public func soon(_ priority: EventPriority, _ body: @escaping () -> Void) {
        // The default priority needs no event of its own (`soon` is every stream's drain path).
        guard priority != .normal else { return soon(body) }
        let box = ClosureBox(body)
        // A one-shot event that frees itself (event_base_once takes no priority).
        var event: OpaquePointer?
        event = event_new(base, -1, 0, { _, _, arg in
            let box = Unmanaged<ClosureBox>.fromOpaque(arg!).takeRetainedValue()
            if let event = box.event { event_free(event) }
            box.body()
        }, Unmanaged.passRetained(box).toOpaque())
        guard let event else { fatalError("event_new failed") }
        box.event = event
        event_priority_set(event, priority.rawValue)
        event_active(event, EV_TIMEOUT, 0)
    }

    @discardableResult
    public func timer(after seconds: Double, repeating: Bool = false, _ body: @escaping () -> Void) -> Timer {
        let t = Timer(loop: self, interval: seconds, repeating: repeating, body: body)
        t.arm()
        return t
    }

    /// Calls `body` when the process receives `signal` (handled inside the loop, not async).
    @discardableResult
    public func onSignal(_ signal: Int32, _ body: @escaping () -> Void) -> Timer {
        let t = Timer(loop: self, signal: signal, body: body)
        t.arm()
        return t
    }
}

final class ClosureBox {
    let body: () -> Void
    /// The one-shot event carrying it, when it frees itself (`soon(_:_:)`).
    var event: OpaquePointer?
    init(_ body: @escaping () -> Void) { self.body = body }
}

/// A timer or signal watcher; cancelling is idempotent. A one-shot timer keeps itself alive
/// until it fires or is cancelled; a repeating one lives as long as its owner holds it.
public final class Timer {
    /// Held so the loop's base outlives this event (`event_free` after `event_base_free` is a
    /// use-after-free). Nil for a timer another scheduler fires.
    private let loop: EventLoop?
    private var event: OpaquePointer?
    /// Seconds until it fires (never negative); nil for a signal watcher.
    private let interval: Double?
    private let body: () -> Void
    private var keepAlive: Timer?
    public private(set) var isCancelled = false

    init(loop: EventLoop, interval: Double, repeating: Bool, body: @escaping () -> Void) {
        self.loop = loop
        // A deadline computed as `until - now` can be just past: it is due now, not never.
        self.interval = max(0, interval)
        self.body = body
        let flags = Int16(repeating ? EV_PERSIST : 0)
        event = event_new(loop.base, -1, flags, { _, _, arg in
            Unmanaged<Timer>.fromOpaque(arg!).takeUnretainedValue().fire()
        }, Unmanaged.passUnretained(self).toOpaque())
        if !repeating { keepAlive = self }
    }

    /// A timer that another scheduler (a test's manual loop) fires by calling `fire()`.
    public init(interval: Double, repeating: Bool, body: @escaping () -> Void) {
        loop = nil
        self.interval = max(0, interval)
        self.body = body
        if !repeating { keepAlive = self }
    }

    init(loop: EventLoop, signal: Int32, body: @escaping () -> Void) {
        self.loop = loop
        self.interval = nil
        self.body = body
        event = event_new(loop.base, signal, Int16(EV_SIGNAL | EV_PERSIST), { _, _, arg in
            Unmanaged<Timer>.fromOpaque(arg!).takeUnretainedValue().body()
        }, Unmanaged.passUnretained(self).toOpaque())
    }

    func arm() {
        guard let event else { return }
        guard let interval else { event_add(event, nil); return }
        var tv = timeval(seconds: interval)
        event_add(event, &tv)
    }

    /// The timer is due: runs its body (a one-shot stops holding itself first).
    public func fire() {
        guard !isCancelled else { return }
        let held = keepAlive
        keepAlive = nil
        body()
        _ = held
    }

    public func cancel() {
        if let event { event_free(event) }
        event = nil
        keepAlive = nil
        isCancelled = true
    }

    deinit { cancel() }
}

extension timeval {
    public init(seconds: Double) {
        let whole = seconds.rounded(.down)
        self.init(tv_sec: Int(whole), tv_usec: Int((seconds - whole) * 1_000_000))
    }
}

/// Keeps an `.urgent` source from starving the loop: past `floodTurn` completions in one turn
/// (more arrived than the loop drains between polls), the source drops to `.normal` and shares
/// turns fairly; once a turn brings at most half that, it is urgent again. libevent runs a
/// lower priority only on turns when no higher one is ready, so a source that is always ready
/// must not stay above the rest.
public struct UrgencyGovernor: Sendable {
    public let floodTurn: Int
    public private(set) var priority: EventPriority

    public init(preferred: EventPriority, floodTurn: Int = 64) {
        self.floodTurn = max(2, floodTurn)
        priority = preferred
        self.preferred = preferred
    }

    private let preferred: EventPriority

    /// A turn of the source handled `completed` items; true when its priority changed.
    public mutating func turn(completed: Int) -> Bool {
        guard preferred == .urgent else { return false }
        if priority == .urgent && completed >= floodTurn {
            priority = .normal
            return true
        }
        if priority == .normal && completed <= floodTurn / 2 {
            priority = .urgent
            return true
        }
        return false
    }
}
