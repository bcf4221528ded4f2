import DispatchCore
import DispatchIO

/// One event, framed once as SSE inside an HTTP chunk, shared by every subscriber.
final class WireEvent: HubEvent {
    let seq: Int64
    let name: String
    let isTerminal: Bool
    let payload: StreamPayload

    init(seq: Int64, name: String, terminal: Bool, json: String) {
        self.seq = seq
        self.name = name
        isTerminal = terminal
        payload = StreamPayload(SSE.encode(id: String(seq), event: name, data: json))
    }

    convenience init(stored e: StoredEvent) {
        self.init(seq: e.seq, name: e.name, terminal: WireEvent.terminalName(e.name), json: e.data)
    }

    /// Whether an event of this name ends its activity (event names of changes are states).
    static func terminalName(_ name: String) -> Bool {
        ActivityState(rawValue: name)?.isTerminal ?? false
    }
}
