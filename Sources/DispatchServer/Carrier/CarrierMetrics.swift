/// The NATS carrier's figures for one worker (rendered into `/metrics` with the worker's).
final class CarrierMetrics {
    var up = false
    var messagesIn = 0
    var messagesOut = 0
    var bytesIn = 0
    var bytesOut = 0
    /// Messages the client dropped (slow consumer) or could not buffer.
    var dropped = 0
    var reconnects = 0
    /// Repairs from PostgreSQL, by what revealed the loss.
    var repairs: [CarrierRepair: Int] = [:]
    var subscriptions = 0
    /// Messages that were not a hint of the expected shape (refused, counted, logged).
    var malformed = 0
    /// The liveness probe: whether the carrier stopped delivering (connected but silent), how
    /// often, and the last probe's round trip.
    var stalled = false
    var stalls = 0
    var probeRoundTrip: Double?
    var sequencerPasses = 0
    /// Passes that found the position lock held by another server's pass.
    var sequencerBusy = 0
    var positionsNumbered = 0
    /// Committed changes not yet numbered for the feed, and how long the oldest has waited.
    var unnumbered = 0
    var unnumberedOldestSeconds = 0.0

    func render(worker w: String) -> String {
        var s = ""
        func line(_ name: String, _ type: String, _ help: String, _ samples: [(String, String)]) {
            s += "# HELP \(name) \(help)\n# TYPE \(name) \(type)\n"
            for (labels, v) in samples { s += "\(name){\(labels)} \(v)\n" }
        }
        line("dispatch_carrier_up", "gauge", "1 when this worker is connected to the carrier (NATS).", [(w, up ? "1" : "0")])
        line("dispatch_carrier_messages_total", "counter", "Carrier messages, by direction.",
             [("\(w),direction=\"in\"", "\(messagesIn)"), ("\(w),direction=\"out\"", "\(messagesOut)")])
        line("dispatch_carrier_bytes_total", "counter", "Carrier payload bytes, by direction.",
             [("\(w),direction=\"in\"", "\(bytesIn)"), ("\(w),direction=\"out\"", "\(bytesOut)")])
        line("dispatch_carrier_dropped_total", "counter", "Carrier messages dropped (slow consumer, not buffered); repaired from PostgreSQL.",
             [(w, "\(dropped)")])
        line("dispatch_carrier_reconnects_total", "counter", "Reconnects to the carrier.", [(w, "\(reconnects)")])
        line("dispatch_carrier_repairs_total", "counter", "Catch-ups from PostgreSQL, by what revealed the loss.",
             CarrierRepair.allCases.map { ("\(w),reason=\"\($0.rawValue)\"", "\(repairs[$0] ?? 0)") })
        line("dispatch_carrier_subscriptions", "gauge", "Carrier subjects this worker listens to (its activities, the feed).",
             [(w, "\(subscriptions)")])
        line("dispatch_carrier_malformed_total", "counter", "Carrier messages refused as not a hint (nothing is believed from them).",
             [(w, "\(malformed)")])
        line("dispatch_carrier_stalled", "gauge", "1 while the carrier is connected but this worker's probes do not come back.",
             [(w, stalled ? "1" : "0")])
        line("dispatch_carrier_stalls_total", "counter", "Times the carrier was found connected but silent (then repaired).",
             [(w, "\(stalls)")])
        if let rt = probeRoundTrip {
            line("dispatch_carrier_probe_seconds", "gauge", "Round trip of the last liveness probe through the carrier.", [(w, "\(rt)")])
        }
        line("dispatch_sequencer_passes_total", "counter", "Numbering passes that committed.", [(w, "\(sequencerPasses)")])
        line("dispatch_sequencer_busy_total", "counter", "Numbering passes skipped because another server's pass held the lock.",
             [(w, "\(sequencerBusy)")])
        line("dispatch_sequencer_positions_total", "counter", "Feed positions numbered.", [(w, "\(positionsNumbered)")])
        line("dispatch_feed_unnumbered", "gauge", "Committed changes not yet numbered for the feed (measured by the numbering worker).",
             [(w, "\(unnumbered)")])
        line("dispatch_feed_unnumbered_oldest_seconds", "gauge",
             "Age of the oldest committed change not yet in the feed (measured by the numbering worker; 0 when none waits).",
             [(w, "\(unnumberedOldestSeconds)")])
        return s
    }
}

/// What revealed that a carrier message was lost.
enum CarrierRepair: String, CaseIterable {
    /// The periodic check found a change in PostgreSQL newer than what a stream or feed had.
    case check
    /// The connection to NATS came back: every stream and feed re-reads.
    case reconnect
    /// NATS dropped messages for this client (slow consumer).
    case dropped
    /// The carrier was connected but its liveness probes stopped coming back.
    case stalled
}
