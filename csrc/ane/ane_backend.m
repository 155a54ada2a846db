/* ane_backend.m -- the ane backend: Apple's Neural Engine through the private
 * in-memory model API of AppleNeuralEngine.framework (docs/ane-facts.md §1,
 * docs/ane-backend.md), behind the same interface as vane (core/backend.h).
 *
 * compile: one device program (ane_model.m) from the MIL text and weights; its
 *          temp folder is left once compiled (ane_keep_temp says when not; the
 *          delta path writes it again when it needs it, ane_update.m).
 * load:    ane_update.m: as compiled, or, after a weight change, by the
 *          ORION_ANE_DELTA policy; every load is timed, and one that took a
 *          compile's time is counted.
 * eval:    each surface (an IOSurface, ane_surface.m) wrapped in an
 *          _ANEIOSurfaceObject, a request with indices 0..n-1 in the binding
 *          order the runtime gives, evaluateWithQoS:. With ORION_ANE_PERF_STATS=1
 *          the request carries an _ANEPerformanceStats and the device's own time
 *          is read back (orion_program_hw_time), where the framework offers it.
 * unload / release: unloadWithQoS:, the model released, the temp folder left. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/backend.h"
#include "../core/error.h"
#include "../core/sha256.h"
#include "ane_internal.h"

#define MODEL_PATH_PREFIX "@model_path/"

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

static void digest_of(const orion_weight_file *f, uint8_t out[32]) {
    sha256_ctx ctx;
    sha256_init(&ctx);
    sha256_update(&ctx, f->data, (size_t)f->nbytes);
    sha256_final(&ctx, out);
}

static int env_on(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

/* macOS 27 (pmetal) checks one hash over a program's weight files: several fail. */
static orion_status with_file_hint(orion_status st, size_t n_files) {
    if (st == ORION_OK || n_files < 2) return st;
    return orion_fail_context(st, "ane: this program has %zu weight files; macOS 27 verifies one "
                              "per program (orion.ir.mil emits one)", n_files);
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
    ap->perf_stats = env_on("ORION_ANE_PERF_STATS");
    snprintf(ap->hw_why, sizeof ap->hw_why, "%s", ap->perf_stats
             ? "no evaluation yet" : "device times are read with ORION_ANE_PERF_STATS=1");
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
    char *mil_path = st == ORION_OK ? ane_join(folder, "model.mil") : NULL;
    if (st == ORION_OK)
        st = mil_path ? ane_read_file(mil_path, &mil_text, &mil_len)
                      : orion_fail(ORION_ERR_OUT_OF_MEMORY, "ane: out of memory");
    free(mil_path);
    if (st == ORION_OK)
        st = with_file_hint(ane_model_create(f, mil_text, mil_len, weights, n_weights, 1,
                                             ane_keep_temp(), &ap->dev), n_weights);
    free(mil_text);
    if (st != ORION_OK) {
        program_free(ap);
        return st;
    }
    *impl_out = ap;
    return ORION_OK;
}

static orion_status ane_load(void *impl) {
    ane_program *ap = impl;
    if (!ap) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "ane: no program");
    orion_status st;
    const ane_framework *f = framework_or_fail(&st);
    if (!f) return st;
    return with_file_hint(ane_update_load(f, ap), ap->n_files);
}

static orion_status ane_unload(void *impl) {
    ane_program *ap = impl;
    if (!ap) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "ane: no program");
    return ap->dev ? ane_model_unload(ap->dev) : ORION_OK;
}

/* ---- eval -------------------------------------------------------------------- */

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

/* One evaluation inside the caller's pool; `stats` (or nil) rides as perfStats.
 * *request_raised: the request could not be made (an exception). */
static orion_status evaluate(const ane_framework *f, ane_model *m, id stats,
                             surface_impl *const *inputs, size_t n_inputs,
                             surface_impl *const *outputs, size_t n_outputs,
                             int *request_raised) {
    *request_raised = 0;
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
                          weightsBuffer:nil perfStats:stats
                         procedureIndex:[NSNumber numberWithInt:0]];
    } @catch (NSException *e) {
        *request_raised = 1;
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

orion_status ane_eval_plain(const ane_framework *f, ane_model *m, surface_impl *const *inputs,
                            size_t n_inputs, surface_impl *const *outputs, size_t n_outputs) {
    NSAutoreleasePool *pool = [[NSAutoreleasePool alloc] init];
    int raised;
    orion_status st = evaluate(f, m, nil, inputs, n_inputs, outputs, n_outputs, &raised);
    [pool drain];
    return st;
}

/* A fresh _ANEPerformanceStats (pmetal's factory), or nil with why in ap->hw_why. */
static id new_stats(const ane_framework *f, ane_program *ap) {
    Class cls = f->perf_stats_class;
    id stats = nil;
    @try {
        if (!cls)
            snprintf(ap->hw_why, sizeof ap->hw_why, "this framework has no _ANEPerformanceStats");
        else if (![cls respondsToSelector:NSSelectorFromString(@SEL_PERF_STATS)])
            snprintf(ap->hw_why, sizeof ap->hw_why, "_ANEPerformanceStats has no +%s",
                     SEL_PERF_STATS);
        else if (!(stats = [(id<OrionANEPerfStatsClass>)cls
                              statsWithHardwareExecutionNS:[NSNumber numberWithInt:0]]))
            snprintf(ap->hw_why, sizeof ap->hw_why, "+[_ANEPerformanceStats %s] returned nil",
                     SEL_PERF_STATS);
        else if (![stats respondsToSelector:NSSelectorFromString(@SEL_HW_TIME)]) {
            snprintf(ap->hw_why, sizeof ap->hw_why, "_ANEPerformanceStats has no -%s", SEL_HW_TIME);
            stats = nil;
        }
    } @catch (NSException *e) {
        snprintf(ap->hw_why, sizeof ap->hw_why, "making an _ANEPerformanceStats raised %s",
                 [[e name] UTF8String]);
        stats = nil;
    }
    return stats;
}

static orion_status ane_eval(void *impl, surface_impl *const *inputs, size_t n_inputs,
                             surface_impl *const *outputs, size_t n_outputs) {
    ane_program *ap = impl;
    if (!ap) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "ane: no program");
    if (!ap->dev)
        return orion_fail(ORION_ERR_STATE, "ane: a weight update failed to make a new device "
                          "program (the error was reported then); release this program and "
                          "compile again");
    if (!ap->dev->loaded)
        return orion_fail(ORION_ERR_STATE, "ane: eval of a program that is not loaded");
    orion_status st;
    const ane_framework *f = framework_or_fail(&st);
    if (!f) return st;
    NSAutoreleasePool *pool = [[NSAutoreleasePool alloc] init];
    id stats = ap->perf_stats ? new_stats(f, ap) : nil;
    ap->hw_offered = 0;
    ap->hw_ns = 0;
    int raised;
    st = evaluate(f, ap->dev, stats, inputs, n_inputs, outputs, n_outputs, &raised);
    if (st != ORION_OK && stats && raised) {
        /* pmetal: on macOS 27 making the request raises on a stats object (its
         * validation sends -count to it): the evaluation goes without, and this
         * program asks no more */
        snprintf(ap->hw_why, sizeof ap->hw_why, "the request refused a stats object: %s",
                 orion_last_error());
        orion_clear_error();
        ap->perf_stats = 0;
        stats = nil;
        st = evaluate(f, ap->dev, nil, inputs, n_inputs, outputs, n_outputs, &raised);
    }
    if (st == ORION_OK && stats) {
        @try {
            ap->hw_ns = [(id<OrionANEPerfStats>)stats hwExecutionTime];
            ap->hw_offered = 1;
        } @catch (NSException *e) {
            snprintf(ap->hw_why, sizeof ap->hw_why, "-[_ANEPerformanceStats %s] raised %s",
                     SEL_HW_TIME, [[e name] UTF8String]);
        }
    }
    [pool drain];
    return st;
}

static int ane_hw_time(void *impl, uint64_t *ns, char *why, size_t capacity) {
    ane_program *ap = impl;
    *ns = ap && ap->hw_offered ? ap->hw_ns : 0;
    if (!ap || !ap->hw_offered) snprintf(why, capacity, "%s", ap ? ap->hw_why : "no program");
    return ap && ap->hw_offered;
}

static void ane_describe_update(void *impl, char *buf, size_t capacity) {
    if (impl) ane_update_describe(impl, buf, capacity);
    else snprintf(buf, capacity, "no program");
}

static void ane_release(void *impl) {
    if (impl) program_free(impl);
}

const orion_backend orion_backend_ane = {
    .name = "ane",
    .reuses_stored = 0,   /* aned's own cache of a program is unproven: opening compiles */
    .keeps_no_mil = 0,    /* the update canary reads the program again (ane_update.m) */
    .available = ane_available,
    .compile = ane_compile,
    .load = ane_load,
    .unload = ane_unload,
    .eval = ane_eval,
    .release = ane_release,
    .describe_update = ane_describe_update,
    .hw_time = ane_hw_time,
};
