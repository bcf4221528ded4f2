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

    init(vault: TokenVault, pushes: Bool) {
        self.vault = vault
        self.pushes = pushes
    }
}

/// Devices and their Live Activity tokens (contract §5.1).
extension API {
    func registerTokens(_ req: HTTPRequest) {
        authenticated(req, .device) { [unowned self] _ in
            if let e = API.requireJSON(req) { return self.fail(req, e) }
            guard let devices = self.devices else { return self.fail(req, API.devicesUnavailable) }
            let registration: DeviceRegistration
            let queries: [PGQuery]
            do {
                registration = try DeviceRegistration.parse(req.body())
                queries = try DeviceRepository.register(registration, vault: devices.vault, pushes: devices.pushes,
                                                      nowMs: Clock.nowMilliseconds())
            } catch let e as DispatchError {
                return self.fail(req, e)
            } catch {
                self.log.error("devices.seal_failed", [("error", "\(error)")])
                return self.fail(req, DispatchError(.internalError, "the tokens could not be stored"))
            }
            self.register(req, queries, devices: devices, hint: PushToken.hint(registration.deviceToken), attempt: 1)
        }
    }

    /// Runs a registration's batch; a deadlock with a concurrent publish batch (both lock
    /// activity rows) is tried again.
    private func register(_ req: HTTPRequest, _ queries: [PGQuery], devices: DevicesContext, hint: String, attempt: Int) {
        db.reader.execute(queries) { [weak self] result in
            guard let self else { return }
            switch result {
            case .failure:
                self.fail(req, Database.unavailable)
            case .success(let rs) where rs.allSatisfy(\.ok):
                if devices.pushes { devices.kick() }
                self.log.debug("devices.registered", [("device", hint), ("activity_tokens", rs.last?.rows.count ?? 0)])
                self.reply(req, 200, DeviceRepository.summaryJSON(rs[rs.count - 1], apns: devices.pushes))
            case .success(let rs):
                let failed = rs.first { !$0.ok }
                if attempt < 3, let state = failed?.sqlState, state == "40P01" || state == "40001" {
                    return self.register(req, queries, devices: devices, hint: hint, attempt: attempt + 1)
                }
                self.log.error("devices.register_failed", [("device", hint), ("error", (failed?.errorMessage ?? "").trimmingNewlines)])
                self.fail(req, DispatchError(.internalError, "the tokens could not be stored"))
            }
        }
    }

    func forgetDevice(_ req: HTTPRequest, _ token: String) {
        authenticated(req, .device) { [unowned self] _ in
            guard let devices = self.devices else { return self.fail(req, API.devicesUnavailable) }
            let valid: String
            do throws(DispatchError) { valid = try PushToken.validate(token, field: "deviceToken") } catch { return self.fail(req, error) }
            self.db.read(DeviceRepository.forget(mac: devices.vault.mac(valid))) { result in
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
