@testable import DispatchCore
import XCTest

/// The broadcast channel decisions (contract §5.5), one row and one answer at a time.
final class BroadcastChannelTests: XCTestCase {
    let t0: Int64 = 1_796_070_000_000
    let policy = Backoff(initial: 1, maximum: 300, jitter: .equal)

    func job(_ phase: BroadcastPhase, channel: String? = "Y2g=", attempts: Int = 1) -> BroadcastJob {
        BroadcastJob(activityID: "rel", leaseID: 3, phase: phase, channelID: channel, environment: .production, attempts: attempts,
                     priority: 5, lastTimestamp: 0, pendingSinceMs: t0, claimedAtMs: t0 + 5)
    }

    func activity(_ state: ActivityState = .processing, seq: Int64 = 2) -> Activity {
        Activity(activityId: "rel", taskName: "Release", state: state, progress: 0.5, seq: seq, createdAt: t0 - 1000, updatedAt: t0,
                 endedAt: state.isTerminal ? t0 : nil, broadcast: true, channelId: "Y2g=")
    }

    func testEachPhaseAsksForItsRequest() {
        XCTAssertEqual(BroadcastRequest.make(job(.create, channel: nil), snapshot: activity(), staleDeadlineMs: nil, dismissalDelaySeconds: 0),
                       .create)
        XCTAssertEqual(BroadcastRequest.make(job(.delete), snapshot: activity(.completed), staleDeadlineMs: nil, dismissalDelaySeconds: 0),
                       .delete(channelID: "Y2g="))
        XCTAssertEqual(BroadcastRequest.make(job(.live), snapshot: nil, staleDeadlineMs: nil, dismissalDelaySeconds: 0),
                       .delete(channelID: "Y2g="), "the activity is gone: so is its channel")
        XCTAssertEqual(BroadcastRequest.make(job(.create, channel: nil), snapshot: nil, staleDeadlineMs: nil, dismissalDelaySeconds: 0), .forget)
        guard case .push(let body, let priority, _, let ts, let seq, let ends, _) = BroadcastRequest.make(
            job(.live), snapshot: activity(), staleDeadlineMs: t0 + 600_000, dismissalDelaySeconds: 0) else { return XCTFail() }
        XCTAssertEqual(priority, 5)
        XCTAssertEqual(ts, 1_796_070_000)
        XCTAssertEqual(seq, 2)
        XCTAssertFalse(ends)
        let aps = (try? JSONParser.parse(body))?["aps"]
        XCTAssertEqual(aps?["event"], .string("update"), "a channel never starts an activity")
        XCTAssertEqual(aps?["stale-date"], .number(1_796_070_600))
        guard case .push(_, let endPriority, _, _, _, let endEnds, let deleteAt) = BroadcastRequest.make(
            job(.live), snapshot: activity(.completed, seq: 3), staleDeadlineMs: nil, dismissalDelaySeconds: 600) else { return XCTFail() }
        XCTAssertEqual(endPriority, 10)
        XCTAssertTrue(endEnds)
        XCTAssertEqual(deleteAt, 1_796_070_600, "deleted at the dismissal date")
        XCTAssertLessThanOrEqual(BroadcastRequest.createBody.count, 100)
    }

    func testAnswersBecomeOutcomes() {
        let ok = APNsAnswer.status(200, reason: nil, timestampMs: nil)
        XCTAssertEqual(BroadcastOutcome.decide(.create, ok, channelHeader: "Y2g=", attempts: 1, policy: policy, random: 0), .created(channelID: "Y2g="))
        if case .retry = BroadcastOutcome.decide(.create, ok, channelHeader: nil, attempts: 1, policy: policy, random: 0) {} else {
            XCTFail("a creation answered without an id is tried again")
        }
        XCTAssertEqual(BroadcastOutcome.decide(.create, .status(400, reason: "FeatureNotEnabled", timestampMs: nil), channelHeader: nil,
                                               attempts: 1, policy: policy, random: 0), .refused(status: "400 FeatureNotEnabled"))
        XCTAssertEqual(BroadcastOutcome.decide(.create, .status(400, reason: "CannotCreateChannelConfig", timestampMs: nil), channelHeader: nil,
                                               attempts: 1, policy: policy, random: 0), .refused(status: "400 CannotCreateChannelConfig"))
        let push = BroadcastRequest.push(body: [], priority: 10, expiration: 0, timestamp: 9, seq: 4, ends: true, deleteAt: 99)
        XCTAssertEqual(BroadcastOutcome.decide(push, ok, channelHeader: nil, attempts: 1, policy: policy, random: 0),
                       .pushed(seq: 4, timestamp: 9, deleteAt: 99))
        XCTAssertEqual(BroadcastOutcome.decide(push, .status(400, reason: "ChannelNotRegistered", timestampMs: nil), channelHeader: nil,
                                               attempts: 1, policy: policy, random: 0),
                       .dropped(seq: 4, timestamp: 9, deleteAt: 99, status: "400 ChannelNotRegistered"),
                       "refused: dropped, and an end still deletes the channel at its dismissal date")
        XCTAssertEqual(BroadcastOutcome.decide(push, .status(429, reason: "TooManyRequests", timestampMs: nil), channelHeader: nil,
                                               attempts: 2, policy: policy, random: 0), .retry(afterSeconds: 1, status: "429 TooManyRequests"))
        XCTAssertEqual(BroadcastOutcome.decide(push, .transport(.connectionLost), channelHeader: nil, attempts: 1, policy: policy, random: 0),
                       .retry(afterSeconds: 0.5, status: "connectionLost"))
        XCTAssertEqual(BroadcastOutcome.decide(.delete(channelID: "Y2g="), ok, channelHeader: nil, attempts: 1, policy: policy, random: 0), .deleted)
        XCTAssertEqual(BroadcastOutcome.decide(.delete(channelID: "Y2g="), .status(400, reason: "ChannelNotRegistered", timestampMs: nil),
                                               channelHeader: nil, attempts: 1, policy: policy, random: 0), .deleted, "already gone")
    }

    /// A push APNs refuses for its content is dropped, never flags the channel: the next change
    /// is pushed (issue 37: one refusal froze every phone on the channel).
    func testARefusedPushIsDroppedAndTheChannelGoesOn() {
        let update = BroadcastRequest.push(body: [], priority: 5, expiration: 0, timestamp: 9, seq: 4, ends: false, deleteAt: 99)
        for (status, reason) in [(400, "BadPriority"), (413, "PayloadTooLarge"), (400, "ChannelNotRegistered")] {
            XCTAssertEqual(BroadcastOutcome.decide(update, .status(status, reason: reason, timestampMs: nil), channelHeader: nil,
                                                   attempts: 1, policy: policy, random: 0),
                           .dropped(seq: 4, timestamp: 9, deleteAt: nil, status: "\(status) \(reason)"))
        }
        // Any request that meets the deployment's pause waits for it (the service pauses everyone).
        for request in [BroadcastRequest.create, update, .delete(channelID: "Y2g=")] {
            XCTAssertEqual(BroadcastOutcome.decide(request, .status(429, reason: "TooManyProviderTokenUpdates", timestampMs: nil),
                                                   channelHeader: nil, attempts: 1, policy: policy, random: 0),
                           .paused(status: "429 TooManyProviderTokenUpdates"))
        }
    }

    /// Once the activity ended and its dismissal date passed, the channel is deleted whatever
    /// its pushes did (an end still retrying is not sent any more); before it, the end is pushed.
    func testAChannelIsDeletedAfterTheDismissalDateWhateverItsPushes() {
        let ended = activity(.error, seq: 3)  // ended at t0; dismissal 600 s later
        let deleteAt: Int64 = 1_796_070_600
        XCTAssertEqual(BroadcastRequest.make(job(.live, attempts: 2), snapshot: ended, staleDeadlineMs: nil, dismissalDelaySeconds: 600,
                                             nowSeconds: deleteAt), .delete(channelID: "Y2g="), "the end failed before: the channel goes")
        XCTAssertEqual(BroadcastRequest.make(job(.live, attempts: 5), snapshot: ended, staleDeadlineMs: nil, dismissalDelaySeconds: 600,
                                             nowSeconds: deleteAt + 7200), .delete(channelID: "Y2g="))
        guard case .push(_, _, _, _, _, true, _) = BroadcastRequest.make(job(.live, attempts: 1), snapshot: ended, staleDeadlineMs: nil,
                                                                      dismissalDelaySeconds: 0, nowSeconds: deleteAt) else {
            return XCTFail("the end's first try always goes (a dismissal of 0 s is already past)")
        }
        guard case .push(_, _, let expiration, _, _, true, deleteAt) = BroadcastRequest.make(
            job(.live), snapshot: ended, staleDeadlineMs: nil, dismissalDelaySeconds: 600, nowSeconds: deleteAt - 1) else {
            return XCTFail("before the dismissal date the end is pushed")
        }
        XCTAssertEqual(expiration, deleteAt - 1 + 60, "an end is kept until its dismissal date, and at least a minute from the send")
        // A live activity's channel is never deleted by time.
        guard case .push(_, _, let liveExpiration, _, _, false, _) = BroadcastRequest.make(
            job(.live), snapshot: activity(), staleDeadlineMs: nil, dismissalDelaySeconds: 600, nowSeconds: deleteAt + 7200) else {
            return XCTFail("a live activity is pushed")
        }
        XCTAssertEqual(liveExpiration, deleteAt + 7200 + 3600, "apns-expiration counts from the send")
    }
}
