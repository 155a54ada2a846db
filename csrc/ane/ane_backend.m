/* ane_backend.m -- the ane backend: Apple's Neural Engine through the private
 * in-memory model API of AppleNeuralEngine.framework (docs/ane-facts.md §1,
 * docs/ane-backend.md), behind the same interface as vane (core/backend.h).
 *
 * compile: one device program (ane_model.m) from the MIL text and weights.
 * load:    when the runtime's weight files still hold what the device program
 *          was made from, loadWithQoS:. When they changed (a delta update:
 *          unload, patch, load), the device must not serve stale weights
 *          silently; ORION_ANE_DELTA chooses how (docs/ane-backend.md,
 *          "Weight updates"):
 *            auto (default)  (a) a delta reload in place, proven once per
 *                            program per process by a canary probe against
 *                            vane (ane_probe.m), then trusted; else
 *                            (b) an honest recompile from a new descriptor,
 *                            counted against the compile budget; else
 *                            (c) a refusal naming the `inputs` strategy;
 *            recompile       (b), then (c);  refuse  (c);
 *            files, data, atomic, purge, descriptor   one raw variant with no
 *                            check, for benchmarks/ane_smoke.py only.
 * eval:    each surface (an IOSurface, ane_surface.m) wrapped in an
 *          _ANEIOSurfaceObject, a request with indices 0..n-1 in the binding
 *          order the runtime gives, evaluateWithQoS:.
 * unload / release: unloadWithQoS:, the model released, the temp folder
 *          removed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/backend.h"
#include "../core/error.h"
#include "../core/sha256.h"
#include "ane_internal.h"

#define MODEL_PATH_PREFIX "@model_path/"

typedef enum { DELTA_UNPROVEN, DELTA_PROVEN, DELTA_BROKEN } delta_state;

typedef struct ane_program {
    ane_model *dev;           /* the device program now in use */
    const mil_program *mil;   /* the runtime's, alive until release (the canary's reference) */
    char *folder;             /* the runtime's program folder: the weights as they should be */
    size_t n_files;
    char **rel;               /* weight files, relative to the folders: "weights/w.bin" */
    uint8_t (*digest)[32];    /* SHA-256 of each weight file as the device program holds it */
    delta_state delta;
    char delta_why[512];      /* what the canary saw */
} ane_program;

/* The runtime's current weight files, in key order. */
typedef struct weight_set {
    size_t n;
    orion_weight_file *files;
    char **keys;
    uint8_t **bytes;
    uint8_t (*digest)[32];    /* SHA-256 of each file */
} weight_set;

static void weight_set_free(weight_set *w) {
    for (size_t i = 0; i < w->n; i++) {
        free(w->keys ? w->keys[i] : NULL);
        free(w->bytes ? w->bytes[i] : NULL);
    }
    free(w->files);
    free(w->keys);
    free(w->bytes);
    free(w->digest);
    memset(w, 0, sizeof *w);
}

static void digest_of(const orion_weight_file *f, uint8_t out[32]) {
    sha256_ctx ctx;
    sha256_init(&ctx);
    sha256_update(&ctx, f->data, (size_t)f->nbytes);
    sha256_final(&ctx, out);
}

static orion_status weight_set_read(const ane_program *ap, const char *folder, weight_set *w) {
    memset(w, 0, sizeof *w);
    size_t n = ap->n_files ? ap->n_files : 1;
    w->files = calloc(n, sizeof *w->files);
    w->keys = calloc(n, sizeof *w->keys);
    w->bytes = calloc(n, sizeof *w->bytes);
    w->digest = calloc(n, sizeof *w->digest);
    if (!w->files || !w->keys || !w->bytes || !w->digest)
        return orion_fail(ORION_ERR_OUT_OF_MEMORY, "ane: out of memory");
    orion_status st = ORION_OK;
    for (size_t i = 0; st == ORION_OK && i < ap->n_files; i++) {
        w->n++;
        char *path = ane_join(folder, ap->rel[i]);
        w->keys[i] = ane_join("@model_path", ap->rel[i]);
        uint64_t size = 0;
        st = path && w->keys[i] ? ane_read_file(path, &w->bytes[i], &size)
                                : orion_fail(ORION_ERR_OUT_OF_MEMORY, "ane: out of memory");
        free(path);
        w->files[i] = (orion_weight_file){w->keys[i], w->bytes[i], size};
        if (st == ORION_OK) digest_of(&w->files[i], w->digest[i]);
    }
    return st;
}

static void remember(ane_program *ap, const weight_set *w) {
    memcpy(ap->digest, w->digest, w->n * sizeof *w->digest);
}

static int differs(const ane_program *ap, const weight_set *w) {
    return w->n && memcmp(ap->digest, w->digest, w->n * sizeof *w->digest) != 0;
}

/* ---- the backend --------------------------------------------------------- */

static int ane_available(char *why, size_t capacity) {
    return ane_framework_get(why, capacity) != NULL;
}

static const ane_framework *framework_or_fail(orion_status *st) {
    char why[1024];
    const ane_framework *f = ane_framework_get(why, sizeof why);
    *st = f ? ORION_OK
            : orion_fail(ORION_ERR_BACKEND_UNAVAILABLE, "backend \"ane\" is unavailable: %s", why);
    return f;
}

static void program_free(ane_program *ap) {
    ane_model_free(ap->dev);
    for (size_t i = 0; i < ap->n_files; i++) free(ap->rel[i]);
    free(ap->rel);
    free(ap->digest);
    free(ap->folder);
    free(ap);
}

static orion_status read_mil(const char *folder, uint8_t **text, uint64_t *len) {
    char *path = ane_join(folder, "model.mil");
    orion_status st = path ? ane_read_file(path, text, len)
                           : orion_fail(ORION_ERR_OUT_OF_MEMORY, "ane: out of memory");
    free(path);
    return st;
}

static orion_status ane_compile(const mil_program *program, const char *folder,
                                const orion_weight_file *weights, size_t n_weights,
                                uint32_t numerics, void **impl_out) {
    (void)numerics;   /* the device decides its arithmetic */
    if (!program || !folder || !impl_out || (n_weights && !weights))
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "ane: compile needs a program and a folder");
    *impl_out = NULL;
    orion_status st;
    const ane_framework *f = framework_or_fail(&st);
    if (!f) return st;
    ane_program *ap = calloc(1, sizeof *ap);
    if (!ap) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "ane: out of memory");
    ap->mil = program;
    ap->folder = strdup(folder);
    ap->rel = calloc(n_weights ? n_weights : 1, sizeof *ap->rel);
    ap->digest = calloc(n_weights ? n_weights : 1, sizeof *ap->digest);
    if (!ap->folder || !ap->rel || !ap->digest)
        st = orion_fail(ORION_ERR_OUT_OF_MEMORY, "ane: out of memory");
    for (size_t i = 0; st == ORION_OK && i < n_weights; i++) {
        if (strncmp(weights[i].key, MODEL_PATH_PREFIX, strlen(MODEL_PATH_PREFIX)) != 0)
            st = orion_fail(ORION_ERR_INVALID_ARGUMENT, "ane: weight key %s does not start with "
                            MODEL_PATH_PREFIX, weights[i].key);
        else if (!(ap->rel[i] = strdup(weights[i].key + strlen(MODEL_PATH_PREFIX))))
            st = orion_fail(ORION_ERR_OUT_OF_MEMORY, "ane: out of memory");
        else {
            ap->n_files++;
            digest_of(&weights[i], ap->digest[i]);
        }
    }
    uint8_t *mil_text = NULL;
    uint64_t mil_len = 0;
    if (st == ORION_OK) st = read_mil(folder, &mil_text, &mil_len);
    if (st == ORION_OK) st = ane_model_create(f, mil_text, mil_len, weights, n_weights, 1, &ap->dev);
    free(mil_text);
    if (st != ORION_OK) {
        program_free(ap);
        return st;
    }
    *impl_out = ap;
    return ORION_OK;
}

/* ---- weight updates -------------------------------------------------------- */

#define WRITE_FILES 1u    /* weights/<name>.bin */
#define WRITE_DATA 2u     /* the staging `data` copy, where it holds one of them */
#define WRITE_ATOMIC 4u   /* a new file renamed over the old one, not in place */

static orion_status write_weights(ane_program *ap, const weight_set *w, unsigned how) {
    orion_status st = ORION_OK;
    for (size_t i = 0; st == ORION_OK && i < w->n; i++) {
        const char *targets[2] = {(how & WRITE_FILES) ? ap->rel[i] : NULL,
                                  (how & WRITE_DATA) && ap->dev->staged == (long)i ? "data" : NULL};
        for (int t = 0; t < 2 && st == ORION_OK; t++) {
            if (!targets[t]) continue;
            char *path = ane_join(ap->dev->tmp_dir, targets[t]);
            if (!path) st = orion_fail(ORION_ERR_OUT_OF_MEMORY, "ane: out of memory");
            else if (how & WRITE_ATOMIC) st = ane_write_atomic(path, w->bytes[i], w->files[i].nbytes);
            else st = ane_write_in_place(path, w->bytes[i], w->files[i].nbytes);
            free(path);
        }
    }
    return st;
}

/* (c): the message a caller acts on. */
static orion_status refuse(ane_program *ap, orion_status status, const char *reason) {
    return orion_fail(status, "ane: program %s: its weights changed, and %s%s%s%s. The ane backend "
                      "never serves stale weights; train with update='inputs' (weights as program "
                      "inputs, the default on ane), which compiles nothing per step",
                      ap->dev->hex_id, reason,
                      ap->delta_why[0] ? " (the delta reload was not used: " : "", ap->delta_why,
                      ap->delta_why[0] ? ")" : "");
}

/* (b): a new descriptor with the new weights: a new identifier, which the
 * device compiles; counted against the budget before it is spent. */
static orion_status recompile(ane_program *ap, const weight_set *w, int compile) {
    char reason[1024];
    if (backend_spend_compile() != ORION_OK) {
        snprintf(reason, sizeof reason, "a new compile would exceed the budget (%s)",
                 orion_last_error());
        return refuse(ap, ORION_ERR_BUDGET, reason);
    }
    orion_status st;
    const ane_framework *f = framework_or_fail(&st);
    if (!f) return st;
    uint8_t *mil_text = NULL;
    uint64_t mil_len = 0;
    st = read_mil(ap->folder, &mil_text, &mil_len);
    if (st != ORION_OK) return st;
    /* The old model goes first: a framework whose identifier ignores the
     * weight bytes would give the new one the same temp folder. */
    ane_model_free(ap->dev);
    ap->dev = NULL;
    st = ane_model_create(f, mil_text, mil_len, w->files, w->n, compile, &ap->dev);
    free(mil_text);
    if (st == ORION_OK) st = ane_model_load(ap->dev);
    if (st == ORION_OK) remember(ap, w);
    return st;
}

typedef struct probe_ctx {
    const ane_framework *f;
    ane_program *ap;
} probe_ctx;

static orion_status eval_in_pool(const ane_framework *f, ane_model *m,
                                 surface_impl *const *inputs, size_t n_inputs,
                                 surface_impl *const *outputs, size_t n_outputs);

static orion_status probe_eval(void *ctx, surface_impl *const *in, size_t n_in,
                               surface_impl *const *out, size_t n_out) {
    probe_ctx *c = ctx;
    NSAutoreleasePool *pool = [[NSAutoreleasePool alloc] init];
    orion_status st = eval_in_pool(c->f, c->ap->dev, in, n_in, out, n_out);
    [pool drain];
    return st;
}

/* (a): the first delta of a program writes canary weights in place, reloads,
 * and compares one probe with vane; only a delta that proves itself is used,
 * then and for the rest of the process. Leaves the program loaded with the
 * new weights (DELTA_PROVEN), or unloaded (DELTA_BROKEN, why in delta_why). */
static orion_status canary(ane_program *ap, const weight_set *w) {
    orion_status st;
    const ane_framework *f = framework_or_fail(&st);
    if (!f) return st;
    weight_set now = {0}, bait = {0};
    float *old = NULL, *want = NULL, *got = NULL;
    size_t n_old = 0, n_want = 0, n_got = 0;
    st = weight_set_read(ap, ap->dev->tmp_dir, &now);
    if (st == ORION_OK && differs(ap, &now)) {
        weight_set_free(&now);
        ap->delta = DELTA_BROKEN;
        snprintf(ap->delta_why, sizeof ap->delta_why, "the temp folder no longer holds the "
                 "weights the device program was made from");
        return ORION_OK;
    }
    weight_set_free(&now);
    if (st == ORION_OK) st = ane_probe_reference(ap->mil, ap->dev->tmp_dir, &old, &n_old);
    if (st == ORION_OK) st = weight_set_read(ap, ap->folder, &bait);
    for (size_t i = 0; st == ORION_OK && i < bait.n; i++)
        st = ane_canary_bytes(bait.bytes[i], bait.files[i].nbytes, bait.keys[i]);
    if (st == ORION_OK) st = write_weights(ap, &bait, WRITE_FILES | WRITE_DATA);
    if (st == ORION_OK) st = ane_probe_reference(ap->mil, ap->dev->tmp_dir, &want, &n_want);
    weight_set_free(&bait);
    if (st == ORION_OK && ane_model_load(ap->dev) != ORION_OK) {
        ap->delta = DELTA_BROKEN;   /* e.g. a framework that verifies the bundle at load */
        snprintf(ap->delta_why, sizeof ap->delta_why, "the reload failed: %s", orion_last_error());
        orion_clear_error();
    } else if (st == ORION_OK) {
        probe_ctx ctx = {f, ap};
        st = ane_probe_device(ap->mil, probe_eval, &ctx, &got, &n_got);
        orion_status st2 = ane_model_unload(ap->dev);
        if (st == ORION_OK) st = st2;
        if (st == ORION_OK && (n_got != n_want || n_old != n_want))
            st = orion_fail(ORION_ERR_INTERNAL, "ane: the canary read %zu outputs on the device "
                            "and %zu on vane", n_got, n_want);
        if (st == ORION_OK)
            ap->delta = ane_probe_judge(got, want, old, n_got, ap->delta_why, sizeof ap->delta_why)
                            ? DELTA_PROVEN : DELTA_BROKEN;
    }
    free(old);
    free(want);
    free(got);
    if (st == ORION_OK && ap->delta == DELTA_PROVEN) {
        st = write_weights(ap, w, WRITE_FILES | WRITE_DATA);
        if (st == ORION_OK) st = ane_model_load(ap->dev);
        if (st == ORION_OK) remember(ap, w);
    }
    return st;
}

static orion_status raw_variant(ane_program *ap, const weight_set *w, const char *variant) {
    orion_status st = ORION_OK;
    if (strcmp(variant, "descriptor") == 0) return recompile(ap, w, 0);   /* load compiles */
    if (strcmp(variant, "files") == 0) st = write_weights(ap, w, WRITE_FILES);
    else if (strcmp(variant, "data") == 0) st = write_weights(ap, w, WRITE_DATA);
    else if (strcmp(variant, "atomic") == 0)
        st = write_weights(ap, w, WRITE_FILES | WRITE_DATA | WRITE_ATOMIC);
    else if (strcmp(variant, "purge") == 0) {
        st = write_weights(ap, w, WRITE_FILES | WRITE_DATA);
        if (st == ORION_OK && !ane_model_purge(ap->dev))
            st = orion_fail(ORION_ERR_BACKEND_UNAVAILABLE, "ane: this framework's "
                            "_ANEInMemoryModel has no purgeCompiledModel");
    }
    if (st == ORION_OK) st = ane_model_load(ap->dev);
    if (st == ORION_OK) remember(ap, w);   /* what was written, whatever the device does */
    return st;
}

static orion_status update_and_load(ane_program *ap, const weight_set *w) {
    const char *policy = getenv("ORION_ANE_DELTA");
    if (!policy || !*policy) policy = "auto";
    if (strcmp(policy, "auto") == 0) {
        if (ap->delta == DELTA_PROVEN) {
            orion_status st = write_weights(ap, w, WRITE_FILES | WRITE_DATA);
            if (st == ORION_OK) st = ane_model_load(ap->dev);
            if (st == ORION_OK) remember(ap, w);
            return st;
        }
        if (ap->delta == DELTA_UNPROVEN) {
            orion_status st = canary(ap, w);
            if (st != ORION_OK || ap->delta == DELTA_PROVEN) return st;
        }
        return recompile(ap, w, 1);
    }
    if (strcmp(policy, "recompile") == 0) return recompile(ap, w, 1);
    if (strcmp(policy, "refuse") == 0)
        return refuse(ap, ORION_ERR_STATE, "ORION_ANE_DELTA=refuse allows neither a delta reload "
                      "nor a recompile");
    static const char *const raw[] = {"files", "data", "atomic", "purge", "descriptor"};
    for (size_t i = 0; i < sizeof raw / sizeof raw[0]; i++)
        if (strcmp(policy, raw[i]) == 0) return raw_variant(ap, w, policy);
    return orion_fail(ORION_ERR_INVALID_ARGUMENT, "ORION_ANE_DELTA=%s: expected auto, recompile, "
                      "refuse, or (benchmarks/ane_smoke.py only) files, data, atomic, purge, "
                      "descriptor", policy);
}

/* After a failed recompile the program has no device program left. */
static orion_status lost(void) {
    return orion_fail(ORION_ERR_STATE, "ane: a weight update failed to make a new device program "
                      "(the error was reported then); release this program and compile again");
}

static orion_status ane_load(void *impl) {
    ane_program *ap = impl;
    if (!ap) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "ane: no program");
    if (!ap->dev) return lost();
    if (ap->dev->loaded) return ORION_OK;
    weight_set w;
    orion_status st = weight_set_read(ap, ap->folder, &w);
    if (st == ORION_OK) st = differs(ap, &w) ? update_and_load(ap, &w) : ane_model_load(ap->dev);
    weight_set_free(&w);
    return st;
}

static orion_status ane_unload(void *impl) {
    ane_program *ap = impl;
    if (!ap) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "ane: no program");
    return ap->dev ? ane_model_unload(ap->dev) : ORION_OK;
}

/* The surfaces of one group, each wrapped in an _ANEIOSurfaceObject, and the
 * indices 0..n-1: surface i binds to the i-th name in sorted order. */
static orion_status wrap_group(const ane_framework *f, const char *what,
                               surface_impl *const *surfaces, size_t n, NSMutableArray *objects,
                               NSMutableArray *indices) {
    for (size_t i = 0; i < n; i++) {
        void *native = surface_native(surfaces[i]);
        if (!native)
            return orion_fail(ORION_ERR_INVALID_ARGUMENT, "ane: %s surface %zu is not an "
                              "IOSurface (it was made before the framework was loaded?)", what, i);
        id object = nil;
        @try {
            object = [(id<OrionANEIOSurfaceObjectClass>)f->iosurface_object_class
                         objectWithIOSurface:native];
        } @catch (NSException *e) {
            return ane_fail_call(ORION_ERR_INTERNAL, "+[_ANEIOSurfaceObject " SEL_IOSURFACE_OBJECT
                                 "]", nil, e, NULL);
        }
        if (!object)
            return ane_fail_call(ORION_ERR_INTERNAL, "+[_ANEIOSurfaceObject " SEL_IOSURFACE_OBJECT
                                 "]", nil, nil, "returned nil");
        [objects addObject:object];
        [indices addObject:[NSNumber numberWithUnsignedLong:(unsigned long)i]];
    }
    return ORION_OK;
}

static orion_status eval_in_pool(const ane_framework *f, ane_model *m,
                                 surface_impl *const *inputs, size_t n_inputs,
                                 surface_impl *const *outputs, size_t n_outputs) {
    NSMutableArray *ins = [NSMutableArray arrayWithCapacity:n_inputs];
    NSMutableArray *in_idx = [NSMutableArray arrayWithCapacity:n_inputs];
    NSMutableArray *outs = [NSMutableArray arrayWithCapacity:n_outputs];
    NSMutableArray *out_idx = [NSMutableArray arrayWithCapacity:n_outputs];
    orion_status st = wrap_group(f, "input", inputs, n_inputs, ins, in_idx);
    if (st == ORION_OK) st = wrap_group(f, "output", outputs, n_outputs, outs, out_idx);
    if (st != ORION_OK) return st;
    id request = nil;
    @try {
        request = [(id<OrionANERequestClass>)f->request_class
                      requestWithInputs:ins inputIndices:in_idx outputs:outs outputIndices:out_idx
                          weightsBuffer:nil perfStats:nil
                         procedureIndex:[NSNumber numberWithInt:0]];
    } @catch (NSException *e) {
        return ane_fail_call(ORION_ERR_INTERNAL, "+[_ANERequest " SEL_REQUEST "]", nil, e, NULL);
    }
    if (!request)
        return ane_fail_call(ORION_ERR_INTERNAL, "+[_ANERequest " SEL_REQUEST "]", nil, nil,
                             "returned nil");
    NSError *error = nil;
    BOOL ok = NO;
    @try {
        ok = [(id<OrionANEModel>)m->model evaluateWithQoS:ANE_QOS
                                                   options:[NSDictionary dictionary]
                                                   request:request
                                                     error:&error];
    } @catch (NSException *e) {
        return ane_fail_call(ORION_ERR_EVAL, "-[_ANEInMemoryModel " SEL_EVAL "]", nil, e, NULL);
    }
    if (!ok)
        return ane_fail_call(ORION_ERR_EVAL, "-[_ANEInMemoryModel " SEL_EVAL "]", error, nil,
                             "returned NO");
    return ORION_OK;
}

static orion_status ane_eval(void *impl, surface_impl *const *inputs, size_t n_inputs,
                             surface_impl *const *outputs, size_t n_outputs) {
    ane_program *ap = impl;
    if (!ap) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "ane: no program");
    if (!ap->dev) return lost();
    if (!ap->dev->loaded)
        return orion_fail(ORION_ERR_STATE, "ane: eval of a program that is not loaded");
    orion_status st;
    const ane_framework *f = framework_or_fail(&st);
    if (!f) return st;
    NSAutoreleasePool *pool = [[NSAutoreleasePool alloc] init];
    st = eval_in_pool(f, ap->dev, inputs, n_inputs, outputs, n_outputs);
    [pool drain];
    return st;
}

static void ane_release(void *impl) {
    if (impl) program_free(impl);
}

const orion_backend orion_backend_ane = {
    .name = "ane",
    .available = ane_available,
    .compile = ane_compile,
    .load = ane_load,
    .unload = ane_unload,
    .eval = ane_eval,
    .release = ane_release,
};
