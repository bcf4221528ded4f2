#ifndef DISPATCH_CNGHTTP2_SHIM_H
#define DISPATCH_CNGHTTP2_SHIM_H
/* nghttp2 (Debian libnghttp2-dev): HTTP/2 framing, streams and flow control for the APNs
   client (H2Client); no I/O of its own (mem_recv / mem_send). */
#include <nghttp2/nghttp2.h>
#endif
