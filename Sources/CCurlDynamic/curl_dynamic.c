#include "curl_dynamic.h"
#include <dlfcn.h>
#include <stddef.h>

static struct {
    CURL *(*easy_init)(void);
    void (*easy_cleanup)(CURL *);
    CURLcode (*easy_perform)(CURL *);
    CURLcode (*easy_setopt)(CURL *, CURLoption, ...);
    CURLcode (*easy_getinfo)(CURL *, CURLINFO, ...);
    CURLcode (*easy_send)(CURL *, const void *, size_t, size_t *);
    CURLcode (*easy_recv)(CURL *, void *, size_t, size_t *);
    const char *(*easy_strerror)(CURLcode);
    char *(*version)(void);
    CURLcode (*global_init)(long);
} fn;

static int loaded;
static const char *load_error;

const char *dispatch_curl_load(void) {
    if (loaded) return load_error;
    loaded = 1;
    static const char *names[] = {"libcurl.so.4", "libcurl-gnutls.so.4", "libcurl.so", "libcurl.4.dylib"};
    void *lib = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !lib; i++) lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) return load_error = "https:// needs libcurl, which is not installed (Debian/Ubuntu: apt-get install libcurl4)";
#define LOAD(field, symbol) \
    if (!(*(void **)&fn.field = dlsym(lib, symbol))) return load_error = "the installed libcurl lacks " symbol;
    LOAD(easy_init, "curl_easy_init")
    LOAD(easy_cleanup, "curl_easy_cleanup")
    LOAD(easy_perform, "curl_easy_perform")
    LOAD(easy_setopt, "curl_easy_setopt")
    LOAD(easy_getinfo, "curl_easy_getinfo")
    LOAD(easy_send, "curl_easy_send")
    LOAD(easy_recv, "curl_easy_recv")
    LOAD(easy_strerror, "curl_easy_strerror")
    LOAD(version, "curl_version")
    LOAD(global_init, "curl_global_init")
#undef LOAD
    if (fn.global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) return load_error = "libcurl failed to initialise";
    return NULL;
}

CURL *dispatch_curl_easy_init(void) { return fn.easy_init(); }
void dispatch_curl_easy_cleanup(CURL *h) { fn.easy_cleanup(h); }
CURLcode dispatch_curl_easy_perform(CURL *h) { return fn.easy_perform(h); }
CURLcode dispatch_curl_setopt_long(CURL *h, CURLoption o, long v) { return fn.easy_setopt(h, o, v); }
CURLcode dispatch_curl_setopt_str(CURL *h, CURLoption o, const char *v) { return fn.easy_setopt(h, o, v); }
CURLcode dispatch_curl_setopt_ptr(CURL *h, CURLoption o, void *v) { return fn.easy_setopt(h, o, v); }
CURLcode dispatch_curl_setopt_xferinfo(CURL *h, curl_xferinfo_callback f) { return fn.easy_setopt(h, CURLOPT_XFERINFOFUNCTION, f); }
CURLcode dispatch_curl_getinfo_socket(CURL *h, curl_socket_t *fd) { return fn.easy_getinfo(h, CURLINFO_ACTIVESOCKET, fd); }
CURLcode dispatch_curl_getinfo_long(CURL *h, CURLINFO i, long *v) { return fn.easy_getinfo(h, i, v); }
CURLcode dispatch_curl_easy_send(CURL *h, const void *b, size_t n, size_t *sent) { return fn.easy_send(h, b, n, sent); }
CURLcode dispatch_curl_easy_recv(CURL *h, void *b, size_t n, size_t *received) { return fn.easy_recv(h, b, n, received); }
const char *dispatch_curl_easy_strerror(CURLcode code) { return fn.easy_strerror(code); }
const char *dispatch_curl_version(void) { return fn.version(); }
