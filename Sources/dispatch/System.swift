#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import DispatchCore
import DispatchSystem
import DispatchCLIKit

/// The few system services the CLI needs beyond DispatchSystem's, over plain libc (no Foundation:
/// it costs start-up time).
enum System {
    static func errorText(_ code: Int32) -> String {
        guard let s = strerror(code) else { return "error \(code)" }
        return String(cString: s).lowercased()
    }

    static func randomKey() -> String {
        var rng = SystemRandomNumberGenerator()
        return CLIIdempotencyKey.make(rng.next(), rng.next())
    }

    /// A random (version 4) UUID for `run`'s activity.
    static func newActivityID() -> String {
        var rng = SystemRandomNumberGenerator()
        return CLIActivityID.uuid(rng.next(), rng.next())
    }

    static func isTerminal(_ fd: Int32) -> Bool { isatty(fd) == 1 }

    /// This machine's host name (gethostname), nil when it has none.
    static func hostName() -> String? {
        var buffer = [CChar](repeating: 0, count: 256)
        guard gethostname(&buffer, buffer.count - 1) == 0 else { return nil }
        let name = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return name.isEmpty ? nil : name
    }

    static func terminalWidth() -> Int {
        var ws = winsize()
        if ioctl(1, UInt(TIOCGWINSZ), &ws) == 0, ws.ws_col > 0 { return Int(ws.ws_col) }
        if let c = Subprocess.environment("COLUMNS"), let n = Int(c), n > 0 { return n }
        return 80
    }

    /// Set by the signal handlers of `watch` so sleeps and reads stop early.
    nonisolated(unsafe) static var interruptSignal: Int32 = 0
    static func interrupted() -> Bool { interruptSignal != 0 }
}

/// Unbuffered output straight to a file descriptor: lines reach a pipe as they are printed.
enum Output {
    static func write(_ fd: Int32, _ bytes: [UInt8]) {
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { raw in
                Glibc.write(fd, raw.baseAddress! + offset, raw.count - offset)
            }
            if n < 0 {
                if errno == EINTR { continue }
                return  // EPIPE and friends: the reader is gone; nothing useful to do
            }
            offset += n
        }
    }

    static func out(_ s: String) { write(1, Array((s + "\n").utf8)) }
    static func outRaw(_ s: String) { write(1, Array(s.utf8)) }
    static func err(_ s: String) { write(2, Array((s + "\n").utf8)) }

    /// `dispatch progress: activity not found (not_found, HTTP 404)`.
    static func fail(_ command: String, _ message: String) {
        err("dispatch \(command): \(message)")
    }
}

/// Notes on stderr besides errors: `retrying…`, run's activity id. Off with `--quiet` when
/// stderr is not a terminal (CLIFeedback decides); safe from any thread.
enum Notes {
    nonisolated(unsafe) static var enabled = true
    nonisolated(unsafe) private static var lock = pthread_mutex_t()
    nonisolated(unsafe) private static var shown: Set<String> = []

    static func show(_ command: String, _ text: String) {
        guard enabled else { return }
        Output.fail(command, text)
    }

    /// Shows the note the first time `key` comes up in this process only.
    static func once(_ key: String, _ command: String, _ text: String) {
        pthread_mutex_lock(&lock)
        let first = shown.insert(key).inserted
        pthread_mutex_unlock(&lock)
        if first { show(command, text) }
    }
}
