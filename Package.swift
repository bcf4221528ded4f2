// swift-tools-version:6.0
import PackageDescription

// The architecture, read top to bottom. Dependencies point one way: down this file.
//
//   Pure (no C module, no clock, no I/O; unit-tested without a process):
//     DispatchCore      the domain: activity, state machine, validation, hub, SSE, JSON, routes,
//                       the write path's machine (PublishMachine; Publisher is its shell)
//     PGCore            the PostgreSQL driver's state machines: connection and pipeline queue
//                       (on DispatchCore's Backoff)
//     DispatchCLIKit    the CLI's decisions: arguments, requests, retries, rendering, watch
//     DispatchBenchKit  the load generator's SSE reading (on DispatchCore's HTTP parser), histograms, the
//                       nginx.conf of the bench's and the tests' helper servers
//     DispatchLiveActivity  the iOS app's ActivityAttributes for Live Activity pushes (no dependency)
//   C, as system libraries: CLibevent, CLibpq, CCrypto (OpenSSL's libcrypto), CCurl, CNats (the
//     NATS client, the carrier between servers), CPicoHTTPParser (the HTTP/1.1 request parser,
//     from Debian's libh2o-evloop), CNghttp2 and CTLS (HTTP/2 framing, and OpenSSL's libssl with
//     libevent's TLS bufferevents: the APNs client); and
//     CCurlDynamic, libcurl's header without linking it: the CLI loads libcurl with dlopen
//     only when a URL is https:// (linking it slowed every start: docs/cli.md, Performance)
//   Shells (thin layers that perform what the pure parts decide):
//     DispatchSystem    clocks, files, processes (plain libc)
//     DispatchCrypto    SHA-256, HMAC, AES-GCM, ES256, random bytes (libcrypto)
//     DispatchBlockingHTTP  the one blocking HTTP/1.1 client (plain sockets, deadlines, DispatchCore's
//                       encoder and parser): the CLI, `dispatchd check`, the bench's setup, the tests
//     DispatchIO        libevent loop, HTTP/1.1 server and streams (its own, on the loop), async libpq driver, libcurl
//                       client (HTTP/2, in the loop), NATS client (hand-off to the loop), logging
//     DispatchServer    dispatchd: routes' handlers, repositories (SQL), streams, auth, metrics
//   Executables: dispatchd, dispatch (the CLI), dispatch-bench
//   Build: EmbedFiles (plugin) + embed-files (its tool) compile directories of text files
//     into a target: DispatchWeb carries web/ (the Activities view, openapi.json), DispatchServer
//     Migrations/, DispatchBuildInfo the git commit of the build
let package = Package(
    name: "Dispatch",
    products: [
        .executable(name: "dispatchd", targets: ["dispatchd"]),
        .executable(name: "dispatch", targets: ["DispatchCLI"]),
        .executable(name: "dispatch-bench", targets: ["dispatch-bench"]),
        .library(name: "DispatchLiveActivity", targets: ["DispatchLiveActivity"]),
    ],
    targets: [
        // Pure.
        .target(name: "DispatchCore", linkerSettings: [.linkedLibrary("m")]),
        .target(name: "PGCore", dependencies: ["DispatchCore"]),
        .target(name: "DispatchCLIKit", dependencies: ["DispatchCore"]),
        .target(name: "DispatchBenchKit", dependencies: ["DispatchCore"]),
        .target(name: "DispatchWeb", exclude: ["WebAssets.embed"], plugins: ["EmbedFiles"]),
        .target(name: "DispatchBuildInfo", exclude: ["Build.gitcommit"], plugins: ["EmbedFiles"]),
        .target(name: "DispatchLiveActivity"),

        // C.
        .systemLibrary(name: "CLibevent", path: "Sources/CLibevent"),
        .systemLibrary(name: "CLibpq", path: "Sources/CLibpq", pkgConfig: "libpq"),
        .systemLibrary(name: "CCrypto", path: "Sources/CCrypto", pkgConfig: "libcrypto"),
        .systemLibrary(name: "CCurl", path: "Sources/CCurl", pkgConfig: "libcurl"),
        .systemLibrary(name: "CCurlDynamic", path: "Sources/CCurlDynamic"),
        .systemLibrary(name: "CNats", path: "Sources/CNats"),
        .systemLibrary(name: "CNghttp2", path: "Sources/CNghttp2", pkgConfig: "libnghttp2"),
        .systemLibrary(name: "CTLS", path: "Sources/CTLS"),
        .systemLibrary(name: "CPicoHTTPParser", path: "Sources/CPicoHTTPParser"),

        // Shells.
        .target(name: "DispatchSystem"),
        .target(name: "DispatchCrypto", dependencies: ["CCrypto"]),
        .target(name: "DispatchBlockingHTTP", dependencies: ["DispatchCore", "DispatchSystem"]),
        .target(name: "DispatchIO", dependencies: ["CLibevent", "CPicoHTTPParser", "CLibpq", "CCurl", "CNats", "CNghttp2", "CTLS", "PGCore", "DispatchCore", "DispatchSystem"]),
        .target(name: "DispatchServer", dependencies: ["DispatchCore", "PGCore", "DispatchIO", "DispatchSystem", "DispatchCrypto", "DispatchBlockingHTTP",
                                                       "DispatchWeb", "DispatchBuildInfo"],
                exclude: ["EmbeddedMigrations.embed"], plugins: ["EmbedFiles"]),

        // Executables.
        .executableTarget(name: "dispatchd", dependencies: ["DispatchServer"]),
        // Not named `dispatch`: its entry point would become `dispatch_main`, libdispatch's name.
        .executableTarget(name: "DispatchCLI", dependencies: ["DispatchCLIKit", "DispatchCore", "DispatchSystem", "DispatchBuildInfo", "DispatchCrypto",
                                                              "DispatchBlockingHTTP", "CCurlDynamic"], path: "Sources/dispatch"),
        .executableTarget(name: "dispatch-bench", dependencies: ["DispatchBenchKit", "DispatchCore", "DispatchSystem", "DispatchBlockingHTTP", "CLibevent"]),

        // Build tools.
        .executableTarget(name: "embed-files"),
        .plugin(name: "EmbedFiles", capability: .buildTool(), dependencies: ["embed-files"]),

        // Tests: one unit-test target per library; the integration targets start real processes
        // against a real PostgreSQL (DispatchTestSupport).
        // Fakes for shells' unit tests: a manually stepped loop and a scripted libpq driver
        // (in the spirit of swift-nio's NIOEmbedded); never linked into dispatchd.
        .target(name: "DispatchHarness", dependencies: ["DispatchIO"]),
        .target(name: "DispatchTestSupport", dependencies: ["DispatchServer", "DispatchCore", "DispatchCrypto", "DispatchIO", "DispatchSystem",
                                                           "DispatchBlockingHTTP"]),
        .testTarget(name: "DispatchCoreTests", dependencies: ["DispatchCore"]),
        .testTarget(name: "PGCoreTests", dependencies: ["PGCore", "DispatchCore"]),
        .testTarget(name: "DispatchCLIKitTests", dependencies: ["DispatchCLIKit", "DispatchCore"]),
        .testTarget(name: "DispatchBenchKitTests", dependencies: ["DispatchBenchKit"]),
        .testTarget(name: "DispatchLiveActivityTests", dependencies: ["DispatchLiveActivity", "DispatchCore"]),
        .testTarget(name: "DispatchCryptoTests", dependencies: ["DispatchCrypto"]),
        .testTarget(name: "DispatchIOTests", dependencies: ["DispatchIO", "DispatchSystem", "CCurl", "CLibevent", "DispatchCore", "DispatchTestSupport",
                                                           "DispatchBenchKit", "DispatchHarness"]),
        .testTarget(name: "DispatchServerTests", dependencies: ["DispatchServer", "DispatchCore", "DispatchCrypto", "DispatchHarness"]),
        .testTarget(name: "ServerIntegrationTests",
                    dependencies: ["DispatchTestSupport", "DispatchServer", "DispatchCore", "DispatchIO", "DispatchSystem", "DispatchCrypto",
                                   "DispatchLiveActivity", "dispatchd"]),
        .testTarget(name: "CLIIntegrationTests",
                    dependencies: ["DispatchTestSupport", "DispatchCLIKit", "DispatchCore", "DispatchSystem", "DispatchBenchKit", "dispatchd", "DispatchCLI"]),
        .testTarget(name: "BenchSmokeTests",
                    dependencies: ["DispatchTestSupport", "DispatchCore", "DispatchSystem", "dispatchd", "dispatch-bench"]),
    ],
    swiftLanguageModes: [.v6]
)

// The hub and codecs are generic or small functions in DispatchCore called on every event:
// let release builds specialise and inline them across modules. Not DispatchLiveActivity: the
// iOS app depends on it by URL and version, and SwiftPM refuses unsafe flags in such a
// dependency (LiveActivityPackageTests); it is plain types, with nothing to inline across.
let builtByApps: Set<String> = ["DispatchLiveActivity"]
for target in package.targets where target.type != .system && target.type != .plugin && !builtByApps.contains(target.name) {
    target.swiftSettings = (target.swiftSettings ?? []) + [.unsafeFlags(["-cross-module-optimization"], .when(configuration: .release))]
}
