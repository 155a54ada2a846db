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

#endif
