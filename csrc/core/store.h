/* store.h -- the program cache across processes: <cache>/store/<key>/.
 *
 * A compile given a store key (orion_compile_options.store_key, the caller's
 * digest of everything the program is made from) leaves its program folder's
 * files there as hard links; a later process opens the entry by its key
 * (orion_program_open_stored) instead of compiling. An entry carries the
 * program marker (PROGRAM_MARKER), is made under a temp name and renamed into
 * place, so no reader sees half of one, and its marker's modification time is
 * its last use. The store is bounded (ORION_CACHE_MAX_BYTES, default 8 GiB;
 * 0: no store): after each entry is added, the least recently used entries
 * go until it fits. Only entries with the marker, owned by the user, real
 * directories, are counted or removed; nothing else is entered. */
#ifndef ORION_CORE_STORE_H
#define ORION_CORE_STORE_H

#include <stddef.h>
#include <stdint.h>
#include "../orion.h"

#define STORE_DEFAULT_MAX_BYTES (((uint64_t)8) << 30)

/* 1 if `key` is 16 to 128 lower-case hex digits (an entry's folder name). */
int store_key_ok(const char *key);
/* The bound in bytes (ORION_CACHE_MAX_BYTES, else the default); 0: no store. */
uint64_t store_max_bytes(void);
/* The entry of `key` under the cache directory `cache` (checked by the
 * caller): its path in buf and *found = 1, its last use updated; *found = 0
 * when there is none. */
orion_status store_find(const char *cache, const char *key, char *buf, size_t capacity,
                        int *found);
/* Adds the program folder `folder` (model.mil and the weight files named by
 * `relpaths`, relative to it) as the entry of `key`, then trims the store to
 * its bound. An entry that is already there stays as it is. */
orion_status store_publish(const char *cache, const char *key, const char *folder,
                           const char *const *relpaths, size_t n_relpaths);
/* Links (or, across file systems, copies) folder/relpath from src/relpath. */
orion_status store_link_file(const char *src, const char *folder, const char *relpath);

#endif
