/* weight_cache.h -- the bytes of weight files that loaded programs bake, read once
 * per file for all of them.
 *
 * Programs whose weight files are one file on disk (hard links, weight_share.h:
 * a layer's prefill buckets and its decode program) share one read-only copy in
 * memory instead of one copy each. An entry is keyed by the file's device, inode,
 * size and modification time, so a file written since it was read is read again:
 * each program still bakes its weights at its own load. */
#ifndef ORION_CORE_WEIGHT_CACHE_H
#define ORION_CORE_WEIGHT_CACHE_H

#include <stdint.h>
#include "../orion.h"

typedef struct weight_bytes weight_bytes;

/* The whole regular file at `path` (64-byte aligned, read-only for the caller),
 * shared with the other holders of the same file version. Release each. */
orion_status weight_bytes_acquire(const char *path, weight_bytes **out, const void **bytes,
                                  uint64_t *size);
void weight_bytes_release(weight_bytes *held);

#endif
