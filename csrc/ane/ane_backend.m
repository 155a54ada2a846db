/* ane_backend.m -- the ane backend: Apple's Neural Engine through the private
 * in-memory model API of AppleNeuralEngine.framework (docs/ane-facts.md §1,
 * docs/ane-backend.md), behind the same interface as vane (core/backend.h).
 *
 * compile: descriptor from the MIL text (NSData) and the weight dictionary
 *          (key -> {offset: 0, data: blob}), model, hexStringIdentifier, the
 *          device's temp folder NSTemporaryDirectory()/<id> with model.mil and
 *          weights/ written before compileWithQoS: (ANE-C30).
 * load:    the delta path first: every weight file the runtime may have
 *          patched in its folder is copied in place (same inode, same size)
 *          over the file the compiled program reads; then loadWithQoS: and a
 *          check that the identifier did not change.
 * eval:    each surface (an IOSurface, ane_surface.m) wrapped in an
 *          _ANEIOSurfaceObject, a request with indices 0..n-1 in the binding
 *          order the runtime gives, evaluateWithQoS:.
 * unload / release: unloadWithQoS:, the model released, the temp folder
 *          removed.
 *
 * The runtime spends the compile budget (ANE-C31) before compile and counts
 * resident programs; a delta reload spends nothing. Every private call runs
 * inside an autorelease pool and @try, and any failure (nil, NO, NSError, an
 * exception) becomes an Orion error naming the selector and the NSError. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../core/backend.h"
#include "../core/error.h"
#include "../core/folder.h"
#include "../core/regular_file.h"
#include "ane_internal.h"

#define MODEL_PATH_PREFIX "@model_path/"
#define LOAD_RETRY_NS 100000000L   /* §1.2 step 5: one retry after 100 ms */

typedef struct ane_program {
    id model;                 /* _ANEInMemoryModel, retained */
    char hex_id[256];         /* hexStringIdentifier at compile */
    char *tmp_dir;            /* NSTemporaryDirectory()/<hex_id>: what the device compiled */
    char *folder;             /* the runtime's program folder (the delta path patches it) */
    size_t n_files;
    char **rel;               /* weight files, relative to both folders: "weights/w.bin" */
    int data_mirror;          /* the compiler's `data` file equals the single weight file */
    int loaded;
    int users_fd;             /* shared flock on tmp_dir/.orion-users while we use it, or -1 */
    struct ane_program *next; /* the registry of device identifiers in use */
} ane_program;

/* The device's temp folder is NSTemporaryDirectory()/<id>, the same path for
 * every process of the user that compiles the same MIL with the same keys.
 * Each process holds a shared flock on a file in it; the last one out (the
 * one that can take the lock exclusively) removes the folder, so one
 * process's release never deletes what another's loaded program reads. */
#define USERS_FILE ".orion-users"

static char *join(const char *dir, const char *rel);

static orion_status hold_temp_folder(ane_program *ap) {
    char *path = join(ap->tmp_dir, USERS_FILE);
    if (!path) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "ane: out of memory");
    ap->users_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    int e = errno;
    free(path);
    if (ap->users_fd < 0 || flock(ap->users_fd, LOCK_SH) != 0)
        return orion_fail(ORION_ERR_IO, "ane: cannot lock the temp folder %s: %s", ap->tmp_dir,
                          strerror(ap->users_fd < 0 ? e : errno));
    return ORION_OK;
}

static void leave_temp_folder(ane_program *ap) {
    if (ap->users_fd < 0) return;
    if (flock(ap->users_fd, LOCK_EX | LOCK_NB) == 0) folder_remove(ap->tmp_dir);
    close(ap->users_fd);   /* drops our lock */
    ap->users_fd = -1;
}

/* ---- the identifiers in use: one temp folder per live model ----------- */

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static ane_program *registry;

static orion_status registry_add(ane_program *ap) {
    orion_status st = ORION_OK;
    pthread_mutex_lock(&registry_lock);
    for (ane_program *q = registry; q; q = q->next)
        if (strcmp(q->hex_id, ap->hex_id) == 0) {
            st = orion_fail(ORION_ERR_STATE, "ane: the device gave identifier %s to a live "
                            "program already; the two would share the temp folder %s. Release "
                            "it first, or give this program's weight files distinct keys",
                            ap->hex_id, ap->tmp_dir);
            break;
        }
    if (st == ORION_OK) {
        ap->next = registry;
        registry = ap;
    }
    pthread_mutex_unlock(&registry_lock);
    return st;
}

static void registry_remove(ane_program *ap) {
    pthread_mutex_lock(&registry_lock);
    for (ane_program **q = &registry; *q; q = &(*q)->next)
        if (*q == ap) {
            *q = ap->next;
            break;
        }
    pthread_mutex_unlock(&registry_lock);
}

/* ---- files --------------------------------------------------------------- */

static orion_status read_file(const char *path, char **out, uint64_t *size) {
    void *buf = NULL;
    uint64_t capacity = 0;
    orion_status st = folder_read_file(path, &buf, &capacity, size);
    if (st != ORION_OK) return orion_fail_context(st, "ane");
    *out = buf;
    return ORION_OK;
}

/* Overwrites a file in place: same inode, same size (the device may have
 * mapped it; §4.2 reports in-place writes seen at reload, atomic ones not). */
static orion_status write_in_place(const char *path, const char *data, uint64_t n) {
    int fd;
    struct stat sb;
    orion_status opened = open_regular_file(path, O_WRONLY | O_NOFOLLOW, &fd, &sb);
    if (opened != ORION_OK) return opened;
    if ((uint64_t)sb.st_size != n) {
        close(fd);
        return orion_fail(ORION_ERR_FORMAT, "ane: %s has %lld bytes, the new weights %llu: a delta "
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

static char *join(const char *dir, const char *rel) {
    size_t n = strlen(dir) + strlen(rel) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, rel);
    return p;
}

/* Copies every weight file that differs from the runtime's folder into the
 * device's temp folder, in place; and the `data` file when it mirrors one. */
static orion_status sync_weights(ane_program *ap) {
    orion_status st = ORION_OK;
    for (size_t i = 0; st == ORION_OK && i < ap->n_files; i++) {
        char *src = join(ap->folder, ap->rel[i]), *dst = join(ap->tmp_dir, ap->rel[i]);
        char *want = NULL, *have = NULL;
        uint64_t nw = 0, nh = 0;
        if (!src || !dst) st = orion_fail(ORION_ERR_OUT_OF_MEMORY, "ane: out of memory");
        if (st == ORION_OK) st = read_file(src, &want, &nw);
        if (st == ORION_OK) st = read_file(dst, &have, &nh);
        if (st == ORION_OK && (nw != nh || memcmp(want, have, (size_t)nw) != 0)) {
            st = write_in_place(dst, want, nw);
            if (st == ORION_OK && ap->data_mirror) {
                char *data = join(ap->tmp_dir, "data");
                st = data ? write_in_place(data, want, nw)
                          : orion_fail(ORION_ERR_OUT_OF_MEMORY, "ane: out of memory");
                free(data);
            }
        }
        free(want);
        free(have);
        free(src);
        free(dst);
    }
    return st;
}

/* 1 if folder/name exists with exactly these bytes. */
static int file_equals(const char *folder, const char *name, const void *bytes, uint64_t n) {
    char *path = join(folder, name), *buf = NULL;
    uint64_t size = 0;
    int same = 0;
    if (path && access(path, F_OK) == 0 && read_file(path, &buf, &size) == ORION_OK)
        same = size == n && memcmp(buf, bytes, (size_t)n) == 0;
    orion_clear_error();   /* a missing file only means "no mirror" */
    free(buf);
    free(path);
    return same;
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
    if (ap->model) [ap->model release];
    for (size_t i = 0; i < ap->n_files; i++) free(ap->rel[i]);
    free(ap->rel);
    free(ap->tmp_dir);
    free(ap->folder);
    free(ap);
}

/* The hex identifier names a folder: refuse anything that is not one plain name. */
static int plain_name(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n >= 200 || strcmp(s, ".") == 0 || strcmp(s, "..") == 0) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              c == '_' || c == '-' || c == '.'))
            return 0;
    }
    return 1;
}

/* Builds the descriptor and the model; fills ap->model, hex_id, tmp_dir. */
static orion_status make_model(const ane_framework *f, ane_program *ap, NSData *mil,
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
    ap->model = [model retain];
    @try {
        hex = [(id<OrionANEModel>)model hexStringIdentifier];
    } @catch (NSException *e) {
        return ane_fail_call(ORION_ERR_INTERNAL, "-[_ANEInMemoryModel " SEL_HEXID "]", nil, e, NULL);
    }
    if (!hex || ![hex isKindOfClass:[NSString class]] || !plain_name([hex UTF8String]))
        return ane_fail_call(ORION_ERR_INTERNAL, "-[_ANEInMemoryModel " SEL_HEXID "]", nil, nil,
                             "did not return a plain folder name");
    snprintf(ap->hex_id, sizeof ap->hex_id, "%s", [hex UTF8String]);
    NSString *tmp = [NSTemporaryDirectory() stringByAppendingPathComponent:hex];
    if (!(ap->tmp_dir = strdup([tmp fileSystemRepresentation])))
        return orion_fail(ORION_ERR_OUT_OF_MEMORY, "ane: out of memory");
    return ORION_OK;
}

static orion_status call_compile(ane_program *ap) {
    NSError *error = nil;
    BOOL ok = NO;
    @try {
        ok = [(id<OrionANEModel>)ap->model compileWithQoS:ANE_QOS
                                                  options:[NSDictionary dictionary]
                                                    error:&error];
    } @catch (NSException *e) {
        return ane_fail_call(ORION_ERR_INTERNAL, "-[_ANEInMemoryModel " SEL_COMPILE "]", nil, e,
                             NULL);
    }
    if (!ok)
        return ane_fail_call(ORION_ERR_INTERNAL, "-[_ANEInMemoryModel " SEL_COMPILE "]", error, nil,
                             "returned NO");
    return ORION_OK;
}

static orion_status ane_compile(const mil_program *program, const char *folder,
                                const orion_weight_file *weights, size_t n_weights,
                                uint32_t numerics, void **impl_out) {
    (void)program;    /* the runtime parsed and verified it; the device gets the text */
    (void)numerics;   /* the device decides its arithmetic */
    if (!folder || !impl_out || (n_weights && !weights))
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "ane: compile needs a folder");
    *impl_out = NULL;
    orion_status st;
    const ane_framework *f = framework_or_fail(&st);
    if (!f) return st;
    ane_program *ap = calloc(1, sizeof *ap);
    if (!ap) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "ane: out of memory");
    ap->users_fd = -1;
    ap->folder = strdup(folder);
    ap->rel = calloc(n_weights ? n_weights : 1, sizeof *ap->rel);
    if (!ap->folder || !ap->rel) st = orion_fail(ORION_ERR_OUT_OF_MEMORY, "ane: out of memory");
    for (size_t i = 0; st == ORION_OK && i < n_weights; i++) {
        if (strncmp(weights[i].key, MODEL_PATH_PREFIX, strlen(MODEL_PATH_PREFIX)) != 0)
            st = orion_fail(ORION_ERR_INVALID_ARGUMENT, "ane: weight key %s does not start with "
                            MODEL_PATH_PREFIX, weights[i].key);
        else if (!(ap->rel[i] = strdup(weights[i].key + strlen(MODEL_PATH_PREFIX))))
            st = orion_fail(ORION_ERR_OUT_OF_MEMORY, "ane: out of memory");
        else
            ap->n_files++;
    }
    char *mil_text = NULL;
    uint64_t mil_len = 0;
    if (st == ORION_OK) {
        char *path = join(folder, "model.mil");
        st = path ? read_file(path, &mil_text, &mil_len)
                  : orion_fail(ORION_ERR_OUT_OF_MEMORY, "ane: out of memory");
        free(path);
    }
    int registered = 0, wrote = 0;
    NSAutoreleasePool *pool = [[NSAutoreleasePool alloc] init];
    if (st == ORION_OK) {
        /* Step 1: MIL as NSData (ANE-C26); weights key -> {offset 0, data}; an
         * empty dictionary, never nil, for a weight-free program (ANE-C27). */
        NSData *mil = [NSData dataWithBytes:mil_text length:(NSUInteger)mil_len];
        NSMutableDictionary *dict = [NSMutableDictionary dictionaryWithCapacity:n_weights];
        for (size_t i = 0; i < n_weights; i++) {
            NSDictionary *entry = [NSDictionary dictionaryWithObjectsAndKeys:
                [NSNumber numberWithInt:0], @"offset",
                [NSData dataWithBytes:weights[i].data length:(NSUInteger)weights[i].nbytes],
                @"data", nil];
            [dict setObject:entry forKey:[NSString stringWithUTF8String:weights[i].key]];
        }
        st = make_model(f, ap, mil, dict);    /* steps 1 and 2, and the identifier */
    }
    if (st == ORION_OK && (st = registry_add(ap)) == ORION_OK) registered = 1;
    /* Step 3: the temp folder the compiler reads, before compiling (ANE-C30). */
    if (st == ORION_OK) {
        wrote = 1;
        st = folder_make_dirs(ap->tmp_dir);
        if (st == ORION_OK) st = hold_temp_folder(ap);
        if (st == ORION_OK) st = folder_write_file(ap->tmp_dir, "model.mil", mil_text, mil_len);
        for (size_t i = 0; st == ORION_OK && i < n_weights; i++)
            st = folder_write_file(ap->tmp_dir, ap->rel[i], weights[i].data, weights[i].nbytes);
    }
    if (st == ORION_OK) st = call_compile(ap);   /* step 4 */
    if (st == ORION_OK && n_weights == 1)
        ap->data_mirror = file_equals(ap->tmp_dir, "data", weights[0].data, weights[0].nbytes);
    [pool drain];
    free(mil_text);
    if (st != ORION_OK) {
        if (wrote) leave_temp_folder(ap);
        if (registered) registry_remove(ap);
        program_free(ap);
        return st;
    }
    *impl_out = ap;
    return ORION_OK;
}

static orion_status call_load(ane_program *ap) {
    NSError *error = nil;
    BOOL ok = NO;
    for (int attempt = 0; attempt < 2 && !ok; attempt++) {
        if (attempt) {
            struct timespec ts = {0, LOAD_RETRY_NS};
            nanosleep(&ts, NULL);
        }
        error = nil;
        @try {
            ok = [(id<OrionANEModel>)ap->model loadWithQoS:ANE_QOS
                                                   options:[NSDictionary dictionary]
                                                     error:&error];
        } @catch (NSException *e) {
            return ane_fail_call(ORION_ERR_INTERNAL, "-[_ANEInMemoryModel " SEL_LOAD "]", nil, e,
                                 NULL);
        }
    }
    if (!ok)
        return ane_fail_call(ORION_ERR_INTERNAL, "-[_ANEInMemoryModel " SEL_LOAD "]", error, nil,
                             "returned NO (after one retry)");
    return ORION_OK;
}

static orion_status call_unload(ane_program *ap) {
    NSError *error = nil;
    BOOL ok = NO;
    @try {
        ok = [(id<OrionANEModel>)ap->model unloadWithQoS:ANE_QOS error:&error];
    } @catch (NSException *e) {
        return ane_fail_call(ORION_ERR_INTERNAL, "-[_ANEInMemoryModel " SEL_UNLOAD "]", nil, e, NULL);
    }
    if (!ok)
        return ane_fail_call(ORION_ERR_INTERNAL, "-[_ANEInMemoryModel " SEL_UNLOAD "]", error, nil,
                             "returned NO");
    return ORION_OK;
}

/* The delta path's promise: a reload keeps the program the device compiled. */
static orion_status check_identifier(ane_program *ap) {
    NSString *hex = nil;
    @try {
        hex = [(id<OrionANEModel>)ap->model hexStringIdentifier];
    } @catch (NSException *e) {
        return ane_fail_call(ORION_ERR_INTERNAL, "-[_ANEInMemoryModel " SEL_HEXID "]", nil, e, NULL);
    }
    if (!hex || ![hex isKindOfClass:[NSString class]] || strcmp([hex UTF8String], ap->hex_id) != 0)
        return orion_fail(ORION_ERR_STATE, "ane: after the reload the device reports identifier "
                          "%s, not %s: the delta path needs the program it compiled",
                          hex ? [hex UTF8String] : "(nil)", ap->hex_id);
    return ORION_OK;
}

static orion_status ane_load(void *impl) {
    ane_program *ap = impl;
    if (!ap) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "ane: no program");
    if (ap->loaded) return ORION_OK;
    orion_status st = sync_weights(ap);
    if (st != ORION_OK) return st;
    NSAutoreleasePool *pool = [[NSAutoreleasePool alloc] init];
    st = call_load(ap);
    if (st == ORION_OK && (st = check_identifier(ap)) != ORION_OK) {
        char message[2048];
        snprintf(message, sizeof message, "%s", orion_last_error());
        call_unload(ap);
        orion_fail(st, "%s", message);
    }
    [pool drain];
    if (st == ORION_OK) ap->loaded = 1;
    return st;
}

static orion_status ane_unload(void *impl) {
    ane_program *ap = impl;
    if (!ap) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "ane: no program");
    if (!ap->loaded) return ORION_OK;
    NSAutoreleasePool *pool = [[NSAutoreleasePool alloc] init];
    orion_status st = call_unload(ap);
    [pool drain];
    ap->loaded = 0;   /* the device holds nothing we could still use */
    return st;
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

static orion_status eval_in_pool(const ane_framework *f, ane_program *ap,
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
        ok = [(id<OrionANEModel>)ap->model evaluateWithQoS:ANE_QOS
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
    if (!ap->loaded) return orion_fail(ORION_ERR_STATE, "ane: eval of a program that is not loaded");
    orion_status st;
    const ane_framework *f = framework_or_fail(&st);
    if (!f) return st;
    NSAutoreleasePool *pool = [[NSAutoreleasePool alloc] init];
    st = eval_in_pool(f, ap, inputs, n_inputs, outputs, n_outputs);
    [pool drain];
    return st;
}

static void ane_release(void *impl) {
    ane_program *ap = impl;
    if (!ap) return;
    NSAutoreleasePool *pool = [[NSAutoreleasePool alloc] init];
    if (ap->loaded) call_unload(ap);   /* Orion [CLAIM]: always unload, or resources leak */
    [ap->model release];
    ap->model = nil;
    [pool drain];
    leave_temp_folder(ap);
    registry_remove(ap);
    program_free(ap);
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
