#if canImport(Glibc)
import Glibc
#endif
import DispatchCore
import DispatchSystem
import DispatchCLIKit

/// `run`'s publishing thread: performs what `CLIRunPublishQueue` decides (start, progress,
/// touches, end, in that order, retried while the server is away) so the command never waits
/// for the network. The main thread offers progress and, when the command is over, the end.
final class RunPublisher: @unchecked Sendable {
    private let client: Client
    private var start: CLIStartOptions
    /// The start's machine is the host name run filled in (not the user's): dropped on a 403.
    private var machineGuessed: Bool
    private let activityID: String
    private var queue: CLIRunPublishQueue
    private var mutex = pthread_mutex_t()
    private var cond = pthread_cond_t()
    private var thread = pthread_t()
    private var endAnswer: HTTPResponse?

    /// The key of the step being tried: a retry of the same step sends the same one.
    private var key: (step: CLIRunPublishQueue.Step, value: String)?
    private var outageNoted = false
    private var warnedProgress = false
    private var warnedTouch = false
    private var lastFailure = ""

    init(client: Client, start: CLIStartOptions, machineGuessed: Bool = false) {
        self.machineGuessed = machineGuessed
        var c = client
        c.attemptTimeout = 5
        self.client = c
        self.start = start
        activityID = start.activityID ?? ""
        queue = CLIRunPublishQueue(touchInterval: start.staleAfter.map { CLIRunCancel.touchInterval(staleAfter: $0) }, now: Clock.monotonic())
        pthread_mutex_init(&mutex, nil)
        // Deadlines are monotonic: the condition waits on the same clock.
        var attributes = pthread_condattr_t()
        pthread_condattr_init(&attributes)
        pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
        pthread_cond_init(&cond, &attributes)
        pthread_condattr_destroy(&attributes)
        thread = spawnThread { [self] in loop() }
    }

    deinit {
        pthread_cond_destroy(&cond)
        pthread_mutex_destroy(&mutex)
    }

    /// The server accepted the start: the activity exists (its stream can be followed).
    var started: Bool { locked { queue.started } }

    func offer(_ progress: Double) {
        locked { queue.offer(progress: progress) }
        pthread_cond_signal(&cond)
    }

    func offer(status: String) {
        locked { queue.offer(status: status) }
        pthread_cond_signal(&cond)
    }

    /// Publishes `end` after what is pending, for at most `budget` seconds if the server keeps
    /// failing, and ends the thread. Returns the end's answer when it was accepted.
    func finish(_ end: CLIEndOptions, budget: Double) -> HTTPResponse? {
        var e = end
        e.activityID = activityID
        locked { queue.requestEnd(e, now: Clock.monotonic(), budget: budget) }
        pthread_cond_signal(&cond)
        pthread_join(thread, nil)
        return locked { endAnswer }
    }

    private func locked<T>(_ body: () -> T) -> T {
        pthread_mutex_lock(&mutex)
        defer { pthread_mutex_unlock(&mutex) }
        return body()
    }

    private func loop() {
        pthread_mutex_lock(&mutex)
        while true {
            switch queue.next(now: Clock.monotonic()) {
            case .finished:
                pthread_mutex_unlock(&mutex)
                return
            case .gaveUp:
                let started = queue.started
                pthread_mutex_unlock(&mutex)
                Output.fail("run", started ? "could not end activity \(activityID): \(lastFailure)"
                                           : "gave up publishing activity \(activityID): \(lastFailure); the command ran untracked")
                return
            case .wait(let until):
                if until == .infinity {
                    pthread_cond_wait(&cond, &mutex)
                } else {
                    var ts = timespec(tv_sec: Int(until.rounded(.down)), tv_nsec: Int((until - until.rounded(.down)) * 1e9))
                    pthread_cond_timedwait(&cond, &mutex, &ts)
                }
            case .send(let step):
                pthread_mutex_unlock(&mutex)
                let outcome = perform(step)
                pthread_mutex_lock(&mutex)
                let now = Clock.monotonic()
                switch outcome {
                case .success(let response):
                    queue.succeeded(step, now: now)
                    if case .end = step { endAnswer = response }
                case .transient:
                    queue.failed(step, transient: true, now: now)
                case .refused:
                    queue.failed(step, transient: false, now: now)
                }
                pthread_mutex_unlock(&mutex)
                report(step, outcome)
                pthread_mutex_lock(&mutex)
            }
        }
    }

    private func perform(_ step: CLIRunPublishQueue.Step) -> Client.Attempt {
        if key?.step != step { key = (step, System.randomKey()) }
        let idempotencyKey = key?.value
        switch step {
        case .start:
            let first = client.attempt(method: "POST", path: "/v1/activities/start", body: CLIRequestBody.start(start), idempotencyKey: idempotencyKey)
            guard case .refused(_, let response) = first,
                  CLIRunMachine.retryWithoutMachine(status: response?.head.status, guessed: machineGuessed) else { return first }
            machineGuessed = false
            start.machine = nil
            key = (step, System.randomKey())  // another body: another key
            return client.attempt(method: "POST", path: "/v1/activities/start", body: CLIRequestBody.start(start), idempotencyKey: key?.value)
        case .progress(let p):
            return client.attempt(method: "POST", path: Client.activityPath(activityID, "/update"),
                                  body: CLIRequestBody.update(CLIUpdateOptions(activityID: activityID, progress: p)), idempotencyKey: idempotencyKey)
        case .status(let line, let p):
            return client.attempt(method: "POST", path: Client.activityPath(activityID, "/update"),
                                  body: CLIRequestBody.update(CLIUpdateOptions(activityID: activityID, progress: p, status: line)),
                                  idempotencyKey: idempotencyKey)
        case .touch:
            return client.attempt(method: "POST", path: Client.activityPath(activityID, "/touch"), body: [], idempotencyKey: idempotencyKey)
        case .end(let e):
            return client.attempt(method: "POST", path: Client.activityPath(activityID, "/end"), body: CLIRequestBody.end(e), idempotencyKey: idempotencyKey)
        }
    }

    /// One line per outage (and one when it is over), and the refusals that matter.
    private func report(_ step: CLIRunPublishQueue.Step, _ outcome: Client.Attempt) {
        switch outcome {
        case .success:
            if outageNoted { Notes.show("run", "the server answers again; activity \(activityID) is caught up") }
            outageNoted = false
        case .transient(let message):
            lastFailure = message
            if !outageNoted {
                Notes.show("run", "\(message); the command runs on, and its activity is published when the server answers")
                outageNoted = true
            }
        case .refused(let message, let response):
            lastFailure = message
            switch step {
            case .start:
                Output.fail("run", "could not start activity \(activityID): \(message); the command runs untracked")
            case .progress, .status:
                if !warnedProgress { Output.fail("run", "progress update failed: \(message) (further failures are not reported)") }
                warnedProgress = true
            case .touch:
                // 404/409: the activity is over (ended elsewhere, or gone stale in an outage).
                if let s = response?.head.status, s == 404 || s == 409 { return }
                if !warnedTouch { Output.fail("run", "touch failed: \(message) (further failures are not reported)") }
                warnedTouch = true
            case .end:
                Output.fail("run", "could not end activity \(activityID): \(message)")
                if client.global.json, let body = response?.body, !body.isEmpty { client.printBody(body) }
            }
        }
    }
}
