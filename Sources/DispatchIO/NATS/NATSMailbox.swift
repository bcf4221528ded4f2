import CNats
import DispatchSystem
import Glibc

/// What the NATS library's threads hand to the loop.
enum NATSEvent {
    /// `subscription` names the subscription it arrived on, so a message already on its way
    /// when the loop unsubscribed is not delivered.
    case message(subscription: Int, subject: String, payload: [UInt8])
    case status(NATSClient.Status)
    case dropped(String)
}

/// The one place where the library's threads meet the loop: a locked queue plus an eventfd
/// the loop watches. Producers (the library's delivery, callback and reconnect threads) only
/// append under the lock and, on the empty → non-empty edge, write the eventfd; they never
/// wait for the loop, so the loop may call into the library (publish, close, which joins the
/// library's threads) without a deadlock. The loop never holds this lock while calling the
/// library. The library holds one retain per registration (the connection, each subscription)
/// and gives it back in its last callback, so the box, and its eventfd, outlive every thread
/// that might still post.
final class NATSMailbox: @unchecked Sendable {
    let fd: Int32
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private var queue: [NATSEvent] = []
    private var head = 0
    /// Messages (not statuses or drop notices) queued, and their payload bytes.
    private var messages = 0
    private var bytes = 0
    private let maxMessages: Int
    private let maxBytes: Int
    /// The eventfd has been written and the loop has not yet emptied the queue.
    private var signalled = false
    private var shut = false
    /// The reconnect backoff's bounds: set before the connection starts, then only read (by
    /// the library's reconnect thread).
    var reconnectBase = 0.25
    var reconnectMax = 8.0
    /// Messages refused because the queue was full (read by the loop for the figures).
    private(set) var refused = 0

    init(maxMessages: Int, maxBytes: Int) throws(SystemError) {
        let fd = eventfd(0, Int32(EFD_NONBLOCK | EFD_CLOEXEC))
        guard fd >= 0 else { throw SystemError("cannot create an eventfd for NATS", errno: errno) }
        self.fd = fd
        self.maxMessages = max(1, maxMessages)
        self.maxBytes = max(1, maxBytes)
        mutex = .allocate(capacity: 1)
        pthread_mutex_init(mutex, nil)
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
        close(fd)
    }

    /// From any thread. A message past the queue's limits is dropped and leaves one drop
    /// notice in its place (one per run of drops), so the loop learns where the gap is.
    func post(_ event: NATSEvent) {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        if shut { return }
        switch event {
        case .message(_, _, let payload):
            if messages + 1 > maxMessages || bytes + payload.count > maxBytes {
                refused += 1
                if case .dropped? = queue.last, queue.count > head { return }
                queue.append(.dropped("slow consumer: the loop's hand-off queue is full"))
            } else {
                messages += 1
                bytes += payload.count
                queue.append(event)
            }
        case .status, .dropped:
            queue.append(event)
        }
        if !signalled {
            signalled = true
            // Under the lock: the loop closes nothing here, but shut() must not race a write.
            ring()
        }
    }

    /// On the loop: up to `limit` events, oldest first, and whether more wait. When more wait,
    /// the eventfd is written again so the loop comes back after the other ready events.
    func take(_ limit: Int) -> [NATSEvent] {
        var drained: UInt64 = 0
        _ = read(fd, &drained, 8)
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        let n = min(limit, queue.count - head)
        let batch = Array(queue[head..<head + n])
        head += n
        for event in batch {
            if case .message(_, _, let payload) = event {
                messages -= 1
                bytes -= payload.count
            }
        }
        if head == queue.count {
            queue.removeAll(keepingCapacity: queue.capacity <= 4096)
            head = 0
            signalled = false
        } else {
            if head > 1024 && head * 2 > queue.count {
                queue.removeFirst(head)
                head = 0
            }
            ring()
        }
        return batch
    }

    var refusedCount: Int {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return refused
    }

    /// No event is accepted after this; what is queued is forgotten.
    func shutDown() {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        shut = true
        queue = []
        head = 0
        messages = 0
        bytes = 0
    }

    private func ring() {
        var one: UInt64 = 1
        _ = write(fd, &one, 8)
    }
}
