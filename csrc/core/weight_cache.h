/* weight_cache.h -- the tensors that loaded programs bake, held once per content.
 *
 * Every program keeps its weights in one file of its own (the device verifies one
 * weight file per program; docs/ane-backend.md), so programs that bake the same
 * tensor (a layer's prefill buckets and its decode program) hold it in different
 * files. vane reads each blob entry of a file it loads into this cache: an entry
 * whose bytes equal a held one (a 64-bit hash, then the bytes compared in full)
 * shares that read-only copy, so equal tensors sit once in memory whichever files
 * they came from. Each program still reads its file at its own load: a patched
 * entry has other bytes, and gets a copy of its own. */
#ifndef ORION_CORE_WEIGHT_CACHE_H
#define ORION_CORE_WEIGHT_CACHE_H

#include <stdint.h>
#include "../orion.h"

typedef struct weight_entry weight_entry;

/* Memory for a tensor of `nbytes` (64-byte aligned), to fill and hand to
 * weight_entry_share; weight_tensor_free if it never gets there. */
void *weight_tensor_alloc(uint64_t nbytes);
void weight_tensor_free(void *tensor, uint64_t nbytes);
/* Shares `tensor` (from weight_tensor_alloc, filled): when equal bytes are held
 * already, frees it and returns the held copy; otherwise holds it. Either way
 * *bytes is read-only for the caller, shared with the other holders. Release
 * each. */
orion_status weight_entry_share(void *tensor, uint64_t nbytes, weight_entry **out,
                                const void **bytes);
void weight_entry_release(weight_entry *held);

#endif
