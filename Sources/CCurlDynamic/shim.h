#ifndef DISPATCH_CCURL_DYNAMIC_SHIM_H
#define DISPATCH_CCURL_DYNAMIC_SHIM_H
/* libcurl's declarations for the `dispatch` CLI, which loads libcurl with dlopen on first use
   instead of linking it (see Sources/dispatch/LibCurl.swift): no `link` in the module map.
   curl_easy_setopt and curl_easy_getinfo are variadic, which Swift cannot call, so these
   typed trampolines call them through the pointer the CLI found with dlsym. */
#define CURL_DISABLE_TYPECHECK 1
#include <sys/types.h>
#include <sys/socket.h>
#include <curl/curl.h>

typedef CURLcode (*dispatch_curl_setopt_fn)(CURL *, CURLoption, ...);
typedef CURLcode (*dispatch_curl_getinfo_fn)(CURL *, CURLINFO, ...);

static inline CURLcode dispatch_curl_call_setopt_long(void *fn, CURL *h, CURLoption o, long v) { return ((dispatch_curl_setopt_fn)fn)(h, o, v); }
static inline CURLcode dispatch_curl_call_setopt_str(void *fn, CURL *h, CURLoption o, const char *v) { return ((dispatch_curl_setopt_fn)fn)(h, o, v); }
static inline CURLcode dispatch_curl_call_setopt_ptr(void *fn, CURL *h, CURLoption o, void *v) { return ((dispatch_curl_setopt_fn)fn)(h, o, v); }
static inline CURLcode dispatch_curl_call_setopt_xferinfo(void *fn, CURL *h, curl_xferinfo_callback f) { return ((dispatch_curl_setopt_fn)fn)(h, CURLOPT_XFERINFOFUNCTION, f); }
static inline CURLcode dispatch_curl_call_getinfo_socket(void *fn, CURL *h, curl_socket_t *fd) { return ((dispatch_curl_getinfo_fn)fn)(h, CURLINFO_ACTIVESOCKET, fd); }
static inline CURLcode dispatch_curl_call_getinfo_long(void *fn, CURL *h, CURLINFO i, long *v) { return ((dispatch_curl_getinfo_fn)fn)(h, i, v); }
#endif
