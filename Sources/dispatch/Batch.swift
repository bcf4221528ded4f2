#if canImport(Glibc)
import Glibc
#endif
import DispatchCore
import DispatchSystem
import DispatchCLIKit

/// `dispatch batch [FILE|-]`: reads the lines, sends them as `POST /v1/changes` requests
/// (CLIBatch decides the rest), prints one result line per change in input order.
enum BatchCommand {
    static func run(_ o: CLIBatchOptions, client: Client) -> CLIExitCode {
        let input: [UInt8]?
        if let path = o.path { input = Files.readBytes(path) } else { input = Files.readStandardInput() }
        guard let input else {
            Output.fail("batch", "cannot read \(o.path ?? "standard input")")
            return .usage
        }
        // Each line, in order: a change to send (its index among those sent) or a result made here.
        var lines: [CLIBatch.Line] = []
        for (number, text) in CLIBatch.lines(input) {
            lines.append(CLIBatch.prepare(text, number: number, newKey: System.randomKey))
        }
        var changes: [[UInt8]] = []
        for case .change(let c) in lines { changes.append(c) }
        var refused = 0
        var next = 0  // the next line to print
        var sent = 0  // changes answered so far
        /// Prints the lines up to (not including) the change with index `upTo`, from `results`.
        func printLines(answered results: [String], upTo: Int) {
            var r = 0
            while next < lines.count {
                switch lines[next] {
                case .refused(let line):
                    refused += 1
                    Output.out(line)
                case .change:
                    guard sent + r < upTo else { return }
                    if !CLIBatch.accepted(results[r]) { refused += 1 }
                    Output.out(results[r])
                    r += 1
                }
                next += 1
            }
        }
        for range in CLIBatch.requests(changes, maxChanges: o.size) {
            switch client.call(method: "POST", path: "/v1/changes", body: CLIBatch.body(changes[range])) {
            case .failed(let code, let message):
                Output.fail("batch", message)
                return code
            case .answered(let response):
                guard case .success = CLIHTTPDisposition.of(status: response.head.status, body: response.body) else {
                    Output.fail("batch", CLIServerError.describe(status: response.head.status, body: response.body))
                    if case .fail(let code) = CLIHTTPDisposition.of(status: response.head.status, body: response.body) { return code }
                    return .unavailable
                }
                guard let results = CLIBatch.results(response.body, expected: range.count) else {
                    Output.fail("batch", "the server's answer is not one result per change")
                    return .unavailable
                }
                printLines(answered: results, upTo: range.upperBound)
                sent = range.upperBound
            }
        }
        printLines(answered: [], upTo: sent)
        return CLIBatch.exitCode(refused: refused)
    }
}
