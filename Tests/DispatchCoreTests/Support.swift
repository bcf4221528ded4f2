import Foundation
import XCTest
@testable import DispatchCore

/// A positive integer from the environment, or `fallback`.
func environmentInt(_ name: String, default fallback: Int) -> Int {
    guard let text = ProcessInfo.processInfo.environment[name], let n = Int(text), n > 0 else { return fallback }
    return n
}

func bytes(_ s: String) -> [UInt8] { Array(s.utf8) }
func text(_ b: [UInt8]) -> String { String(decoding: b, as: UTF8.self) }

enum PublishCall: String { case start, update, end }

/// Runs one publishing call's validation; nil on success.
func validationError(_ call: PublishCall, _ body: [UInt8]) -> DispatchError? {
    do throws(DispatchError) {
        switch call {
        case .start: _ = try Validation.start(body)
        case .update: _ = try Validation.update(body)
        case .end: _ = try Validation.end(body)
        }
        return nil
    } catch {
        return error
    }
}

/// The HTTP status each validation code must map to (contract §6).
let expectedStatus: [String: Int] = [
    "invalid_json": 400, "invalid_field": 400, "unknown_field": 400, "missing_field": 400, "body_too_large": 413,
]

/// Asserts a call's outcome: nil expects success, otherwise the error code and its HTTP status.
func assertValidation(_ call: PublishCall, _ body: String, _ code: String?, file: StaticString = #filePath, line: UInt = #line) {
    assertValidation(call, bytes(body), code, label: body, file: file, line: line)
}

func assertValidation(_ call: PublishCall, _ body: [UInt8], _ code: String?, label: String? = nil,
                      file: StaticString = #filePath, line: UInt = #line) {
    let err = validationError(call, body)
    let shown = label.map { $0.count > 120 ? String($0.prefix(120)) + "…" : $0 } ?? "\(body.count) bytes"
    XCTAssertEqual(err?.code.rawValue, code, "\(call) \(shown): \(err?.message ?? "accepted")", file: file, line: line)
    if let err, let code, let status = expectedStatus[code] {
        XCTAssertEqual(err.httpStatus, status, "\(call) \(shown)", file: file, line: line)
    }
}

/// A JSON string literal for `s`, as a client would send it.
func quoted(_ s: String) -> String {
    var out: [UInt8] = []
    JSONWriter.appendQuoted(s, to: &out)
    return text(out)
}
