import DispatchCore
import DispatchIO

extension API {
    func getActivity(_ req: HTTPRequest, _ id: String) {
        authenticated(req, .read) { [unowned self] _ in
            self.activities.read(id) { result in
                switch result {
                case .failure(let e): self.fail(req, e)
                case .success(nil): self.fail(req, DispatchError(.notFound, "no activity \(id)"))
                case .success(let s?): self.reply(req, 200, s.activity.json())
                }
            }
        }
    }

    func listActivities(_ req: HTTPRequest) {
        authenticated(req, .read) { [unowned self] _ in
            let q = req.query
            var lq = ActivityRepository.ListQuery(limit: 50)
            do throws(DispatchError) {
                for k in q.keys where !["state", "machine", "q", "limit", "cursor"].contains(k) {
                    throw DispatchError(.invalidQuery, "unknown query parameter \(k)")
                }
                switch q["state"] {
                case nil: break
                case "active": lq.finished = false
                case "finished": lq.finished = true
                default: throw DispatchError(.invalidQuery, "state must be active or finished")
                }
                if let m = q["machine"] {
                    guard (1...64).contains(m.utf8.count) else { throw DispatchError(.invalidQuery, "machine must be 1-64 characters") }
                    lq.machine = m
                }
                if let t = q["q"] {
                    guard (1...200).contains(t.count), !t.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) else {
                        throw DispatchError(.invalidQuery, "q must be 1-200 characters without control characters")
                    }
                    lq.text = t
                }
                lq.limit = try Validation.integer(q["limit"], name: "limit", range: 1...500, default: 50)
                if let c = q["cursor"] {
                    guard let cursor = ListCursor.decode(c) else { throw DispatchError(.invalidQuery, "cursor is not valid") }
                    lq.cursor = cursor
                }
            } catch {
                return self.fail(req, error)
            }
            self.activities.list(lq) { result in
                switch result {
                case .failure(let e): self.fail(req, e)
                case .success(let items):
                    var w = JSONWriter(capacity: 512 * items.count + 64)
                    w.beginObject()
                    w.key("activities")
                    w.beginArray()
                    for a in items { w.raw(a.json()) }
                    w.endArray()
                    let next = items.count == Int(lq.limit) ? items.last.map { ListCursor(createdAt: $0.createdAt, activityId: $0.activityId).encode() } : nil
                    w.field("nextCursor", next)
                    w.endObject()
                    self.reply(req, 200, w.bytes)
                }
            }
        }
    }

    func history(_ req: HTTPRequest, _ id: String) {
        authenticated(req, .read) { [unowned self] _ in
            let after: Int64, limit: Int64, before: Int64?, descending: Bool
            do throws(DispatchError) {
                let q = req.query
                limit = try Validation.integer(q["limit"], name: "limit", range: 1...1000, default: 100)
                switch q["order"] {
                case nil, "asc": descending = q["before"] != nil
                case "desc": descending = true
                default: throw DispatchError(.invalidQuery, "order must be asc or desc")
                }
                if q["order"] == "asc" && q["before"] != nil { throw DispatchError(.invalidQuery, "before pages newest first: leave out order=asc") }
                if descending && q["after"] != nil { throw DispatchError(.invalidQuery, "after pages oldest first; use before with order=desc") }
                after = try Validation.integer(q["after"], name: "after", range: 0...Int64.max, default: 0)
                before = q["before"] == nil ? nil : try Validation.integer(q["before"], name: "before", range: 1...Int64.max, default: 1)
            } catch {
                return self.fail(req, error)
            }
            let answer: (Result<[StoredEvent], DispatchError>) -> Void = { result in
                switch result {
                case .failure(let e): self.fail(req, e)
                case .success(let events) where !events.isEmpty: self.reply(req, 200, API.historyJSON(events))
                case .success:
                    // An empty page: tell an unknown activity apart from one with nothing new.
                    self.activities.read(id) { r in
                        switch r {
                        case .success(nil): self.fail(req, DispatchError(.notFound, "no activity \(id)"))
                        case .failure(let e): self.fail(req, e)
                        case .success: self.reply(req, 200, API.historyJSON([]))
                        }
                    }
                }
            }
            if descending {
                self.activities.historyBackwards(id, before: before, limit: limit, answer)
            } else {
                self.activities.history(id, after: after, limit: limit, answer)
            }
        }
    }

    static func historyJSON(_ events: [StoredEvent]) -> [UInt8] {
        var w = JSONWriter(capacity: 512 * events.count + 32)
        w.beginObject()
        w.key("events")
        w.beginArray()
        for e in events {
            w.beginObject()
            w.field("seq", e.seq)
            w.field("event", e.name)
            w.key("data"); w.raw(Array(e.data.utf8))
            w.field("createdAt", Timestamp.format(milliseconds: e.createdMs))
            w.endObject()
        }
        w.endArray()
        w.endObject()
        return w.bytes
    }

    func statusStream(_ req: HTTPRequest, _ id: String) {
        // A bearer key this worker holds needs no callback (connects are this path's load).
        if let key = cachedBearerKey(req, .read, allowQuery: true) { return openStatusStream(req, id, key) }
        authenticated(req, .read, allowQuery: true) { [unowned self] key in self.openStatusStream(req, id, key) }
    }

    private func openStatusStream(_ req: HTTPRequest, _ id: String, _ key: APIKey) {
        guard !isShuttingDown else {
            return fail(req, DispatchError(.databaseUnavailable, "the server is shutting down"))
        }
        if streamsHeld(by: key.id) >= config.maxStreamsPerKey {
            return fail(req, DispatchError(.tooManyStreams, "this key already holds \(config.maxStreamsPerKey) streams"))
        }
        // HEAD gets the stream's headers only: a stream writes to the socket itself, so it
        // would send a body after a HEAD answer and hold a stream slot.
        if req.method == .head {
            return reply(req, 200, [], contentType: "text/event-stream", headers: [("Cache-Control", "no-cache")])
        }
        let lastEventID = Validation.lastEventID(req.header("Last-Event-ID") ?? req.queryParameter("lastEventId"))
        streams.open(req, activityID: id, lastEventID: lastEventID, keyID: key.id, sessionHash: key.sessionHash, extraHeaders: corsHeaders(req))
    }
}
