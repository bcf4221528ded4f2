/// How long to wait before trying again after the `attempt`-th failure in a row (1 for the
/// first): `initial`, doubling per attempt, never above `maximum`; pure. With `.equal` jitter
/// the wait is a uniform pick in [step/2, step], so deliveries that failed together do not come
/// back together. The randomness comes from the caller (a fraction, or a generator it owns: a
/// `SeededGenerator` in tests), never from here.
///
/// Used by the PostgreSQL driver's reconnects, the webhook, push and broadcast outboxes and
/// the CLI's retries; each keeps its own bounds.
public struct Backoff: Equatable, Sendable {
    public enum Jitter: Equatable, Sendable {
        /// Exactly the step: a reconnect loop, a CLI retry.
        case none
        /// A uniform pick in [step/2, step].
        case equal
    }

    public var initial: Double
    public var maximum: Double
    public var jitter: Jitter

    public init(initial: Double, maximum: Double, jitter: Jitter = .none) {
        self.initial = initial
        self.maximum = maximum
        self.jitter = jitter
    }

    /// `initial · 2^(attempt−1)`, capped at `maximum`; attempts below 1 count as 1.
    public func step(afterAttempt attempt: Int) -> Double {
        let doublings = min(max(attempt, 1) - 1, 1000)
        let grown = initial * Double(sign: .plus, exponent: doublings, significand: 1)
        return min(grown, maximum)
    }

    /// The wait after the `attempt`-th failure, with `random` in [0, 1) as the jitter's draw
    /// (ignored without jitter; clamped into [0, 1)).
    public func delay(afterAttempt attempt: Int, random: Double) -> Double {
        let step = step(afterAttempt: attempt)
        switch jitter {
        case .none:
            return step
        case .equal:
            let r = random.isNaN ? 0 : min(max(random, 0), 0.999_999)
            return step / 2 + step / 2 * r
        }
    }

    /// The wait after the `attempt`-th failure, the jitter drawn from `generator`.
    public func delay<G: RandomNumberGenerator>(afterAttempt attempt: Int, using generator: inout G) -> Double {
        delay(afterAttempt: attempt, random: Double.random(in: 0..<1, using: &generator))
    }
}

/// SplitMix64: a small, fast generator whose sequence is fixed by its seed, for tests and
/// simulations that must replay (the same seed, the same jitter, the same disconnect points).
/// Not for secrets.
public struct SeededGenerator: RandomNumberGenerator, Sendable {
    public private(set) var state: UInt64

    public init(seed: UInt64) { state = seed }

    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
