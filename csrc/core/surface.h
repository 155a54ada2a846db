/* surface.h -- surface internals that the runtime and the backends share. */
#ifndef ORION_CORE_SURFACE_H
#define ORION_CORE_SURFACE_H

#include "../orion.h"

typedef struct surface_impl surface_impl;

/* Validates the handle and takes a reference (released with surface_put). */
orion_status surface_get(orion_surface handle, surface_impl **out);
void surface_put(surface_impl *s);

void *surface_base(const surface_impl *s);
uint64_t surface_size(const surface_impl *s);
/* The platform object behind the surface (an IOSurfaceRef on macOS), or NULL. */
void *surface_native(const surface_impl *s);
/* Lock around backend access; flags as orion_surface_lock. */
orion_status surface_lock_impl(surface_impl *s, uint32_t flags);
orion_status surface_unlock_impl(surface_impl *s, uint32_t flags);

/* orion_surface_set_zero_tail's promise (block 0: none), and a write by Orion itself
 * (an eval's output, a sequence copy's rows) that keeps it true: it widens the blocks'
 * live part over each row [offset + r * stride, + nbytes) that lies in one block, else
 * drops it. */
void surface_zero_tail(surface_impl *s, uint64_t *block, uint64_t *live);
void surface_wrote(surface_impl *s, uint64_t offset, uint64_t stride, uint64_t rows,
                   uint64_t nbytes);

/* A platform allocator behind surfaces, chosen at build time. With the ane
 * backend built (ORION_WITH_ANE), surfaces are IOSurfaces whenever the
 * framework is present in this process (csrc/ane/ane_surface.m), so the device
 * reads the very memory Python writes; otherwise they are anonymous shared
 * memory. `active` is decided once per process. */
typedef struct surface_platform {
    const char *name;
    int (*active)(void);
    /* A zero-filled buffer of nbytes: its native object and base address. */
    orion_status (*create)(uint64_t nbytes, void **native, void **base);
    orion_status (*lock)(void *native, uint32_t flags);
    orion_status (*unlock)(void *native, uint32_t flags);
    void (*destroy)(void *native);
} surface_platform;

#ifdef ORION_WITH_ANE
extern const surface_platform orion_surface_iosurface;
#endif

#endif
