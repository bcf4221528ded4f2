#ifndef DISPATCH_CTLS_SHIM_H
#define DISPATCH_CTLS_SHIM_H
/* OpenSSL's libssl and libevent's OpenSSL bufferevents (Debian libssl-dev, libevent-dev):
   TLS client connections on our libevent loop, for the APNs client (H2Client). The libevent
   types it needs are opaque pointers, as in CLibevent. */
#include <sys/types.h>
#include <sys/time.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <stdint.h>
#include <openssl/ssl.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>
#include <event2/event.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/buffer.h>
#include <event2/dns.h>
#include <event2/util.h>

/* Macros Swift cannot call. */
static inline int dispatch_ssl_ctx_min_tls12(SSL_CTX *ctx) {
    return (int)SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
}
static inline int dispatch_ssl_set_sni(SSL *ssl, const char *name) {
    return (int)SSL_set_tlsext_host_name(ssl, name);
}
#endif
