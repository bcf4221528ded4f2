/// Publishing commands, already validated.
public struct StartCommand: Equatable, Sendable {
    public var activityId: String?
    public var taskName: String
    public var systemImage: String?
    public var machine: String?
    public var cancelURL: String?
    public var initialProgress: Double?
    public var status: String?
    public var state: ActivityState
    /// Push-to-start a Live Activity on every registered iPhone.
    public var liveActivity: Bool
    /// Seconds without a change before the server ends it as stale; nil: the server's default.
    public var staleAfter: Int?
    /// Ask for an APNs broadcast channel (contract §5.5).
    public var broadcast = false

    public init(activityId: String? = nil, taskName: String, systemImage: String? = nil, machine: String? = nil,
                cancelURL: String? = nil, initialProgress: Double? = nil, status: String? = nil,
                state: ActivityState = .queued, liveActivity: Bool = false, staleAfter: Int? = nil) {
        self.activityId = activityId
        self.taskName = taskName
        self.systemImage = systemImage
        self.machine = machine
        self.cancelURL = cancelURL
        self.initialProgress = initialProgress
        self.status = status
        self.state = state
        self.liveActivity = liveActivity
        self.staleAfter = staleAfter
    }

    /// A canonical text of what the start asked for, stored to recognise an identical repeat.
    /// Fields added later are written only when given, so stored fingerprints stay valid.
    public var fingerprint: String {
        var w = JSONWriter()
        w.beginArray()
        w.string(taskName); w.field2(systemImage); w.field2(machine); w.field2(cancelURL)
        if let initialProgress { w.number(initialProgress) } else { w.null() }
        w.field2(status); w.string(state.rawValue)
        if liveActivity || staleAfter != nil { w.bool(liveActivity) }
        if let staleAfter { w.int(Int64(staleAfter)) }
        if broadcast { w.string("broadcast") }
        w.endArray()
        return w.string
    }
}

/// A field an update may leave alone, clear (JSON null), or set.
public enum Patch<Value: Equatable & Sendable>: Equatable, Sendable {
    case keep
    case set(Value?)

    func applied(to current: Value?) -> Value? {
        switch self {
        case .keep: return current
        case .set(let v): return v
        }
    }
}

public struct UpdateCommand: Equatable, Sendable {
    public var progress: Patch<Double>
    public var status: Patch<String>
    public var state: ActivityState

    public init(progress: Patch<Double> = .keep, status: Patch<String> = .keep, state: ActivityState = .processing) {
        self.progress = progress
        self.status = status
        self.state = state
    }
}

public struct EndCommand: Equatable, Sendable {
    public var progress: Patch<Double>
    public var status: Patch<String>
    public var state: ActivityState
    public var error: String?

    public init(progress: Patch<Double> = .keep, status: Patch<String> = .keep, state: ActivityState = .completed,
                error: String? = nil) {
        self.progress = progress
        self.status = status
        self.state = state
        self.error = error
    }

    public var fingerprint: String {
        var w = JSONWriter()
        w.beginArray()
        switch progress {
        case .keep: w.string("keep")
        case .set(let v): if let v { w.number(v) } else { w.null() }
        }
        switch status {
        case .keep: w.bool(false)  // not a string: a status may be the text "keep"
        case .set(let v): w.field2(v)
        }
        w.string(state.rawValue)
        w.field2(error)
        w.endArray()
        return w.string
    }
}

extension JSONWriter {
    mutating func field2(_ v: String?) { if let v { string(v) } else { null() } }
}

/// The activity state machine: pure decisions over a stored snapshot.
public enum ActivityMachine {
    /// What a start does to an activity that may already exist.
    public enum StartOutcome: Equatable, Sendable {
        case create(ActivityEvent)
        /// An identical start of a live activity: answer 200 with what is stored.
        case alreadyStarted(Activity)
    }

    public static func start(_ cmd: StartCommand, id: String, now: Int64) -> ActivityEvent {
        let snapshot = Activity(activityId: id, taskName: cmd.taskName, systemImage: cmd.systemImage,
                                machine: cmd.machine, cancelURL: cmd.cancelURL, state: cmd.state,
                                progress: cmd.initialProgress, status: cmd.status, attempt: 1, seq: 1,
                                liveActivity: cmd.liveActivity, createdAt: now, updatedAt: now, broadcast: cmd.broadcast)
        return ActivityEvent(name: .state(cmd.state), snapshot: snapshot)
    }

    /// A start for an id that exists: identical and live is fine, anything else conflicts.
    public static func restart(_ cmd: StartCommand, existing: Activity, storedFingerprint: String?) -> Result<Activity, DispatchError> {
        if existing.state.isTerminal {
            return .failure(DispatchError(.alreadyFinished, "activity \(existing.activityId) has already finished", snapshot: existing))
        }
        if storedFingerprint == cmd.fingerprint { return .success(existing) }
        return .failure(DispatchError(.conflict, "activity \(existing.activityId) already exists with different fields", snapshot: existing))
    }

    /// Which state a live activity may move to through an update (the contract's diagram):
    /// queued -> processing, processing <-> retrying, retrying -> queued, processing <-> idle;
    /// staying put is a progress/status update. Terminal states are reached only by `end`.
    public static func canMove(from: ActivityState, to: ActivityState) -> Bool {
        switch (from, to) {
        case (.queued, .queued), (.queued, .processing): return true
        case (.processing, .processing), (.processing, .retrying), (.processing, .idle): return true
        case (.retrying, .retrying), (.retrying, .processing), (.retrying, .queued): return true
        case (.idle, .idle), (.idle, .processing): return true
        case (.queued, .retrying), (.queued, .idle), (.processing, .queued), (.retrying, .idle),
             (.idle, .queued), (.idle, .retrying): return false
        case (_, .completed), (_, .error), (_, .cancelled), (_, .rejected): return false
        case (.completed, _), (.error, _), (.cancelled, _), (.rejected, _): return false
        }
    }

    /// Which terminal state an end may reach from a live state: `rejected` means refused
    /// before it ran, so only a queued activity can be rejected.
    public static func canEnd(from: ActivityState, as state: ActivityState) -> Bool {
        state != .rejected || from == .queued
    }

    public static func update(_ cmd: UpdateCommand, current: Activity, now: Int64) -> Result<ActivityEvent, DispatchError> {
        if current.state.isTerminal {
            return .failure(DispatchError(.alreadyFinished, "activity \(current.activityId) has already finished", snapshot: current))
        }
        guard canMove(from: current.state, to: cmd.state) else {
            return .failure(DispatchError(.invalidTransition,
                                          "an activity cannot move from \(current.state.rawValue) to \(cmd.state.rawValue)",
                                          snapshot: current))
        }
        var next = current
        if cmd.state == .retrying && current.state != .retrying { next.attempt += 1 }
        next.state = cmd.state
        next.progress = cmd.progress.applied(to: current.progress)
        next.status = cmd.status.applied(to: current.status)
        next.seq = current.seq + 1
        next.updatedAt = max(now, current.updatedAt)
        return .success(ActivityEvent(name: .state(cmd.state), snapshot: next))
    }

    public enum CancelOutcome: Equatable, Sendable {
        /// The first request: a `cancel_requested` event (state unchanged).
        case requested(ActivityEvent)
        /// Asked before: answer 202 with what is stored, write nothing.
        case alreadyRequested(Activity)
    }

    /// A remote cancel request: only the publisher ends the job; this tells it (and watchers).
    public static func cancel(current: Activity, reason: String? = nil, now: Int64) -> Result<CancelOutcome, DispatchError> {
        if current.state.isTerminal {
            return .failure(DispatchError(.alreadyFinished, "activity \(current.activityId) has already finished", snapshot: current))
        }
        if current.cancelRequested { return .success(.alreadyRequested(current)) }
        var next = current
        next.cancelRequested = true
        next.cancelReason = reason
        next.seq = current.seq + 1
        next.updatedAt = max(now, current.updatedAt)
        return .success(.requested(ActivityEvent(name: .cancelRequested, snapshot: next)))
    }

    public enum EndOutcome: Equatable, Sendable {
        case ended(ActivityEvent)
        /// The exact end that finished it, repeated: answer 200 with what is stored.
        case alreadyEnded(Activity)
    }

    public static func end(_ cmd: EndCommand, current: Activity, storedEndFingerprint: String?, now: Int64) -> Result<EndOutcome, DispatchError> {
        if current.state.isTerminal {
            if storedEndFingerprint == cmd.fingerprint { return .success(.alreadyEnded(current)) }
            return .failure(DispatchError(.alreadyFinished, "activity \(current.activityId) has already finished", snapshot: current))
        }
        guard canEnd(from: current.state, as: cmd.state) else {
            return .failure(DispatchError(.invalidTransition,
                                          "only a queued activity can end as rejected; this one is \(current.state.rawValue)",
                                          snapshot: current))
        }
        var next = current
        next.state = cmd.state
        switch cmd.progress {
        case .keep: next.progress = cmd.state == .completed ? 1 : current.progress
        case .set(let v): next.progress = v
        }
        next.status = cmd.status.applied(to: current.status)
        next.error = cmd.error
        next.seq = current.seq + 1
        next.updatedAt = max(now, current.updatedAt)
        next.endedAt = next.updatedAt
        return .success(.ended(ActivityEvent(name: .state(cmd.state), snapshot: next)))
    }
}
