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
    var sequencerLeader = false
    var sequencerPasses = 0
    var positionsNumbered = 0

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
        line("dispatch_sequencer_leader", "gauge", "1 on the one process numbering feed positions.", [(w, sequencerLeader ? "1" : "0")])
        line("dispatch_sequencer_passes_total", "counter", "Numbering passes that committed.", [(w, "\(sequencerPasses)")])
        line("dispatch_sequencer_positions_total", "counter", "Feed positions numbered.", [(w, "\(positionsNumbered)")])
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
}
