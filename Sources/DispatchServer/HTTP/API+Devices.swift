import DispatchCore
import DispatchIO
import DispatchSystem

/// What the devices API needs beyond the database: the vault for tokens, and the sender to
/// wake when a registration marked the outbox.
final class DevicesContext {
    let vault: TokenVault
    /// APNs is configured: registrations lead to pushes.
    let pushes: Bool
    var kick: () -> Void = {}
    let limits: KeyLimits
    /// Registrations and deletions per key (this worker's share of the rate).
    private var registrations: PerKeyRate

    init(vault: TokenVault, pushes: Bool, limits: KeyLimits) {
        self.vault = vault
        self.pushes = pushes
        self.limits = limits
        registrations = PerKeyRate(rate: limits.deviceRatePerSecond)
    }

    /// The per-key device rate (DISPATCH_DEVICE_RATE); admin keys are not limited.
    func checkRate(_ key: APIKey) -> DispatchError? {
        let rate = limits.deviceRatePerSecond
        guard rate > 0, !key.isAdmin else { return nil }
        guard let wait = registrations.take(key.id, now: Clock.monotonic()) else { return nil }
        var e = DispatchError(.rateLimited, "device registration rate limit of \(rate)/s for key \(key.name) exceeded")
        e.retryAfterSeconds = max(1, Int(wait.rounded(.up)))
        return e
    }

    /// Devices this key may register; 0: no limit (admin keys).
    func maxDevices(_ key: APIKey) -> Int { key.isAdmin ? 0 : limits.maxDevicesPerKey }
}

/// Devices and their Live Activity tokens (contract §5.1): each registration belongs to the
/// key that made it, and no other key sees, changes or forgets it (§6).
extension API {
    func registerTokens(_ req: HTTPRequest) {
        authenticated(req, .device) { [unowned self] key in
            if let e = API.requireJSON(req) { return self.fail(req, e) }
            guard let devices = self.devices else { return self.fail(req, API.devicesUnavailable) }
            if let e = devices.checkRate(key) { return self.fail(req, e) }
            let registration: DeviceRegistration
            let queries: [PGQuery]
            do {
                registration = try DeviceRegistration.parse(req.body())
                if let e = KeyRules.registrationRefusal(registration, mayRead: key.allows(.read)) { return self.fail(req, e) }
                queries = try DeviceRepository.register(registration, keyID: key.id, maxDevices: devices.maxDevices(key),
                                                      maxTokens: devices.limits.maxActivityTokensPerDevice,
                                                      vault: devices.vault, pushes: devices.pushes, nowMs: Clock.nowMilliseconds())
            } catch let e as DispatchError {
                return self.fail(req, e)
            } catch {
                self.log.error("devices.seal_failed", [("error", "\(error)")])
                return self.fail(req, DispatchError(.internalError, "the tokens could not be stored"))
            }
            self.register(req, queries, devices: devices, hint: PushToken.hint(registration.deviceToken),
                          maxDevices: devices.maxDevices(key), attempt: 1)
        }
    }

    /// Runs a registration's batch; a deadlock with a concurrent publish batch (both lock
    /// activity rows) is tried again.
    private func register(_ req: HTTPRequest, _ queries: [PGQuery], devices: DevicesContext, hint: String, maxDevices: Int, attempt: Int) {
        db.reader.execute(queries) { [weak self] result in
            guard let self else { return }
            switch result {
            case .failure:
                self.fail(req, Database.unavailable)
            case .success(let rs) where rs.allSatisfy(\.ok) && rs[DeviceRepository.upsertIndex].rows.isEmpty:
                // A new device past the key's limit: nothing was written.
                self.fail(req, KeyRules.tooManyDevices(max: maxDevices))
            case .success(let rs) where rs.allSatisfy(\.ok):
                if devices.pushes { devices.kick() }
                self.log.debug("devices.registered", [("device", hint), ("activity_tokens", rs.last?.rows.count ?? 0)])
                self.reply(req, 200, DeviceRepository.summaryJSON(rs[rs.count - 1], apns: devices.pushes))
            case .success(let rs):
                let failed = rs.first { !$0.ok }
                if attempt < 3, let state = failed?.sqlState, state == "40P01" || state == "40001" {
                    return self.register(req, queries, devices: devices, hint: hint, maxDevices: maxDevices, attempt: attempt + 1)
                }
                self.log.error("devices.register_failed", [("device", hint), ("error", (failed?.errorMessage ?? "").trimmingNewlines)])
                self.fail(req, DispatchError(.internalError, "the tokens could not be stored"))
            }
        }
    }

    /// `204` whether or not this key had registered the device: the answer tells nothing about
    /// other keys' registrations, which stay as they are.
    func forgetDevice(_ req: HTTPRequest, _ token: String) {
        authenticated(req, .device) { [unowned self] key in
            guard let devices = self.devices else { return self.fail(req, API.devicesUnavailable) }
            if let e = devices.checkRate(key) { return self.fail(req, e) }
            let valid: String
            do throws(DispatchError) { valid = try PushToken.validate(token, field: "deviceToken") } catch { return self.fail(req, error) }
            self.db.read(DeviceRepository.forget(mac: devices.vault.mac(valid), keyID: key.id)) { result in
                switch result {
                case .failure(let e): self.fail(req, e)
                case .success(let r):
                    self.log.info("devices.forgotten", [("device", PushToken.hint(valid)), ("known", !r.rows.isEmpty)])
                    self.reply(req, 204, [])
                }
            }
        }
    }

    static let devicesUnavailable = DispatchError(
        .notFound, "Live Activity devices are not set up on this server (it needs DISPATCH_TOKEN_KEY to keep tokens)")
}
