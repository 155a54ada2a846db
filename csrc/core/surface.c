/* surface.c -- tensor buffers shared with Python and the backends, zero-copy.
 *
 * On Linux (and wherever no IOSurface is needed) a surface is anonymous shared
 * memory: one flat row, page-aligned, zero-filled. The interface mirrors what
 * an IOSurface offers (lock/unlock, base address, bytes per row, size) so the
 * ane backend can put IOSurfaces behind the same handles: when it is built and
 * its framework is present, surfaces come from that platform allocator
 * (surface_platform in surface.h) and `native` is the IOSurfaceRef. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "error.h"
#include "handles.h"
#include "surface.h"

/* Larger than any ANE tensor ([1, 65536, 1, 16384] fp16 is 2 GiB); refuses
 * absurd sizes before the kernel is asked. */
#define SURFACE_MAX_BYTES (((uint64_t)1) << 34)

struct surface_impl {
    handle_obj obj;          /* first: the handle table's view */
    void *base;              /* page-aligned mapping of mapped_bytes, or the platform's */
    const struct surface_platform *pf;  /* the allocator of native, or NULL */
    void *native;            /* the platform object (IOSurfaceRef), or NULL: our mapping */
    uint64_t nbytes;         /* the size asked for */
    uint64_t mapped_bytes;   /* nbytes rounded up to pages */
    int lock_depth;          /* guarded by lock_mutex */
    pthread_mutex_t lock_mutex;
    /* orion_surface_set_zero_tail's promise, guarded by lock_mutex; block 0: none */
    uint64_t tail_block, tail_live;
};

static handle_table surfaces = HANDLE_TABLE_INIT("surface");

/* The platform allocator of this build, if it is active in this process. */
static const surface_platform *platform(void) {
#ifdef ORION_WITH_ANE
    if (orion_surface_iosurface.active()) return &orion_surface_iosurface;
#endif
    return NULL;
}

static void surface_destroy(handle_obj *obj) {
    surface_impl *s = (surface_impl *)obj;
    if (s->pf) s->pf->destroy(s->native);
    else munmap(s->base, s->mapped_bytes);
    pthread_mutex_destroy(&s->lock_mutex);
    free(s);
}

orion_status orion_surface_create(uint64_t nbytes, orion_surface *out) {
    orion_clear_error();
    if (!out) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "surface_create: out is NULL");
    *out = 0;
    if (nbytes == 0) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "surface size must be > 0");
    if (nbytes > SURFACE_MAX_BYTES)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT,
                          "surface size %llu bytes exceeds the limit of %llu bytes",
                          (unsigned long long)nbytes, (unsigned long long)SURFACE_MAX_BYTES);
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t mapped = (nbytes + page - 1) / page * page;
    surface_impl *s = calloc(1, sizeof *s);
    if (!s) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "out of memory for a surface");
    const surface_platform *pf = platform();
    if (pf) {
        orion_status st = pf->create(nbytes, &s->native, &s->base);
        if (st != ORION_OK) {
            free(s);
            return st;
        }
        s->pf = pf;
    } else if ((s->base = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                               -1, 0)) == MAP_FAILED) {
        int e = errno;
        free(s);
        return orion_fail(ORION_ERR_OUT_OF_MEMORY, "cannot map a %llu-byte surface: %s",
                          (unsigned long long)nbytes, strerror(e));
    }
    s->nbytes = nbytes;
    s->mapped_bytes = mapped;
    pthread_mutex_init(&s->lock_mutex, NULL);
    s->obj.destroy = surface_destroy;
    orion_status st = handle_add(&surfaces, &s->obj, out);
    if (st != ORION_OK) surface_destroy(&s->obj);
    return st;
}

orion_status orion_surface_create_tensor(int64_t channels, int64_t seq, orion_surface *out) {
    orion_clear_error();
    if (channels <= 0 || seq <= 0 || channels > 65536 || seq > 65536)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT,
                          "tensor surface [1, %lld, 1, %lld]: channels and seq must be in 1..65536",
                          (long long)channels, (long long)seq);
    return orion_surface_create((uint64_t)channels * (uint64_t)seq * 2u, out);
}

orion_status orion_surface_retain(orion_surface h) {
    orion_clear_error();
    return handle_retain(&surfaces, h);
}

orion_status orion_surface_release(orion_surface h) {
    orion_clear_error();
    return handle_release(&surfaces, h);
}

orion_status surface_get(orion_surface h, surface_impl **out) {
    handle_obj *obj;
    orion_status st = handle_get(&surfaces, h, &obj);
    if (st == ORION_OK) *out = (surface_impl *)obj;
    return st;
}

void surface_put(surface_impl *s) { handle_put(s ? &s->obj : NULL); }
void *surface_base(const surface_impl *s) { return s->base; }
uint64_t surface_size(const surface_impl *s) { return s->nbytes; }
void *surface_native(const surface_impl *s) { return s->native; }

orion_status surface_lock_impl(surface_impl *s, uint32_t flags) {
    if (flags & ~(uint32_t)ORION_LOCK_READ_ONLY)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "unknown surface lock flags 0x%x", flags);
    if (s->pf) {
        orion_status st = s->pf->lock(s->native, flags);
        if (st != ORION_OK) return st;
    }
    pthread_mutex_lock(&s->lock_mutex);
    s->lock_depth++;
    pthread_mutex_unlock(&s->lock_mutex);
    return ORION_OK;
}

orion_status surface_unlock_impl(surface_impl *s, uint32_t flags) {
    pthread_mutex_lock(&s->lock_mutex);
    int depth = s->lock_depth;
    if (depth > 0) s->lock_depth--;
    pthread_mutex_unlock(&s->lock_mutex);
    if (depth == 0) return orion_fail(ORION_ERR_STATE, "surface unlock without a matching lock");
    if (s->pf) return s->pf->unlock(s->native, flags);
    return ORION_OK;
}

void surface_zero_tail(surface_impl *s, uint64_t *block, uint64_t *live) {
    pthread_mutex_lock(&s->lock_mutex);
    *block = s->tail_block;
    *live = s->tail_live;
    pthread_mutex_unlock(&s->lock_mutex);
}

/* Orion wrote `rows` rows of nbytes, at offset + r * stride: the promise still holds
 * with the live part of the blocks widened over each row that lies in one block, and
 * is dropped at the first that does not. */
void surface_wrote(surface_impl *s, uint64_t offset, uint64_t stride, uint64_t rows,
                   uint64_t nbytes) {
    pthread_mutex_lock(&s->lock_mutex);
    for (uint64_t r = 0; r < rows && s->tail_block && nbytes; r++) {
        uint64_t block = s->tail_block, in_block = (offset + r * stride) % block;
        if (nbytes <= block - in_block) {
            if (in_block + nbytes > s->tail_live) s->tail_live = in_block + nbytes;
        } else {
            s->tail_block = s->tail_live = 0;
        }
    }
    pthread_mutex_unlock(&s->lock_mutex);
}

/* The public calls below share one shape: look up, act, put back. */
#define WITH_SURFACE(h, s, body)                          \
    do {                                                  \
        orion_clear_error();                              \
        surface_impl *s;                                  \
        orion_status st_ = surface_get((h), &s);          \
        if (st_ != ORION_OK) return st_;                  \
        body;                                             \
        surface_put(s);                                   \
        return st_;                                       \
    } while (0)

orion_status orion_surface_lock(orion_surface h, uint32_t flags) {
    WITH_SURFACE(h, s, st_ = surface_lock_impl(s, flags));
}

orion_status orion_surface_unlock(orion_surface h, uint32_t flags) {
    WITH_SURFACE(h, s, st_ = surface_unlock_impl(s, flags));
}

orion_status orion_surface_base_address(orion_surface h, void **out) {
    if (!out) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "surface_base_address: out is NULL");
    WITH_SURFACE(h, s, *out = s->base);
}

orion_status orion_surface_alloc_size(orion_surface h, uint64_t *out) {
    if (!out) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "surface_alloc_size: out is NULL");
    WITH_SURFACE(h, s, *out = s->nbytes);
}

orion_status orion_surface_bytes_per_row(orion_surface h, uint64_t *out) {
    if (!out) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "surface_bytes_per_row: out is NULL");
    WITH_SURFACE(h, s, *out = s->nbytes);
}

orion_status orion_surface_set_zero_tail(orion_surface h, uint64_t block_bytes,
                                         uint64_t live_bytes) {
    orion_clear_error();
    if (block_bytes && live_bytes > block_bytes)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT,
                          "surface_set_zero_tail: %llu live bytes in blocks of %llu",
                          (unsigned long long)live_bytes, (unsigned long long)block_bytes);
    WITH_SURFACE(h, s, {
        pthread_mutex_lock(&s->lock_mutex);
        s->tail_block = block_bytes;
        s->tail_live = block_bytes ? live_bytes : 0;
        pthread_mutex_unlock(&s->lock_mutex);
    });
}

orion_status orion_surface_zero_tail(orion_surface h, uint64_t *block_bytes,
                                     uint64_t *live_bytes) {
    if (!block_bytes || !live_bytes)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "surface_zero_tail: an out is NULL");
    WITH_SURFACE(h, s, surface_zero_tail(s, block_bytes, live_bytes));
}

orion_status orion_surface_wrote(orion_surface h, uint64_t offset, uint64_t nbytes) {
    WITH_SURFACE(h, s, surface_wrote(s, offset, 0, 1, nbytes));
}

uint64_t orion_surface_live_count(void) { return handle_live(&surfaces); }
