import DispatchCore
import DispatchCrypto
import DispatchIO
import DispatchSystem

/// `dispatchd keys create|list|revoke`, straight against the database, with the same SQL the
/// server runs (`KeySQL`).
enum KeysCommand {
    static func run(_ args: [String], conninfo: String) -> Int32 {
        do {
            let db = try BlockingPG(conninfo)
            switch args.first {
            case "create": return try create(Array(args.dropFirst()), db)
            case "list": return try list(db)
            case "revoke":
                guard args.count == 2 else { printError("usage: dispatchd keys revoke NAME"); return 2 }
                guard !(try db.query(KeySQL.revoke(name: args[1]))).rows.isEmpty else {
                    printError("dispatchd keys revoke: no active key named \(args[1])")
                    return 3
                }
                print("revoked \(args[1])")
                return 0
            default:
                printError("usage: dispatchd keys create|list|revoke")
                return 2
            }
        } catch {
            printError("dispatchd keys: \(error)")
            return 1
        }
    }

    private static func create(_ args: [String], _ db: BlockingPG) throws -> Int32 {
        var name: String?, scopes: String?, machine: String?
        var i = 0
        while i < args.count {
            guard i + 1 < args.count else { printError("dispatchd keys create: \(args[i]) needs a value"); return 2 }
            switch args[i] {
            case "--name": name = args[i + 1]
            case "--scope", "--scopes": scopes = args[i + 1]
            case "--machine": machine = args[i + 1]
            default: printError("dispatchd keys create: unknown option \(args[i])"); return 2
            }
            i += 2
        }
        guard let name, let scopeText = scopes, let parsed = Scope.parseList(scopeText) else {
            printError("usage: dispatchd keys create --name NAME --scope publish[,read,device,admin] [--machine M]")
            return 2
        }
        let spec: KeySpec
        do { spec = try KeySpec(name: name, scopes: parsed, machine: machine) } catch {
            printError("dispatchd keys create: \(error.message)")
            return 2
        }
        var rng = SystemRandomNumberGenerator()
        let secret = RandomID.secret(using: &rng)
        guard !(try db.query(KeySQL.create(spec, secretHash: SHA256.hex(Array(secret.utf8))))).rows.isEmpty else {
            printError("dispatchd keys create: a key named \(name) exists")
            return 5
        }
        print(secret)
        return 0
    }

    private static func list(_ db: BlockingPG) throws -> Int32 {
        print("NAME\tSCOPES\tMACHINE\tCREATED\tLAST USED\tSTATUS")
        for row in try db.query(KeySQL.list).rows {
            let k = KeyListing(row: row)
            let time = { (ms: Int64?) in ms.map { Timestamp.format(milliseconds: $0) } ?? "-" }
            print([k.name, k.scopes.joined(separator: ","), k.machine ?? "-", time(k.createdMs), time(k.lastUsedMs),
                   k.revokedMs == nil ? "active" : "revoked"].joined(separator: "\t"))
        }
        return 0
    }
}
