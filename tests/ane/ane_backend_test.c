/* ane_backend_test.c -- the ane backend through Orion's public C ABI, on the
 * stand-in framework (ORION_ANE_FRAMEWORK): compile, eval, the delta reload,
 * the compile budget, and every documented failure of the private API (class
 * missing, compile refused with an NSError, evaluation failure, ...) as a
 * clear Orion error, leaving nothing alive. Built with the ASan build, it runs
 * with leak checks on (tests/ane/build_standin.sh).
 *
 *   ane_backend_test                      the whole suite
 *   ane_backend_test --unavailable TEXT   the framework is unusable: ane is
 *                                         not listed, compiling on it fails
 *                                         with a message containing TEXT, and
 *                                         vane still works
 * Prints "N passed, M failed"; exits 1 on any failure. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "orion.h"
#include "programs.h"
#include "standin.h"

static int passed, failed;

#define CHECK(cond, ...)                                          \
    do {                                                          \
        if (cond) {                                               \
            passed++;                                             \
        } else {                                                  \
            failed++;                                             \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);  \
            fprintf(stderr, __VA_ARGS__);                         \
            fprintf(stderr, " [last error: %s]\n", orion_last_error()); \
        }                                                         \
    } while (0)

/* ---- the stand-in's control interface, from the library the backend loaded */

static struct {
    size_t (*log)(char *, size_t);
    void (*log_clear)(void);
    void (*fail)(const char *, int, int);
    void (*clear_faults)(void);
    void (*set_compile_limit)(int);
    int (*compiles)(void), (*loads)(void), (*live_objects)(void), (*live_surfaces)(void);
    int (*violations)(char *, size_t);
    const char *(*mode)(void);
} sd;

static int bind_standin(void) {
    const char *path = getenv("ORION_ANE_FRAMEWORK");
    void *h = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
    if (!h) return 0;
#define SYM(field, name) *(void **)&sd.field = dlsym(h, name)
    SYM(log, "ane_standin_log");
    SYM(log_clear, "ane_standin_log_clear");
    SYM(mode, "ane_standin_mode");
    SYM(fail, "ane_standin_fail");
    SYM(clear_faults, "ane_standin_clear_faults");
    SYM(set_compile_limit, "ane_standin_set_compile_limit");
    SYM(compiles, "ane_standin_compiles");
    SYM(loads, "ane_standin_loads");
    SYM(live_objects, "ane_standin_live_objects");
    SYM(live_surfaces, "ane_standin_live_surfaces");
    SYM(violations, "ane_standin_violations");
    dlclose(h);   /* the backend keeps its own reference for the process */
    return sd.log && sd.violations && sd.mode;
}

static char log_text[1 << 16];

static const char *call_log(void) {
    sd.log(log_text, sizeof log_text);
    return log_text;
}

/* The private calls of the log, in order, one a line, nothing else. */
static int log_in_order(const char *const *calls, size_t n) {
    const char *p = call_log();
    for (size_t i = 0; i < n; i++) {
        const char *q = strstr(p, calls[i]);
        if (!q) {
            fprintf(stderr, "call %s not found (in order) in the log:\n%s\n", calls[i], log_text);
            return 0;
        }
        p = q + strlen(calls[i]);
    }
    return 1;
}

/* ---- helpers --------------------------------------------------------------- */

static orion_compile_options ANE = {"ane", NULL, ORION_NUMERICS_FP16, NULL};

static orion_status compile(const char *mil, const uint8_t *blob, const char *key,
                            orion_program *out) {
    orion_weight_file w = {key ? key : T_KEY, blob, T_BLOB_BYTES};
    return orion_program_compile(mil, strlen(mil), blob ? &w : NULL, blob ? 1 : 0, &ANE, out);
}

static orion_surface tensor_surface(float base, float step) {
    orion_surface s = 0;
    void *p = NULL;
    if (orion_surface_create(T_BYTES, &s) != ORION_OK) return 0;
    orion_surface_lock(s, 0);
    orion_surface_base_address(s, &p);
    t_fill(p, base, step);
    orion_surface_unlock(s, 0);
    return s;
}

static float read_at(orion_surface s, int i) {
    void *p = NULL;
    orion_surface_lock(s, ORION_LOCK_READ_ONLY);
    orion_surface_base_address(s, &p);
    float v = t_at(p, i);
    orion_surface_unlock(s, ORION_LOCK_READ_ONLY);
    return v;
}

static int message_has(const char *a, const char *b) {
    const char *m = orion_last_error();
    return strstr(m, a) && (!b || strstr(m, b));
}

/* Files named model.mil anywhere under dir (program folders left behind). */
static int count_models(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (lstat(path, &sb) != 0) continue;
        if (S_ISDIR(sb.st_mode)) n += count_models(path);
        else if (strcmp(e->d_name, "model.mil") == 0) n++;
    }
    closedir(d);
    return n;
}

/* ---- tests ----------------------------------------------------------------- */

static void test_listed(void) {
    char buf[256];
    CHECK(orion_backends(buf, sizeof buf) == ORION_OK && strcmp(buf, "ane,vane") == 0,
          "backends are \"ane,vane\": got \"%s\"", buf);
    CHECK(orion_backend_describe("ane", buf, sizeof buf) == ORION_OK &&
              strncmp(buf, "ane: available", 14) == 0,
          "describe: %s", buf);
}

static void test_eval_and_call_order(void) {
    sd.log_clear();
    orion_program p = 0;
    CHECK(compile(MIL_SUB, NULL, NULL, &p) == ORION_OK, "compile on ane");
    char name[16] = "";
    orion_program_backend(p, name, sizeof name);
    CHECK(strcmp(name, "ane") == 0, "the program is on ane: %s", name);
    CHECK(orion_program_load(p) == ORION_OK, "load");
    orion_surface a = tensor_surface(100, 1), b = tensor_surface(1, 0), z = tensor_surface(0, 0);
    orion_surface in[2] = {a, b}, out[1] = {z};   /* binding order: in_a, in_b */
    CHECK(orion_program_eval(p, in, 2, out, 1) == ORION_OK, "eval");
    CHECK(read_at(z, 5) == 104.0f && read_at(z, 130) == 101.0f,
          "out_z = in_a - in_b: got %g, %g", read_at(z, 5), read_at(z, 130));
    CHECK(orion_program_release(p) == ORION_OK, "release");
    static const char *const order[] = {
        "+[_ANEInMemoryModelDescriptor modelWithMILText:weights:optionsPlist:]",
        "+[_ANEInMemoryModel inMemoryModelWithDescriptor:]",
        "-[_ANEInMemoryModel hexStringIdentifier]",
        "-[_ANEInMemoryModel compileWithQoS:options:error:] qos=21",
        "-[_ANEInMemoryModel loadWithQoS:options:error:] qos=21",
        "+[_ANEIOSurfaceObject objectWithIOSurface:]",
        "+[_ANEIOSurfaceObject objectWithIOSurface:]",
        "+[_ANEIOSurfaceObject objectWithIOSurface:]",
        "+[_ANERequest requestWithInputs:inputIndices:outputs:outputIndices:weightsBuffer:"
        "perfStats:procedureIndex:] inputs=2 outputs=1",
        "-[_ANEInMemoryModel evaluateWithQoS:options:request:error:] qos=21",
        "-[_ANEInMemoryModel unloadWithQoS:error:] qos=21",
        "-[_ANEInMemoryModel dealloc]",
    };
    CHECK(log_in_order(order, sizeof order / sizeof order[0]), "the documented call sequence");
    CHECK(strstr(call_log(), "0 held a CPU lock") != NULL,
          "the device gets the surfaces without a CPU lock (IOSurfaceLock is for CPU access)");
    orion_surface_release(a);
    orion_surface_release(b);
    orion_surface_release(z);
}

/* Unload, patch every weight to `base`, load: the status of the load. */
static orion_status delta(orion_program p, uint8_t *blob, float base) {
    t_blob(blob, base);
    orion_blob_patch patch = {64, ORION_BLOB_FLOAT16, blob + 128, T_BYTES};
    orion_status st = orion_program_unload(p);
    if (st == ORION_OK) st = orion_program_patch_weights(p, T_KEY, &patch, 1);
    if (st == ORION_OK) st = orion_program_load(p);
    return st;
}

static int permissive(void) { return strcmp(sd.mode(), "permissive") == 0; }
static int compile_on_miss(void) { return strcmp(sd.mode(), "compile-on-miss") == 0; }

static orion_update_stats stats_now(void) {
    orion_update_stats u;
    orion_update_stats_read(&u);
    return u;
}

static char path_text[1024];

static const char *update_path(orion_program p) {
    orion_program_update_path(p, path_text, sizeof path_text);
    return path_text;
}

/* The backend's order (docs/ane-backend.md): (a) a delta reload proven by a
 * canary, (b) an honest recompile, counted, (c) a refusal naming `inputs`.
 * In every stand-in mode a delta update takes effect or fails: never stale, and
 * never an uncounted compile (compile-on-miss compiles at load: its compiles are
 * slow here, as on the device, so the load's time gives them away). */
static void test_delta_reload(void) {
    if (compile_on_miss()) setenv("ANE_STANDIN_COMPILE_MS", "60", 1);
    uint8_t *blob = malloc(T_BLOB_BYTES);
    t_blob(blob, 10);
    orion_program p = 0;
    CHECK(compile(MIL_ADD_W, blob, NULL, &p) == ORION_OK, "compile a weighted program");
    CHECK(strncmp(update_path(p), "unproven", 8) == 0, "before any update: %s", path_text);
    orion_surface a = tensor_surface(0, 0), z = tensor_surface(0, 0);
    CHECK(orion_program_load(p) == ORION_OK && orion_program_eval(p, &a, 1, &z, 1) == ORION_OK &&
              read_at(z, 3) == 13.0f,
          "the baked weights: %g", read_at(z, 3));
    uint32_t spent = orion_compile_count();
    int device_compiles = sd.compiles();
    orion_update_stats before = stats_now();
    orion_blob_patch patch = {64, ORION_BLOB_FLOAT16, blob + 128, T_BYTES};
    CHECK(orion_program_patch_weights(p, T_KEY, &patch, 1) == ORION_ERR_STATE,
          "a loaded program cannot be patched");
    CHECK(delta(p, blob, 500) == ORION_OK, "unload, patch, load (%s)", sd.mode());
    CHECK(orion_program_eval(p, &a, 1, &z, 1) == ORION_OK && read_at(z, 3) == 503.0f,
          "the reload evaluates the patched weights (%s): %g", sd.mode(), read_at(z, 3));
    /* (a) proven: nothing; (b) counted; compile-on-miss: the canary's load compiled
     * (counted as hidden), then (b) */
    uint32_t first = permissive() ? 0 : compile_on_miss() ? 2 : 1, later = permissive() ? 0 : 1;
    CHECK(orion_compile_count() == spent + first && sd.compiles() == device_compiles + (int)first,
          "%s: the update cost %u compiles on the counter and %d on the device (want %u)",
          sd.mode(), orion_compile_count() - spent, sd.compiles() - device_compiles, first);
    orion_update_stats after = stats_now();
    CHECK(after.canary_probes == before.canary_probes + 1 &&
              after.hidden_compiles == before.hidden_compiles + (compile_on_miss() ? 1u : 0u) &&
              after.probes_failed == before.probes_failed + (permissive() ? 0u : 1u) &&
              after.demotions == before.demotions + (permissive() ? 0u : 1u),
          "%s: probes %u, failed %u, hidden compiles %u, demotions %u", sd.mode(),
          after.canary_probes - before.canary_probes, after.probes_failed - before.probes_failed,
          after.hidden_compiles - before.hidden_compiles, after.demotions - before.demotions);
    const char *why = permissive() ? "delta: proven by a canary probe"
                      : compile_on_miss() ? "loads compile"
                      : strcmp(sd.mode(), "observed") == 0 ? "the delta had no effect"
                                                           : "hash mismatch";
    CHECK(strstr(update_path(p), why) && (permissive() || strncmp(path_text, "recompile: ", 11) == 0),
          "%s: the update path says \"%s\": %s", sd.mode(), why, path_text);
    CHECK(delta(p, blob, 900) == ORION_OK && orion_program_eval(p, &a, 1, &z, 1) == ORION_OK &&
              read_at(z, 3) == 903.0f,
          "a second update takes effect too: %g", read_at(z, 3));
    CHECK(orion_compile_count() == spent + first + later &&
              sd.compiles() == device_compiles + (int)(first + later),
          "%s: the second update: %u compiles on the counter, %d on the device", sd.mode(),
          orion_compile_count() - spent, sd.compiles() - device_compiles);
    CHECK(strstr(call_log(), "fault") == NULL, "no fault was injected");

    /* (c): no compile left, and a delta that is not proven: a refusal. */
    uint32_t old_budget = orion_compile_budget();
    orion_set_compile_budget(orion_compile_count());
    orion_status st = delta(p, blob, 40);
    if (permissive()) {
        CHECK(st == ORION_OK, "permissive: a proven delta needs no compile");
    } else {
        CHECK(st == ORION_ERR_BUDGET && message_has("update='inputs'", "ANE-C31"),
              "%s: with the budget spent the update is refused, naming inputs", sd.mode());
        CHECK(orion_program_eval(p, &a, 1, &z, 1) == ORION_ERR_STATE,
              "and the stale program cannot be evaluated");
    }
    orion_set_compile_budget(old_budget);
    setenv("ORION_ANE_DELTA", "refuse", 1);
    CHECK(delta(p, blob, 60) == ORION_ERR_STATE && message_has("update='inputs'", NULL),
          "ORION_ANE_DELTA=refuse refuses, naming inputs");
    setenv("ORION_ANE_DELTA", "recompile", 1);
    spent = orion_compile_count();
    CHECK(delta(p, blob, 70) == ORION_OK && orion_compile_count() == spent + 1 &&
              orion_program_eval(p, &a, 1, &z, 1) == ORION_OK && read_at(z, 3) == 73.0f,
          "ORION_ANE_DELTA=recompile recompiles, counted: %g", read_at(z, 3));
    setenv("ORION_ANE_DELTA", "bogus", 1);
    CHECK(delta(p, blob, 80) == ORION_ERR_INVALID_ARGUMENT && message_has("ORION_ANE_DELTA=bogus", NULL),
          "an unknown ORION_ANE_DELTA is an error");
    unsetenv("ORION_ANE_DELTA");
    orion_program_release(p);
    orion_surface_release(a);
    orion_surface_release(z);
    free(blob);
    unsetenv("ANE_STANDIN_COMPILE_MS");
}

/* ---- the device temp folder ------------------------------------------------- */

static char test_tmp[256];

/* Walks the device temp folders under the test's TMP (the runtime's cache,
 * orion-<uid>, and the stand-in's own aned folder aside): counts the folders, and
 * the weight and `data` files that hold none of `allowed`. */
static void scan_temp(const char *dir, int depth, const uint8_t *const *allowed, int n_allowed,
                      int *folders, int *foreign) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *name = e->d_name;
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0) continue;
        if (depth == 0 && (strncmp(name, "orion-", 6) == 0 || strcmp(name, "standin-aned") == 0))
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, name);
        struct stat sb;
        if (lstat(path, &sb) != 0) continue;
        if (S_ISDIR(sb.st_mode)) {
            if (depth == 0) (*folders)++;
            scan_temp(path, depth + 1, allowed, n_allowed, folders, foreign);
        } else if (allowed && (strcmp(name, "w.bin") == 0 || strcmp(name, "data") == 0) &&
                   sb.st_size == T_BLOB_BYTES) {
            uint8_t *buf = malloc(T_BLOB_BYTES);
            FILE *f = fopen(path, "rb");
            int same = 0;
            if (f && fread(buf, 1, T_BLOB_BYTES, f) == T_BLOB_BYTES)
                for (int i = 0; i < n_allowed && !same; i++)
                    same = memcmp(buf, allowed[i], T_BLOB_BYTES) == 0;
            if (f) fclose(f);
            free(buf);
            if (!same) {
                (*foreign)++;
                fprintf(stderr, "  %s holds weights that are neither the old nor the new ones\n",
                        path);
            }
        }
    }
    closedir(d);
}

static int device_folders(void) {
    int folders = 0, foreign = 0;
    scan_temp(test_tmp, 0, NULL, 0, &folders, &foreign);
    return folders;
}

/* No weight or `data` file of a device temp folder holds anything but `a` or `b`. */
static int no_canary_left(const uint8_t *a, const uint8_t *b) {
    const uint8_t *allowed[2] = {a, b};
    int folders = 0, foreign = 0;
    scan_temp(test_tmp, 0, allowed, 2, &folders, &foreign);
    return foreign == 0;
}

/* Once compiled, the device keeps the program: its temp folder (the compiler's
 * inputs and the framework's staging copy, twice the weights) is left, and loads
 * and reloads work without it, in every mode. ORION_ANE_KEEP_TEMP=1 keeps it. */
static void test_temp_folder_left_after_compile(void) {
    uint8_t *blob = malloc(T_BLOB_BYTES);
    t_blob(blob, 10);
    orion_program p = 0;
    orion_surface a = tensor_surface(0, 0), z = tensor_surface(0, 0);
    CHECK(compile(MIL_ADD_W, blob, NULL, &p) == ORION_OK && device_folders() == 0,
          "%s: no device temp folder once compiled (%d)", sd.mode(), device_folders());
    CHECK(orion_program_load(p) == ORION_OK && orion_program_unload(p) == ORION_OK &&
              orion_program_load(p) == ORION_OK && orion_program_eval(p, &a, 1, &z, 1) == ORION_OK &&
              read_at(z, 3) == 13.0f,
          "%s: loads and reloads without it: %g", sd.mode(), read_at(z, 3));
    orion_program_release(p);
    setenv("ORION_ANE_KEEP_TEMP", "1", 1);
    CHECK(compile(MIL_ADD_W, blob, NULL, &p) == ORION_OK && device_folders() == 1,
          "ORION_ANE_KEEP_TEMP=1 keeps it (%d)", device_folders());
    orion_program_release(p);
    CHECK(device_folders() == 0, "and the release removes it (%d)", device_folders());
    unsetenv("ORION_ANE_KEEP_TEMP");
    orion_surface_release(a);
    orion_surface_release(z);
    free(blob);
}

/* Every way out of the canary, refusals and failures included, leaves the real
 * weights where the canary's were: a later load that compiles what the folder
 * holds can never build the canary. */
static void test_no_canary_left_behind(void) {
    if (compile_on_miss()) setenv("ANE_STANDIN_COMPILE_MS", "60", 1);
    uint8_t *old = malloc(T_BLOB_BYTES), *fresh = malloc(T_BLOB_BYTES), *blob = malloc(T_BLOB_BYTES);
    uint32_t budget = orion_compile_budget();
    struct {
        const char *path;
        const char *fault;   /* injected into the canary's probe, or NULL */
        int count, no_budget;
    } cases[] = {
        {"a refusal for budget after the probe", NULL, 0, 1},
        {"an evaluation failure in the probe", "evaluateWithQoS:options:request:error:", 1, 0},
        {"a failed reload, then a refusal for budget", "loadWithQoS:options:error:", 2, 1},
    };
    /* weights of their own in each case: aned's cache outlives programs */
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
        orion_program p = 0;
        t_blob(old, 20.0f + (float)i);
        t_blob(fresh, 520.0f + (float)i);
        memcpy(blob, old, T_BLOB_BYTES);
        CHECK(compile(MIL_ADD_W, blob, NULL, &p) == ORION_OK && orion_program_load(p) == ORION_OK,
              "compile and load");
        if (cases[i].no_budget) orion_set_compile_budget(orion_compile_count());
        if (cases[i].fault) sd.fail(cases[i].fault, cases[i].count, 0);
        orion_status st = delta(p, blob, 520.0f + (float)i);
        sd.clear_faults();
        orion_set_compile_budget(budget);
        CHECK(no_canary_left(old, fresh), "%s (%s, status %s): no canary weights remain",
              cases[i].path, sd.mode(), orion_status_name(st));
        CHECK(!cases[i].no_budget || permissive() || st == ORION_ERR_BUDGET,
              "%s (%s): refused for budget: %s", cases[i].path, sd.mode(), orion_status_name(st));
        CHECK(st != ORION_OK || device_folders() <= 1, "%s: one folder at most", cases[i].path);
        orion_program_release(p);
    }
    CHECK(device_folders() == 0, "every temp folder went with its program (%d)", device_folders());
    /* a proven delta probed again at every update (ORION_ANE_REPROBE=1) */
    setenv("ORION_ANE_REPROBE", "1", 1);
    orion_program p = 0;
    t_blob(blob, 30);
    t_blob(fresh, 530);
    uint8_t *last = malloc(T_BLOB_BYTES);
    t_blob(last, 630);
    orion_update_stats before = stats_now();
    CHECK(compile(MIL_ADD_W, blob, NULL, &p) == ORION_OK && orion_program_load(p) == ORION_OK &&
              delta(p, blob, 530) == ORION_OK && delta(p, blob, 630) == ORION_OK,
          "%s: two updates, each probed", sd.mode());
    orion_update_stats after = stats_now();
    CHECK(no_canary_left(fresh, last), "%s: no canary weights remain after the spot probe",
          sd.mode());
    CHECK(!permissive() || (after.canary_probes == before.canary_probes + 1 &&
                            after.spot_probes == before.spot_probes + 1),
          "permissive: one canary probe, one spot probe (%u, %u)",
          after.canary_probes - before.canary_probes, after.spot_probes - before.spot_probes);
    CHECK(!permissive() || strstr(update_path(p), "2 probe(s)"), "the probes are counted: %s",
          update_path(p));
    orion_program_release(p);
    unsetenv("ORION_ANE_REPROBE");
    unsetenv("ANE_STANDIN_COMPILE_MS");
    free(old);
    free(fresh);
    free(blob);
    free(last);
}

/* A raw variant's reload that compiles (compile-on-miss: an edited folder is a
 * cache miss) is counted against the budget, not hidden. (Weights no other test
 * uses: aned's cache outlives programs, and a hit compiles nothing.) */
static void test_hidden_compile_is_counted(void) {
    if (!compile_on_miss()) return;
    setenv("ANE_STANDIN_COMPILE_MS", "60", 1);
    setenv("ORION_ANE_DELTA", "files", 1);
    uint8_t *blob = malloc(T_BLOB_BYTES);
    t_blob(blob, 11);
    orion_program p = 0;
    orion_surface a = tensor_surface(0, 0), z = tensor_surface(0, 0);
    CHECK(compile(MIL_ADD_W, blob, NULL, &p) == ORION_OK && orion_program_load(p) == ORION_OK,
          "compile and load");
    uint32_t spent = orion_compile_count();
    orion_update_stats before = stats_now();
    CHECK(delta(p, blob, 700) == ORION_OK && orion_program_eval(p, &a, 1, &z, 1) == ORION_OK &&
              read_at(z, 3) == 703.0f,
          "the edited folder compiled at load: %g", read_at(z, 3));
    CHECK(orion_compile_count() == spent + 1 && stats_now().hidden_compiles ==
              before.hidden_compiles + 1 && strstr(update_path(p), "took a compile's time"),
          "that compile is counted (%u) and recorded: %s", orion_compile_count() - spent,
          update_path(p));
    orion_program_release(p);
    unsetenv("ORION_ANE_DELTA");
    unsetenv("ANE_STANDIN_COMPILE_MS");
    orion_surface_release(a);
    orion_surface_release(z);
    free(blob);
}

/* One weight file per program: macOS 27 fails a program with several (the old
 * inference layout) at the bundle check, naming the count; one file passes. */
static void test_weight_files_per_program(void) {
    int macos27 = strcmp(sd.mode(), "macos27") == 0;
    uint8_t *w = malloc(T_BLOB_BYTES), *v = malloc(T_BLOB_BYTES), *wv = malloc(T_BLOB2_BYTES);
    t_blob(w, 10);
    t_blob(v, 1000);
    t_blob2(wv, 10, 1000);
    orion_weight_file two[2] = {{T_KEY, w, T_BLOB_BYTES}, {T_KEY_V, v, T_BLOB_BYTES}};
    orion_program p = 0;
    orion_status st = orion_program_compile(MIL_ADD_TWO_FILES, strlen(MIL_ADD_TWO_FILES), two, 2,
                                            &ANE, &p);
    if (macos27)
        CHECK(st == ORION_ERR_INTERNAL && message_has("verifyBundleAtPath: hash mismatch",
                                                      "2 weight files; macOS 27 verifies one"),
              "macos27: two weight files are refused, naming why: %s", orion_last_error());
    else
        CHECK(st == ORION_OK, "%s: two weight files compile", sd.mode());
    if (p) orion_program_release(p);
    orion_weight_file one = {T_KEY_WV, wv, T_BLOB2_BYTES};
    orion_surface a = tensor_surface(0, 0), z = tensor_surface(0, 0);
    CHECK(orion_program_compile(MIL_ADD_ONE_FILE, strlen(MIL_ADD_ONE_FILE), &one, 1, &ANE, &p) ==
                  ORION_OK &&
              orion_program_load(p) == ORION_OK && orion_program_eval(p, &a, 1, &z, 1) == ORION_OK &&
              read_at(z, 3) == 1016.0f,
          "%s: both tensors in one file: %g", sd.mode(), read_at(z, 3));
    orion_program_release(p);
    orion_surface_release(a);
    orion_surface_release(z);
    free(w);
    free(v);
    free(wv);
}

/* A program that never changes weights loads what it compiled, in every mode. */
static void test_reload_unchanged(void) {
    uint8_t *blob = malloc(T_BLOB_BYTES);
    t_blob(blob, 10);
    orion_program p = 0;
    orion_surface a = tensor_surface(0, 0), z = tensor_surface(0, 0);
    uint32_t spent = orion_compile_count();
    CHECK(compile(MIL_ADD_W, blob, NULL, &p) == ORION_OK && orion_program_load(p) == ORION_OK &&
              orion_program_unload(p) == ORION_OK && orion_program_load(p) == ORION_OK &&
              orion_program_eval(p, &a, 1, &z, 1) == ORION_OK && read_at(z, 3) == 13.0f &&
              orion_compile_count() == spent + 1,
          "unload and load without a patch: no compile, same output");
    orion_program_release(p);
    orion_surface_release(a);
    orion_surface_release(z);
    free(blob);
}

static void test_budget(void) {
    uint32_t old = orion_compile_budget();
    orion_set_compile_budget(orion_compile_count() + 1);
    orion_program p = 0, q = 0;
    CHECK(compile(MIL_SUB, NULL, NULL, &p) == ORION_OK, "the last compile of the budget");
    orion_program_release(p);
    int device = sd.compiles();
    CHECK(compile(MIL_SUB, NULL, NULL, &q) == ORION_ERR_BUDGET && message_has("ANE-C31", NULL) &&
              sd.compiles() == device,
          "the runtime refuses the next compile before the device sees it");
    orion_set_compile_budget(old);
}

static void test_device_compile_limit(void) {
    uint64_t live = orion_program_live_count();
    sd.set_compile_limit(sd.compiles());
    orion_program p = 0;
    CHECK(compile(MIL_SUB, NULL, NULL, &p) == ORION_ERR_INTERNAL &&
              message_has("-[_ANEInMemoryModel compileWithQoS:options:error:] failed",
                          "ANECCompile() FAILED") &&
              message_has("NSError domain com.apple.appleneuralengine, code 3", NULL),
          "a compile the device refuses names the selector and the NSError");
    CHECK(p == 0 && orion_program_live_count() == live, "nothing is left of it");
    sd.set_compile_limit(100000);
}

typedef enum { AT_COMPILE, AT_LOAD, AT_EVAL } phase;

typedef struct fault_case {
    const char *selector;
    int count, mode;
    phase at;
    orion_status want;
    const char *text1, *text2;
} fault_case;

static const fault_case FAULTS[] = {
    {"modelWithMILText:weights:optionsPlist:", 1, 0, AT_COMPILE, ORION_ERR_INTERNAL,
     "+[_ANEInMemoryModelDescriptor modelWithMILText:weights:optionsPlist:] returned nil", NULL},
    {"modelWithMILText:weights:optionsPlist:", 1, 1, AT_COMPILE, ORION_ERR_INTERNAL,
     "+[_ANEInMemoryModelDescriptor modelWithMILText:weights:optionsPlist:] raised "
     "NSInternalInconsistencyException", "injected exception"},
    {"inMemoryModelWithDescriptor:", 1, 0, AT_COMPILE, ORION_ERR_INTERNAL,
     "+[_ANEInMemoryModel inMemoryModelWithDescriptor:] returned nil", NULL},
    {"hexStringIdentifier", 1, 1, AT_COMPILE, ORION_ERR_INTERNAL,
     "-[_ANEInMemoryModel hexStringIdentifier] raised", NULL},
    {"compileWithQoS:options:error:", 1, 0, AT_COMPILE, ORION_ERR_INTERNAL,
     "-[_ANEInMemoryModel compileWithQoS:options:error:] failed: _ANECompiler : ANECCompile() "
     "FAILED (injected)", "code 3"},
    {"compileWithQoS:options:error:", 1, 1, AT_COMPILE, ORION_ERR_INTERNAL,
     "-[_ANEInMemoryModel compileWithQoS:options:error:] raised NSInternalInconsistencyException",
     NULL},
    {"loadWithQoS:options:error:", 2, 0, AT_LOAD, ORION_ERR_INTERNAL,
     "-[_ANEInMemoryModel loadWithQoS:options:error:] failed: Program load failure (0x50004)",
     "code 327684"},
    {"loadWithQoS:options:error:", 1, 0, AT_LOAD, ORION_OK, NULL, NULL},   /* the retry */
    {"loadWithQoS:options:error:", 1, 1, AT_LOAD, ORION_ERR_INTERNAL,
     "-[_ANEInMemoryModel loadWithQoS:options:error:] raised", NULL},
    {"evaluateWithQoS:options:request:error:", 1, 0, AT_EVAL, ORION_ERR_EVAL,
     "-[_ANEInMemoryModel evaluateWithQoS:options:request:error:] failed: "
     "ANEProgramProcessRequestDirect() Failed with status=0x1d : Program Inference error",
     "code 29"},
    {"evaluateWithQoS:options:request:error:", 1, 1, AT_EVAL, ORION_ERR_EVAL,
     "-[_ANEInMemoryModel evaluateWithQoS:options:request:error:] raised", NULL},
    {"requestWithInputs:inputIndices:outputs:outputIndices:weightsBuffer:perfStats:procedureIndex:",
     1, 0, AT_EVAL, ORION_ERR_INTERNAL,
     "+[_ANERequest requestWithInputs:inputIndices:outputs:outputIndices:weightsBuffer:perfStats:"
     "procedureIndex:] returned nil", NULL},
    {"objectWithIOSurface:", 1, 0, AT_EVAL, ORION_ERR_INTERNAL,
     "+[_ANEIOSurfaceObject objectWithIOSurface:] returned nil", NULL},
    {"objectWithIOSurface:", 1, 1, AT_EVAL, ORION_ERR_INTERNAL,
     "+[_ANEIOSurfaceObject objectWithIOSurface:] raised", NULL},
};

static void test_faults(void) {
    uint8_t *blob = malloc(T_BLOB_BYTES);
    t_blob(blob, 10);
    for (size_t i = 0; i < sizeof FAULTS / sizeof FAULTS[0]; i++) {
        const fault_case *fc = &FAULTS[i];
        orion_program p = 0;
        orion_surface a = tensor_surface(0, 0), z = tensor_surface(0, 0);
        orion_status st = ORION_OK;
        if (fc->at == AT_COMPILE) sd.fail(fc->selector, fc->count, fc->mode);
        st = compile(MIL_ADD_W, blob, NULL, &p);
        if (st == ORION_OK && fc->at == AT_LOAD) sd.fail(fc->selector, fc->count, fc->mode);
        if (st == ORION_OK) st = orion_program_load(p);
        if (st == ORION_OK && fc->at == AT_EVAL) sd.fail(fc->selector, fc->count, fc->mode);
        if (st == ORION_OK) st = orion_program_eval(p, &a, 1, &z, 1);
        CHECK(st == fc->want && (!fc->text1 || message_has(fc->text1, fc->text2)),
              "fault %s x%d (%s): status %s, message \"%s\"", fc->selector, fc->count,
              fc->mode ? "raise" : "fail", orion_status_name(st), orion_last_error());
        int loaded = -1;
        if (p) orion_program_is_loaded(p, &loaded);
        CHECK(st == ORION_OK || fc->at != AT_LOAD || loaded == 0,
              "a failed load leaves the program unloaded");
        if (p) orion_program_release(p);
        sd.clear_faults();
        orion_surface_release(a);
        orion_surface_release(z);
    }
    free(blob);
}

static void test_iosurface_create_failure(void) {
    sd.fail("IOSurfaceCreate", 1, 0);
    orion_surface s = 0;
    CHECK(orion_surface_create(T_BYTES, &s) == ORION_ERR_OUT_OF_MEMORY &&
              message_has("IOSurfaceCreate", "returned NULL") && s == 0,
          "IOSurfaceCreate returning NULL is an Orion error");
    sd.clear_faults();
}

static void test_unload_failure(void) {
    orion_program p = 0;
    orion_surface a = tensor_surface(100, 1), b = tensor_surface(1, 0), z = tensor_surface(0, 0);
    orion_surface in[2] = {a, b};
    CHECK(compile(MIL_SUB, NULL, NULL, &p) == ORION_OK && orion_program_load(p) == ORION_OK,
          "compile and load");
    sd.fail("unloadWithQoS:error:", 1, 0);
    CHECK(orion_program_unload(p) == ORION_ERR_INTERNAL && message_has("unloadWithQoS:error:", NULL),
          "a refused unload is reported with the selector");
    int loaded = 1;
    orion_program_is_loaded(p, &loaded);
    CHECK(loaded == 0 && orion_program_load(p) == ORION_OK &&
              orion_program_eval(p, in, 2, &z, 1) == ORION_OK && read_at(z, 5) == 104.0f,
          "after a refused unload the program is reloaded and runs");
    orion_program_release(p);
    orion_surface_release(a);
    orion_surface_release(b);
    orion_surface_release(z);
}

static void test_distinct_keys_share_nothing(void) {
    uint8_t *b1 = malloc(T_BLOB_BYTES), *b2 = malloc(T_BLOB_BYTES);
    t_blob(b1, 10);
    t_blob(b2, 20);
    orion_program p = 0, q = 0;
    CHECK(compile(MIL_ADD_W, b1, NULL, &p) == ORION_OK, "first program");
    CHECK(compile(MIL_ADD_W, b2, NULL, &q) == ORION_ERR_STATE, "same MIL and keys: refused");
    orion_program_release(p);
    free(b1);
    free(b2);
}

typedef struct thread_arg {
    orion_program p;
    orion_surface in[2], out;
    orion_status st;
} thread_arg;

static void *eval_thread(void *v) {
    thread_arg *t = v;
    for (int i = 0; i < 20 && t->st == ORION_OK; i++) t->st = orion_program_eval(t->p, t->in, 2, &t->out, 1);
    return NULL;
}

static void test_threads(void) {
    thread_arg t = {0};
    CHECK(compile(MIL_SUB, NULL, NULL, &t.p) == ORION_OK && orion_program_load(t.p) == ORION_OK,
          "compile and load");
    t.in[0] = tensor_surface(100, 1);
    t.in[1] = tensor_surface(1, 0);
    t.out = tensor_surface(0, 0);
    pthread_t th[2];
    thread_arg ts[2] = {t, t};
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, eval_thread, &ts[i]);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    CHECK(ts[0].st == ORION_OK && ts[1].st == ORION_OK && read_at(t.out, 5) == 104.0f,
          "evaluations from threads the runtime did not create");
    orion_program_release(t.p);
    orion_surface_release(t.in[0]);
    orion_surface_release(t.in[1]);
    orion_surface_release(t.out);
}

static int run_unavailable(const char *expect) {
    char buf[1024];
    CHECK(orion_backends(buf, sizeof buf) == ORION_OK && strcmp(buf, "vane") == 0,
          "only vane is listed: \"%s\"", buf);
    CHECK(orion_backend_describe("ane", buf, sizeof buf) == ORION_OK &&
              strstr(buf, "unavailable") && strstr(buf, expect),
          "describe says why: %s", buf);
    orion_program p = 0;
    CHECK(compile(MIL_SUB, NULL, NULL, &p) == ORION_ERR_BACKEND_UNAVAILABLE &&
              message_has("backend \"ane\" is unavailable", expect),
          "compiling on ane fails clearly");
    orion_compile_options vane = {"auto", NULL, ORION_NUMERICS_FP16, NULL};
    orion_surface a = tensor_surface(100, 1), b = tensor_surface(1, 0), z = tensor_surface(0, 0);
    orion_surface in[2] = {a, b};
    CHECK(orion_program_compile(MIL_SUB, strlen(MIL_SUB), NULL, 0, &vane, &p) == ORION_OK &&
              orion_program_load(p) == ORION_OK && orion_program_eval(p, in, 2, &z, 1) == ORION_OK &&
              read_at(z, 5) == 104.0f,
          "auto falls back to vane, which works");
    char name[16] = "";
    orion_program_backend(p, name, sizeof name);
    CHECK(strcmp(name, "vane") == 0, "auto chose %s", name);
    orion_program_release(p);
    orion_surface_release(a);
    orion_surface_release(b);
    orion_surface_release(z);
    printf("ane_backend_test --unavailable: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

int main(int argc, char **argv) {
    /* Everything this test writes goes under one fresh folder, checked at the end.
     * GNUstep's NSTemporaryDirectory() reads TMP (not TMPDIR) from the environment
     * the process started with: so the test runs again, with both set. */
    if (!getenv("ORION_ANE_TEST_TMP")) {
        char tmp[] = "/tmp/orion-ane-test-XXXXXX";
        if (!mkdtemp(tmp)) return 2;
        setenv("ORION_ANE_TEST_TMP", tmp, 1);
        setenv("TMPDIR", tmp, 1);
        setenv("TMP", tmp, 1);
        execv("/proc/self/exe", argv);
        return 2;
    }
    char tmp[256];
    snprintf(tmp, sizeof tmp, "%s", getenv("ORION_ANE_TEST_TMP"));
    snprintf(test_tmp, sizeof test_tmp, "%s", tmp);
    unsetenv("ORION_CACHE_DIR");
    unsetenv("ORION_BACKEND");
    unsetenv("ORION_ANE_DELTA");
    if (argc == 3 && strcmp(argv[1], "--unavailable") == 0) {
        int rc = run_unavailable(argv[2]);
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
        return rc;
    }
    char buf[256];
    orion_backends(buf, sizeof buf);   /* loads the framework */
    if (!bind_standin()) {
        fprintf(stderr, "ORION_ANE_FRAMEWORK does not name the loaded stand-in\n");
        return 2;
    }
    orion_set_compile_budget(100000);
    sd.set_compile_limit(100000);
    test_listed();
    test_eval_and_call_order();
    test_delta_reload();
    test_temp_folder_left_after_compile();
    test_weight_files_per_program();
    test_no_canary_left_behind();
    test_hidden_compile_is_counted();
    test_reload_unchanged();
    test_budget();
    test_device_compile_limit();
    test_faults();
    test_iosurface_create_failure();
    test_unload_failure();
    test_distinct_keys_share_nothing();
    test_threads();
    CHECK(orion_program_live_count() == 0 && orion_surface_live_count() == 0,
          "no program or surface is alive");
    CHECK(sd.live_objects() == 0 && sd.live_surfaces() == 0,
          "every private object and IOSurface was released (%d objects, %d surfaces)",
          sd.live_objects(), sd.live_surfaces());
    char v[4096] = "";
    CHECK(sd.violations(v, sizeof v) == 0, "no misuse of the private API: %s", v);
    CHECK(count_models(tmp) == 0, "no program folder or device temp folder is left in %s", tmp);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    printf("ane_backend_test: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
