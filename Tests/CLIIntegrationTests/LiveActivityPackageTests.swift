import DispatchSystem
import Glibc
import XCTest

/// The iOS app adds this package by URL and version and uses its `DispatchLiveActivity`
/// library. SwiftPM builds a versioned dependency under stricter rules than the root package
/// (no unsafe flags, for one): a path dependency or this package's own build would not notice,
/// so this test makes a git repository of the package, tags it, and builds a small package that
/// depends on it by `file://` URL and version, then decodes one push with it.
final class LiveActivityPackageTests: XCTestCase {
    func testAnotherPackageDependsOnTheLibraryByURLAndVersion() throws {
        let root = "/" + "\(#filePath)".split(separator: "/").dropLast(3).joined(separator: "/")
        let swift = try XCTUnwrap(Self.executable("swift"), "swift is not on PATH")
        let dir = try makeScratchDirectory("live-activity-package")
        defer { _ = Subprocess.run(["/bin/rm", "-rf", dir]) }

        // The package as it is now (committed or not, but not what git ignores), as version 1.0.0.
        let copy = try run(["/bin/sh", "-c", """
            mkdir -p '\(dir)/dispatch' && cd '\(root)' \
            && git ls-files -z --cached --others --exclude-standard \
            | tar --null --ignore-failed-read -T - -cf - | tar -C '\(dir)/dispatch' -xf -
            """])
        XCTAssertEqual(copy.status, 0, copy.output)
        for step in [["init", "-q"], ["add", "-A"], ["-c", "user.name=test", "-c", "user.email=test@example.org", "commit", "-q", "-m", "1.0.0"],
                     ["tag", "1.0.0"]] {
            let r = try run(["git", "-C", dir + "/dispatch"] + step)
            XCTAssertEqual(r.status, 0, "git \(step.joined(separator: " ")): \(r.output)")
        }

        try Files.makeDirectory(dir + "/app/Sources/App")
        try Files.write(dir + "/app/Package.swift", """
            // swift-tools-version:6.0
            import PackageDescription

            let package = Package(
                name: "App",
                dependencies: [.package(url: "file://\(dir)/dispatch", from: "1.0.0")],
                targets: [.executableTarget(name: "App", dependencies: [.product(name: "DispatchLiveActivity", package: "dispatch")])]
            )
            """)
        try Files.write(dir + "/app/Sources/App/main.swift", #"""
            import DispatchLiveActivity
            import Foundation

            let push = #"{"aps":{"timestamp":1796070001,"event":"update","content-state":{"state":"processing","progress":0.5,"#
                + #""status":"half way","attempt":1,"seq":3,"updatedAt":1796070000}}}"#
            let aps = try JSONDecoder().decode(LiveActivityPush.Envelope.self, from: Data(push.utf8)).aps
            print("decoded", aps.event, aps.contentState.seq, aps.contentState.updatedAt, aps.contentState.isFinal)
            """#)
        // SwiftPM's lock files go to TMPDIR: inside the scratch directory, removed with it.
        try Files.makeDirectory(dir + "/tmp")
        var environment = Subprocess.currentEnvironment()
        environment["TMPDIR"] = dir + "/tmp"
        let built = try run([swift, "run", "--package-path", dir + "/app", "--cache-path", dir + "/cache", "App"], environment: environment)
        XCTAssertEqual(built.status, 0, built.output)
        XCTAssertTrue(built.output.contains("decoded update 3 1796070000.0 false"), built.output)
    }

    private func run(_ argv: [String], environment: [String: String]? = nil) throws -> Subprocess.Output {
        var argv = argv
        if !argv[0].hasPrefix("/") { argv[0] = try XCTUnwrap(Self.executable(argv[0]), "\(argv[0]) is not on PATH") }
        return Subprocess.run(argv, environment: environment)
    }

    private static func executable(_ name: String) -> String? {
        let path = Subprocess.environment("PATH") ?? "/usr/bin:/bin"
        return (path.split(separator: ":").map { "\($0)/\(name)" } + ["/opt/swift/usr/bin/\(name)"]).first { access($0, X_OK) == 0 }
    }
}
