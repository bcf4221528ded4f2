import DispatchCore
import DispatchIO

/// `GET /v1/activities/{id}/live-activity` (contract §5.2): the push the server sends, or
/// would send without APNs configured, for the activity's latest change, built by the same
/// `LiveActivityPayload` the push service uses, so a page shows exactly what a phone receives.
extension API {
    func liveActivity(_ req: HTTPRequest, _ id: String) {
        authenticated(req, .read) { [unowned self] _ in
            self.activities.read(id) { result in
                switch result {
                case .failure(let e): self.fail(req, e)
                case .success(nil): self.fail(req, DispatchError(.notFound, "no activity \(id)"))
                case .success(let stored?):
                    // The change before the latest tells a state change (priority 10) from a
                    // progress or status update (5).
                    self.activities.historyBackwards(id, before: stored.activity.seq, limit: 1) { previous in
                        switch previous {
                        case .failure(let e): self.fail(req, e)
                        case .success(let events):
                            let before = events.first.flatMap { API.state(ofSnapshot: $0.data) }
                            let stale = LiveActivityPayload.staleDeadline(stored.activity, staleAfterSeconds: stored.staleAfter,
                                                                          touchedMs: stored.touchedMs)
                            // Whether any phone gets it: a page hides its phone preview on a
                            // deployment without APNs.
                            self.reply(req, 200, self.livePush(stored.activity, previousState: before,
                                                               staleDate: stale.map(LiveActivityPayload.seconds)),
                                       headers: [("Dispatch-Pushes", self.devices?.pushes == true ? "on" : "off")])
                        }
                    }
                }
            }
        }
    }

    /// `{"event", "priority", "payload"}` for `a`'s latest change.
    func livePush(_ a: Activity, previousState: ActivityState?, staleDate: Int64? = nil) -> [UInt8] {
        let event: LiveActivityPayload.Event
        let priority: Int
        if previousState == nil && a.liveActivity && !a.state.isTerminal {
            event = .start
            priority = 10
        } else {
            event = LiveActivityPayload.event(kind: .update, state: a.state)
            priority = event == .end || previousState != a.state ? 10 : 5
        }
        let payload = LiveActivityPayload.build(a, event: event, timestamp: LiveActivityPayload.seconds(a.updatedAt),
                                                dismissalDelaySeconds: Int64(config.pushDismissalSeconds),
                                                extras: LiveActivityPayload.Extras(staleDate: staleDate))
        var w = JSONWriter(capacity: payload.count + 64)
        w.beginObject()
        w.field("event", event.rawValue)
        w.field("priority", Int64(priority))
        w.key("payload"); w.raw(payload)
        w.endObject()
        return w.bytes
    }

    static func state(ofSnapshot json: String) -> ActivityState? {
        guard let value = try? JSONParser.parse(json), case .string(let s)? = value["state"] else { return nil }
        return ActivityState(rawValue: s)
    }
}
