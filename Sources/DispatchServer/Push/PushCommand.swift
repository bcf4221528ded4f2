import DispatchCore
import DispatchIO
import DispatchSystem

/// `dispatchd push status`: the outbox and the devices, straight from the database (like
/// `dispatchd keys`), for an operator asking "did the phone get it?". Tokens show as their
/// last four digits only.
enum PushCommand {
    static func run(_ args: [String], conninfo: String) -> Int32 {
        guard args == ["status"] else {
            printError("usage: dispatchd push status")
            return 2
        }
        do {
            let db = try BlockingPG(conninfo)
            let totals = try db.query(DeviceRepository.totals)
            guard let t = totals.first else { return 1 }
            func n(_ column: String) -> String { t[column] ?? "0" }
            print("outbox: \(n("pending")) pending (\(n("due")) due now, \(n("sending")) being sent, \(n("backing_off")) backing off), "
                + "\(n("failed")) failed, \(n("settled")) up to date")
            print("activities: \(n("entries_pending")) with a change to push (\(n("entries_due")) due now, \(n("entries_sending")) being sent, "
                + "\(n("entries_paced")) paced), \(n("entries")) in all")
            print("tokens: \(n("devices")) devices, \(n("push_to_start")) push-to-start, \(n("activity_tokens")) activity tokens")
            let rows = try db.query(DeviceRepository.perDevice)
            let channels = try db.query(BroadcastRepository.list)
            if !channels.rows.isEmpty {
                // Channel ids are no secret (every subscribed phone holds one): shown whole.
                print("")
                print(["ACTIVITY", "CHANNEL", "PHASE", "ENVIRONMENT", "PUSHED SEQ", "WANTED SEQ", "LAST STATUS"].joined(separator: "\t"))
                for r in channels.rows {
                    print([r["activity_id"] ?? "-", r["channel_id"] ?? "-", r["phase"] ?? "-", r["environment"] ?? "-",
                           r["sent_seq"] ?? "0", r["wanted_seq"] ?? "0", r["last_status"] ?? "-"].joined(separator: "\t"))
                }
            }
            guard !rows.rows.isEmpty else { return 0 }
            print("")
            print(["DEVICE", "PUSH-TO-START", "ACTIVITY TOKENS", "PENDING", "WAITING FOR TOKEN", "FAILED", "LAST STATUS", "LAST SENT"]
                .joined(separator: "\t"))
            for r in rows.rows {
                print([r["token_hint"] ?? "-", r["push_to_start_hint"] ?? "-", r["activity_tokens"] ?? "0", r["pending"] ?? "0",
                       r["waiting_for_token"] ?? "0", r["failed"] ?? "0", r["last_status"] ?? "-", r["last_sent"] ?? "-"]
                    .joined(separator: "\t"))
            }
            return 0
        } catch {
            printError("dispatchd push: \(error)")
            return 1
        }
    }
}
