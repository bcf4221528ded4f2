// picohttpparser (MIT, by Kazuho Oku et al.), as Debian ships it: compiled into libh2o-evloop
// (package libh2o-evloop-dev), which exports its functions but installs no header of its own.
// These are its documented declarations; nothing else of h2o is used.
#ifndef DISPATCH_CPICOHTTPPARSER_SHIM_H
#define DISPATCH_CPICOHTTPPARSER_SHIM_H
#include <stddef.h>


struct phr_header {
    const char *name;
    size_t name_len;
    const char *value;
    size_t value_len;
};

// Bytes consumed (the whole head), -1 on a malformed head, -2 while it is incomplete.
int phr_parse_request(const char *buf, size_t len, const char **method, size_t *method_len, const char **path,
                      size_t *path_len, int *minor_version, struct phr_header *headers, size_t *num_headers,
                      size_t last_len);

// Zero-filled before the first call. Later picohttpparser releases append two counters to this
// struct; the reserved tail makes room for them, so either layout is safe to pass.
struct phr_chunked_decoder {
    size_t bytes_left_in_chunk;
    char consume_trailer;
    char _hex_count;
    char _state;
    unsigned long long _reserved_for_later_layouts[2];
};

// Decodes chunked data in place: on return *bufsz is the decoded length at buf. -2: all input
// consumed, more needed; -1: malformed; otherwise the body ended and the result is how many
// bytes after it (starting at buf + *bufsz) were not part of it.
long phr_decode_chunked(struct phr_chunked_decoder *decoder, char *buf, size_t *bufsz);
#endif
