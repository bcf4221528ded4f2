#ifndef DISPATCH_CLIBEVENT_SHIM_H
#define DISPATCH_CLIBEVENT_SHIM_H
/* System headers first, before event-config.h defines _GNU_SOURCE, so their
   declarations match the ones Swift's Glibc module already has. */
#include <sys/types.h>
#include <sys/time.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <stdint.h>
#include <event2/event.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/listener.h>
#include <event2/http.h>
#include <event2/http_struct.h>
#include <event2/keyvalq_struct.h>
#include <event2/thread.h>
#include <event2/util.h>
#endif
