import XCTest
import DispatchCore
import DispatchCLIKit

final class CLIRenderingTests: XCTestCase {
    let snapshot = #"{"activityId":"TEST-RTORRENT-01","taskName":"Debian 13 Trixie ISO","systemImage":"arrow.down.circle.fill","machine":"shodan","cancelURL":null,"state":"processing","progress":0.68,"status":"Downloading at 18.4 MB/s (68%)","attempt":1,"seq":5,"cancelRequested":false,"createdAt":"2026-11-29T22:53:26.123Z","updatedAt":"2026-11-29T22:55:01.004Z","endedAt":null}"#

    func testSnapshotView() throws {
        let v = try XCTUnwrap(CLIActivityView(jsonText: snapshot))
        XCTAssertEqual(v.activityID, "TEST-RTORRENT-01")
        XCTAssertEqual(v.progress, 0.68)
        XCTAssertEqual(v.seq, 5)
        XCTAssertFalse(v.isTerminal)
        XCTAssertEqual(v.createdAt ?? 0, 1_795_992_806.123, accuracy: 0.0001)
        XCTAssertEqual(v.elapsed(now: 1_795_992_806.123 + 62) ?? 0, 62, accuracy: 0.001)
        XCTAssertNil(CLIActivityView(jsonText: "{}"))
        XCTAssertNil(CLIActivityView(jsonText: "not json"))
    }

    func testTimestamps() {
        XCTAssertEqual(CLIProgress.parseTimestamp("1970-01-01T00:00:00Z"), 0)
        XCTAssertEqual(CLIProgress.parseTimestamp("2000-03-01T00:00:00.5Z"), 951_868_800.5)
        XCTAssertEqual(CLIProgress.parseTimestamp("2026-11-29T23:53:26+01:00"), CLIProgress.parseTimestamp("2026-11-29T22:53:26Z"))
        XCTAssertNil(CLIProgress.parseTimestamp("2026-11-29 nope"))
        XCTAssertNil(CLIProgress.parseTimestamp("2026-13-29T22:53:26Z"))
        XCTAssertNil(CLIProgress.parseTimestamp("2026-11-29T22:53:26"))
    }

    func testPercentBarAndDuration() {
        XCTAssertEqual(CLIProgress.percentText(0.68), "68%")
        XCTAssertEqual(CLIProgress.percentText(0.29), "29%")
        XCTAssertEqual(CLIProgress.percentText(0.685), "68.5%")
        XCTAssertEqual(CLIProgress.percentText(nil), "-")
        XCTAssertEqual(CLIProgress.bar(0.5, cells: 10), "[█████░░░░░]")
        XCTAssertEqual(CLIProgress.bar(1, cells: 4), "[████]")
        XCTAssertEqual(CLIProgress.bar(nil, cells: 3), "[···]")
        XCTAssertEqual(CLIProgress.duration(42.9), "42s")
        XCTAssertEqual(CLIProgress.duration(185), "3m05s")
        XCTAssertEqual(CLIProgress.duration(3720), "1h02m")
        XCTAssertEqual(CLIProgress.duration(-5), "0s")
    }

    func testPlainLine() throws {
        var v = try XCTUnwrap(CLIActivityView(jsonText: snapshot))
        XCTAssertEqual(CLIProgress.plainLine(event: "processing", view: v),
                       "#5 processing 68% [shodan] Downloading at 18.4 MB/s (68%)")
        v.state = "error"; v.error = "disk\nfull"; v.machine = nil; v.status = nil; v.progress = nil
        XCTAssertEqual(CLIProgress.plainLine(event: "error", view: v), "#5 error - — error: disk full")
        XCTAssertEqual(CLIProgress.plainLine(event: "not_found", view: CLIActivityView(activityID: "x")), "not_found x")
    }

    func testLiveLineFitsTheWidthAndKeepsTheBar() throws {
        let v = try XCTUnwrap(CLIActivityView(jsonText: snapshot))
        let now = v.createdAt! + 62
        let wide = CLIProgress.liveLine(view: v, width: 120, now: now, frame: 0)
        XCTAssertEqual(wide, "⠋ Debian 13 Trixie ISO [█████████████░░░░░░░] 68% processing  Downloading at 18.4 MB/s (68%) · shodan · 1m02s")
        for width in [20, 40, 60, 79, 80, 100] {
            let line = CLIProgress.liveLine(view: v, width: width, now: now, frame: 3)
            XCTAssertLessThanOrEqual(line.count, width, "width \(width): \(line)")
            if width >= 40 { XCTAssertTrue(line.contains("68%"), "width \(width): \(line)") }
        }
        var done = v
        done.state = "completed"
        XCTAssertTrue(CLIProgress.liveLine(view: done, width: 100, now: now, frame: 0).hasPrefix("✔ "))
    }

    /// The live line names the state: "waiting" for idle, the attempt while retrying, and each
    /// final state with a mark of its own (rejected is not shown as an error).
    func testLiveLineShowsTheState() throws {
        var v = try XCTUnwrap(CLIActivityView(jsonText: snapshot))
        let now = v.createdAt! + 62
        func line(_ state: String, attempt: Int? = nil, width: Int = 120) -> String {
            v.state = state
            v.attempt = attempt
            return CLIProgress.liveLine(view: v, width: width, now: now, frame: 0)
        }
        XCTAssertEqual(line("idle"), "‖ Debian 13 Trixie ISO [█████████████░░░░░░░] 68% waiting  Downloading at 18.4 MB/s (68%) · shodan · 1m02s")
        XCTAssertTrue(line("retrying", attempt: 3).contains("68% retrying (attempt 3)  "), line("retrying", attempt: 3))
        XCTAssertTrue(line("queued").hasPrefix("⠋ Debian 13 Trixie ISO [█████████████░░░░░░░] 68% queued  "))
        XCTAssertTrue(line("rejected").hasPrefix("⊗ Debian 13 Trixie ISO [█████████████░░░░░░░] 68% rejected  "))
        XCTAssertTrue(line("error").hasPrefix("✘ "))
        XCTAssertTrue(line("cancelled").hasPrefix("⊘ "))
        XCTAssertEqual(Set(["completed", "error", "cancelled", "rejected", "idle"].map { CLIProgress.glyph(CLIActivityView(activityID: "a", state: $0), frame: 0) }).count, 5,
                       "one mark per final state, and one for waiting")
        // Narrow terminals keep the state: the bar and the attempt's words shrink first.
        for width in [30, 40, 50, 60] {
            let l = line("retrying", attempt: 12, width: width)
            XCTAssertLessThanOrEqual(l.count, width, l)
            XCTAssertTrue(l.contains("retry"), "width \(width): \(l)")
            let idle = line("idle", width: width)
            XCTAssertLessThanOrEqual(idle.count, width, idle)
            XCTAssertTrue(idle.contains("waiting"), "width \(width): \(idle)")
        }
        XCTAssertEqual(CLIProgress.plainLine(event: "retrying", view: { var r = v; r.state = "retrying"; r.attempt = 2; return r }()),
                       "#5 retrying 68% (attempt 2) [shodan] Downloading at 18.4 MB/s (68%)")
    }

    func testProgressExtractor() throws {
        let x = try CLIProgressExtractor(pattern: "([0-9]+(?:[.,][0-9]+)?)%")
        XCTAssertEqual(x.progress(in: "Downloading 68% done"), 0.68)
        XCTAssertEqual(x.progress(in: "10% ... 20,5%"), 0.205)
        XCTAssertNil(x.progress(in: "no numbers"))
        XCTAssertNil(x.progress(in: "150%"))
        let custom = try CLIProgressExtractor(pattern: #"progress=(\d+)"#)
        XCTAssertEqual(custom.progress(in: "step progress=7 of 100"), 0.07)
        XCTAssertThrowsError(try CLIProgressExtractor(pattern: "(a)(b)"))
        XCTAssertThrowsError(try CLIProgressExtractor(pattern: "("))
    }

    /// What `run` reads as progress when given no pattern, and what it leaves alone.
    func testProgressShapes() {
        let cases: [(String, Double?)] = [
            ("Downloading 68% done", 0.68), ("68.5%", 0.685), ("68,5 %", nil), ("[68,5%]", 0.685), ("100%", 1), ("0%", 0),
            ("10% ... 20%", 0.2), ("150%", nil), ("(45%) eta 3s", 0.45),
            ("[3/10] Compiling Foo", 0.3), ("12/40 files", 0.3), ("Building [====>  ] 120/200: crate", 0.6),
            ("━━━━━━ 1.2/4.8 MB 5.0 MB/s", 0.25), ("step 1/1", 1), ("1/0", nil), ("41/40", nil),
            ("10% then 3/4", 0.75), ("3/4 then 10%", 0.1),
            ("2024/05/06 12:00", nil), ("route 10.0.0.1/24", nil), ("sha256%20", nil), ("version 1.2.3/4", nil),
            ("x86/64", nil), ("a/12", nil), ("no numbers", nil), ("", nil), ("99999999999999999%", nil),
            ("épée 50%", 0.5), ("ü50%", nil),
        ]
        for (line, expected) in cases {
            XCTAssertEqual(CLIProgressShapes.progress(in: line), expected, line)
        }
    }

    func testLineSplitter() {
        var s = CLILineSplitter(maxLineBytes: 8)
        XCTAssertEqual(s.feed(Array("a\r\nb\rc".utf8)), ["a", "b"])
        XCTAssertEqual(s.feed(Array("d\n\n".utf8)), ["cd"])
        XCTAssertEqual(s.feed(Array("0123456789".utf8)), ["01234567"])
        XCTAssertEqual(s.finish(), "89")
        XCTAssertNil(s.finish())
    }
}
