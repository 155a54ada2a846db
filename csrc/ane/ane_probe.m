/* ane_probe.m -- the canary of the delta path: one probe evaluation proving
 * that the device computes with the weights the host wrote (docs/ane-backend.md,
 * "Weight updates").
 *
 * Public reverse engineering shows the device may serve a cached program
 * whatever the temp folder holds (a delta reload with no effect), so a delta is
 * checked before it is trusted: the host writes canary weights (the new weights
 * with signs flipped in a fixed pattern, so the outputs differ from the new
 * weights' and from the old ones'), the device evaluates a fixed probe input,
 * and vane evaluates the same program on the same input with the canary weights
 * and with the new ones. The delta took effect only if the device's outputs are
 * vane's canary outputs: its distance from them is under a quarter of the change
 * the canary makes (L2 norms), and that change is well above fp16 noise. The new
 * weights are the contrast, not the old ones: those need not be kept anywhere,
 * and a stale device gives the old weights' outputs, far from the canary's as
 * well. Plain C inside: only the device evaluation (given as a callback) touches
 * the framework. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/backend.h"
#include "../core/blobfile.h"
#include "../core/error.h"
#include "ane_internal.h"

#define PROBE_AGREE 0.25   /* the device's miss, as a share of the change the canary makes */
#define PROBE_NOISE 2e-3   /* a change under 0.2% of the outputs' L2 norm proves nothing (fp16) */
#define PROBE_FLOOR 1e-6

static uint32_t mix(uint64_t i) {   /* a fixed pseudo-random pattern (splitmix-style) */
    uint64_t z = i + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (uint32_t)(z ^ (z >> 31));
}

orion_status ane_canary_bytes(uint8_t *blob, uint64_t n, const char *what) {
    blob_view view;
    orion_status st = blob_view_parse(blob, n, what, &view);
    if (st != ORION_OK) return st;
    for (uint64_t e = 0; e < view.count; e++) {
        const orion_blob_entry *entry = &view.entries[e];
        uint32_t size = entry->dtype == ORION_BLOB_FLOAT16 ? 2u
                        : entry->dtype == ORION_BLOB_FLOAT32 ? 4u : 0u;
        if (!size) continue;
        uint8_t *p = blob + entry->data_offset;
        for (uint64_t i = 0; i < entry->nbytes / size; i++)
            if (mix(i + e * 7919u) & 1u) p[i * size + size - 1] ^= 0x80u;   /* sign, little-endian */
    }
    blob_view_free(&view);
    return ORION_OK;
}

/* ---- probe surfaces -------------------------------------------------------- */

typedef struct probe_io {
    size_t n_in, n_out;
    orion_surface *handles;     /* inputs then outputs */
    surface_impl **impls;
    orion_io_info *info;
} probe_io;

static void probe_free(probe_io *io) {
    for (size_t i = 0; i < io->n_in + io->n_out; i++) {
        if (io->impls && io->impls[i]) surface_put(io->impls[i]);
        if (io->handles && io->handles[i]) orion_surface_release(io->handles[i]);
    }
    free(io->handles);
    free(io->impls);
    free(io->info);
    memset(io, 0, sizeof *io);
}

static orion_status fill_input(surface_impl *s, const orion_io_info *info, size_t which) {
    orion_status st = surface_lock_impl(s, 0);
    if (st != ORION_OK) return st;
    uint64_t count = info->nbytes / (info->dtype == ORION_BLOB_FLOAT32 ? 4u : 2u);
    for (uint64_t i = 0; i < count && st == ORION_OK; i++) {
        float v = (float)((int)(mix(i * 31u + which) % 2001u) - 1000) / 2000.0f;   /* [-0.5, 0.5] */
        if (info->dtype == ORION_BLOB_FLOAT32)
            ((float *)surface_base(s))[i] = v;
        else
            st = orion_f32_to_f16(&v, (uint16_t *)surface_base(s) + i, 1);
    }
    orion_status st2 = surface_unlock_impl(s, 0);
    return st != ORION_OK ? st : st2;
}

/* Surfaces for the program's inputs (filled with the probe) and outputs, one
 * size per group as the device requires. */
static orion_status probe_make(const mil_program *program, probe_io *io) {
    memset(io, 0, sizeof *io);
    io->n_in = mil_io_count(program, 0);
    io->n_out = mil_io_count(program, 1);
    size_t total = io->n_in + io->n_out;
    io->handles = calloc(total ? total : 1, sizeof *io->handles);
    io->impls = calloc(total ? total : 1, sizeof *io->impls);
    io->info = calloc(total ? total : 1, sizeof *io->info);
    if (!io->handles || !io->impls || !io->info)
        return orion_fail(ORION_ERR_OUT_OF_MEMORY, "ane: out of memory");
    uint64_t size[2] = {49152u, 49152u};   /* ANE-C23's minimum */
    orion_status st = ORION_OK;
    for (size_t i = 0; i < total && st == ORION_OK; i++) {
        int out = i >= io->n_in;
        st = mil_io_info(program, out, out ? i - io->n_in : i, &io->info[i]);
        if (st == ORION_OK && io->info[i].nbytes > size[out]) size[out] = io->info[i].nbytes;
    }
    for (size_t i = 0; i < total && st == ORION_OK; i++) {
        st = orion_surface_create(size[i >= io->n_in], &io->handles[i]);
        if (st == ORION_OK) st = surface_get(io->handles[i], &io->impls[i]);
        if (st == ORION_OK && i < io->n_in) st = fill_input(io->impls[i], &io->info[i], i);
    }
    return st;
}

/* Every output element as float, concatenated. */
static orion_status probe_read(probe_io *io, float **out, size_t *n) {
    size_t count = 0;
    for (size_t i = io->n_in; i < io->n_in + io->n_out; i++)
        count += io->info[i].nbytes / (io->info[i].dtype == ORION_BLOB_FLOAT32 ? 4u : 2u);
    float *v = malloc((count ? count : 1) * sizeof *v);
    if (!v) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "ane: out of memory");
    size_t at = 0;
    orion_status st = ORION_OK;
    for (size_t i = io->n_in; i < io->n_in + io->n_out && st == ORION_OK; i++) {
        surface_impl *s = io->impls[i];
        int f32 = io->info[i].dtype == ORION_BLOB_FLOAT32;
        size_t k = io->info[i].nbytes / (f32 ? 4u : 2u);
        if ((st = surface_lock_impl(s, ORION_LOCK_READ_ONLY)) != ORION_OK) break;
        if (f32) memcpy(v + at, surface_base(s), k * sizeof *v);
        else st = orion_f16_to_f32((const uint16_t *)surface_base(s), v + at, k);
        orion_status st2 = surface_unlock_impl(s, ORION_LOCK_READ_ONLY);
        if (st == ORION_OK) st = st2;
        at += k;
    }
    if (st != ORION_OK) {
        free(v);
        return st;
    }
    *out = v;
    *n = count;
    return ORION_OK;
}

orion_status ane_probe_device(const mil_program *program, ane_eval_fn eval, void *ctx, float **out,
                              size_t *n) {
    probe_io io;
    orion_status st = probe_make(program, &io);
    if (st == ORION_OK) st = eval(ctx, io.impls, io.n_in, io.impls + io.n_in, io.n_out);
    if (st == ORION_OK) st = probe_read(&io, out, n);
    probe_free(&io);
    return st;
}

orion_status ane_probe_reference(const mil_program *program, const char *folder, float **out,
                                 size_t *n) {
    void *impl = NULL;
    orion_status st = orion_backend_vane.compile(program, folder, NULL, 0, ORION_NUMERICS_FP16, &impl);
    if (st == ORION_OK) st = orion_backend_vane.load(impl);
    probe_io io;
    memset(&io, 0, sizeof io);
    if (st == ORION_OK) st = probe_make(program, &io);
    if (st == ORION_OK)
        st = orion_backend_vane.eval(impl, io.impls, io.n_in, io.impls + io.n_in, io.n_out);
    if (st == ORION_OK) st = probe_read(&io, out, n);
    probe_free(&io);
    if (impl) {
        orion_backend_vane.unload(impl);
        orion_backend_vane.release(impl);
    }
    return st != ORION_OK ? orion_fail_context(st, "ane: the canary's reference on vane") : st;
}

int ane_probe_judge(const float *device, const float *canary, const float *plain, size_t n,
                    char *why, size_t capacity) {
    /* L2 norms over every output: the change the canary makes, how far the device
     * is from the canary's outputs, how far from the uncanaried weights', and the
     * signal itself. */
    double change = 0, off = 0, unmoved = 0, signal = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(canary[i]) || !isfinite(plain[i]) || !isfinite(device[i])) {
            snprintf(why, capacity, "the probe gave a non-finite output at %zu", i);
            return 0;
        }
        change += ((double)canary[i] - plain[i]) * ((double)canary[i] - plain[i]);
        off += ((double)device[i] - canary[i]) * ((double)device[i] - canary[i]);
        unmoved += ((double)device[i] - plain[i]) * ((double)device[i] - plain[i]);
        signal += (double)canary[i] * canary[i];
    }
    change = sqrt(change), off = sqrt(off), unmoved = sqrt(unmoved), signal = sqrt(signal);
    if (change <= PROBE_NOISE * signal + PROBE_FLOOR) {
        snprintf(why, capacity, "the probe cannot tell the canary weights from the real ones "
                 "(the outputs move by %.3g, under the noise level %.3g)", change,
                 PROBE_NOISE * signal + PROBE_FLOOR);
        return 0;
    }
    if (off > PROBE_AGREE * change) {
        snprintf(why, capacity, "the canary weights moved vane's outputs by %.3g (L2) but the "
                 "device's are %.3g from vane's canary outputs: the delta had no effect on the "
                 "device (%.3g from the uncanaried weights' outputs)", change, off, unmoved);
        return 0;
    }
    snprintf(why, capacity, "the device follows the canary: %.3g from vane's outputs, which the "
             "canary moved by %.3g (L2)", off, change);
    return 1;
}
