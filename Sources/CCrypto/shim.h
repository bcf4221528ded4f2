#ifndef DISPATCH_CCRYPTO_SHIM_H
#define DISPATCH_CCRYPTO_SHIM_H
/* libcrypto only (hashes, MACs, AEAD, ECDSA); nothing here needs libssl's TLS. */
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <openssl/rand.h>
#include <openssl/pem.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/ecdsa.h>
#endif
