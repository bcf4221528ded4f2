import DispatchCore
import DispatchCrypto
import DispatchSystem
import Glibc

/// `Tests/tools/fake_apns.py` as a subprocess: a local APNs (HTTP/2 over TLS) that checks
/// every request like APNs and against the contract, records it, and answers as scripted.
/// Its stdin is a pipe this process holds: if the test process dies, the fake exits.
public final class FakeAPNs: @unchecked Sendable {
    public static let teamID = "TEAM123456"
    public static let keyID = "TESTKEY123"
    public static let topic = "com.example.dispatch"
    /// A fixed token key for servers on an external database (tests only).
    public static let tokenKey = String(repeating: "5e", count: 32)

    public let port: Int
    /// Where its channel management API listens (Apple's api-manage-broadcast host).
    public let managePort: Int
    public let controlPort: Int
    public let pki: String
    public let logPath: String
    private var pid: pid_t
    private var stdinFD: Int32
    private let control: HTTPClient

    /// The test keys (`make_test_pki.sh`), made once per machine and shared.
    public static func makePKI() throws -> String {
        let dir = "/tmp/dispatch-test-pki"
        let out = Subprocess.run(["/bin/sh", TestPaths.repositoryRoot + "/Tests/tools/make_test_pki.sh", dir])
        guard out.status == 0 else { throw TestError("make_test_pki.sh failed: \(out.output)") }
        return dir
    }

    /// `environment`: the APNs environment this instance plays (production or sandbox).
    public static func start(environment: String = "production") throws -> FakeAPNs {
        guard access("/usr/bin/python3", X_OK) == 0,
              Subprocess.run(["/usr/bin/python3", "-c", "import h2, jwt, cryptography"]).status == 0 else {
            throw TestError("the fake APNs needs Debian's python3 with python3-h2, python3-jwt and python3-cryptography (make test-deps)")
        }
        let pki = try makePKI()
        var input: [Int32] = [0, 0], output: [Int32] = [0, 0]
        guard pipe(&input) == 0, pipe(&output) == 0 else { throw TestError("pipe failed") }
        // Our ends must not leak into the fake (or into servers started later: a server
        // holding the stdin pipe would keep the fake alive after this process died).
        for fd in [input[1], output[0]] { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        let logPath = "/tmp/fake-apns-\(getpid())-\(Int(Clock.monotonic() * 1000) % 1_000_000).log"
        let logFD = open(logPath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        var options = Subprocess.Options()
        options.stdin = .fd(input[0])
        options.stdout = .fd(output[1])
        options.stderr = logFD >= 0 ? .fd(logFD) : .null
        options.closeInChild = [input[1], output[0]]
        let spawned = Subprocess.spawn([
            "/usr/bin/python3", TestPaths.repositoryRoot + "/Tests/tools/fake_apns.py",
            "--cert", pki + "/server.pem", "--key", pki + "/server-key.pem",
            "--auth-key-pub", pki + "/AuthKey_\(keyID).pub.pem", "--team-id", teamID, "--key-id", keyID,
            "--topic", topic, "--port", "0", "--control-port", "0", "--environment", environment,
        ], options)
        close(input[0])
        close(output[1])
        if logFD >= 0 { close(logFD) }
        guard case .success(let pid) = spawned else {
            close(input[1]); close(output[0])
            throw TestError("cannot start fake_apns.py")
        }
        defer { close(output[0]) }
        // Its first stdout line: {"port": N, "controlPort": M}.
        var line: [UInt8] = []
        let deadline = Clock.monotonic() + 20
        while !line.contains(10) && Clock.monotonic() < deadline {
            var p = pollfd(fd: output[0], events: Int16(POLLIN), revents: 0)
            guard poll(&p, 1, 100) >= 0 else { continue }
            if p.revents == 0 { continue }
            var buf = [UInt8](repeating: 0, count: 256)
            let n = read(output[0], &buf, buf.count)
            if n <= 0 { break }
            line += buf[0..<n]
        }
        guard let json = try? JSONParser.parse(Array(line.prefix { $0 != 10 })),
              case .number(let port)? = json["port"], case .number(let controlPort)? = json["controlPort"],
              case .number(let managePort)? = json["managePort"] else {
            kill(pid, SIGKILL)
            _ = Subprocess.wait(pid)
            close(input[1])
            throw TestError("fake_apns.py did not start: \(Files.read(logPath) ?? "")")
        }
        return FakeAPNs(pid: pid, stdinFD: input[1], port: Int(port), managePort: Int(managePort), controlPort: Int(controlPort),
                        pki: pki, logPath: logPath)
    }

    init(pid: pid_t, stdinFD: Int32, port: Int, managePort: Int, controlPort: Int, pki: String, logPath: String) {
        self.pid = pid
        self.stdinFD = stdinFD
        self.port = port
        self.managePort = managePort
        self.controlPort = controlPort
        self.pki = pki
        self.logPath = logPath
        control = HTTPClient(port: controlPort)
    }

    deinit { stop() }

    public func stop() {
        guard pid > 0 else { return }
        kill(pid, SIGTERM)
        _ = Subprocess.wait(pid)
        pid = 0
        close(stdinFD)
    }

    /// What a server needs to push here (an external database needs the token key too).
    public var serverEnvironment: [String: String] {
        ["DISPATCH_APNS_KEY_FILE": pki + "/AuthKey_\(Self.keyID).p8", "DISPATCH_APNS_KEY_ID": Self.keyID,
         "DISPATCH_APNS_TEAM_ID": Self.teamID, "DISPATCH_APNS_TOPIC": Self.topic,
         "DISPATCH_APNS_URL": "https://127.0.0.1:\(port)", "DISPATCH_APNS_CA_FILE": pki + "/ca.pem",
         // Every APNs host at this fake: a test never reaches Apple.
         "DISPATCH_APNS_SANDBOX_URL": "https://127.0.0.1:\(port)", "DISPATCH_APNS_MANAGE_URL": "https://127.0.0.1:\(managePort)",
         "DISPATCH_APNS_MANAGE_SANDBOX_URL": "https://127.0.0.1:\(managePort)",
         "DISPATCH_TOKEN_KEY": Self.tokenKey]
    }

    // MARK: - Control

    /// One request as the fake recorded it.
    public struct Recorded: Sendable {
        public var time: Double
        public var connection: Int
        public var token: String
        /// nil while unanswered (a pending delay, or cut by GOAWAY or a dropped connection).
        public var status: Int?
        public var reason: String?
        public var detail: String?
        public var action: String?
        public var headers: [String: String]
        public var body: JSONValue?
        public var bodyBytes: [UInt8]
        public var jwtHash: String?
        public var jwtIat: Int?
        /// `push` or `manage`: the listener that took it.
        public var listener: String
        /// For channel requests: `create`, `read`, `delete` (management) or `push` (a broadcast).
        public var channel: String?
        public var channelID: String?
        public var method: String? { headers[":method"] }
        public var path: String? { headers[":path"] }

        public var event: String? { if case .string(let e)? = body?["aps"]?["event"] { return e }; return nil }
        public var seq: Int? { if case .number(let n)? = body?["aps"]?["content-state"]?["seq"] { return Int(n) }; return nil }
        public var state: String? { if case .string(let s)? = body?["aps"]?["content-state"]?["state"] { return s }; return nil }
        public var priority: Int? { headers["apns-priority"].flatMap { Int($0) } }
        public var timestamp: Int? { if case .number(let n)? = body?["aps"]?["timestamp"] { return Int(n) }; return nil }
    }

    public func requests(token: String? = nil) throws -> [Recorded] {
        let r = try control.get("/requests" + (token.map { "?token=\($0)" } ?? ""))
        guard case .array(let items)? = r.json?["requests"] else { throw TestError("bad /requests answer: \(r.text.prefix(200))") }
        return items.map { v in
            func str(_ k: String) -> String? { if case .string(let s)? = v[k] { return s }; return nil }
            func num(_ k: String) -> Double? { if case .number(let n)? = v[k] { return n }; return nil }
            var headers: [String: String] = [:]
            if case .object(let h)? = v["headers"] { for (k, value) in h { if case .string(let s) = value { headers[k] = s } } }
            let body = v["body"].flatMap { $0 == .null ? nil : $0 }
            return Recorded(time: num("time") ?? 0, connection: Int(num("connection") ?? 0), token: str("token") ?? "",
                            status: num("status").map { Int($0) }, reason: str("reason"), detail: str("detail"), action: str("action"),
                            headers: headers, body: body, bodyBytes: body.map(Self.encode) ?? [], jwtHash: str("jwtHash"),
                            jwtIat: num("jwtIat").map { Int($0) }, listener: str("listener") ?? "push", channel: str("channel"),
                            channelID: str("channelId"))
        }
    }

    /// `{"total", "byStatus", "unanswered", "connectionsOpened", "connectionsOpen", "distinctJwts", "refusedStreams", "pings"}`.
    public func stats() throws -> JSONValue {
        guard let v = try control.get("/stats").json else { throw TestError("bad /stats answer") }
        return v
    }

    public func stat(_ key: String) throws -> Int {
        if case .number(let n)? = try stats()[key] { return Int(n) }
        return -1
    }

    /// Scripts answers for `token` ("*": any): JSON items of fake_apns.py's `respond` list.
    public func script(token: String, respond: [String], otherwise: String? = nil) throws {
        var body = #"{"token":"\#(token)","respond":[\#(respond.joined(separator: ","))]"#
        if let otherwise { body += #","otherwise":\#(otherwise)"# }
        body += "}"
        let r = try control.post("/behavior", body)
        guard r.status == 200 else { throw TestError("script refused: \(r.text)") }
    }

    public func resetBehavior() throws { _ = try control.request("DELETE", "/behavior") }
    public func clearRequests() throws { _ = try control.request("DELETE", "/requests") }

    public func setMaxJWTAge(_ seconds: Double) throws {
        _ = try control.post("/config", #"{"maxJwtAgeSeconds":\#(seconds)}"#)
    }

    /// Declares `token` a token of `environment` (production, sandbox, or none): an instance
    /// of another environment answers it 400 BadDeviceToken.
    public func declare(token: String, environment: String) throws {
        let r = try control.post("/tokens", #"{"token":"\#(token)","environment":"\#(environment)"}"#)
        guard r.status == 200 else { throw TestError("declaration refused: \(r.text)") }
    }

    /// The channel management knobs: broadcast enabled for the App ID, and the channel limit.
    public func configureChannels(enabled: Bool = true, max: Int = 10_000) throws {
        _ = try control.post("/config", #"{"broadcastEnabled":\#(enabled),"maxChannels":\#(max)}"#)
    }

    /// Shortens (or lengthens) Apple's 20 minutes between provider token updates.
    public func setMinJWTInterval(_ seconds: Double) throws {
        _ = try control.post("/config", #"{"minJwtIntervalSeconds":\#(seconds)}"#)
    }

    /// A provider token (ES256 JWT) the fake accepts, issued now: for tests that speak to the
    /// fake with an HTTP client of their own (its first accepted request raises the
    /// connection's stream limit, as APNs does).
    public func providerToken() throws -> String {
        guard let pem = Files.read(pki + "/AuthKey_\(Self.keyID).p8") else { throw TestError("no test signing key in \(pki)") }
        let signer = try ES256Signer(pem: pem)
        var header = JSONWriter()
        header.beginObject(); header.field("alg", "ES256"); header.field("kid", Self.keyID); header.endObject()
        var claims = JSONWriter()
        claims.beginObject(); claims.field("iss", Self.teamID); claims.field("iat", Int64(Clock.nowMilliseconds() / 1000)); claims.endObject()
        let input = Base64.urlEncode(header.bytes) + "." + Base64.urlEncode(claims.bytes)
        return input + "." + Base64.urlEncode(try signer.sign(Array(input.utf8)))
    }

    public func goawayAll() throws { _ = try control.post("/goaway-all", "{}") }

    /// The peer stops answering on every open connection (no answers, no PING ACKs, no FIN);
    /// connections opened afterwards are served.
    public func silenceAll() throws { _ = try control.post("/silence-all", "{}") }

    /// Waits until `condition` holds over the recorded requests; returns the last read.
    @discardableResult
    public func wait(timeout: Double = 10, token: String? = nil, _ condition: ([Recorded]) -> Bool) throws -> [Recorded] {
        let deadline = Clock.monotonic() + timeout
        var seen = try requests(token: token)
        while !condition(seen) && Clock.monotonic() < deadline {
            usleep(50_000)
            seen = try requests(token: token)
        }
        return seen
    }

    static func encode(_ v: JSONValue) -> [UInt8] {
        var w = JSONWriter()
        func write(_ v: JSONValue) {
            switch v {
            case .null: w.null()
            case .bool(let b): w.bool(b)
            case .number(let d): w.number(d)
            case .string(let s): w.string(s)
            case .array(let items): w.beginArray(); for i in items { write(i) }; w.endArray()
            case .object(let members): w.beginObject(); for (k, x) in members { w.key(k); write(x) }; w.endObject()
            }
        }
        write(v)
        return w.bytes
    }
}
