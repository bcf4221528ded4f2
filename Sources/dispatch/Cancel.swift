#if canImport(Glibc)
import Glibc
#endif
import DispatchCore
import DispatchCrypto
import DispatchSystem
import DispatchCLIKit

/// `dispatch cancel`, `dispatch touch` and `dispatch verify-webhook`.
enum CancelCommands {
    static func cancel(_ o: CLICancelOptions, client: Client) -> CLIExitCode {
        client.publish(command: "cancel", path: Client.activityPath(o.activityID, "/cancel"), body: CLIRequestBody.cancel(o)) { response in
            if client.global.json { client.printBody(response.body) }
        }
    }

    /// An empty body (Content-Length: 0): a touch changes nothing but the stale deadline, and
    /// repeating it is harmless.
    static func touch(_ id: String, client: Client) -> CLIExitCode {
        switch client.call(method: "POST", path: Client.activityPath(id, "/touch"), body: []) {
        case .failed(let code, let message):
            Output.fail("touch", message)
            return code
        case .answered(let response):
            switch CLIHTTPDisposition.of(status: response.head.status) {
            case .success:
                return .success
            case .fail(let code):
                Output.fail("touch", CLIServerError.describe(status: response.head.status, body: response.body))
                return code
            case .retry:
                Output.fail("touch", CLIServerError.describe(status: response.head.status, body: response.body))
                return .unavailable
            }
        }
    }

    /// Exit 0: the body is signed by the secret, recently enough; 1: it is not (or unreadable).
    static func verifyWebhook(_ o: CLIVerifyWebhookOptions) -> Int32 {
        guard let body = o.bodyPath == "-" ? Files.readStandardInput() : Files.readBytes(o.bodyPath) else {
            Output.fail("verify-webhook", "cannot read \(o.bodyPath): \(System.errorText(errno))")
            return 1
        }
        let result = CLIWebhookVerifier.verify(
            header: o.signature, body: body, secret: o.secret, now: Clock.nowMilliseconds() / 1000, maxAge: o.maxAge,
            mac: { HMACSHA256.mac(key: $0, message: $1) }, equal: { constantTimeEquals($0, $1) })
        switch result {
        case .success:
            return 0
        case .failure(let failure):
            Output.fail("verify-webhook", failure.message)
            return 1
        }
    }
}
