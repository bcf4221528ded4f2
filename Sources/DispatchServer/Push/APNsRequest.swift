import DispatchCore
import DispatchCrypto
import DispatchIO

/// The wire side of one push: the provider token (an ES256 JWT) and the HTTP/2 request.
enum APNsRequest {
    /// `header.claims.signature`, each base64url: `{"alg":"ES256","kid":…}`, `{"iss":…,"iat":…}`.
    static func providerToken(keyID: String, teamID: String, issuedAt: Int64, signer: ES256Signer) throws(CryptoError) -> String {
        var header = JSONWriter()
        header.beginObject(); header.field("alg", "ES256"); header.field("kid", keyID); header.endObject()
        var claims = JSONWriter()
        claims.beginObject(); claims.field("iss", teamID); claims.field("iat", issuedAt); claims.endObject()
        let input = Base64.urlEncode(header.bytes) + "." + Base64.urlEncode(claims.bytes)
        return input + "." + Base64.urlEncode(try signer.sign(Array(input.utf8)))
    }

    static func make(_ settings: APNsSettings, environment: APNsEnvironment, token: String, providerToken: String, body: [UInt8],
                     priority: Int, expiration: Int64, timeout: Double) -> CurlClient.Request {
        CurlClient.Request(url: settings.pushURL(environment) + "/3/device/" + token, method: "POST", headers: [
            ("authorization", "bearer " + providerToken),
            ("apns-topic", settings.apnsTopic),
            ("apns-push-type", "liveactivity"),
            ("apns-priority", String(priority)),
            ("apns-expiration", String(expiration)),
            ("content-type", "application/json"),
        ], body: body, timeout: timeout)
    }

    /// What a transfer that got no answer means for the push.
    static func failure(_ kind: HTTPClientFailure.Kind) -> APNsAnswer.TransportFailure {
        switch kind {
        case .retryOnNewConnection: return .connectionLost
        case .timeout: return .timeout
        case .connect, .tls, .refusedAddress: return .connect
        case .invalidRequest: return .invalidRequest
        case .cancelled: return .cancelled
        case .other: return .other
        }
    }
}
