import DispatchCore
import DispatchIO

/// The feed, the Activities view and the API description (contract §8, §9).
extension API {
    func feed(_ req: HTTPRequest) {
        fail(req, DispatchError(.notFound, "the feed is not available yet"))
    }

    func page(_ req: HTTPRequest, _ name: String) {
        fail(req, DispatchError(.notFound, "no such endpoint"))
    }

    func openAPI(_ req: HTTPRequest) {
        fail(req, DispatchError(.notFound, "no such endpoint"))
    }
}
