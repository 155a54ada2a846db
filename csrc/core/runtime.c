/* runtime.c -- programs: compile -> load -> eval -> unload -> patch -> load.
 *
 * Everything both backends share lives here (see backend.h): argument checks,
 * handles, MIL parse + verify, the identifier and program folder, the compile
 * budget (ANE-C31), resident-program and weight-window limits (ANE-C34,
 * ANE-C35), eval-time surface checks (ANE-C17, C18, C23, C25) and the
 * in-place weight patch of the delta path. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend.h"
#include "catalog.h"
#include "error.h"
#include "folder.h"
#include "handles.h"
#include "regular_file.h"
#include "sha256.h"
#include "store.h"
#include "surface.h"
#include "weight_share.h"

#define DEFAULT_COMPILE_BUDGET 119u     /* ANE-C31: the device fails after ~119 compiles */
#define MAX_RESIDENT_PROGRAMS 127u      /* ANE-C34: program 128 fails to load */
#define WEIGHT_WINDOW_BYTES (((uint64_t)4) << 30)  /* ANE-C35 */
#define MIN_SURFACE_BYTES 49152u        /* ANE-C23 */
#define MAX_MIL_BYTES (((uint64_t)256) << 20)
#define MAX_WEIGHT_FILES 4096u
#define IDENTIFIER_HEX 20               /* hex digits taken from each of three SHA-256s */

/* ---- backends ---------------------------------------------------------- */

static const orion_backend *const all_backends[] = {
#ifdef ORION_WITH_ANE
    &orion_backend_ane,
#endif
    &orion_backend_vane,
};
#define N_BACKENDS (sizeof all_backends / sizeof all_backends[0])

static const orion_backend *backend_named(const char *name) {
    for (size_t i = 0; i < N_BACKENDS; i++)
        if (strcmp(all_backends[i]->name, name) == 0) return all_backends[i];
    return NULL;
}

static orion_status choose_backend(const char *requested, const orion_backend **out) {
    const char *name = requested, *from = "";
    if (!name || !*name || strcmp(name, "auto") == 0) {
        const char *env = getenv("ORION_BACKEND");
        name = env && *env ? env : "auto";
        if (env && *env) from = " (from ORION_BACKEND)";
    }
    char why[512] = "";
    if (strcmp(name, "auto") == 0) {
        for (size_t i = 0; i < N_BACKENDS; i++)
            if (all_backends[i]->available(why, sizeof why)) {
                *out = all_backends[i];
                return ORION_OK;
            }
        return orion_fail(ORION_ERR_BACKEND_UNAVAILABLE, "no backend is available: %s", why);
    }
    const orion_backend *b = backend_named(name);
    if (!b) {
        if (strcmp(name, "ane") == 0)
            return orion_fail(ORION_ERR_BACKEND_UNAVAILABLE,
                              "backend \"ane\" is not built into this library (it is built on "
                              "Apple platforms only); use \"vane\"");
        return orion_fail(ORION_ERR_INVALID_ARGUMENT,
                          "unknown backend \"%s\"%s (expected \"ane\", \"vane\" or \"auto\")",
                          name, from);
    }
    if (!b->available(why, sizeof why))
        return orion_fail(ORION_ERR_BACKEND_UNAVAILABLE, "backend \"%s\" is unavailable: %s",
                          name, why);
    *out = b;
    return ORION_OK;
}

orion_status orion_backends(char *buf, size_t capacity) {
    orion_clear_error();
    if (!buf || capacity == 0) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "backends: no buffer");
    buf[0] = '\0';
    size_t used = 0;
    for (size_t i = 0; i < N_BACKENDS; i++) {
        char why[512];
        if (!all_backends[i]->available(why, sizeof why)) continue;
        int n = snprintf(buf + used, capacity - used, "%s%s", used ? "," : "", all_backends[i]->name);
        if (n < 0 || (size_t)n >= capacity - used)
            return orion_fail(ORION_ERR_INVALID_ARGUMENT, "backends: buffer too small");
        used += (size_t)n;
    }
    return ORION_OK;
}

orion_status orion_backend_describe(const char *backend, char *buf, size_t capacity) {
    orion_clear_error();
    if (!backend || !buf || capacity == 0)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "backend_describe: NULL argument");
    const orion_backend *b = backend_named(backend);
    if (!b) {
        snprintf(buf, capacity, "%s: not built into this library", backend);
        return ORION_OK;
    }
    char why[512] = "";
    int ok = b->available(why, sizeof why);
    snprintf(buf, capacity, "%s: %s%s%s", backend, ok ? "available" : "unavailable",
             why[0] ? ": " : "", why);
    return ORION_OK;
}

/* ---- compile budget ---------------------------------------------------- */

static pthread_mutex_t budget_lock = PTHREAD_MUTEX_INITIALIZER;
static uint32_t compiles_spent;
static uint32_t compile_budget_value;
static int budget_initialised;

static void budget_init_locked(void) {
    if (budget_initialised) return;
    budget_initialised = 1;
    compile_budget_value = DEFAULT_COMPILE_BUDGET;
    const char *env = getenv("ORION_COMPILE_BUDGET");
    if (env && *env) {
        char *end;
        unsigned long v = strtoul(env, &end, 10);
        if (*end == '\0' && v > 0 && v <= 1000000) compile_budget_value = (uint32_t)v;
    }
}

uint32_t orion_compile_count(void) {
    pthread_mutex_lock(&budget_lock);
    uint32_t n = compiles_spent;
    pthread_mutex_unlock(&budget_lock);
    return n;
}

uint32_t orion_compile_budget(void) {
    pthread_mutex_lock(&budget_lock);
    budget_init_locked();
    uint32_t n = compile_budget_value;
    pthread_mutex_unlock(&budget_lock);
    return n;
}

orion_status orion_set_compile_budget(uint32_t budget) {
    orion_clear_error();
    if (budget == 0) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "compile budget must be > 0");
    pthread_mutex_lock(&budget_lock);
    budget_init_locked();
    compile_budget_value = budget;
    pthread_mutex_unlock(&budget_lock);
    return ORION_OK;
}

/* Takes one compile from the budget, or fails naming ANE-C31. */
static orion_status budget_spend(void) {
    pthread_mutex_lock(&budget_lock);
    budget_init_locked();
    orion_status st = ORION_OK;
    if (compiles_spent >= compile_budget_value)
        st = orion_fail(ORION_ERR_BUDGET,
                        "ANE-C31 (compile budget): all %u compiles of this process are spent; the "
                        "device refuses further compiles. Fix: pass weights as program inputs "
                        "(training: update='inputs'), or on vane update them with the delta path "
                        "(unload, patch, load), which spends none; or checkpoint and restart the "
                        "process; vane's budget is set with orion_set_compile_budget or "
                        "ORION_COMPILE_BUDGET", compile_budget_value);
    else
        compiles_spent++;
    pthread_mutex_unlock(&budget_lock);
    return st;
}

orion_status backend_spend_compile(void) { return budget_spend(); }

/* ---- what the weight-update paths did ------------------------------------ */

static orion_update_stats update_stats;

void backend_count_hidden_compile(void) {
    pthread_mutex_lock(&budget_lock);
    compiles_spent++;
    update_stats.hidden_compiles++;
    pthread_mutex_unlock(&budget_lock);
}

void backend_note(backend_event event) {
    pthread_mutex_lock(&budget_lock);
    switch (event) {
    case BACKEND_CANARY_PROBE: update_stats.canary_probes++; break;
    case BACKEND_SPOT_PROBE: update_stats.spot_probes++; break;
    case BACKEND_PROBE_FAILED: update_stats.probes_failed++; break;
    case BACKEND_DEMOTION: update_stats.demotions++; break;
    }
    pthread_mutex_unlock(&budget_lock);
}

orion_status orion_update_stats_read(orion_update_stats *out) {
    orion_clear_error();
    if (!out) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "update_stats: out is NULL");
    pthread_mutex_lock(&budget_lock);
    *out = update_stats;
    pthread_mutex_unlock(&budget_lock);
    return ORION_OK;
}

/* ---- the program registry ---------------------------------------------- */

typedef struct program {
    handle_obj obj;                  /* first: the handle table's view */
    pthread_mutex_t lock;            /* serialises load/unload/eval/patch */
    const orion_backend *backend;
    void *impl;
    mil_program *mil;
    char identifier[3 * IDENTIFIER_HEX + 1];
    char *folder;
    char **keys;                     /* weight keys, as compiled */
    size_t n_keys;
    orion_io_info *inputs, *outputs; /* binding order */
    uint32_t n_inputs, n_outputs;
    uint64_t weight_bytes;           /* baked weight bytes (ANE-C35 accounting) */
    int loaded;
    struct program *next_live;       /* live list: identifiers in use */
} program;

static handle_table programs = HANDLE_TABLE_INIT("program");
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static program *live_programs;
static uint64_t loaded_programs;
static uint64_t loaded_weight_bytes;
static uint64_t parsed_mil_bytes;    /* orion_parsed_mil_bytes (atomic) */

static void live_remove(program *p) {
    pthread_mutex_lock(&live_lock);
    for (program **q = &live_programs; *q; q = &(*q)->next_live)
        if (*q == p) {
            *q = p->next_live;
            break;
        }
    pthread_mutex_unlock(&live_lock);
}

/* Adds p under its identifier unless a live program already holds it. */
static orion_status live_add(program *p) {
    orion_status st = ORION_OK;
    pthread_mutex_lock(&live_lock);
    for (program *q = live_programs; q; q = q->next_live)
        if (strcmp(q->identifier, p->identifier) == 0 && strcmp(q->folder, p->folder) == 0) {
            st = orion_fail(ORION_ERR_STATE,
                            "a live program already has identifier %s (same MIL text and weight "
                            "keys) and owns its folder; release it first, or give this program's "
                            "weight files distinct keys", p->identifier);
            break;
        }
    if (st == ORION_OK) {
        p->next_live = live_programs;
        live_programs = p;
    }
    pthread_mutex_unlock(&live_lock);
    return st;
}

/* The program counts as unloaded even when the backend reports a failure:
 * the device has dropped it either way, and the failure is returned. */
static orion_status unload_locked(program *p) {
    if (!p->loaded) return ORION_OK;
    orion_status st = p->backend->unload(p->impl);
    p->loaded = 0;
    pthread_mutex_lock(&live_lock);
    loaded_programs--;
    loaded_weight_bytes -= p->weight_bytes;
    pthread_mutex_unlock(&live_lock);
    return st;
}

/* Frees the program's parse, which orion_parsed_mil_bytes counts. */
static void drop_mil(program *p) {
    if (!p->mil) return;
    __atomic_sub_fetch(&parsed_mil_bytes, mil_program_bytes(p->mil), __ATOMIC_RELAXED);
    mil_program_free(p->mil);
    p->mil = NULL;
}

static void program_free(program *p) {
    if (p->impl) p->backend->release(p->impl);
    drop_mil(p);
    if (p->folder) {
        weight_share_forget_folder(p->folder);
        folder_remove_program(p->folder);
    }
    free(p->folder);
    for (size_t i = 0; i < p->n_keys; i++) free(p->keys[i]);
    free(p->keys);
    free(p->inputs);
    free(p->outputs);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

static void program_destroy(handle_obj *obj) {
    program *p = (program *)obj;
    pthread_mutex_lock(&p->lock);
    (void)unload_locked(p);   /* release cannot report; the program goes regardless */
    pthread_mutex_unlock(&p->lock);
    live_remove(p);
    program_free(p);
}

static orion_status program_get(orion_program h, program **out) {
    handle_obj *obj;
    orion_status st = handle_get(&programs, h, &obj);
    if (st == ORION_OK) *out = (program *)obj;
    return st;
}

uint64_t orion_program_live_count(void) { return handle_live(&programs); }

uint64_t orion_program_loaded_count(void) {
    pthread_mutex_lock(&live_lock);
    uint64_t n = loaded_programs;
    pthread_mutex_unlock(&live_lock);
    return n;
}

uint64_t orion_parsed_mil_bytes(void) {
    return __atomic_load_n(&parsed_mil_bytes, __ATOMIC_RELAXED);
}

/* ---- compile ----------------------------------------------------------- */

static void hex_digest(const void *data, size_t n, char *out) {
    sha256_ctx ctx;
    uint8_t d[32];
    sha256_init(&ctx);
    sha256_update(&ctx, data, n);
    sha256_final(&ctx, d);
    for (int i = 0; i < IDENTIFIER_HEX / 2; i++) sprintf(out + 2 * i, "%02x", d[i]);
}

static int compare_keys(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The identifier: three SHA-256s, of the MIL text, of the sorted weight keys,
 * and of the backend and numerics. Weight *values* do not enter it, as on the
 * device: a delta update keeps the identifier. */
static void make_identifier(program *p, const char *mil, size_t mil_len, uint32_t numerics) {
    hex_digest(mil, mil_len, p->identifier);
    sha256_ctx ctx;
    uint8_t d[32];
    sha256_init(&ctx);
    for (size_t i = 0; i < p->n_keys; i++) sha256_update(&ctx, p->keys[i], strlen(p->keys[i]) + 1);
    sha256_final(&ctx, d);
    for (int i = 0; i < IDENTIFIER_HEX / 2; i++) sprintf(p->identifier + IDENTIFIER_HEX + 2 * i, "%02x", d[i]);
    char opts[64];
    int n = snprintf(opts, sizeof opts, "%s/%u", p->backend->name, numerics);
    hex_digest(opts, (size_t)n, p->identifier + 2 * IDENTIFIER_HEX);
}

static orion_status check_compile_args(const char *mil_text, uint64_t mil_len,
                                       const orion_weight_file *weights, uint64_t n_weights,
                                       const orion_compile_options *options, orion_program *out) {
    if (!out) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "compile: out is NULL");
    if (!mil_text || mil_len == 0) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "compile: empty MIL text");
    if (mil_len > MAX_MIL_BYTES)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "compile: MIL text of %llu bytes exceeds %llu",
                          (unsigned long long)mil_len, (unsigned long long)MAX_MIL_BYTES);
    if (n_weights && !weights) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "compile: weights is NULL");
    if (n_weights > MAX_WEIGHT_FILES)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "compile: %llu weight files is too many",
                          (unsigned long long)n_weights);
    for (uint64_t i = 0; i < n_weights; i++) {
        orion_status st = folder_check_key(weights[i].key);
        if (st != ORION_OK) return st;
        if (weights[i].nbytes && !weights[i].data)
            return orion_fail(ORION_ERR_INVALID_ARGUMENT, "weight file %s has no data", weights[i].key);
        for (uint64_t j = 0; j < i; j++)
            if (strcmp(weights[i].key, weights[j].key) == 0)
                return orion_fail(ORION_ERR_INVALID_ARGUMENT, "weight key %s is given twice",
                                  weights[i].key);
    }
    if (options && options->numerics > ORION_NUMERICS_STRICT)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "unknown numerics mode %u", options->numerics);
    return ORION_OK;
}

static orion_status copy_io(program *p) {
    p->n_inputs = (uint32_t)mil_io_count(p->mil, 0);
    p->n_outputs = (uint32_t)mil_io_count(p->mil, 1);
    p->inputs = calloc(p->n_inputs ? p->n_inputs : 1, sizeof *p->inputs);
    p->outputs = calloc(p->n_outputs ? p->n_outputs : 1, sizeof *p->outputs);
    if (!p->inputs || !p->outputs) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "out of memory");
    for (uint32_t i = 0; i < p->n_inputs; i++) {
        orion_status st = mil_io_info(p->mil, 0, i, &p->inputs[i]);
        if (st != ORION_OK) return st;
    }
    for (uint32_t i = 0; i < p->n_outputs; i++) {
        orion_status st = mil_io_info(p->mil, 1, i, &p->outputs[i]);
        if (st != ORION_OK) return st;
    }
    for (size_t i = 0; i < mil_blobfile_count(p->mil); i++) {
        mil_blobfile_ref ref;
        if (mil_blobfile_at(p->mil, i, &ref) == ORION_OK) p->weight_bytes += ref.nbytes;
    }
    return ORION_OK;
}

static orion_status write_folder(program *p, const char *mil_text, uint64_t mil_len,
                                 const orion_weight_file *weights, uint64_t n_weights) {
    orion_status st = folder_make_dirs(p->folder);
    if (st == ORION_OK) st = folder_write_file(p->folder, PROGRAM_MARKER, "", 0);
    if (st == ORION_OK) st = folder_write_file(p->folder, "model.mil", mil_text, mil_len);
    for (uint64_t i = 0; st == ORION_OK && i < n_weights; i++)
        st = weight_share_write(p->folder, weights[i].key + strlen("@model_path/"),
                                weights[i].data, weights[i].nbytes);
    return st;
}

/* Links the program folder's files from a store entry (orion_program_open_stored). */
static orion_status link_folder(program *p, const char *stored) {
    char src[4096];
    orion_status st = folder_make_dirs(p->folder);
    if (st == ORION_OK) st = folder_write_file(p->folder, PROGRAM_MARKER, "", 0);
    if (st == ORION_OK && snprintf(src, sizeof src, "%s/model.mil", stored) >= (int)sizeof src)
        st = orion_fail(ORION_ERR_INVALID_ARGUMENT, "store path is too long");
    if (st == ORION_OK) st = store_link_file(src, p->folder, "model.mil");
    for (size_t i = 0; st == ORION_OK && i < p->n_keys; i++) {
        const char *rel = p->keys[i] + strlen("@model_path/");
        if (snprintf(src, sizeof src, "%s/%s", stored, rel) >= (int)sizeof src)
            st = orion_fail(ORION_ERR_INVALID_ARGUMENT, "store path is too long");
        else
            st = store_link_file(src, p->folder, rel);
    }
    return st;
}

static orion_status cache_base(const orion_compile_options *options, char *base, size_t cap) {
    if (options && options->cache_dir && *options->cache_dir) {
        if (snprintf(base, cap, "%s", options->cache_dir) >= (int)cap)
            return orion_fail(ORION_ERR_INVALID_ARGUMENT, "cache directory path is too long");
        return ORION_OK;
    }
    return folder_default_cache(base, cap);
}

/* Keeps a compiled program in the store; a failure there loses only the reuse. */
static void publish(program *p, const char *base, const char *key) {
    const char **rel = calloc(p->n_keys ? p->n_keys : 1, sizeof *rel);
    if (!rel) return;
    for (size_t i = 0; i < p->n_keys; i++) rel[i] = p->keys[i] + strlen("@model_path/");
    (void)store_publish(base, key, p->folder, rel, p->n_keys);
    free(rel);
    orion_clear_error();
}

/* A compile (stored == NULL: the folder written from the arguments, one compile
 * spent, the program published under options->store_key when given) or an open of
 * the store entry at `stored` (its files linked; a compile spent only by a backend
 * that compiles again). */
static orion_status program_make(const char *mil_text, uint64_t mil_len,
                                 const orion_weight_file *weights, uint64_t n_weights,
                                 const orion_compile_options *options, const char *stored,
                                 orion_program *out) {
    orion_status st = check_compile_args(mil_text, mil_len, weights, n_weights, options, out);
    if (st != ORION_OK) return st;
    *out = 0;
    uint32_t numerics = options ? options->numerics : ORION_NUMERICS_FP16;
    const char *store_key = options && !stored ? options->store_key : NULL;
    if (store_key && !store_key_ok(store_key))
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "store_key must be 16 to 128 lower-case "
                          "hex digits");

    program *p = calloc(1, sizeof *p);
    if (!p) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "out of memory");
    pthread_mutex_init(&p->lock, NULL);
    p->obj.destroy = program_destroy;

    char base[4096], cache[4096];
    st = choose_backend(options ? options->backend : NULL, &p->backend);
    if (st == ORION_OK) st = mil_parse(mil_text, (size_t)mil_len, &p->mil);
    if (st == ORION_OK)
        __atomic_add_fetch(&parsed_mil_bytes, mil_program_bytes(p->mil), __ATOMIC_RELAXED);
    if (st == ORION_OK) st = mil_verify(p->mil, weights, (size_t)n_weights);
    if (st == ORION_OK) st = copy_io(p);
    if (st == ORION_OK) {
        p->keys = calloc(n_weights ? n_weights : 1, sizeof *p->keys);
        if (!p->keys) st = orion_fail(ORION_ERR_OUT_OF_MEMORY, "out of memory");
        for (uint64_t i = 0; st == ORION_OK && i < n_weights; i++) {
            p->keys[i] = strdup(weights[i].key);
            if (!p->keys[i]) st = orion_fail(ORION_ERR_OUT_OF_MEMORY, "out of memory");
            else p->n_keys++;
        }
        if (st == ORION_OK) qsort(p->keys, p->n_keys, sizeof *p->keys, compare_keys);
    }
    if (st == ORION_OK) {
        make_identifier(p, mil_text, (size_t)mil_len, numerics);
        st = cache_base(options, base, sizeof base);
        if (st == ORION_OK) st = folder_process_dir(base, cache, sizeof cache);
        size_t n = strlen(cache) + 2 + sizeof p->identifier;
        if (st == ORION_OK && !(p->folder = malloc(n))) st = orion_fail(ORION_ERR_OUT_OF_MEMORY, "out of memory");
        if (st == ORION_OK) snprintf(p->folder, n, "%s/%s", cache, p->identifier);
    }
    int in_live = 0;
    if (st == ORION_OK && (st = live_add(p)) == ORION_OK) in_live = 1;
    if (st == ORION_OK)
        st = stored ? link_folder(p, stored) : write_folder(p, mil_text, mil_len, weights, n_weights);
    if (st == ORION_OK && !(stored && p->backend->reuses_stored)) st = budget_spend();
    if (st == ORION_OK) {
        st = p->backend->compile(p->mil, p->folder, weights, (size_t)n_weights, numerics, &p->impl);
        if (st != ORION_OK) p->impl = NULL;
    }
    if (st == ORION_OK && p->backend->keeps_no_mil) drop_mil(p);   /* copy_io kept what it reads */
    if (st == ORION_OK) st = handle_add(&programs, &p->obj, out);
    if (st != ORION_OK) {
        if (in_live) live_remove(p);
        else {
            free(p->folder);   /* the folder belongs to the live program that holds the id */
            p->folder = NULL;
        }
        program_free(p);
        return st;
    }
    if (store_key) publish(p, base, store_key);
    return ORION_OK;
}

orion_status orion_program_compile(const char *mil_text, uint64_t mil_len,
                                   const orion_weight_file *weights, uint64_t n_weights,
                                   const orion_compile_options *options, orion_program *out) {
    orion_clear_error();
    return program_make(mil_text, mil_len, weights, n_weights, options, NULL, out);
}

/* ---- the program store ------------------------------------------------- */

typedef struct mapped_file {
    void *data;
    uint64_t nbytes;
} mapped_file;

/* Maps entry/<key less "@model_path/"> read-only (only the pages the verifier reads,
 * the blob headers, are touched; a backend that reads weights reads the folder). */
static orion_status map_weight(const char *entry, const char *key, mapped_file *m) {
    char path[4096];
    int fd;
    struct stat info;
    if (snprintf(path, sizeof path, "%s/%s", entry, key + strlen("@model_path/")) >= (int)sizeof path)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "store path is too long");
    orion_status st = open_regular_file(path, O_RDONLY | O_NOFOLLOW, &fd, &info);
    if (st != ORION_OK) return st;
    m->nbytes = (uint64_t)info.st_size;
    m->data = m->nbytes ? mmap(NULL, (size_t)m->nbytes, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (m->data == MAP_FAILED) {
        m->data = NULL;
        return orion_fail(ORION_ERR_IO, "cannot map %s: %s", path, strerror(errno));
    }
    return ORION_OK;
}

static orion_status read_stored_mil(const char *entry, char **text, uint64_t *len) {
    char path[4096];
    struct stat info;
    if (snprintf(path, sizeof path, "%s/model.mil", entry) >= (int)sizeof path)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "store path is too long");
    if (lstat(path, &info) != 0 || !S_ISREG(info.st_mode) || (uint64_t)info.st_size > MAX_MIL_BYTES)
        return orion_fail(ORION_ERR_IO, "%s is missing, not a regular file or too large", path);
    void *buf = NULL;
    uint64_t cap = 0;
    orion_status st = folder_read_file(path, &buf, &cap, len);
    *text = buf;
    return st;
}

orion_status orion_program_is_stored(const char *key, const orion_compile_options *options,
                                     int *found) {
    orion_clear_error();
    if (!found) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "is_stored: found is NULL");
    *found = 0;
    char base[4096], entry[4096];
    orion_status st = cache_base(options, base, sizeof base);
    if (st == ORION_OK) st = folder_check_cache(base);
    if (st == ORION_OK) st = store_find(base, key, entry, sizeof entry, found);
    return st;
}

orion_status orion_program_open_stored(const char *key, const orion_compile_options *options,
                                       orion_program *out, int *found) {
    orion_clear_error();
    if (!out || !found) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "open_stored: NULL argument");
    *out = 0;
    *found = 0;
    char base[4096], cache[4096], entry[4096];
    orion_status st = cache_base(options, base, sizeof base);
    if (st == ORION_OK) st = folder_process_dir(base, cache, sizeof cache);
    if (st == ORION_OK) st = store_find(base, key, entry, sizeof entry, found);
    if (st != ORION_OK || !*found) return st;
    char *text = NULL;
    uint64_t len = 0;
    mil_program *mil = NULL;
    orion_weight_file *files = NULL;
    mapped_file *maps = NULL;
    size_t n = 0;
    st = read_stored_mil(entry, &text, &len);
    if (st == ORION_OK) st = mil_parse(text, (size_t)len, &mil);
    size_t refs = st == ORION_OK ? mil_blobfile_count(mil) : 0;
    if (st == ORION_OK && (!(files = calloc(refs + 1, sizeof *files)) ||
                           !(maps = calloc(refs + 1, sizeof *maps))))
        st = orion_fail(ORION_ERR_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; st == ORION_OK && i < refs; i++) {   /* each distinct file once */
        mil_blobfile_ref ref;
        if ((st = mil_blobfile_at(mil, i, &ref)) != ORION_OK) break;
        size_t j = 0;
        while (j < n && strcmp(files[j].key, ref.path) != 0) j++;
        if (j < n) continue;
        if ((st = folder_check_key(ref.path)) != ORION_OK) break;
        if ((st = map_weight(entry, ref.path, &maps[n])) != ORION_OK) break;
        files[n] = (orion_weight_file){ref.path, maps[n].data, maps[n].nbytes};
        n++;
    }
    if (st == ORION_OK) st = program_make(text, len, files, n, options, entry, out);
    if (st == ORION_ERR_IO) {   /* the entry went (trimmed by another process): a miss */
        orion_clear_error();
        st = ORION_OK;
        *found = 0;
    }
    for (size_t i = 0; i < n; i++)
        if (maps[i].data) munmap(maps[i].data, (size_t)maps[i].nbytes);
    free(maps);
    free(files);
    if (mil) mil_program_free(mil);
    free(text);
    return st;
}

/* ---- life cycle -------------------------------------------------------- */

#define WITH_PROGRAM(h, p, body)                      \
    do {                                              \
        orion_clear_error();                          \
        program *p;                                   \
        orion_status st_ = program_get((h), &p);      \
        if (st_ != ORION_OK) return st_;              \
        pthread_mutex_lock(&p->lock);                 \
        body;                                         \
        pthread_mutex_unlock(&p->lock);               \
        handle_put(&p->obj);                          \
        return st_;                                   \
    } while (0)

static orion_status load_locked(program *p) {
    if (p->loaded) return ORION_OK;
    pthread_mutex_lock(&live_lock);
    uint64_t resident = loaded_programs, bytes = loaded_weight_bytes;
    pthread_mutex_unlock(&live_lock);
    if (resident >= MAX_RESIDENT_PROGRAMS)
        return constraint_fail("ANE-C34", "%llu programs are already loaded in this process",
                               (unsigned long long)resident);
    if (bytes + p->weight_bytes > WEIGHT_WINDOW_BYTES)
        return constraint_fail("ANE-C35", "loading %llu more weight bytes would exceed the 4 GiB "
                               "window (%llu loaded)", (unsigned long long)p->weight_bytes,
                               (unsigned long long)bytes);
    orion_status st = p->backend->load(p->impl);
    if (st != ORION_OK) return st;
    p->loaded = 1;
    pthread_mutex_lock(&live_lock);
    loaded_programs++;
    loaded_weight_bytes += p->weight_bytes;
    pthread_mutex_unlock(&live_lock);
    return ORION_OK;
}

orion_status orion_program_load(orion_program h) { WITH_PROGRAM(h, p, st_ = load_locked(p)); }

orion_status orion_program_unload(orion_program h) { WITH_PROGRAM(h, p, st_ = unload_locked(p)); }

orion_status orion_program_release(orion_program h) {
    orion_clear_error();
    return handle_release(&programs, h);
}

orion_status orion_program_is_loaded(orion_program h, int *out) {
    if (!out) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "is_loaded: out is NULL");
    WITH_PROGRAM(h, p, *out = p->loaded);
}

/* Checks one group of surfaces (inputs or outputs) against the signature. */
static orion_status check_group(const char *what, const orion_io_info *io, uint32_t n,
                                surface_impl *const *s, const char *uniform_id) {
    for (uint32_t i = 0; i < n; i++) {
        uint64_t size = surface_size(s[i]);
        if (size < MIN_SURFACE_BYTES)
            return constraint_fail("ANE-C23", "%s surface %u (%s) has %llu bytes, below the "
                                   "device minimum of %u", what, i, io[i].name,
                                   (unsigned long long)size, MIN_SURFACE_BYTES);
        if (size < io[i].nbytes)
            return constraint_fail("ANE-C25", "%s surface %u (%s) has %llu bytes; its tensor "
                                   "needs %llu", what, i, io[i].name, (unsigned long long)size,
                                   (unsigned long long)io[i].nbytes);
        if (i > 0 && size != surface_size(s[0]))
            return constraint_fail(uniform_id, "%s surface %u (%s) has %llu bytes but surface 0 "
                                   "(%s) has %llu", what, i, io[i].name, (unsigned long long)size,
                                   io[0].name, (unsigned long long)surface_size(s[0]));
    }
    return ORION_OK;
}

static orion_status eval_locked(program *p, const orion_surface *in, uint64_t n_in,
                                const orion_surface *out, uint64_t n_out) {
    if (!p->loaded)
        return orion_fail(ORION_ERR_STATE, "program %s is not loaded (call load after compile or "
                          "after a weight patch)", p->identifier);
    if (n_in != p->n_inputs || n_out != p->n_outputs)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "program takes %u inputs and %u outputs; got "
                          "%llu and %llu", p->n_inputs, p->n_outputs, (unsigned long long)n_in,
                          (unsigned long long)n_out);
    if ((n_in && !in) || (n_out && !out))
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "eval: surface array is NULL");
    for (uint64_t i = 0; i < n_out; i++) {
        for (uint64_t j = 0; j < n_in; j++)
            if (out[i] == in[j])
                return orion_fail(ORION_ERR_INVALID_ARGUMENT, "eval: output %llu is also input "
                                  "%llu; outputs need their own surfaces", (unsigned long long)i,
                                  (unsigned long long)j);
        for (uint64_t j = 0; j < i; j++)
            if (out[i] == out[j])
                return orion_fail(ORION_ERR_INVALID_ARGUMENT, "eval: outputs %llu and %llu are the "
                                  "same surface", (unsigned long long)j, (unsigned long long)i);
    }
    size_t total = (size_t)(n_in + n_out);
    surface_impl **s = calloc(total ? total : 1, sizeof *s);
    if (!s) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "out of memory");
    orion_status st = ORION_OK;
    size_t got = 0;
    for (; got < total && st == ORION_OK; got++) {
        orion_surface h = got < n_in ? in[got] : out[got - n_in];
        st = surface_get(h, &s[got]);
        if (st != ORION_OK)
            orion_fail_context(st, "eval: %s %llu", got < n_in ? "input" : "output",
                               (unsigned long long)(got < n_in ? got : got - n_in));
    }
    if (st != ORION_OK) got--;   /* the failed slot holds nothing */
    if (st == ORION_OK) st = check_group("input", p->inputs, p->n_inputs, s, "ANE-C18");
    if (st == ORION_OK) st = check_group("output", p->outputs, p->n_outputs, s + n_in, "ANE-C17");
    /* No CPU lock here: vane reads and writes with the CPU and locks itself,
     * the ane backend hands the surfaces to the device, which needs none. */
    /* the outputs are written (if only in part when the eval fails): a zero-tail
     * promise on them widens over what they hold, or goes */
    for (uint64_t i = 0; st == ORION_OK && i < n_out; i++)
        surface_wrote(s[n_in + i], 0, 0, 1, p->outputs[i].nbytes);
    if (st == ORION_OK) st = p->backend->eval(p->impl, s, (size_t)n_in, s + n_in, (size_t)n_out);
    for (size_t i = 0; i < got; i++) surface_put(s[i]);
    free(s);
    return st;
}

orion_status orion_program_prefetch(orion_program h) {
    WITH_PROGRAM(h, p, if (p->loaded && p->backend->prefetch) p->backend->prefetch(p->impl));
}

orion_status orion_program_set_live_columns(orion_program h, uint64_t columns, uint64_t first,
                                            uint64_t live) {
    if (columns ? live < 1 || first > columns || live > columns - first
                : first != 0 || live != 0) {
        orion_clear_error();
        return orion_fail(ORION_ERR_INVALID_ARGUMENT,
                          "live columns: %llu from column %llu of %llu (1 <= live, first + live "
                          "<= columns, or 0, 0 and 0)", (unsigned long long)live,
                          (unsigned long long)first, (unsigned long long)columns);
    }
    WITH_PROGRAM(h, p, if (p->backend->set_live_columns)
                           p->backend->set_live_columns(p->impl, columns, first, live));
}

orion_status orion_program_eval(orion_program h, const orion_surface *inputs, uint64_t n_inputs,
                                const orion_surface *outputs, uint64_t n_outputs) {
    WITH_PROGRAM(h, p, st_ = eval_locked(p, inputs, n_inputs, outputs, n_outputs));
}

/* ---- introspection ----------------------------------------------------- */

static orion_status copy_string(const char *s, char *buf, size_t capacity) {
    if (!buf || capacity == 0) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "no output buffer");
    size_t n = strlen(s);
    if (n >= capacity)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "buffer of %zu bytes is too small (%zu needed)",
                          capacity, n + 1);
    memcpy(buf, s, n + 1);
    return ORION_OK;
}

orion_status orion_program_io_count(orion_program h, uint32_t *n_inputs, uint32_t *n_outputs) {
    if (!n_inputs || !n_outputs) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "io_count: NULL");
    WITH_PROGRAM(h, p, { *n_inputs = p->n_inputs; *n_outputs = p->n_outputs; });
}

orion_status orion_program_io(orion_program h, int is_output, uint32_t index, orion_io_info *out) {
    if (!out) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "program_io: out is NULL");
    WITH_PROGRAM(h, p, {
        uint32_t n = is_output ? p->n_outputs : p->n_inputs;
        if (index >= n)
            st_ = orion_fail(ORION_ERR_INVALID_ARGUMENT, "program has %u %s; no index %u", n,
                             is_output ? "outputs" : "inputs", index);
        else
            *out = (is_output ? p->outputs : p->inputs)[index];
    });
}

orion_status orion_program_identifier(orion_program h, char *buf, size_t capacity) {
    WITH_PROGRAM(h, p, st_ = copy_string(p->identifier, buf, capacity));
}

orion_status orion_program_folder(orion_program h, char *buf, size_t capacity) {
    WITH_PROGRAM(h, p, st_ = copy_string(p->folder, buf, capacity));
}

orion_status orion_program_backend(orion_program h, char *buf, size_t capacity) {
    WITH_PROGRAM(h, p, st_ = copy_string(p->backend->name, buf, capacity));
}

orion_status orion_program_update_path(orion_program h, char *buf, size_t capacity) {
    if (!buf || capacity == 0) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "no output buffer");
    WITH_PROGRAM(h, p, {
        if (p->backend->describe_update) p->backend->describe_update(p->impl, buf, capacity);
        else snprintf(buf, capacity, "delta: %s reads the patched weight files at load",
                      p->backend->name);
    });
}

orion_status orion_program_hw_time(orion_program h, int *offered, uint64_t *ns, char *why,
                                   size_t capacity) {
    if (!offered || !ns || !why || capacity == 0)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "hw_time: NULL argument");
    WITH_PROGRAM(h, p, {
        *ns = 0;
        why[0] = '\0';
        *offered = p->backend->hw_time ? p->backend->hw_time(p->impl, ns, why, capacity) : 0;
        if (!p->backend->hw_time)
            snprintf(why, capacity, "the %s backend has no device time to report",
                     p->backend->name);
    });
}

static orion_status weight_path_locked(program *p, const char *key, char *buf, size_t capacity) {
    if (!key) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "weight key is NULL");
    for (size_t i = 0; i < p->n_keys; i++)
        if (strcmp(p->keys[i], key) == 0) {
            int n = snprintf(buf, capacity, "%s/%s", p->folder, key + strlen("@model_path/"));
            if (n < 0 || (size_t)n >= capacity)
                return orion_fail(ORION_ERR_INVALID_ARGUMENT, "buffer too small for the weight path");
            return ORION_OK;
        }
    return orion_fail(ORION_ERR_INVALID_ARGUMENT, "program %s has no weight file \"%s\"",
                      p->identifier, key);
}

orion_status orion_program_weight_path(orion_program h, const char *key, char *buf, size_t capacity) {
    if (!buf || capacity == 0) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "no output buffer");
    WITH_PROGRAM(h, p, st_ = weight_path_locked(p, key, buf, capacity));
}

orion_status orion_program_patch_weights(orion_program h, const char *key,
                                         const orion_blob_patch *patches, uint64_t count) {
    WITH_PROGRAM(h, p, {
        char path[4096];
        if (p->loaded)
            st_ = orion_fail(ORION_ERR_STATE, "program %s is loaded: unload it before patching its "
                             "weights (the device reads them at load)", p->identifier);
        else if ((st_ = weight_path_locked(p, key, path, sizeof path)) == ORION_OK &&
                 (st_ = weight_share_unshare(path)) == ORION_OK)   /* patch its own bytes */
            st_ = orion_blob_patch_entries(path, patches, count);
    });
}
