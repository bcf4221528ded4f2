import DispatchCore
import DispatchCrypto
import DispatchHarness
import DispatchIO
import XCTest
@testable import DispatchServer

/// Bearer-key authentication in one process: the key lookups on a scripted reader session, the
/// `last_used_at` flush on a manual loop, the clock the loop's own. What costs a round trip and
/// what does not, and the failure paths: a lookup lost with its session, a statement refused,
/// a revocation racing a lookup in flight, a flood of made-up keys, a flush that fails, and no
/// flush after `stop`.
final class AuthShellTests: XCTestCase {
    var loop: ManualLoop!
    var scripted: ScriptedDatabase!
    var auth: Auth!
    var answers: [String] = []

    var reader: ScriptedSession { scripted.sessions[1] }

    override func setUp() {
        loop = ManualLoop()
        scripted = ScriptedDatabase(loop: loop, metrics: Metrics(worker: 0))
        loop.runSoon()
        auth = Auth(db: scripted.db, loop: loop, log: Logger(level: .error), ttl: 10, publishRate: 0, now: { [unowned self] in self.loop.now })
    }

    override func tearDown() {
        auth.stop()
        scripted.db.close()
        loop.runSoon()
        XCTAssertEqual(scripted.violations, [])
    }

    /// `auth_key`'s row for a key with `scopes`, or no row (unknown or revoked).
    static func keyRow(id: Int64?, scopes: String = "publish") -> PGResult {
        PGResult(columns: ["id", "name", "scopes", "machine"], rows: id.map { [[String($0), "key-\($0)", scopes, nil]] } ?? [])
    }

    func authenticate(_ secret: String?, needs scope: Scope = .publish) {
        auth.authenticate(secret, needs: scope) { [unowned self] result in
            switch result {
            case .success(let key): self.answers.append("key \(key.id)")
            case .failure(let e): self.answers.append("\(e.httpStatus) \(e.message)")
            }
        }
    }

    /// Answers every lookup waiting on the reader with `row`; how many there were.
    @discardableResult
    func answerLookups(_ row: PGResult) -> Int {
        var n = 0
        while reader.answerNext({ name, _ in
            XCTAssertEqual(name, "auth_key")
            return row
        }) { n += 1 }
        loop.runSoon()
        return n
    }

    func testAKnownKeyCostsOneLookupPerTTL() {
        authenticate("s3cret")
        XCTAssertEqual(reader.pending, ["auth_key"])
        XCTAssertEqual(reader.parameters(of: "auth_key"), [SHA256.hex(Array("s3cret".utf8))], "only the hash leaves the process")
        answerLookups(Self.keyRow(id: 7))
        XCTAssertEqual(answers, ["key 7"])

        loop.advance(by: 9)
        authenticate("s3cret")
        XCTAssertEqual(reader.pending, [], "within the TTL: from the cache")
        XCTAssertEqual(answers, ["key 7", "key 7"])

        loop.advance(by: 2)
        authenticate("s3cret")
        XCTAssertEqual(reader.pending, ["auth_key"], "past the TTL: read again")
        answerLookups(Self.keyRow(id: nil))
        XCTAssertEqual(answers.last, "401 the API key is not valid", "revoked meanwhile")
    }

    /// The status stream's synchronous path answers only what `authenticate` would answer
    /// from memory: a fresh key with the scope; everything else goes the long way.
    func testACachedKeyIsAnsweredWithoutACallbackOnlyWhileFreshAndAllowed() {
        XCTAssertNil(auth.cachedKey("s3cret", allowing: .read), "never looked up")
        authenticate("s3cret", needs: .read)
        answerLookups(Self.keyRow(id: 7, scopes: "read"))
        XCTAssertEqual(auth.cachedKey("s3cret", allowing: .read)?.id, 7)
        XCTAssertNil(auth.cachedKey("s3cret", allowing: .publish), "the scope is checked: the long way answers 403")
        authenticate("nobody", needs: .read)
        answerLookups(Self.keyRow(id: nil))
        XCTAssertNil(auth.cachedKey("nobody", allowing: .read), "a refused secret is the long way's 401")
        loop.advance(by: 11)
        XCTAssertNil(auth.cachedKey("s3cret", allowing: .read), "past the TTL: read again")
        XCTAssertEqual(reader.pending, [])
    }

    func testTheBearerSchemeIsReadInAnyCaseAndNeedsAToken() {
        XCTAssertEqual(Auth.bearerToken("Bearer abc"), "abc")
        XCTAssertEqual(Auth.bearerToken("bEaReR abc def"), "abc def", "the rest of the value, spaces and all")
        XCTAssertEqual(Auth.bearerToken("Bearer  abc"), " abc", "a second space belongs to the token (which then matches no key)")
        XCTAssertNil(Auth.bearerToken("Bearer "))
        XCTAssertNil(Auth.bearerToken("Bearer"))
        XCTAssertNil(Auth.bearerToken("Basic abc"))
        XCTAssertNil(Auth.bearerToken("Bearerx abc"))
        XCTAssertNil(Auth.bearerToken("Bearer\tabc"))
        XCTAssertNil(Auth.bearerToken("Bëarer abc"))
    }

    func testLookupsOfOneSecretInFlightShareOneQuery() {
        for _ in 0..<5 { authenticate("same") }
        authenticate("other")
        XCTAssertEqual(reader.pending, ["auth_key", "auth_key"], "one per secret, not one per request")
        XCTAssertEqual(answerLookups(Self.keyRow(id: 3)), 2)
        XCTAssertEqual(answers, Array(repeating: "key 3", count: 6))
    }

    func testNoKeyOrAnOversizedOneIsRefusedWithoutARoundTrip() {
        authenticate(nil)
        authenticate("")
        authenticate(String(repeating: "k", count: 513))
        XCTAssertEqual(reader.pending, [])
        XCTAssertEqual(answers, Array(repeating: "401 an API key is required: Authorization: Bearer <key>", count: 3))
    }

    func testAKeyWithoutTheScopeIsForbiddenAndNamesIt() {
        authenticate("reader", needs: .publish)
        answerLookups(Self.keyRow(id: 4, scopes: "read"))
        auth.authenticate("reader", needsAnyOf: [.device, .admin, .publish]) { [unowned self] r in
            if case .failure(let e) = r { self.answers.append("\(e.httpStatus) \(e.message)") }
        }
        authenticate("reader", needs: .read)
        XCTAssertEqual(answers, ["403 this key lacks the publish scope", "403 this key lacks the device, admin or publish scope", "key 4"])
    }

    /// A failed lookup says nothing about the key: every request waiting on it gets 503, and
    /// nothing is cached, so the next request reads again once the session is back.
    func testALookupLostWithItsSessionAnswers503ToEveryWaiterAndCachesNothing() {
        for _ in 0..<3 { authenticate("k") }
        XCTAssertEqual(reader.pending, ["auth_key"])
        reader.connectionLost()
        loop.runSoon()
        XCTAssertEqual(answers, Array(repeating: "503 the database is unavailable, retry shortly", count: 3))

        loop.advance(by: 5)  // the session reconnects
        reader.driver.socketReady()
        loop.runSoon()
        authenticate("k")
        XCTAssertEqual(reader.pending.last, "auth_key", "not a cached refusal: read again")
        answerLookups(Self.keyRow(id: 9))
        XCTAssertEqual(answers.last, "key 9")
    }

    func testAStatementRefusedIsA503NotACachedRefusal() {
        authenticate("k")
        reader.answerNext { _, _ in .failure("relation \"api_keys\" does not exist", sqlState: "42P01") }
        loop.runSoon()
        XCTAssertEqual(answers, ["503 the database is unavailable, retry shortly"])
        authenticate("k")
        XCTAssertEqual(reader.pending, ["auth_key"], "read again")
    }

    /// A lookup that read the key just before its revocation committed answers the request it
    /// was made for, but is not cached: the next request reads again and sees the revocation.
    func testALookupInFlightAcrossARevocationIsNotCached() {
        authenticate("k")
        auth.invalidateAll()
        answerLookups(Self.keyRow(id: 5))
        XCTAssertEqual(answers, ["key 5"])
        authenticate("k")
        XCTAssertEqual(reader.pending, ["auth_key"], "not served from the cache")
        answerLookups(Self.keyRow(id: nil))
        XCTAssertEqual(answers.last, "401 the API key is not valid")
    }

    /// Made-up keys are remembered apart from good ones: a flood of them fills (and empties)
    /// their own table, never pushing a good key out of the cache.
    func testAFloodOfMadeUpKeysNeverEvictsAGoodKey() {
        authenticate("good")
        answerLookups(Self.keyRow(id: 1))
        for i in 0..<(Auth.maxCached + 10) { authenticate("made-up-\(i)") }
        XCTAssertEqual(answerLookups(Self.keyRow(id: nil)), Auth.maxCached + 10)
        authenticate("made-up-\(Auth.maxCached + 5)")
        XCTAssertEqual(reader.pending, [], "a refusal is remembered for the TTL too")
        answers.removeAll()
        authenticate("good")
        XCTAssertEqual(reader.pending, [], "the good key is still cached")
        XCTAssertEqual(answers, ["key 1"])
    }

    /// The keys used are written down every 30 s in one statement; a failure is only logged;
    /// `stop` writes the last ones and no flush runs after it.
    func testUsedKeysAreStampedInOneStatementAndNeverAfterStop() {
        authenticate("a")
        answerLookups(Self.keyRow(id: 11))
        authenticate("b")
        answerLookups(Self.keyRow(id: 12))
        loop.advance(by: 30)
        XCTAssertEqual(reader.pending, ["touch_keys"])
        let ids = reader.parameters(of: "touch_keys")?.first??.trimmingCharacters(in: CharacterSet(charactersIn: "{}"))
            .split(separator: ",").sorted()
        XCTAssertEqual(ids, ["11", "12"])
        reader.answerNext { _, _ in .failure("deadlock detected", sqlState: "40P01") }
        loop.runSoon()

        loop.advance(by: 30)
        XCTAssertEqual(reader.pending, [], "nothing used since: nothing written")
        authenticate("a")
        answerLookups(Self.keyRow(id: 11))  // read again: the TTL passed
        auth.stop()
        XCTAssertEqual(reader.pending, ["touch_keys"], "stop writes the last uses")
        reader.answerNext { _, _ in PGResult(columns: [], rows: []) }
        authenticate("b")
        answerLookups(Self.keyRow(id: 12))
        loop.advance(by: 60)
        XCTAssertEqual(reader.pending, [], "no flush after stop")
    }
}
