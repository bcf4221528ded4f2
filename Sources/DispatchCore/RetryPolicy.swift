/// When an outbox delivery (a push, a webhook) is tried again: capped exponential backoff with
/// full jitter, so deliveries that failed together do not come back together. Pure: the caller
/// passes the random fraction.
public struct RetryPolicy: Equatable, Sendable {
    public var initial: Double
    public var maximum: Double

    public init(initial: Double, maximum: Double) {
        self.initial = initial
        self.maximum = maximum
    }

    /// Seconds to wait after the `attempt`-th failure (1 for the first), given `random` in
    /// [0, 1): a uniform pick in [cap/2, cap], where cap doubles per attempt up to `maximum`.
    public func delay(afterAttempt attempt: Int, random: Double) -> Double {
        let exponent = min(max(attempt - 1, 0), 62)
        let cap = min(maximum, initial * Double(1 << min(exponent, 30)))
        return cap / 2 + cap / 2 * min(max(random, 0), 0.999_999)
    }
}
