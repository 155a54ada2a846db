/* sha256.h -- SHA-256 (FIPS 180-4) for program identifiers.
 * Written here rather than linked from a crypto library: the core has no
 * dependencies, and an identifier needs no more than this. */
#ifndef ORION_CORE_SHA256_H
#define ORION_CORE_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct sha256_ctx {
    uint32_t state[8];
    uint64_t length;       /* bytes hashed so far */
    uint8_t block[64];
    size_t used;
} sha256_ctx;

void sha256_init(sha256_ctx *ctx);
void sha256_update(sha256_ctx *ctx, const void *data, size_t n);
void sha256_final(sha256_ctx *ctx, uint8_t digest[32]);

#endif
