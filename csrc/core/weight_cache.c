/* weight_cache.c -- see weight_cache.h. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "error.h"
#include "weight_cache.h"

#define N_BUCKETS 1024u   /* a model holds hundreds of entries, a few per bucket */

struct weight_entry {
    uint64_t hash;
    uint64_t size;
    void *data;
    uint64_t refs;
    weight_entry *next;   /* in its bucket */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static weight_entry *buckets[N_BUCKETS];
static uint64_t resident;

/* ---- the content hash: four xxhash-style lanes over 8-byte words -------- */

#define P1 0x9E3779B185EBCA87ull
#define P2 0xC2B2AE3D27D4EB4Full

static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static uint64_t round64(uint64_t acc, uint64_t word) { return rotl(acc + word * P2, 31) * P1; }

static uint64_t load64(const uint8_t *p) {
    uint64_t w;
    memcpy(&w, p, sizeof w);
    return w;
}

/* Equal bytes give equal hashes; a collision only costs a full comparison. */
static uint64_t content_hash(const uint8_t *p, uint64_t n) {
    uint64_t lane[4] = {n + P1 + P2, n + P2, n, n - P1};
    uint64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++) lane[k] = round64(lane[k], load64(p + i + 8 * k));
    uint64_t h = rotl(lane[0], 1) + rotl(lane[1], 7) + rotl(lane[2], 12) + rotl(lane[3], 18);
    for (; i + 8 <= n; i += 8) h = round64(h, load64(p + i));
    for (; i < n; i++) h = round64(h, p[i]);
    h ^= h >> 33;
    h *= P2;
    return h ^ (h >> 29);
}

/* ---- memory for a tensor -------------------------------------------------- */

/* Tensors live as long as their programs stay loaded, between the transient
 * buffers of builds: from the heap, those leave it fragmented (GPT-2 small held
 * ~30 MiB more after trimming). So a large one gets pages of its own, returned to
 * the system at release; from 4 MiB on it starts on a 2 MiB boundary and its whole
 * 2 MiB pages are offered to transparent huge pages (a decode step streams every
 * byte once; no TLB miss every 4 KiB). Small ones stay on the heap, 64-byte aligned. */
#define OWN_PAGES_BYTES ((uint64_t)256 << 10)
#define HUGE_BYTES ((uint64_t)2 << 20)

static uint64_t mapped_size(uint64_t n) {
    return (n + HUGE_BYTES - 1) / HUGE_BYTES * HUGE_BYTES;
}

void *weight_tensor_alloc(uint64_t n) {
    if (n < OWN_PAGES_BYTES) return aligned_alloc(64, (size_t)((n + 63) / 64 * 64 + 64));
    uint64_t size = mapped_size(n);
    /* map one huge page more, then unmap the slack before and after the aligned part */
    uint8_t *raw = mmap(NULL, (size_t)(size + HUGE_BYTES), PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    uint8_t *p = (uint8_t *)(((uintptr_t)raw + HUGE_BYTES - 1) / HUGE_BYTES * HUGE_BYTES);
    if (p > raw) munmap(raw, (size_t)(p - raw));
    uint64_t after = (uint64_t)(raw + size + HUGE_BYTES - (p + size));
    if (after) munmap(p + size, (size_t)after);
#if defined(MADV_HUGEPAGE)
    if (n >= 2 * HUGE_BYTES) madvise(p, (size_t)(n / HUGE_BYTES * HUGE_BYTES), MADV_HUGEPAGE);
#endif
    return p;   /* pages past n are never touched, so never resident */
}

void weight_tensor_free(void *p, uint64_t n) {
    if (!p) return;
    if (n < OWN_PAGES_BYTES) free(p);
    else munmap(p, (size_t)mapped_size(n));
}

/* ---- the cache ------------------------------------------------------------ */

orion_status weight_entry_share(void *tensor, uint64_t nbytes, weight_entry **out,
                                const void **bytes) {
    uint64_t hash = content_hash(tensor, nbytes);
    weight_entry **bucket = &buckets[hash % N_BUCKETS];
    weight_entry *e = calloc(1, sizeof *e);   /* before the lock: nothing can fail under it */
    pthread_mutex_lock(&lock);
    weight_entry *held = *bucket;
    while (held && !(held->hash == hash && held->size == nbytes &&
                     memcmp(held->data, tensor, (size_t)nbytes) == 0))
        held = held->next;
    if (held) {
        held->refs++;
    } else if (e) {
        *e = (weight_entry){hash, nbytes, tensor, 1, *bucket};
        *bucket = e;
        resident += nbytes;
        held = e;
        e = NULL;
    }
    pthread_mutex_unlock(&lock);
    free(e);
    if (!held) {
        weight_tensor_free(tensor, nbytes);
        return orion_fail(ORION_ERR_OUT_OF_MEMORY, "no memory to hold a weight");
    }
    if (held->data != tensor) weight_tensor_free(tensor, nbytes);
    *out = held;
    *bytes = held->data;
    return ORION_OK;
}

void weight_entry_release(weight_entry *held) {
    if (!held) return;
    pthread_mutex_lock(&lock);
    if (--held->refs == 0) {
        for (weight_entry **q = &buckets[held->hash % N_BUCKETS]; *q; q = &(*q)->next)
            if (*q == held) {
                *q = held->next;
                break;
            }
        resident -= held->size;
    } else {
        held = NULL;
    }
    pthread_mutex_unlock(&lock);
    if (held) {
        weight_tensor_free(held->data, held->size);
        free(held);
    }
}

uint64_t orion_weight_memory_bytes(void) {
    pthread_mutex_lock(&lock);
    uint64_t n = resident;
    pthread_mutex_unlock(&lock);
    return n;
}
