#ifndef DISPATCH_CURL_DYNAMIC_H
#define DISPATCH_CURL_DYNAMIC_H
/* libcurl for the `dispatch` CLI, loaded with dlopen on first use rather than linked: linking it
   loads libcurl and its ~30 dependencies (OpenSSL, nghttp2, Kerberos, LDAP...) into every run
   of the CLI, which measured 3-5 ms on top of a ~5 ms `dispatch progress` against a local
   server. Only https:// needs it, so only https:// pays for it (docs/cli.md, Performance).

   The same typed-wrapper shape as CCurl's shim (Swift cannot call the variadic
   curl_easy_setopt), through function pointers resolved by dispatch_curl_load. */
#define CURL_DISABLE_TYPECHECK 1
#include <curl/curl.h>

/* Loads libcurl.so.4 (or the GnuTLS flavour) and runs curl_global_init, once; call it from the
   main thread before any other thread uses curl. NULL on success, else why it failed. */
const char *dispatch_curl_load(void);

CURL *dispatch_curl_easy_init(void);
void dispatch_curl_easy_cleanup(CURL *h);
CURLcode dispatch_curl_easy_perform(CURL *h);
CURLcode dispatch_curl_setopt_long(CURL *h, CURLoption o, long v);
CURLcode dispatch_curl_setopt_str(CURL *h, CURLoption o, const char *v);
CURLcode dispatch_curl_setopt_ptr(CURL *h, CURLoption o, void *v);
CURLcode dispatch_curl_setopt_xferinfo(CURL *h, curl_xferinfo_callback f);
CURLcode dispatch_curl_getinfo_socket(CURL *h, curl_socket_t *fd);
CURLcode dispatch_curl_getinfo_long(CURL *h, CURLINFO i, long *v);
CURLcode dispatch_curl_easy_send(CURL *h, const void *buffer, size_t length, size_t *sent);
CURLcode dispatch_curl_easy_recv(CURL *h, void *buffer, size_t length, size_t *received);
const char *dispatch_curl_easy_strerror(CURLcode code);
/* "libcurl/7.88.1 OpenSSL/3.0.15 ...", for error messages and --version. */
const char *dispatch_curl_version(void);
#endif
