/* ane_update.m -- what a load does on the device when the runtime's weight files
 * no longer hold what the device program was made from (a delta update: unload,
 * patch, load). The device must neither serve stale weights silently nor compile
 * unseen. ORION_ANE_DELTA chooses how (docs/ane-backend.md, "Weight updates"):
 *   auto (default)  (a) a delta reload in place, proven by a canary probe against
 *                   vane at the program's first update (ane_probe.m) and probed again
 *                   every ORION_ANE_REPROBE proven updates (default 20; 0: never);
 *                   a probe that fails, or a load on this path that takes a
 *                   compile's time, demotes the program to (b) for the process; else
 *                   (b) an honest recompile from a new descriptor, counted; else
 *                   (c) a refusal naming the `inputs` strategy;
 *   recompile       (b), then (c);  refuse  (c);
 *   files, data, atomic, purge, descriptor   one raw variant with no check, for
 *                   benchmarks/ane_smoke.py only (the temp folder is kept for them).
 * Every load is timed against the program's compile and plain loads: one that looks
 * like a compile is counted against the budget and recorded, whatever the policy.
 * The canary's weights never outlive the probe: the temp folder gets the real
 * weights back on every way out of it, refusals and errors included. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/backend.h"
#include "../core/error.h"
#include "../core/sha256.h"
#include "ane_internal.h"

#define DEFAULT_REPROBE 20u

static const char *const RAW[] = {"files", "data", "atomic", "purge", "descriptor"};

const char *ane_delta_policy(void) {
    const char *p = getenv("ORION_ANE_DELTA");
    if (!p || !*p) return "auto";
    if (strcmp(p, "auto") == 0 || strcmp(p, "recompile") == 0 || strcmp(p, "refuse") == 0)
        return p;
    return ane_delta_is_raw(p) ? p : NULL;
}

int ane_keep_temp(void) {
    const char *keep = getenv("ORION_ANE_KEEP_TEMP");
    return ane_delta_is_raw(ane_delta_policy()) || (keep && *keep && strcmp(keep, "0") != 0);
}

int ane_delta_is_raw(const char *policy) {
    for (size_t i = 0; policy && i < sizeof RAW / sizeof RAW[0]; i++)
        if (strcmp(policy, RAW[i]) == 0) return 1;
    return 0;
}

static orion_status bad_policy(void) {
    return orion_fail(ORION_ERR_INVALID_ARGUMENT, "ORION_ANE_DELTA=%s: expected auto, recompile, "
                      "refuse, or (benchmarks/ane_smoke.py only) files, data, atomic, purge, "
                      "descriptor", getenv("ORION_ANE_DELTA"));
}

/* ORION_ANE_REPROBE: proven updates between two probes of a program; 0: never. */
static orion_status reprobe_every(uint32_t *out) {
    const char *v = getenv("ORION_ANE_REPROBE");
    *out = DEFAULT_REPROBE;
    if (!v || !*v) return ORION_OK;
    char *end;
    unsigned long n = strtoul(v, &end, 10);
    if (*end || n > 1000000ul || *v == '-')
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "ORION_ANE_REPROBE=%s: expected the number "
                          "of delta updates between two probes of a program (0: never)", v);
    *out = (uint32_t)n;
    return ORION_OK;
}

/* ---- the runtime's current weight files, in key order ---------------------- */

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
        if (st == ORION_OK) {
            sha256_ctx ctx;
            sha256_init(&ctx);
            sha256_update(&ctx, w->bytes[i], (size_t)size);
            sha256_final(&ctx, w->digest[i]);
        }
    }
    return st;
}

static void remember(ane_program *ap, const weight_set *w) {
    memcpy(ap->digest, w->digest, w->n * sizeof *w->digest);
}

static int differs(const ane_program *ap, const weight_set *w) {
    return w->n && memcmp(ap->digest, w->digest, w->n * sizeof *w->digest) != 0;
}

static orion_status read_mil(const char *folder, uint8_t **text, uint64_t *len) {
    char *path = ane_join(folder, "model.mil");
    orion_status st = path ? ane_read_file(path, text, len)
                           : orion_fail(ORION_ERR_OUT_OF_MEMORY, "ane: out of memory");
    free(path);
    return st;
}

/* ---- the temp folder ------------------------------------------------------------ */

#define WRITE_FILES 1u    /* weights/<name>.bin */
#define WRITE_DATA 2u     /* the staging `data` copy, where it holds one of them */
#define WRITE_ATOMIC 4u   /* a new file renamed over the old one, not in place */

static orion_status write_weights(ane_program *ap, const weight_set *w, unsigned how) {
    if (!ane_model_staged(ap->dev))
        return orion_fail(ORION_ERR_STATE, "ane: program %s: the temp folder was left after the "
                          "compile (set ORION_ANE_DELTA before compiling to keep it for a raw "
                          "variant)", ap->dev->hex_id);
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

/* The temp folder written again with `w` (it was left after the compile), held. */
static orion_status stage(ane_program *ap, const weight_set *w) {
    if (ane_model_staged(ap->dev)) return write_weights(ap, w, WRITE_FILES | WRITE_DATA);
    uint8_t *mil = NULL;
    uint64_t mil_len = 0;
    orion_status st = read_mil(ap->folder, &mil, &mil_len);
    if (st == ORION_OK) st = ane_model_stage(ap->dev, mil, mil_len, w->files, w->n);
    free(mil);
    return st;
}

/* Once the delta path is not in use for a program, its temp folder goes (unless
 * ORION_ANE_KEEP_TEMP keeps every folder). */
static void leave_unless_kept(ane_program *ap) {
    if (!ane_keep_temp()) ane_model_unstage(ap->dev);
}

/* ---- loads, timed ---------------------------------------------------------------- */

/* A load; one that took a compile's time is counted and recorded (*compiled = 1).
 * `plain`: nothing changed since the compile, so the first such load is the
 * program's plain-load time. */
static orion_status load_counted(ane_program *ap, int plain, int *compiled) {
    *compiled = 0;
    orion_status st = ane_model_load(ap->dev);
    char why[256];
    if (st == ORION_OK && ane_model_load_compiled(ap->dev, plain, why, sizeof why)) {
        backend_count_hidden_compile();
        ap->hidden++;
        snprintf(ap->hidden_why, sizeof ap->hidden_why, "%s", why);
        *compiled = 1;
    }
    return st;
}

static void demote(ane_program *ap, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void demote(ane_program *ap, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(ap->delta_why, sizeof ap->delta_why, fmt, args);
    va_end(args);
    ap->delta = DELTA_DEMOTED;
    backend_note(BACKEND_DEMOTION);
}

/* The weights are what the device program was made from. A failure without the
 * temp folder says how to keep it, for a framework that would read it at load. */
static orion_status plain_load(ane_program *ap) {
    int compiled;
    orion_status st = load_counted(ap, 1, &compiled);
    if (st != ORION_OK && !ane_model_staged(ap->dev))
        orion_fail_context(st, "ane: program %s was loaded without its temp folder, which is left "
                           "after the compile (ORION_ANE_KEEP_TEMP=1 keeps it)", ap->dev->hex_id);
    return st;
}

/* ---- (c) and (b) ------------------------------------------------------------------ */

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
static orion_status recompile(const ane_framework *f, ane_program *ap, const weight_set *w,
                              int compile) {
    char reason[1024];
    if (backend_spend_compile() != ORION_OK) {
        snprintf(reason, sizeof reason, "a new compile would exceed the budget (%s)",
                 orion_last_error());
        return refuse(ap, ORION_ERR_BUDGET, reason);
    }
    uint8_t *mil_text = NULL;
    uint64_t mil_len = 0;
    orion_status st = read_mil(ap->folder, &mil_text, &mil_len);
    if (st != ORION_OK) return st;
    /* The old model goes first: a framework whose identifier ignores the
     * weight bytes would give the new one the same temp folder. */
    ane_model_free(ap->dev);
    ap->dev = NULL;
    st = ane_model_create(f, mil_text, mil_len, w->files, w->n, compile, ane_keep_temp(), &ap->dev);
    free(mil_text);
    if (st == ORION_OK) st = plain_load(ap);
    if (st == ORION_OK) remember(ap, w);
    return st;
}

/* ---- (a) the canary -------------------------------------------------------------- */

typedef struct probe_ctx {
    const ane_framework *f;
    ane_program *ap;
} probe_ctx;

static orion_status probe_eval(void *ctx, surface_impl *const *in, size_t n_in,
                               surface_impl *const *out, size_t n_out) {
    probe_ctx *c = ctx;
    return ane_eval_plain(c->f, c->ap->dev, in, n_in, out, n_out);
}

static orion_status copy_set(const weight_set *from, weight_set *to) {
    memset(to, 0, sizeof *to);
    size_t n = from->n ? from->n : 1;
    to->files = calloc(n, sizeof *to->files);
    to->keys = calloc(n, sizeof *to->keys);
    to->bytes = calloc(n, sizeof *to->bytes);
    to->digest = calloc(n, sizeof *to->digest);
    if (!to->files || !to->keys || !to->bytes || !to->digest)
        return orion_fail(ORION_ERR_OUT_OF_MEMORY, "ane: out of memory");
    for (size_t i = 0; i < from->n; i++) {
        to->n++;
        to->keys[i] = strdup(from->keys[i]);
        to->bytes[i] = malloc(from->files[i].nbytes ? from->files[i].nbytes : 1);
        if (!to->keys[i] || !to->bytes[i])
            return orion_fail(ORION_ERR_OUT_OF_MEMORY, "ane: out of memory");
        memcpy(to->bytes[i], from->bytes[i], from->files[i].nbytes);
        to->files[i] = (orion_weight_file){to->keys[i], to->bytes[i], from->files[i].nbytes};
    }
    return ORION_OK;
}

/* The probe itself: canary weights in the temp folder, a reload, one evaluation on
 * the device against vane's for the canary and for the real new weights. *passed
 * when the device followed the canary and its load compiled nothing; `why` says
 * what was seen. Leaves the program unloaded and the folder with canary weights. */
static orion_status run_probe(const ane_framework *f, ane_program *ap, const weight_set *w,
                              int *passed, char *why, size_t capacity) {
    weight_set bait = {0};
    float *real = NULL, *want = NULL, *got = NULL;
    size_t n_real = 0, n_want = 0, n_got = 0;
    *passed = 0;
    orion_status st = ane_probe_reference(ap->mil, ap->folder, &real, &n_real);
    if (st == ORION_OK) st = copy_set(w, &bait);
    for (size_t i = 0; st == ORION_OK && i < bait.n; i++)
        st = ane_canary_bytes(bait.bytes[i], bait.files[i].nbytes, bait.keys[i]);
    if (st == ORION_OK) st = stage(ap, &bait);
    if (st == ORION_OK) st = ane_probe_reference(ap->mil, ap->dev->tmp_dir, &want, &n_want);
    weight_set_free(&bait);
    int compiled = 0;
    if (st == ORION_OK && load_counted(ap, 0, &compiled) != ORION_OK) {
        snprintf(why, capacity, "the reload failed: %s", orion_last_error());   /* e.g. verify */
        orion_clear_error();
    } else if (st == ORION_OK) {
        probe_ctx ctx = {f, ap};
        st = ane_probe_device(ap->mil, probe_eval, &ctx, &got, &n_got);
        orion_status st2 = ane_model_unload(ap->dev);
        if (st == ORION_OK) st = st2;
        if (st == ORION_OK && (n_got != n_want || n_real != n_want))
            st = orion_fail(ORION_ERR_INTERNAL, "ane: the canary read %zu outputs on the device "
                            "and %zu on vane", n_got, n_want);
        if (st == ORION_OK) *passed = ane_probe_judge(got, want, real, n_got, why, capacity);
        if (st == ORION_OK && compiled) {
            /* it followed only because the load compiled the folder: not a delta */
            snprintf(why, capacity, "loads compile (%s)", ap->hidden_why);
            *passed = 0;
        }
    }
    free(real);
    free(want);
    free(got);
    return st;
}

/* (a) A probe of the delta path (the first update of a program, or a spot check of a
 * proven one). On every way out the temp folder gets the real new weights back: the
 * canary's never stay where a later load could build them. Proven: the program is
 * loaded with the new weights and the folder is kept for the next updates. Not
 * proven: the program is demoted (why in delta_why), unloaded, the folder left. */
static orion_status probe_delta(const ane_framework *f, ane_program *ap, const weight_set *w,
                                int spot) {
    backend_note(spot ? BACKEND_SPOT_PROBE : BACKEND_CANARY_PROBE);
    ap->probes++;
    ap->since_probe = 0;
    int passed = 0;
    char why[512] = "";
    orion_status st = run_probe(f, ap, w, &passed, why, sizeof why);
    if (ane_model_staged(ap->dev)) {   /* the real weights back, whatever happened */
        orion_status back = write_weights(ap, w, WRITE_FILES | WRITE_DATA);
        if (st == ORION_OK) st = back;
    }
    if (st != ORION_OK || !passed) {
        if (st == ORION_OK) {
            backend_note(BACKEND_PROBE_FAILED);
            demote(ap, "the %s probe of the delta path failed: %s", spot ? "spot" : "canary", why);
        }
        leave_unless_kept(ap);
        return st;
    }
    ap->delta = DELTA_PROVEN;
    snprintf(ap->delta_why, sizeof ap->delta_why, "proven by a %s probe: %s",
             spot ? "spot" : "canary", why);
    int compiled;
    st = load_counted(ap, 0, &compiled);
    if (st == ORION_OK) remember(ap, w);
    if (st == ORION_OK && compiled) {
        demote(ap, "loads compile (%s)", ap->hidden_why);
        leave_unless_kept(ap);
    }
    return st;
}

/* A proven delta: the new weights in place, a reload (timed). */
static orion_status proven_delta(ane_program *ap, const weight_set *w) {
    orion_status st = write_weights(ap, w, WRITE_FILES | WRITE_DATA);
    int compiled;
    if (st == ORION_OK) st = load_counted(ap, 0, &compiled);
    if (st == ORION_OK) remember(ap, w);
    if (st == ORION_OK && compiled) {
        demote(ap, "loads compile (%s)", ap->hidden_why);
        leave_unless_kept(ap);
    }
    return st;
}

/* ---- raw variants (benchmarks/ane_smoke.py) ---------------------------------------- */

static orion_status raw_variant(const ane_framework *f, ane_program *ap, const weight_set *w,
                                const char *variant) {
    orion_status st = ORION_OK;
    if (strcmp(variant, "descriptor") == 0) return recompile(f, ap, w, 0);   /* load compiles */
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
    int compiled;
    if (st == ORION_OK) st = load_counted(ap, 0, &compiled);
    if (st == ORION_OK) remember(ap, w);   /* what was written, whatever the device does */
    return st;
}

/* ---- the policy --------------------------------------------------------------------- */

static orion_status update_and_load(const ane_framework *f, ane_program *ap, const weight_set *w) {
    const char *policy = ane_delta_policy();
    if (!policy) return bad_policy();
    if (strcmp(policy, "auto") == 0) {
        uint32_t every;
        orion_status st = reprobe_every(&every);
        if (st != ORION_OK) return st;
        if (ap->delta == DELTA_PROVEN && !(every && ap->since_probe + 1 >= every)) {
            ap->since_probe++;
            return proven_delta(ap, w);
        }
        if (ap->delta != DELTA_DEMOTED) {
            st = probe_delta(f, ap, w, ap->delta == DELTA_PROVEN);
            if (st != ORION_OK || ap->delta == DELTA_PROVEN || ap->dev->loaded) return st;
        }
        return recompile(f, ap, w, 1);
    }
    if (strcmp(policy, "recompile") == 0) return recompile(f, ap, w, 1);
    if (strcmp(policy, "refuse") == 0)
        return refuse(ap, ORION_ERR_STATE, "ORION_ANE_DELTA=refuse allows neither a delta reload "
                      "nor a recompile");
    return raw_variant(f, ap, w, policy);
}

/* After a failed recompile the program has no device program left. */
static orion_status lost(void) {
    return orion_fail(ORION_ERR_STATE, "ane: a weight update failed to make a new device program "
                      "(the error was reported then); release this program and compile again");
}

orion_status ane_update_load(const ane_framework *f, ane_program *ap) {
    if (!ap->dev) return lost();
    if (ap->dev->loaded) return ORION_OK;
    weight_set w;
    orion_status st = weight_set_read(ap, ap->folder, &w);
    if (st == ORION_OK) st = differs(ap, &w) ? update_and_load(f, ap, &w) : plain_load(ap);
    weight_set_free(&w);
    return st;
}

void ane_update_describe(const ane_program *ap, char *buf, size_t capacity) {
    const char *policy = ane_delta_policy();
    char hidden[384] = "";
    if (ap->hidden)
        snprintf(hidden, sizeof hidden, "; %u load(s) took a compile's time and were counted "
                 "(the last: %s)", ap->hidden, ap->hidden_why);
    uint32_t every = DEFAULT_REPROBE;
    if (reprobe_every(&every) != ORION_OK) orion_clear_error();
    if (!policy)
        snprintf(buf, capacity, "invalid: ORION_ANE_DELTA=%s", getenv("ORION_ANE_DELTA"));
    else if (ane_delta_is_raw(policy))
        snprintf(buf, capacity, "raw variant %s (benchmarks/ane_smoke.py): no check%s", policy,
                 hidden);
    else if (strcmp(policy, "auto") != 0)
        snprintf(buf, capacity, "%s: ORION_ANE_DELTA=%s%s", policy, policy, hidden);
    else if (ap->delta == DELTA_PROVEN)
        snprintf(buf, capacity, "delta: %s; %u probe(s); probed again every %u updates%s",
                 ap->delta_why, ap->probes, every, hidden);
    else if (ap->delta == DELTA_DEMOTED)
        snprintf(buf, capacity, "recompile: %s; %u probe(s)%s", ap->delta_why, ap->probes, hidden);
    else
        snprintf(buf, capacity, "unproven: the first weight update probes the delta path with "
                 "a canary%s", hidden);
}
