#ifndef DISPATCH_CNATS_SHIM_H
#define DISPATCH_CNATS_SHIM_H
/* The official NATS C client (Debian's libnats-dev). Only nats.h: the libevent adapter in
   nats/adapters/ defines functions in its header, and Dispatch uses the client's own I/O
   threads anyway (see NATSClient.swift). */
#include <sys/types.h>
#include <stdint.h>
#include <stdbool.h>
/* The eventfd through which the library's threads wake the loop (Swift's Glibc lacks it). */
#include <sys/eventfd.h>
#include <nats/nats.h>
#endif
