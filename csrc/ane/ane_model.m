/* ane_model.m -- one device program: the descriptor, the _ANEInMemoryModel,
 * its temp folder NSTemporaryDirectory()/<hexStringIdentifier>, compile,
 * load, unload (docs/ane-facts.md §1.2, steps 1-5).
 *
 * The identifier hashes the MIL text, the weight bytes and the options (as
 * public reverse engineering of the framework shows) and is fixed when the
 * model is made: new weights through a new descriptor are a new program, which
 * the device compiles (explicitly here, or hidden inside the load). Compiles and
 * loads are timed, so that a load that compiled unseen can be told by its time.
 * The temp folder holds the compiler's inputs and the framework's staging copy
 * of the weights (twice the weights on disk); once compiled, the device keeps the
 * program (pmetal: it evaluates, unloads and reloads without the folder), so the
 * folder is left unless the caller keeps it for the delta path. Every private
 * call runs inside @try, and any failure (nil, NO, NSError, an exception)
 * becomes an Orion error naming the selector and the NSError. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../core/error.h"
#include "../core/folder.h"
#include "../core/regular_file.h"
#include "ane_internal.h"

#define MODEL_PATH_PREFIX "@model_path/"
#define LOAD_RETRY_NS 100000000L   /* §1.2 step 5: one retry after 100 ms */
/* A compile this much slower than a plain load can be told from one by its time
 * (device compiles take 11-80 ms and more, loads about 2 ms: docs/ane-facts.md §7). */
#define DISTINCT_COMPILE_NS 10000000ull

/* ---- files ------------------------------------------------------------------- */

char *ane_join(const char *dir, const char *rel) {
    size_t n = strlen(dir) + strlen(rel) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, rel);
    return p;
}

orion_status ane_read_file(const char *path, uint8_t **out, uint64_t *size) {
    void *buf = NULL;
    uint64_t capacity = 0;
    orion_status st = folder_read_file(path, &buf, &capacity, size);
    if (st != ORION_OK) return orion_fail_context(st, "ane");
    *out = buf;
    return ORION_OK;
}

/* Same inode, same size: a client that may have the file mapped sees it. */
orion_status ane_write_in_place(const char *path, const uint8_t *data, uint64_t n) {
    int fd;
    struct stat sb;
    orion_status opened = open_regular_file(path, O_WRONLY | O_NOFOLLOW, &fd, &sb);
    if (opened != ORION_OK) return opened;
    if ((uint64_t)sb.st_size != n) {
        close(fd);
        return orion_fail(ORION_ERR_FORMAT, "ane: %s has %lld bytes, the new weights %llu: a weight "
                          "update keeps every size", path, (long long)sb.st_size,
                          (unsigned long long)n);
    }
    uint64_t done = 0;
    while (done < n) {
        ssize_t w = pwrite(fd, data + done, (size_t)(n - done), (off_t)done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = errno;
            close(fd);
            return orion_fail(ORION_ERR_IO, "ane: writing %s: %s", path, strerror(e));
        }
        done += (uint64_t)w;
    }
    if (close(fd) != 0) return orion_fail(ORION_ERR_IO, "ane: closing %s: %s", path, strerror(errno));
    return ORION_OK;
}

/* A new file renamed over the old one (a new inode). The temp name is this
 * process's and this call's own: processes that share a temp folder write the
 * same inputs into it at once, and each reader sees one whole file or the other. */
orion_status ane_write_atomic(const char *path, const uint8_t *data, uint64_t n) {
    static unsigned long serial;
    unsigned long mine = __atomic_add_fetch(&serial, 1, __ATOMIC_RELAXED);
    size_t len = strlen(path) + 64;
    char *tmp = malloc(len);
    if (!tmp) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "ane: out of memory");
    snprintf(tmp, len, "%s.%ld.%lu.orion-new", path, (long)getpid(), mine);
    /* never write through a link or FIFO planted at the temp name */
    unlink(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    orion_status st = ORION_OK;
    if (fd < 0) st = orion_fail(ORION_ERR_IO, "ane: cannot create %s: %s", tmp, strerror(errno));
    for (uint64_t done = 0; st == ORION_OK && done < n;) {
        ssize_t w = write(fd, data + done, (size_t)(n - done));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) st = orion_fail(ORION_ERR_IO, "ane: writing %s: %s", tmp, strerror(errno));
        else done += (uint64_t)w;
    }
    if (fd >= 0 && close(fd) != 0 && st == ORION_OK)
        st = orion_fail(ORION_ERR_IO, "ane: closing %s: %s", tmp, strerror(errno));
    if (st == ORION_OK && rename(tmp, path) != 0)
        st = orion_fail(ORION_ERR_IO, "ane: renaming %s: %s", tmp, strerror(errno));
    if (st != ORION_OK) unlink(tmp);
    free(tmp);
    return st;
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- the identifiers in use: one temp folder per live model ------------- */

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static ane_model *registry;

static orion_status registry_add(ane_model *m) {
    orion_status st = ORION_OK;
    pthread_mutex_lock(&registry_lock);
    for (ane_model *q = registry; q; q = q->next)
        if (strcmp(q->hex_id, m->hex_id) == 0) {
            st = orion_fail(ORION_ERR_STATE, "ane: the device gave identifier %s to a live "
                            "program already (same MIL text, weights and options); the two would "
                            "share the temp folder %s. Release it first", m->hex_id, m->tmp_dir);
            break;
        }
    if (st == ORION_OK) {
        m->next = registry;
        registry = m;
        m->registered = 1;
    }
    pthread_mutex_unlock(&registry_lock);
    return st;
}

static void registry_remove(ane_model *m) {
    pthread_mutex_lock(&registry_lock);
    for (ane_model **q = &registry; *q; q = &(*q)->next)
        if (*q == m) {
            *q = m->next;
            break;
        }
    m->registered = 0;
    pthread_mutex_unlock(&registry_lock);
}

/* ---- descriptor and model --------------------------------------------------- */

/* The hex identifier names a folder: refuse anything that is not one plain name. */
static int plain_name(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n >= 250 || strcmp(s, ".") == 0 || strcmp(s, "..") == 0) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              c == '_' || c == '-' || c == '.'))
            return 0;
    }
    return 1;
}

/* key -> {offset: 0, data: blob}, built so that its first value is the data:
 * the framework hashes, and stages as `data`, the entry's first value. */
static NSDictionary *weight_entry(const orion_weight_file *w) {
    NSData *data = [NSData dataWithBytes:w->data length:(NSUInteger)w->nbytes];
    NSNumber *zero = [NSNumber numberWithInt:0];
    NSDictionary *e = [NSDictionary dictionaryWithObjectsAndKeys:zero, @"offset", data, @"data", nil];
    if (![[[e allValues] objectAtIndex:0] isKindOfClass:[NSData class]])
        e = [NSDictionary dictionaryWithObjectsAndKeys:data, @"data", zero, @"offset", nil];
    if (![[[e allValues] objectAtIndex:0] isKindOfClass:[NSData class]]) return nil;
    return e;
}

static orion_status make_model(const ane_framework *f, ane_model *m, NSData *mil,
                               NSDictionary *weights) {
    id descriptor = nil, model = nil;
    NSString *hex = nil;
    @try {
        descriptor = [(id<OrionANEDescriptorClass>)f->descriptor_class
                          modelWithMILText:mil weights:weights optionsPlist:nil];
    } @catch (NSException *e) {
        return ane_fail_call(ORION_ERR_INTERNAL, "+[_ANEInMemoryModelDescriptor " SEL_DESCRIPTOR "]",
                             nil, e, NULL);
    }
    if (!descriptor)
        return ane_fail_call(ORION_ERR_INTERNAL, "+[_ANEInMemoryModelDescriptor " SEL_DESCRIPTOR "]",
                             nil, nil, "returned nil (the MIL text or the weight dictionary was "
                             "refused)");
    @try {
        model = [(id<OrionANEModelClass>)f->model_class inMemoryModelWithDescriptor:descriptor];
    } @catch (NSException *e) {
        return ane_fail_call(ORION_ERR_INTERNAL, "+[_ANEInMemoryModel " SEL_MODEL "]", nil, e, NULL);
    }
    if (!model)
        return ane_fail_call(ORION_ERR_INTERNAL, "+[_ANEInMemoryModel " SEL_MODEL "]", nil, nil,
                             "returned nil");
    m->model = [model retain];
    @try {
        hex = [(id<OrionANEModel>)model hexStringIdentifier];
    } @catch (NSException *e) {
        return ane_fail_call(ORION_ERR_INTERNAL, "-[_ANEInMemoryModel " SEL_HEXID "]", nil, e, NULL);
    }
    if (!hex || ![hex isKindOfClass:[NSString class]] || !plain_name([hex UTF8String]))
        return ane_fail_call(ORION_ERR_INTERNAL, "-[_ANEInMemoryModel " SEL_HEXID "]", nil, nil,
                             "did not return a plain folder name");
    snprintf(m->hex_id, sizeof m->hex_id, "%s", [hex UTF8String]);
    NSString *tmp = [NSTemporaryDirectory() stringByAppendingPathComponent:hex];
    if (!(m->tmp_dir = strdup([tmp fileSystemRepresentation])))
        return orion_fail(ORION_ERR_OUT_OF_MEMORY, "ane: out of memory");
    return ORION_OK;
}

static orion_status call_compile(ane_model *m) {
    NSError *error = nil;
    BOOL ok = NO;
    uint64_t t0 = now_ns();
    @try {
        ok = [(id<OrionANEModel>)m->model compileWithQoS:ANE_QOS
                                                 options:[NSDictionary dictionary]
                                                   error:&error];
    } @catch (NSException *e) {
        return ane_fail_call(ORION_ERR_INTERNAL, "-[_ANEInMemoryModel " SEL_COMPILE "]", nil, e,
                             NULL);
    }
    if (!ok)
        return ane_fail_call(ORION_ERR_INTERNAL, "-[_ANEInMemoryModel " SEL_COMPILE "]", error, nil,
                             "returned NO");
    m->compile_ns = now_ns() - t0;
    return ORION_OK;
}

/* Which weight file `data` holds after compile (the framework's staging copy:
 * the last entry it wrote), or -1. */
static long staged_file(const ane_model *m, const orion_weight_file *w, size_t n) {
    char *path = ane_join(m->tmp_dir, "data");
    uint8_t *buf = NULL;
    uint64_t size = 0;
    long which = -1;
    if (path && access(path, F_OK) == 0 && ane_read_file(path, &buf, &size) == ORION_OK)
        for (size_t i = 0; i < n && which < 0; i++)
            if (size == w[i].nbytes && memcmp(buf, w[i].data, (size_t)size) == 0) which = (long)i;
    orion_clear_error();   /* no `data` only means no staging copy */
    free(buf);
    free(path);
    return which;
}

void ane_model_free(ane_model *m) {
    if (!m) return;
    NSAutoreleasePool *pool = [[NSAutoreleasePool alloc] init];
    if (m->loaded) ane_model_unload(m);   /* Orion [CLAIM]: always unload, or resources leak */
    [m->model release];
    [pool drain];
    ane_model_unstage(m);
    if (m->registered) registry_remove(m);
    free(m->tmp_dir);
    free(m);
}

/* One file of the held temp folder, written whole (ane_write_atomic). */
static orion_status write_input(ane_model *m, const char *rel, const void *data, uint64_t n) {
    char *path = ane_join(m->tmp_dir, rel);
    if (!path) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "ane: out of memory");
    char *slash = strrchr(path, '/');
    *slash = '\0';
    orion_status st = folder_make_dirs(path);
    *slash = '/';
    if (st == ORION_OK) st = ane_write_atomic(path, data, n);
    free(path);
    return st;
}

/* model.mil and the weight files, written into the held temp folder. */
static orion_status write_inputs(ane_model *m, const uint8_t *mil_text, uint64_t mil_len,
                                 const orion_weight_file *weights, size_t n) {
    orion_status st = write_input(m, "model.mil", mil_text, mil_len);
    for (size_t i = 0; st == ORION_OK && i < n; i++)
        st = write_input(m, weights[i].key + strlen(MODEL_PATH_PREFIX), weights[i].data,
                         weights[i].nbytes);
    return st;
}

orion_status ane_model_stage(ane_model *m, const uint8_t *mil_text, uint64_t mil_len,
                             const orion_weight_file *weights, size_t n) {
    orion_status st = ane_temp_enter(m->tmp_dir, &m->users_fd);
    if (st == ORION_OK) st = write_inputs(m, mil_text, mil_len, weights, n);
    /* the framework's staging copy, where its compile made one */
    if (st == ORION_OK && m->staged >= 0 && (size_t)m->staged < n)
        st = write_input(m, "data", weights[m->staged].data, weights[m->staged].nbytes);
    return st;
}

void ane_model_unstage(ane_model *m) { ane_temp_leave(m->tmp_dir, &m->users_fd); }

int ane_model_staged(const ane_model *m) { return m->users_fd >= 0; }

orion_status ane_model_create(const ane_framework *f, const uint8_t *mil_text, uint64_t mil_len,
                              const orion_weight_file *weights, size_t n, int compile,
                              int keep_folder, ane_model **out) {
    *out = NULL;
    ane_model *m = calloc(1, sizeof *m);
    if (!m) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "ane: out of memory");
    m->users_fd = -1;
    m->staged = -1;
    orion_status st = ORION_OK;
    NSAutoreleasePool *pool = [[NSAutoreleasePool alloc] init];
    /* Step 1: MIL as NSData (ANE-C26); an empty dictionary, never nil, for a
     * weight-free program (ANE-C27). */
    NSData *mil = [NSData dataWithBytes:mil_text length:(NSUInteger)mil_len];
    NSMutableDictionary *dict = [NSMutableDictionary dictionaryWithCapacity:n];
    for (size_t i = 0; st == ORION_OK && i < n; i++) {
        NSDictionary *entry = weight_entry(&weights[i]);
        if (!entry)
            st = orion_fail(ORION_ERR_INTERNAL, "ane: cannot build a weight entry for %s whose "
                            "first value is its data (the framework hashes that value)",
                            weights[i].key);
        else
            [dict setObject:entry forKey:[NSString stringWithUTF8String:weights[i].key]];
    }
    if (st == ORION_OK) st = make_model(f, m, mil, dict);   /* steps 1, 2 and the identifier */
    if (st == ORION_OK) st = registry_add(m);
    /* Step 3: the temp folder the compiler reads, before compiling (ANE-C30). */
    if (st == ORION_OK) st = ane_temp_enter(m->tmp_dir, &m->users_fd);
    if (st == ORION_OK) st = write_inputs(m, mil_text, mil_len, weights, n);
    if (st == ORION_OK && compile) st = call_compile(m);   /* step 4 */
    if (st == ORION_OK && compile) m->staged = staged_file(m, weights, n);
    [pool drain];
    if (st != ORION_OK) {
        ane_model_free(m);
        return st;
    }
    if (compile && !keep_folder) ane_model_unstage(m);
    *out = m;
    return ORION_OK;
}

orion_status ane_model_load(ane_model *m) {
    NSError *error = nil;
    BOOL ok = NO;
    NSAutoreleasePool *pool = [[NSAutoreleasePool alloc] init];
    orion_status st = ORION_OK;
    uint64_t t0 = 0;
    for (int attempt = 0; attempt < 2 && !ok && st == ORION_OK; attempt++) {
        if (attempt) {
            struct timespec ts = {0, LOAD_RETRY_NS};
            nanosleep(&ts, NULL);
        }
        error = nil;
        t0 = now_ns();   /* the attempt that succeeds is the load's time */
        @try {
            ok = [(id<OrionANEModel>)m->model loadWithQoS:ANE_QOS
                                                  options:[NSDictionary dictionary]
                                                    error:&error];
        } @catch (NSException *e) {
            st = ane_fail_call(ORION_ERR_INTERNAL, "-[_ANEInMemoryModel " SEL_LOAD "]", nil, e, NULL);
        }
    }
    if (st == ORION_OK && !ok)
        st = ane_fail_call(ORION_ERR_INTERNAL, "-[_ANEInMemoryModel " SEL_LOAD "]", error, nil,
                           "returned NO (after one retry)");
    [pool drain];
    if (st == ORION_OK) {
        m->loaded = 1;
        m->last_load_ns = now_ns() - t0;
        m->loads_seen++;
    }
    return st;
}

int ane_model_load_compiled(ane_model *m, int may_be_baseline, char *why, size_t capacity) {
    uint64_t t = m->last_load_ns, plain = m->plain_load_ns, compile = m->compile_ns;
    if (!compile) {   /* made without compileWithQoS: its first load was the compile */
        m->compile_ns = t;
        return 0;
    }
    if (may_be_baseline && m->loads_seen == 1) {   /* the plain load right after the compile */
        if (t < compile / 2) m->plain_load_ns = t;
        return 0;
    }
    int distinct = compile >= plain + DISTINCT_COMPILE_NS;
    if (distinct && t >= plain + (compile - plain) / 2) {
        snprintf(why, capacity, "a load took %.1f ms against %.1f ms for a plain load of this "
                 "program and %.1f ms for its compile", (double)t / 1e6, (double)plain / 1e6,
                 (double)compile / 1e6);
        return 1;
    }
    if (!plain || t < plain) m->plain_load_ns = t;
    return 0;
}

orion_status ane_model_unload(ane_model *m) {
    if (!m->loaded) return ORION_OK;
    NSError *error = nil;
    BOOL ok = NO;
    orion_status st = ORION_OK;
    NSAutoreleasePool *pool = [[NSAutoreleasePool alloc] init];
    @try {
        ok = [(id<OrionANEModel>)m->model unloadWithQoS:ANE_QOS error:&error];
    } @catch (NSException *e) {
        st = ane_fail_call(ORION_ERR_INTERNAL, "-[_ANEInMemoryModel " SEL_UNLOAD "]", nil, e, NULL);
    }
    if (st == ORION_OK && !ok)
        st = ane_fail_call(ORION_ERR_INTERNAL, "-[_ANEInMemoryModel " SEL_UNLOAD "]", error, nil,
                           "returned NO");
    [pool drain];
    m->loaded = 0;   /* the device holds nothing we could still use */
    return st;
}

int ane_model_purge(ane_model *m) {
    NSAutoreleasePool *pool = [[NSAutoreleasePool alloc] init];
    int sent = 0;
    @try {
        if ([m->model respondsToSelector:NSSelectorFromString(@"purgeCompiledModel")]) {
            [(id<OrionANEModelPurge>)m->model purgeCompiledModel];
            sent = 1;
        }
    } @catch (NSException *e) {
        sent = 0;
    }
    [pool drain];
    return sent;
}
