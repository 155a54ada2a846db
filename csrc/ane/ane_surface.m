/* ane_surface.m -- IOSurfaces behind Orion's surfaces (§1.4), so the device
 * reads and writes the memory that Python's numpy views see: zero-copy.
 *
 * Every surface is one flat row created with the property dictionary all
 * projects use (width = bytes per row = alloc size = the byte count, height 1,
 * one byte per element, pixel format 0). CPU access is bracketed by
 * IOSurfaceLock / IOSurfaceUnlock (read-only for reads); surface.c counts the
 * nesting and calls these for every lock and unlock. */
#include <string.h>

#include "../core/error.h"
#include "../core/surface.h"
#include "ane_internal.h"

static int iosurface_active(void) { return ane_framework_get(NULL, 0) != NULL; }

static orion_status iosurface_lock(void *native, uint32_t flags) {
    const ane_framework *f = ane_framework_get(NULL, 0);
    uint32_t options = (flags & ORION_LOCK_READ_ONLY) ? ANE_LOCK_READ_ONLY : 0;
    int kr = f->IOSurfaceLock(native, options, NULL);
    if (kr != 0)
        return orion_fail(ORION_ERR_INTERNAL, "ane: IOSurfaceLock(options %u) failed with "
                          "kern_return 0x%x", options, (unsigned)kr);
    return ORION_OK;
}

static orion_status iosurface_unlock(void *native, uint32_t flags) {
    const ane_framework *f = ane_framework_get(NULL, 0);
    uint32_t options = (flags & ORION_LOCK_READ_ONLY) ? ANE_LOCK_READ_ONLY : 0;
    int kr = f->IOSurfaceUnlock(native, options, NULL);
    if (kr != 0)
        return orion_fail(ORION_ERR_INTERNAL, "ane: IOSurfaceUnlock(options %u) failed with "
                          "kern_return 0x%x", options, (unsigned)kr);
    return ORION_OK;
}

static void iosurface_destroy(void *native) {
    const ane_framework *f = ane_framework_get(NULL, 0);
    f->CFRelease(native);
}

static orion_status iosurface_create(uint64_t nbytes, void **native, void **base) {
    const ane_framework *f = ane_framework_get(NULL, 0);
    if (!f) return orion_fail(ORION_ERR_BACKEND_UNAVAILABLE, "ane: IOSurface is not available");
    NSAutoreleasePool *pool = [[NSAutoreleasePool alloc] init];
    NSNumber *bytes = [NSNumber numberWithUnsignedLongLong:(unsigned long long)nbytes];
    NSNumber *one = [NSNumber numberWithInt:1];
    NSNumber *zero = [NSNumber numberWithInt:0];
    NSDictionary *props = [NSDictionary dictionaryWithObjectsAndKeys:
        bytes, f->kWidth, one, f->kHeight, one, f->kBytesPerElement, bytes, f->kBytesPerRow,
        bytes, f->kAllocSize, zero, f->kPixelFormat, nil];
    void *surface = f->IOSurfaceCreate((const void *)props);
    [pool drain];
    if (!surface)
        return orion_fail(ORION_ERR_OUT_OF_MEMORY, "ane: IOSurfaceCreate of %llu bytes returned "
                          "NULL", (unsigned long long)nbytes);
    orion_status st = ORION_OK;
    size_t alloc = f->IOSurfaceGetAllocSize(surface);
    void *p = f->IOSurfaceGetBaseAddress(surface);
    if (alloc < nbytes || !p)
        st = orion_fail(ORION_ERR_INTERNAL, "ane: IOSurfaceCreate of %llu bytes gave %zu bytes "
                        "at %p", (unsigned long long)nbytes, alloc, p);
    /* Surfaces start zero-filled, as on every platform: written under the lock. */
    if (st == ORION_OK && (st = iosurface_lock(surface, 0)) == ORION_OK) {
        memset(p, 0, (size_t)nbytes);
        st = iosurface_unlock(surface, 0);
    }
    if (st != ORION_OK) {
        f->CFRelease(surface);
        return st;
    }
    *native = surface;
    *base = p;
    return ORION_OK;
}

const surface_platform orion_surface_iosurface = {
    .name = "IOSurface",
    .active = iosurface_active,
    .create = iosurface_create,
    .lock = iosurface_lock,
    .unlock = iosurface_unlock,
    .destroy = iosurface_destroy,
};
