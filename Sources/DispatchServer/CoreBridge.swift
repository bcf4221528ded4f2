import DispatchCore

enum DispatchCoreBridge {
    static func sha256Hex(_ s: String) -> String { SHA256.hex(Array(s.utf8)) }
}
