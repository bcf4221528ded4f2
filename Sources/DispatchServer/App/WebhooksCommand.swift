import DispatchCore
import DispatchIO

/// `dispatchd webhooks status|retry`: the cancel webhook outbox for an operator, straight
/// against the database with the sender's own SQL (`WebhookSQL`).
enum WebhooksCommand {
    static let usage = "usage: dispatchd webhooks status [--state pending|delivered|failed] [--limit N] | dispatchd webhooks retry DELIVERY_ID"

    static func run(_ args: [String], conninfo: String) -> Int32 {
        do {
            let db = try BlockingPG(conninfo)
            switch args.first {
            case "status": return try status(Array(args.dropFirst()), db)
            case "retry":
                guard args.count == 2 else { printError(usage); return 2 }
                guard !(try db.query(WebhookSQL.requeue(deliveryID: args[1]))).rows.isEmpty else {
                    printError("dispatchd webhooks retry: no failed or waiting delivery \(args[1]) (delivered, in flight, or unknown)")
                    return 3
                }
                print("queued \(args[1]) again")
                return 0
            default:
                printError(usage)
                return 2
            }
        } catch {
            printError("dispatchd webhooks: \(error)")
            return 1
        }
    }

    private static func status(_ args: [String], _ db: BlockingPG) throws -> Int32 {
        var limit = 20
        var state: String?
        var i = 0
        while i < args.count {
            guard i + 1 < args.count else { printError(usage); return 2 }
            switch args[i] {
            case "--limit":
                guard let n = Int(args[i + 1]), (1...10_000).contains(n) else { printError("dispatchd webhooks status: --limit must be 1-10000"); return 2 }
                limit = n
            case "--state":
                guard ["pending", "delivered", "failed"].contains(args[i + 1]) else {
                    printError("dispatchd webhooks status: --state must be pending, delivered or failed")
                    return 2
                }
                state = args[i + 1]
            default:
                printError(usage)
                return 2
            }
            i += 2
        }
        var counts: [String: String] = [:]
        for row in try db.query(WebhookSQL.summary).rows { counts[row["state"] ?? "?"] = row["n"] ?? "0" }
        print("pending \(counts["pending"] ?? "0")  delivered \(counts["delivered"] ?? "0")  failed \(counts["failed"] ?? "0")")
        print("DELIVERY\tACTIVITY\tSTATE\tATTEMPTS\tCREATED\tDUE\tLAST STATUS\tURL")
        for r in try db.query(WebhookSQL.recent(limit: limit, state: state)).rows {
            print([r["delivery_id"], r["activity_id"], r["state"], r["attempts"], r["created"], r["due"], r["last_status"], r["url"]]
                .map { ($0 ?? "-").replacingTabs }.joined(separator: "\t"))
        }
        return 0
    }
}

private extension String {
    /// One field per column, whatever a URL or a status holds.
    var replacingTabs: String { String(map { $0 == "\t" || $0 == "\n" ? " " : $0 }) }
}
