import Foundation
import XCTest

/// A scratch directory for one test, removed when the test ends.
final class TempDirectory {
    let url: URL

    init() throws {
        url = FileManager.default.temporaryDirectory.appendingPathComponent("dispatch-crypto-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }

    deinit { try? FileManager.default.removeItem(at: url) }

    func path(_ name: String) -> String { url.appendingPathComponent(name).path }

    func write(_ name: String, _ contents: [UInt8]) throws { try Data(contents).write(to: url.appendingPathComponent(name)) }

    func read(_ name: String) throws -> [UInt8] { Array(try Data(contentsOf: url.appendingPathComponent(name))) }

    func text(_ name: String) throws -> String { String(decoding: try read(name), as: UTF8.self) }
}

/// Runs the `openssl` command line tool (the independent implementation we check interop against).
/// Returns its exit status and its stdout and stderr together.
@discardableResult
func openssl(_ arguments: [String]) throws -> (status: Int32, output: String) {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
    process.arguments = ["openssl"] + arguments
    let pipe = Pipe()
    process.standardOutput = pipe
    process.standardError = pipe
    process.standardInput = FileHandle.nullDevice  // never let it wait on a passphrase prompt
    try process.run()
    let output = pipe.fileHandleForReading.readDataToEndOfFile()  // before waiting: a full pipe would block it
    process.waitUntilExit()
    return (process.terminationStatus, String(decoding: output, as: UTF8.self))
}

/// Runs `openssl` and fails the test unless it exits 0.
func opensslOK(_ arguments: [String], file: StaticString = #filePath, line: UInt = #line) throws {
    let result = try openssl(arguments)
    XCTAssertEqual(result.status, 0, "openssl \(arguments.joined(separator: " ")): \(result.output)", file: file, line: line)
}

/// r ‖ s as DER `SEQUENCE { INTEGER r, INTEGER s }`, written apart from the library's own conversion
/// so the interop check does not trust the code it checks.
func derSignature(_ raw: [UInt8]) -> [UInt8] {
    func integer(_ magnitude: ArraySlice<UInt8>) -> [UInt8] {
        var value = Array(magnitude.drop(while: { $0 == 0 }))
        if value.isEmpty { value = [0] }
        if value[0] & 0x80 != 0 { value.insert(0, at: 0) }  // DER integers are signed
        return [0x02, UInt8(value.count)] + value
    }
    let body = integer(raw[0..<32]) + integer(raw[32..<64])
    return [0x30, UInt8(body.count)] + body  // at most 70 bytes: always the short length form
}

/// The reverse of `derSignature`, for signatures made by the openssl tool; nil if `der` is not one.
func rawSignature(_ der: [UInt8]) -> [UInt8]? {
    guard der.count >= 8, der[0] == 0x30, Int(der[1]) == der.count - 2 else { return nil }
    var raw: [UInt8] = []
    var i = 2
    for _ in 0..<2 {
        guard i + 2 <= der.count, der[i] == 0x02, i + 2 + Int(der[i + 1]) <= der.count else { return nil }
        let value = der[(i + 2)..<(i + 2 + Int(der[i + 1]))].drop(while: { $0 == 0 })
        guard value.count <= 32 else { return nil }
        raw += [UInt8](repeating: 0, count: 32 - value.count) + value
        i += 2 + Int(der[i + 1])
    }
    return i == der.count ? raw : nil
}
