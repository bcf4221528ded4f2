import DispatchCore
import DispatchIO

/// Devices and their Live Activity tokens (contract §5.1).
extension API {
    func registerTokens(_ req: HTTPRequest) {
        fail(req, DispatchError(.notFound, "device registration is not available yet"))
    }

    func forgetDevice(_ req: HTTPRequest, _ token: String) {
        fail(req, DispatchError(.notFound, "device registration is not available yet"))
    }
}
