import CLibevent
import DispatchSystem
import Glibc

/// One libevent loop: timers, deferred work and signals, with Swift closures. Everything that
/// registers an event on it holds the loop, so the base is freed only after the last event.
public final class EventLoop {
    let base: OpaquePointer

    public init() {
        guard let base = event_base_new() else { fatalError("event_base_new failed") }
        self.base = base
    }

    deinit { event_base_free(base) }

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
    init(_ body: @escaping () -> Void) { self.body = body }
}

/// A timer or signal watcher; cancelling is idempotent. A one-shot timer keeps itself alive
/// until it fires or is cancelled; a repeating one lives as long as its owner holds it.
public final class Timer {
    /// Held so the loop's base outlives this event (`event_free` after `event_base_free` is a
    /// use-after-free).
    private let loop: EventLoop
    private var event: OpaquePointer?
    private let interval: Double
    private let body: () -> Void
    private var keepAlive: Timer?

    init(loop: EventLoop, interval: Double, repeating: Bool, body: @escaping () -> Void) {
        self.loop = loop
        self.interval = interval
        self.body = body
        let flags = Int16(repeating ? EV_PERSIST : 0)
        event = event_new(loop.base, -1, flags, { _, _, arg in
            let timer = Unmanaged<Timer>.fromOpaque(arg!).takeUnretainedValue()
            let held = timer.keepAlive
            timer.keepAlive = nil
            timer.body()
            _ = held
        }, Unmanaged.passUnretained(self).toOpaque())
        if !repeating { keepAlive = self }
    }

    init(loop: EventLoop, signal: Int32, body: @escaping () -> Void) {
        self.loop = loop
        self.interval = -1
        self.body = body
        event = event_new(loop.base, signal, Int16(EV_SIGNAL | EV_PERSIST), { _, _, arg in
            Unmanaged<Timer>.fromOpaque(arg!).takeUnretainedValue().body()
        }, Unmanaged.passUnretained(self).toOpaque())
    }

    func arm() {
        guard let event else { return }
        if interval < 0 { event_add(event, nil); return }
        var tv = timeval(seconds: interval)
        event_add(event, &tv)
    }

    public func cancel() {
        if let event { event_free(event) }
        event = nil
        keepAlive = nil
    }

    deinit { cancel() }
}

extension timeval {
    public init(seconds: Double) {
        let whole = seconds.rounded(.down)
        self.init(tv_sec: Int(whole), tv_usec: Int((seconds - whole) * 1_000_000))
    }
}
