#ifndef DISPATCH_CCURL_SHIM_H
#define DISPATCH_CCURL_SHIM_H
/* The typed wrappers below replace curl's type-checking macros. */
#define CURL_DISABLE_TYPECHECK 1
#include <sys/types.h>
#include <sys/socket.h>
#include <curl/curl.h>

/* curl_easy_setopt, curl_multi_setopt and curl_easy_getinfo are variadic, which Swift cannot
   call: one typed wrapper per argument type. Callback options take their exact C type, so a
   Swift closure literal converts to it. */

static inline CURLcode dispatch_curl_easy_setopt_long(CURL *h, CURLoption o, long v) { return curl_easy_setopt(h, o, v); }
static inline CURLcode dispatch_curl_easy_setopt_off(CURL *h, CURLoption o, curl_off_t v) { return curl_easy_setopt(h, o, v); }
static inline CURLcode dispatch_curl_easy_setopt_ptr(CURL *h, CURLoption o, void *v) { return curl_easy_setopt(h, o, v); }
static inline CURLcode dispatch_curl_easy_setopt_str(CURL *h, CURLoption o, const char *v) { return curl_easy_setopt(h, o, v); }
static inline CURLcode dispatch_curl_easy_setopt_slist(CURL *h, CURLoption o, struct curl_slist *v) { return curl_easy_setopt(h, o, v); }
static inline CURLcode dispatch_curl_easy_setopt_write(CURL *h, CURLoption o, curl_write_callback f) { return curl_easy_setopt(h, o, f); }
static inline CURLcode dispatch_curl_easy_setopt_opensocket(CURL *h, curl_opensocket_callback f) { return curl_easy_setopt(h, CURLOPT_OPENSOCKETFUNCTION, f); }
static inline CURLcode dispatch_curl_easy_setopt_closesocket(CURL *h, curl_closesocket_callback f) { return curl_easy_setopt(h, CURLOPT_CLOSESOCKETFUNCTION, f); }

static inline CURLMcode dispatch_curl_multi_setopt_long(CURLM *m, CURLMoption o, long v) { return curl_multi_setopt(m, o, v); }
static inline CURLMcode dispatch_curl_multi_setopt_ptr(CURLM *m, CURLMoption o, void *v) { return curl_multi_setopt(m, o, v); }
static inline CURLMcode dispatch_curl_multi_setopt_socket(CURLM *m, curl_socket_callback f) { return curl_multi_setopt(m, CURLMOPT_SOCKETFUNCTION, f); }
static inline CURLMcode dispatch_curl_multi_setopt_timer(CURLM *m, curl_multi_timer_callback f) { return curl_multi_setopt(m, CURLMOPT_TIMERFUNCTION, f); }

static inline CURLcode dispatch_curl_easy_getinfo_long(CURL *h, CURLINFO i, long *v) { return curl_easy_getinfo(h, i, v); }
static inline CURLcode dispatch_curl_easy_getinfo_off(CURL *h, CURLINFO i, curl_off_t *v) { return curl_easy_getinfo(h, i, v); }
static inline CURLcode dispatch_curl_easy_getinfo_str(CURL *h, CURLINFO i, char **v) { return curl_easy_getinfo(h, i, v); }

/* The address curl is about to connect to; its storage is large enough for sockaddr_in6
   although the field is declared as a plain struct sockaddr. */
static inline const struct sockaddr *dispatch_curl_sockaddr(const struct curl_sockaddr *a) { return &a->addr; }

/* CURL_GLOBAL_DEFAULT is a macro built from others; give Swift a plain call. */
static inline CURLcode dispatch_curl_global_init(void) { return curl_global_init(CURL_GLOBAL_DEFAULT); }
#endif
