import DispatchCore
import DispatchIO

/// Remote cancel and keeping an activity fresh (contract §5.3, §5.4).
extension API {
    func cancel(_ req: HTTPRequest, _ id: String) {
        fail(req, DispatchError(.notFound, "remote cancel is not available yet"))
    }

    func touch(_ req: HTTPRequest, _ id: String) {
        fail(req, DispatchError(.notFound, "touch is not available yet"))
    }
}
