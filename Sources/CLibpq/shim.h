#ifndef DISPATCH_CLIBPQ_SHIM_H
#define DISPATCH_CLIBPQ_SHIM_H
#include <libpq-fe.h>
#endif
