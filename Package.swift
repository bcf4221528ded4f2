// swift-tools-version:6.0
import PackageDescription

// Dependencies point one way: C shims <- DispatchIO <- DispatchServer <- executables.
// DispatchCore is pure (no C module, no clock, no I/O) and is shared by all of them.
let package = Package(
    name: "Dispatch",
    products: [
        .executable(name: "dispatchd", targets: ["dispatchd"]),
        .executable(name: "dispatch", targets: ["DispatchCLI"]),
        .executable(name: "dispatch-bench", targets: ["dispatch-bench"]),
    ],
    targets: [
        .systemLibrary(name: "CLibevent", path: "Sources/CLibevent"),
        .systemLibrary(name: "CLibpq", path: "Sources/CLibpq", pkgConfig: "libpq"),
        .systemLibrary(name: "CCurl", path: "Sources/CCurl", pkgConfig: "libcurl"),
        .target(name: "DispatchCore", linkerSettings: [.linkedLibrary("m")]),
        .target(name: "DispatchIO", dependencies: ["CLibevent", "CLibpq", "CCurl", "DispatchCore"]),
        .target(name: "DispatchServer", dependencies: ["DispatchCore", "DispatchIO", "CLibevent", "CLibpq"]),
        .executableTarget(name: "dispatchd", dependencies: ["DispatchServer"]),
        // Not named `dispatch`: its entry point would become `dispatch_main`, libdispatch's name.
        .executableTarget(name: "DispatchCLI", dependencies: ["DispatchCore"], path: "Sources/dispatch"),
        .executableTarget(name: "dispatch-bench", dependencies: ["DispatchCore", "DispatchIO", "CLibevent"]),
        .target(name: "DispatchTestSupport", dependencies: ["DispatchServer", "DispatchCore"]),
        .testTarget(name: "DispatchCoreTests", dependencies: ["DispatchCore"]),
        .testTarget(name: "DispatchIOTests", dependencies: ["DispatchIO", "CCurl"]),
        .testTarget(name: "DispatchServerTests",
                    dependencies: ["DispatchTestSupport", "DispatchServer", "DispatchCore", "dispatchd"]),
        .testTarget(name: "BenchSmokeTests",
                    dependencies: ["DispatchTestSupport", "DispatchCore", "dispatchd", "dispatch-bench"]),
        .testTarget(name: "DispatchCLITests",
                    dependencies: ["DispatchTestSupport", "DispatchCore", "dispatchd", "DispatchCLI"]),
    ],
    swiftLanguageModes: [.v6]
)

// The hub and codecs are generic or small functions in DispatchCore called on every event:
// let release builds specialise and inline them across modules.
for target in package.targets where target.type != .system {
    target.swiftSettings = (target.swiftSettings ?? []) + [.unsafeFlags(["-cross-module-optimization"], .when(configuration: .release))]
}
