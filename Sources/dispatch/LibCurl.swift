#if canImport(Glibc)
import Glibc
#endif
import CCurlDynamic

/// libcurl, loaded with dlopen the first time an https:// URL needs it: linking it would load
/// it and its ~30 dependencies (OpenSSL, nghttp2, Kerberos, LDAP...) into every run of the
/// CLI, 3-5 ms on top of a ~5 ms `dispatch progress` (docs/cli.md, Performance).
struct LibCurl {
    typealias Handle = UnsafeMutableRawPointer

    let easyInit: @convention(c) () -> Handle?
    let easyCleanup: @convention(c) (Handle?) -> Void
    let easyPerform: @convention(c) (Handle?) -> CURLcode
    let easySend: @convention(c) (Handle?, UnsafeRawPointer?, Int, UnsafeMutablePointer<Int>?) -> CURLcode
    let easyRecv: @convention(c) (Handle?, UnsafeMutableRawPointer?, Int, UnsafeMutablePointer<Int>?) -> CURLcode
    let easyStrerror: @convention(c) (CURLcode) -> UnsafePointer<CChar>?
    /// The variadic ones, called through the shim's typed trampolines.
    let setopt: UnsafeMutableRawPointer
    let getinfo: UnsafeMutableRawPointer

    /// Loaded once; call it on the main thread before other threads start (curl_global_init is
    /// not thread-safe).
    nonisolated(unsafe) static let shared: Result<LibCurl, LoadError> = load()

    struct LoadError: Error { let message: String }

    private static func load() -> Result<LibCurl, LoadError> {
        let names = ["libcurl.so.4", "libcurl-gnutls.so.4", "libcurl.so"]
        guard let lib = names.lazy.compactMap({ dlopen($0, RTLD_NOW | RTLD_LOCAL) }).first else {
            return .failure(LoadError(message: "https:// needs libcurl, which is not installed (Debian/Ubuntu: apt-get install libcurl4)"))
        }
        var missing: String?
        func symbol<T>(_ name: String, as type: T.Type) -> T? {
            guard let p = dlsym(lib, name) else { missing = missing ?? name; return nil }
            return unsafeBitCast(p, to: type)
        }
        typealias GlobalInit = @convention(c) (Int) -> CURLcode
        guard let easyInit = symbol("curl_easy_init", as: (@convention(c) () -> Handle?).self),
              let easyCleanup = symbol("curl_easy_cleanup", as: (@convention(c) (Handle?) -> Void).self),
              let easyPerform = symbol("curl_easy_perform", as: (@convention(c) (Handle?) -> CURLcode).self),
              let easySend = symbol("curl_easy_send", as: (@convention(c) (Handle?, UnsafeRawPointer?, Int, UnsafeMutablePointer<Int>?) -> CURLcode).self),
              let easyRecv = symbol("curl_easy_recv", as: (@convention(c) (Handle?, UnsafeMutableRawPointer?, Int, UnsafeMutablePointer<Int>?) -> CURLcode).self),
              let easyStrerror = symbol("curl_easy_strerror", as: (@convention(c) (CURLcode) -> UnsafePointer<CChar>?).self),
              let globalInit = symbol("curl_global_init", as: GlobalInit.self),
              let setopt = dlsym(lib, "curl_easy_setopt"), let getinfo = dlsym(lib, "curl_easy_getinfo") else {
            return .failure(LoadError(message: "the installed libcurl lacks \(missing ?? "curl_easy_setopt or curl_easy_getinfo")"))
        }
        guard globalInit(Int(CURL_GLOBAL_SSL | CURL_GLOBAL_WIN32)) == CURLE_OK else {
            return .failure(LoadError(message: "libcurl failed to initialise"))
        }
        return .success(LibCurl(easyInit: easyInit, easyCleanup: easyCleanup, easyPerform: easyPerform, easySend: easySend,
                                easyRecv: easyRecv, easyStrerror: easyStrerror, setopt: setopt, getinfo: getinfo))
    }

    func set(_ h: Handle, _ option: CURLoption, _ value: Int) -> CURLcode {
        dispatch_curl_call_setopt_long(setopt, h, option, value)
    }

    func set(_ h: Handle, _ option: CURLoption, _ value: String?) -> CURLcode {
        dispatch_curl_call_setopt_str(setopt, h, option, value)
    }

    func set(_ h: Handle, _ option: CURLoption, pointer: UnsafeMutableRawPointer?) -> CURLcode {
        dispatch_curl_call_setopt_ptr(setopt, h, option, pointer)
    }

    func setProgress(_ h: Handle, _ callback: curl_xferinfo_callback) -> CURLcode {
        dispatch_curl_call_setopt_xferinfo(setopt, h, callback)
    }

    func activeSocket(_ h: Handle, _ fd: inout curl_socket_t) -> CURLcode {
        dispatch_curl_call_getinfo_socket(getinfo, h, &fd)
    }

    func describe(_ code: CURLcode) -> String {
        easyStrerror(code).map { String(cString: $0) } ?? "curl error \(code.rawValue)"
    }
}
