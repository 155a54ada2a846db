/* standin.m -- a stand-in for AppleNeuralEngine.framework, for Linux CI.
 *
 * It implements what the ane backend calls (docs/ane-facts.md §1) and checks
 * what the real device is documented to check:
 *   - the descriptor takes NSData MIL text (ANE-C26) and a weight dictionary,
 *     never nil (ANE-C27), of key -> {offset, data};
 *   - compile needs the temp folder NSTemporaryDirectory()/<hex id> with
 *     model.mil and the weight files written first (ANE-C30), and is refused
 *     after the per-process compile limit (ANE-C31) with an NSError;
 *   - the behaviour of load depends on the mode (ANE_STANDIN_MODE, read at
 *     every call; see standin.h, which also lists macos27 and compile-on-miss):
 *     `observed` (the default) models what public
 *     reverse engineering of the framework shows: the identifier hashes the
 *     weight bytes, compile writes model.mil and the staging `data` itself and
 *     puts the program in a per-identifier cache (aned's), and load serves
 *     that cache, ignoring later edits of the temp folder (a naive delta
 *     reload is stale, as maderix measured), compiling at load (a hidden
 *     compile, counted) when the identifier is not cached; `verify` adds the
 *     bundle check of newer builds (a load fails if a bundle file changed
 *     after compile); `permissive` is the belief the backend was first
 *     written against: a keys-only identifier, and load re-reads the weight
 *     files from the folder;
 *   - a weight entry whose first value is not NSData is refused (the framework
 *     hashes [[entry allValues] firstObject] as data);
 *   - _ANEPerformanceStats carries the evaluation's time back, as pmetal reads it;
 *   - IOSurface allocations are rounded up to 16 KiB;
 *   - evaluate binds surface k to the symbol its index names, symbols in
 *     byte-wise sorted name order (ANE-C19, C20), and answers status 0x1d for
 *     a wrong count, bad indices, non-uniform sizes in a group (ANE-C17, C18),
 *     surfaces under 49152 bytes (ANE-C23) or smaller than their tensor
 *     (ANE-C25).
 * Programs run on vane through the public C ABI of a private copy of Orion's
 * core linked into this library (its own budget, handles and errors: nothing
 * is shared with, or counted twice in, the library under test). Every call is
 * logged; misuse that the device would silently tolerate (locks, releases) is
 * recorded as a violation. Tests only: this never ships in the wheel. */
#define _GNU_SOURCE   /* PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP: the stand-in is Linux only */
#import <Foundation/Foundation.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/sha256.h"
#include "orion.h"
#include "standin.h"

#define MIN_SURFACE_BYTES 49152u
#define STATUS_0X1D "ANEProgramProcessRequestDirect() Failed with status=0x1d : Program Inference error"
#define ERROR_DOMAIN @"com.apple.appleneuralengine"

/* ---- shared state: log, faults, counters --------------------------------- */

static pthread_mutex_t state_lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static char *log_buf;
static size_t log_len, log_cap;
static char *viol_buf;
static size_t viol_len, viol_cap;
static int n_violations;
static int compile_limit = -1;
static int compiles, loads, locks, live_objects, live_surfaces;

typedef struct fault {
    char selector[128];
    int count, mode;
} fault;
static fault faults[16];

static void append(char **buf, size_t *len, size_t *cap, const char *fmt, va_list ap) {
    char line[1024];
    int n = vsnprintf(line, sizeof line, fmt, ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof line) n = sizeof line - 1;
    if (*len + (size_t)n + 2 > *cap) {
        size_t cap2 = (*cap ? *cap * 2 : 4096) + (size_t)n;
        char *p = realloc(*buf, cap2);
        if (!p) return;
        *buf = p;
        *cap = cap2;
    }
    memcpy(*buf + *len, line, (size_t)n);
    *len += (size_t)n;
    (*buf)[(*len)++] = '\n';
    (*buf)[*len] = '\0';
}

static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logf_(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&state_lock);
    append(&log_buf, &log_len, &log_cap, fmt, ap);
    pthread_mutex_unlock(&state_lock);
    va_end(ap);
}

static void violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void violation(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&state_lock);
    append(&viol_buf, &viol_len, &viol_cap, fmt, ap);
    n_violations++;
    pthread_mutex_unlock(&state_lock);
    va_end(ap);
}

static void count(int *counter, int delta) {
    pthread_mutex_lock(&state_lock);
    *counter += delta;
    pthread_mutex_unlock(&state_lock);
}

/* -1: no fault; else the mode of the fault taken for this call. */
static int take_fault(const char *selector) {
    int mode = -1;
    pthread_mutex_lock(&state_lock);
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++)
        if (faults[i].count > 0 && strcmp(faults[i].selector, selector) == 0) {
            faults[i].count--;
            mode = faults[i].mode;
            break;
        }
    pthread_mutex_unlock(&state_lock);
    if (mode >= 0) logf_("  fault injected: %s (%s)", selector, mode ? "raise" : "fail");
    if (mode == ANE_STANDIN_RAISE)
        [NSException raise:NSInternalInconsistencyException
                    format:@"stand-in: injected exception in %s", selector];
    return mode;
}

size_t ane_standin_log(char *buf, size_t capacity) {
    pthread_mutex_lock(&state_lock);
    size_t n = log_len;
    if (buf && capacity) {
        size_t c = n < capacity - 1 ? n : capacity - 1;
        if (c) memcpy(buf, log_buf, c);
        buf[c] = '\0';
    }
    pthread_mutex_unlock(&state_lock);
    return n;
}

void ane_standin_log_clear(void) {
    pthread_mutex_lock(&state_lock);
    log_len = 0;
    if (log_buf) log_buf[0] = '\0';
    pthread_mutex_unlock(&state_lock);
}

void ane_standin_fail(const char *selector, int n, int mode) {
    pthread_mutex_lock(&state_lock);
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++)
        if (faults[i].count == 0 || strcmp(faults[i].selector, selector) == 0) {
            snprintf(faults[i].selector, sizeof faults[i].selector, "%s", selector);
            faults[i].count = n;
            faults[i].mode = mode;
            break;
        }
    pthread_mutex_unlock(&state_lock);
}

void ane_standin_clear_faults(void) {
    pthread_mutex_lock(&state_lock);
    memset(faults, 0, sizeof faults);
    pthread_mutex_unlock(&state_lock);
}

static int limit_locked(void) {
    if (compile_limit < 0) {
        const char *env = getenv("ANE_STANDIN_COMPILE_LIMIT");
        compile_limit = env && *env ? atoi(env) : 119;
    }
    return compile_limit;
}

void ane_standin_set_compile_limit(int limit) {
    pthread_mutex_lock(&state_lock);
    compile_limit = limit;
    pthread_mutex_unlock(&state_lock);
}

#define COUNTER_GETTER(fn, var)             \
    int fn(void) {                          \
        pthread_mutex_lock(&state_lock);    \
        int n = var;                        \
        pthread_mutex_unlock(&state_lock);  \
        return n;                           \
    }
COUNTER_GETTER(ane_standin_compiles, compiles)
COUNTER_GETTER(ane_standin_loads, loads)
COUNTER_GETTER(ane_standin_locks, locks)
COUNTER_GETTER(ane_standin_live_objects, live_objects)
COUNTER_GETTER(ane_standin_live_surfaces, live_surfaces)

int ane_standin_violations(char *buf, size_t capacity) {
    pthread_mutex_lock(&state_lock);
    int n = n_violations;
    if (buf && capacity) {
        size_t c = viol_len < capacity - 1 ? viol_len : capacity - 1;
        if (c) memcpy(buf, viol_buf, c);
        buf[c] = '\0';
    }
    pthread_mutex_unlock(&state_lock);
    return n;
}

void ane_standin_violations_clear(void) {
    pthread_mutex_lock(&state_lock);
    n_violations = 0;
    viol_len = 0;
    if (viol_buf) viol_buf[0] = '\0';
    pthread_mutex_unlock(&state_lock);
}

static NSError *device_error(long code, NSString *text) {
    return [NSError errorWithDomain:ERROR_DOMAIN code:code
                           userInfo:[NSDictionary dictionaryWithObject:text
                                                                forKey:NSLocalizedDescriptionKey]];
}

/* The inner core's last message (its own copy of orion_last_error). */
static NSString *inner_error(void) { return [NSString stringWithUTF8String:orion_last_error()]; }

/* ---- the mode ------------------------------------------------------------- */

enum { MODE_OBSERVED, MODE_VERIFY, MODE_PERMISSIVE, MODE_MACOS27, MODE_COMPILE_ON_MISS };
static const char *const mode_names[] = {"observed", "verify", "permissive", "macos27",
                                         "compile-on-miss"};

static int standin_mode(void) {
    const char *m = getenv("ANE_STANDIN_MODE");
    if (!m || !*m) return MODE_OBSERVED;
    for (int i = 0; i < (int)(sizeof mode_names / sizeof mode_names[0]); i++)
        if (strcmp(m, mode_names[i]) == 0) return i;
    violation("ANE_STANDIN_MODE=%s is not observed, verify, permissive, macos27 or "
              "compile-on-miss", m);
    return MODE_OBSERVED;
}

const char *ane_standin_mode(void) { return mode_names[standin_mode()]; }

/* Modes that check the bundle at load (a file changed after compile fails). */
static int verifies(int mode) { return mode == MODE_VERIFY || mode == MODE_MACOS27; }

/* Simulated compile time (ANE_STANDIN_COMPILE_MS), so that a compile hidden
 * in a load shows in its wall time as it does on the device. */
static void compile_delay(void) {
    const char *ms = getenv("ANE_STANDIN_COMPILE_MS");
    int n = ms && *ms ? atoi(ms) : 0;
    if (n > 0) usleep((useconds_t)n * 1000u);
}

/* ---- IOSurface ----------------------------------------------------------- */

NSString *const kIOSurfaceWidth = @"IOSurfaceWidth";
NSString *const kIOSurfaceHeight = @"IOSurfaceHeight";
NSString *const kIOSurfaceBytesPerElement = @"IOSurfaceBytesPerElement";
NSString *const kIOSurfaceBytesPerRow = @"IOSurfaceBytesPerRow";
NSString *const kIOSurfaceAllocSize = @"IOSurfaceAllocSize";
NSString *const kIOSurfacePixelFormat = @"IOSurfacePixelFormat";

#define LOCK_READ_ONLY 1u
#define LOCK_STACK 64
#define ALLOC_GRANULE 16384u   /* IOSurface rounds allocations up to 16 KiB */

@interface StandinIOSurface : NSObject {
@public
    void *base;
    size_t alloc, mapped;
    int depth;                       /* CPU locks held */
    uint32_t options[LOCK_STACK];    /* the options of each held lock */
    uint32_t seed;
}
@end

@implementation StandinIOSurface
- (void)dealloc {
    if (depth > 0) violation("IOSurface of %zu bytes freed with %d CPU lock(s) held", alloc, depth);
    if (base) munmap(base, mapped);
    count(&live_surfaces, -1);
    [super dealloc];
}
@end

static size_t number(NSDictionary *d, NSString *key, int *ok) {
    id v = [d objectForKey:key];
    if (![v isKindOfClass:[NSNumber class]]) {
        *ok = 0;
        return 0;
    }
    return (size_t)[v unsignedLongLongValue];
}

void *IOSurfaceCreate(const void *properties) {
    if (take_fault("IOSurfaceCreate") >= 0) return NULL;
    NSDictionary *d = (NSDictionary *)properties;
    if (![d isKindOfClass:[NSDictionary class]]) {
        violation("IOSurfaceCreate: properties is not a dictionary");
        return NULL;
    }
    int ok = 1;
    size_t width = number(d, kIOSurfaceWidth, &ok), height = number(d, kIOSurfaceHeight, &ok);
    size_t bpe = number(d, kIOSurfaceBytesPerElement, &ok), bpr = number(d, kIOSurfaceBytesPerRow, &ok);
    size_t alloc = number(d, kIOSurfaceAllocSize, &ok), fmt = number(d, kIOSurfacePixelFormat, &ok);
    logf_("IOSurfaceCreate %zu", alloc);
    if (!ok || width == 0 || height == 0) {
        violation("IOSurfaceCreate: a property of §1.4 is missing");
        return NULL;
    }
    if (height != 1 || bpe != 1 || bpr != width || alloc != width || fmt != 0)
        violation("IOSurfaceCreate: properties differ from §1.4 (width %zu, height %zu, bytes per "
                  "element %zu, bytes per row %zu, alloc %zu, pixel format %zu)", width, height,
                  bpe, bpr, alloc, fmt);
    alloc = (alloc + ALLOC_GRANULE - 1) / ALLOC_GRANULE * ALLOC_GRANULE;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t mapped = (alloc + page - 1) / page * page;
    void *base = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return NULL;
    StandinIOSurface *s = [[StandinIOSurface alloc] init];
    s->base = base;
    s->alloc = alloc;
    s->mapped = mapped;
    count(&live_surfaces, 1);
    return s;   /* +1, as IOSurfaceCreate's Create rule says */
}

static StandinIOSurface *as_surface(void *p, const char *fn) {
    id o = (id)p;
    if (!o || ![o isKindOfClass:[StandinIOSurface class]]) {
        violation("%s: not an IOSurface", fn);
        return nil;
    }
    return (StandinIOSurface *)o;
}

int IOSurfaceLock(void *surface, uint32_t options, uint32_t *seed) {
    StandinIOSurface *s = as_surface(surface, "IOSurfaceLock");
    if (!s) return (int)0xe00002c2;   /* kIOReturnBadArgument */
    pthread_mutex_lock(&state_lock);
    if (s->depth >= LOCK_STACK) {
        pthread_mutex_unlock(&state_lock);
        violation("IOSurfaceLock: more than %d nested locks", LOCK_STACK);
        return (int)0xe00002c2;
    }
    s->options[s->depth++] = options;
    locks++;
    if (seed) *seed = s->seed;
    pthread_mutex_unlock(&state_lock);
    return 0;
}

int IOSurfaceUnlock(void *surface, uint32_t options, uint32_t *seed) {
    StandinIOSurface *s = as_surface(surface, "IOSurfaceUnlock");
    if (!s) return (int)0xe00002c2;
    pthread_mutex_lock(&state_lock);
    int depth = s->depth;
    uint32_t held = depth > 0 ? s->options[depth - 1] : 0;
    if (depth > 0) {
        s->depth--;
        if (!(held & LOCK_READ_ONLY)) s->seed++;
    }
    if (seed) *seed = s->seed;
    pthread_mutex_unlock(&state_lock);
    if (depth == 0) {
        violation("IOSurfaceUnlock without a lock");
        return (int)0xe00002cd;   /* kIOReturnNotOpen */
    }
    if ((held & LOCK_READ_ONLY) != (options & LOCK_READ_ONLY))
        violation("IOSurfaceUnlock(options %u) of a lock taken with options %u", options, held);
    return 0;
}

void *IOSurfaceGetBaseAddress(void *surface) {
    StandinIOSurface *s = as_surface(surface, "IOSurfaceGetBaseAddress");
    return s ? s->base : NULL;
}

size_t IOSurfaceGetAllocSize(void *surface) {
    StandinIOSurface *s = as_surface(surface, "IOSurfaceGetAllocSize");
    return s ? s->alloc : 0;
}

const void *CFRetain(const void *object) {
    if (object) [(id)object retain];
    return object;
}

void CFRelease(const void *object) {
    if (!object) {
        violation("CFRelease(NULL)");   /* crashes on macOS */
        return;
    }
    [(id)object release];
}

/* ---- _ANEIOSurfaceObject ------------------------------------------------ */

@interface _ANEIOSurfaceObject : NSObject {
@public
    StandinIOSurface *surface;
}
+ (id)objectWithIOSurface:(void *)surface;
@end

@implementation _ANEIOSurfaceObject
+ (id)objectWithIOSurface:(void *)ref {
    logf_("+[_ANEIOSurfaceObject objectWithIOSurface:]");
    if (take_fault("objectWithIOSurface:") >= 0) return nil;
    StandinIOSurface *s = as_surface(ref, "objectWithIOSurface:");
    if (!s) return nil;
    _ANEIOSurfaceObject *o = [[_ANEIOSurfaceObject alloc] init];
    o->surface = [s retain];
    count(&live_objects, 1);
    return [o autorelease];
}
- (void)dealloc {
    [surface release];
    count(&live_objects, -1);
    [super dealloc];
}
@end

/* ---- _ANEPerformanceStats ------------------------------------------------ */

/* As pmetal uses it before macOS 27: +statsWithHardwareExecutionNS: makes one, the
 * request carries it, and after an evaluation -hwExecutionTime holds the device's
 * own time in ns. Here that is the inner evaluation's wall time; 0 with
 * ANE_STANDIN_HW_TIME=0 (a device that reports none); with
 * ANE_STANDIN_PERF_STATS=absent the factory returns nil (stats not offered). */
@interface _ANEPerformanceStats : NSObject {
@public
    unsigned long long hw_ns;
}
@end

@implementation _ANEPerformanceStats
+ (id)statsWithHardwareExecutionNS:(id)ns {
    logf_("+[_ANEPerformanceStats statsWithHardwareExecutionNS:]");
    const char *absent = getenv("ANE_STANDIN_PERF_STATS");
    if (absent && strcmp(absent, "absent") == 0) return nil;
    _ANEPerformanceStats *st = [[_ANEPerformanceStats alloc] init];
    st->hw_ns = [ns respondsToSelector:@selector(unsignedLongLongValue)]
                    ? [ns unsignedLongLongValue] : 0;
    count(&live_objects, 1);
    return [st autorelease];
}
- (unsigned long long)hwExecutionTime {
    return hw_ns;
}
- (void)dealloc {
    count(&live_objects, -1);
    [super dealloc];
}
@end

static void record_hw_time(id stats, unsigned long long wall_ns) {
    if (![stats isKindOfClass:[_ANEPerformanceStats class]]) return;
    const char *hw = getenv("ANE_STANDIN_HW_TIME");
    ((_ANEPerformanceStats *)stats)->hw_ns = hw && strcmp(hw, "0") == 0 ? 0 : (wall_ns ? wall_ns : 1);
}

/* ---- _ANERequest ---------------------------------------------------------- */

#ifndef STANDIN_OMIT_REQUEST
@interface _ANERequest : NSObject {
@public
    NSArray *inputs, *inputIndices, *outputs, *outputIndices;
    NSNumber *procedureIndex;
    id perfStats;
}
@end

static int array_of(NSArray *a, Class cls) {
    if (![a isKindOfClass:[NSArray class]]) return 0;
    for (NSUInteger i = 0; i < [a count]; i++)
        if (![[a objectAtIndex:i] isKindOfClass:cls]) return 0;
    return 1;
}

@implementation _ANERequest
+ (id)requestWithInputs:(NSArray *)ins inputIndices:(NSArray *)inIdx outputs:(NSArray *)outs
          outputIndices:(NSArray *)outIdx weightsBuffer:(id)weightsBuffer perfStats:(id)perfStats
         procedureIndex:(NSNumber *)procedure {
    logf_("+[_ANERequest requestWithInputs:inputIndices:outputs:outputIndices:weightsBuffer:"
          "perfStats:procedureIndex:] inputs=%lu outputs=%lu", (unsigned long)[ins count],
          (unsigned long)[outs count]);
    if (take_fault("requestWithInputs:inputIndices:outputs:outputIndices:weightsBuffer:"
                   "perfStats:procedureIndex:") >= 0)
        return nil;
    /* §1.2 step 8: procedureIndex is an object; an int there crashes. */
    if (![(id)procedure isKindOfClass:[NSNumber class]])
        [NSException raise:NSInvalidArgumentException format:@"procedureIndex is not an NSNumber"];
    if (!array_of(ins, [_ANEIOSurfaceObject class]) || !array_of(outs, [_ANEIOSurfaceObject class]) ||
        !array_of(inIdx, [NSNumber class]) || !array_of(outIdx, [NSNumber class]) ||
        [ins count] != [inIdx count] || [outs count] != [outIdx count])
        return nil;
    if (weightsBuffer) logf_("  weightsBuffer given (ignored)");
    /* pmetal: on macOS 27 the request's validation sends -count to perfStats, so the
     * single stats object earlier releases take raises there. */
    if (perfStats && standin_mode() == MODE_MACOS27 && ![perfStats isKindOfClass:[NSArray class]])
        [NSException raise:NSInvalidArgumentException
                    format:@"-[%@ count]: unrecognized selector sent to instance",
                           NSStringFromClass([perfStats class])];
    if (perfStats) logf_("  perfStats given");
    _ANERequest *r = [[_ANERequest alloc] init];
    r->inputs = [ins copy];
    r->inputIndices = [inIdx copy];
    r->outputs = [outs copy];
    r->outputIndices = [outIdx copy];
    r->procedureIndex = [procedure retain];
    r->perfStats = [perfStats retain];
    count(&live_objects, 1);
    return [r autorelease];
}
- (void)dealloc {
    [inputs release];
    [inputIndices release];
    [outputs release];
    [outputIndices release];
    [procedureIndex release];
    [perfStats release];
    count(&live_objects, -1);
    [super dealloc];
}
@end
#endif

/* ---- _ANEInMemoryModelDescriptor ------------------------------------------- */

@interface _ANEInMemoryModelDescriptor : NSObject {
@public
    NSData *milText;
    NSDictionary *weights;       /* key -> {offset, data} */
    NSString *hexId;
    int mode;                    /* the mode when it was made */
}
@end

static void hex_lower20(const void *data, size_t n, char *out) {
    sha256_ctx ctx;
    uint8_t d[32];
    sha256_init(&ctx);
    sha256_update(&ctx, data, n);
    sha256_final(&ctx, d);
    for (int i = 0; i < 10; i++) sprintf(out + 2 * i, "%02x", d[i]);
}

static void hex_upper(const uint8_t d[32], char out[65]) {
    for (int i = 0; i < 32; i++) sprintf(out + 2 * i, "%02X", d[i]);
}

/* The identifier public reverse engineering shows (iOS 26.1): upper-case hex
 * SHA-256 of the MIL text, of the weight data (4 zero bytes, then each
 * entry's data in sorted key order), and of the options, joined by "_". */
static NSString *observed_identifier(NSData *mil, NSArray *keys, NSDictionary *w, id options) {
    sha256_ctx ctx;
    uint8_t d[32];
    char a[65], b[65], c[65];
    sha256_init(&ctx);
    sha256_update(&ctx, [mil bytes], [mil length]);
    sha256_final(&ctx, d);
    hex_upper(d, a);
    static const uint8_t zero[4];
    sha256_init(&ctx);
    sha256_update(&ctx, zero, sizeof zero);
    for (NSUInteger i = 0; i < [keys count]; i++) {
        NSData *data = [[[w objectForKey:[keys objectAtIndex:i]] allValues] objectAtIndex:0];
        sha256_update(&ctx, [data bytes], [data length]);
    }
    sha256_final(&ctx, d);
    hex_upper(d, b);
    const char *opt = options ? [[options description] UTF8String] : "";
    sha256_init(&ctx);
    sha256_update(&ctx, opt, strlen(opt));
    sha256_final(&ctx, d);
    hex_upper(d, c);
    return [NSString stringWithFormat:@"%s_%s_%s", a, b, c];
}

/* The keys-only identifier of the permissive mode (the belief of §4.1). */
static NSString *keys_identifier(NSData *mil, NSArray *keys, id options) {
    NSMutableData *key_bytes = [NSMutableData data];
    for (NSUInteger i = 0; i < [keys count]; i++) {
        const char *k = [[keys objectAtIndex:i] UTF8String];
        [key_bytes appendBytes:k length:strlen(k) + 1];
    }
    char hex[61];
    hex_lower20([mil bytes], [mil length], hex);
    hex_lower20([key_bytes bytes], [key_bytes length], hex + 20);
    const char *opt = options ? [[options description] UTF8String] : "";
    hex_lower20(opt, strlen(opt), hex + 40);
    hex[60] = '\0';
    return [NSString stringWithUTF8String:hex];
}

@implementation _ANEInMemoryModelDescriptor
+ (id)modelWithMILText:(NSData *)mil weights:(NSDictionary *)w optionsPlist:(id)options {
    logf_("+[_ANEInMemoryModelDescriptor modelWithMILText:weights:optionsPlist:] weights=%lu",
          (unsigned long)[w count]);
    if (take_fault("modelWithMILText:weights:optionsPlist:") >= 0) return nil;
    if (![(id)mil isKindOfClass:[NSData class]]) {   /* ANE-C26: an NSString fails */
        logf_("  refused: milText is not NSData");
        return nil;
    }
    if (!w)   /* ANE-C27: nil crashes; the stand-in raises instead */
        [NSException raise:NSInvalidArgumentException format:@"weights dictionary is nil"];
    NSArray *keys = [[w allKeys] sortedArrayUsingSelector:@selector(compare:)];
    for (NSUInteger i = 0; i < [keys count]; i++) {
        NSString *k = [keys objectAtIndex:i];
        NSDictionary *v = [w objectForKey:k];
        if (![k isKindOfClass:[NSString class]] || ![k hasPrefix:@"@model_path/"] ||
            ![v isKindOfClass:[NSDictionary class]] ||
            ![[v objectForKey:@"offset"] isKindOfClass:[NSNumber class]] ||
            ![[v objectForKey:@"data"] isKindOfClass:[NSData class]]) {
            logf_("  refused: weight entry %s is not key -> {offset, data}",
                  [[k description] UTF8String]);
            return nil;
        }
        /* The framework hashes the entry's first value as data. */
        if (![[[v allValues] objectAtIndex:0] isKindOfClass:[NSData class]]) {
            logf_("  refused: the first value of weight entry %s is not NSData", [k UTF8String]);
            return nil;
        }
    }
    _ANEInMemoryModelDescriptor *d = [[_ANEInMemoryModelDescriptor alloc] init];
    d->mode = standin_mode();
    d->milText = [mil copy];
    d->weights = [w copy];
    d->hexId = [(d->mode == MODE_PERMISSIVE ? keys_identifier(mil, keys, options)
                                            : observed_identifier(mil, keys, w, options)) retain];
    logf_("  identifier %s", [d->hexId UTF8String]);
    count(&live_objects, 1);
    return [d autorelease];
}
- (void)dealloc {
    [milText release];
    [weights release];
    [hexId release];
    count(&live_objects, -1);
    [super dealloc];
}
@end

/* ---- _ANEInMemoryModel ------------------------------------------------------ */

@interface _ANEInMemoryModel : NSObject {
@public
    _ANEInMemoryModelDescriptor *descriptor;
    orion_program inner;         /* the program on vane, in the stand-in's own core */
    NSString *inner_key;         /* the aned cache key whose program inner runs */
    NSString *aned_dir;          /* where aned keeps inner's folder (not the temp folder) */
    int compiled, loaded;
    NSDictionary *bundle;        /* verify modes: file -> SHA-256 at compile */
}
@end

static NSString *temp_folder(_ANEInMemoryModelDescriptor *d) {
    return [NSTemporaryDirectory() stringByAppendingPathComponent:d->hexId];
}

static NSString *relative(NSString *key) { return [key substringFromIndex:[@"@model_path/" length]]; }

/* The inner program's weight file replaced by new bytes: a new file renamed over
 * it, so that other inner programs whose files the inner core hard-linked to it
 * (equal bytes, weight_share.h) keep theirs. */
static int replace_file(const char *path, const void *data, size_t n) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.standin-new", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) return -1;
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(fd, (const char *)data + done, n - done);
        if (w <= 0) {
            close(fd);
            unlink(tmp);
            return -1;
        }
        done += (size_t)w;
    }
    if (close(fd) != 0 || rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* aned's cache of compiled programs, by identifier (observed and verify modes):
 * what load serves, whatever the temp folder holds by then. */
static NSMutableSet *aned_cache;

static int cached(NSString *hex) {
    pthread_mutex_lock(&state_lock);
    int hit = aned_cache && [aned_cache containsObject:hex];
    pthread_mutex_unlock(&state_lock);
    return hit;
}

static void cache_put(NSString *hex, int present) {
    pthread_mutex_lock(&state_lock);
    if (!aned_cache) aned_cache = [[NSMutableSet alloc] init];
    if (present) [aned_cache addObject:hex];
    else [aned_cache removeObject:hex];
    pthread_mutex_unlock(&state_lock);
}

/* One device compile, against the per-process limit (ANE-C31). */
static BOOL spend_device_compile(NSError **error) {
    pthread_mutex_lock(&state_lock);
    int limit = limit_locked(), refused = compiles >= limit;
    compiles++;
    pthread_mutex_unlock(&state_lock);
    if (refused && error)
        *error = device_error(3, [NSString stringWithFormat:@"_ANECompiler : ANECCompile() "
                                  "FAILED: this process has used its %d compiles", limit]);
    if (!refused) compile_delay();
    return !refused;
}

/* The weight files as they stand in the temp folder, key -> bytes (a missing file
 * is left out). */
static NSDictionary *folder_weights(_ANEInMemoryModelDescriptor *d) {
    NSString *folder = temp_folder(d);
    NSMutableDictionary *out = [NSMutableDictionary dictionary];
    NSArray *keys = [d->weights allKeys];
    for (NSUInteger i = 0; i < [keys count]; i++) {
        NSString *key = [keys objectAtIndex:i];
        NSData *bytes = [NSData dataWithContentsOfFile:
                                    [folder stringByAppendingPathComponent:relative(key)]];
        if (bytes) [out setObject:bytes forKey:key];
    }
    return out;
}

/* The descriptor's weights, key -> bytes. */
static NSDictionary *descriptor_weights(_ANEInMemoryModelDescriptor *d) {
    NSMutableDictionary *out = [NSMutableDictionary dictionary];
    NSArray *keys = [d->weights allKeys];
    for (NSUInteger i = 0; i < [keys count]; i++)
        [out setObject:[[d->weights objectForKey:[keys objectAtIndex:i]] objectForKey:@"data"]
                forKey:[keys objectAtIndex:i]];
    return out;
}

/* SHA-256 over weights (key -> bytes) in the order of `keys`, upper-case hex. */
static NSString *weights_digest(NSDictionary *weights, NSArray *keys) {
    sha256_ctx ctx;
    uint8_t d[32];
    char hex[65];
    sha256_init(&ctx);
    for (NSUInteger i = 0; i < [keys count]; i++) {
        NSData *bytes = [weights objectForKey:[keys objectAtIndex:i]];
        if (bytes) sha256_update(&ctx, [bytes bytes], [bytes length]);
    }
    sha256_final(&ctx, d);
    hex_upper(d, hex);
    return [NSString stringWithUTF8String:hex];
}

static NSArray *sorted_keys(_ANEInMemoryModelDescriptor *d) {
    return [[d->weights allKeys] sortedArrayUsingSelector:@selector(compare:)];
}

/* The descriptor's program on vane, from `weights` (key -> bytes: the descriptor's,
 * or the temp folder's for a compile at load in compile-on-miss mode). Its inner
 * folder is aned's, outside the client's temp folder (which a client may remove
 * once compiled): one per model object (two models may share a hex id, and two
 * programs of one MIL and keys cannot share a cache folder in the inner core). */
static BOOL compile_inner(_ANEInMemoryModel *m, NSDictionary *weights, NSError **error) {
    _ANEInMemoryModelDescriptor *d = m->descriptor;
    NSArray *keys = sorted_keys(d);
    NSUInteger n = [keys count];
    orion_weight_file *files = calloc(n ? n : 1, sizeof *files);
    for (NSUInteger i = 0; i < n; i++) {
        NSString *key = [keys objectAtIndex:i];
        NSData *bytes = [weights objectForKey:key];
        files[i].key = [key UTF8String];
        files[i].data = [bytes bytes];
        files[i].nbytes = [bytes length];
    }
    if (m->inner) {
        if (m->loaded) orion_program_unload(m->inner);
        orion_program_release(m->inner);
        m->inner = 0;
        m->loaded = 0;
    }
    if (!m->aned_dir) {
        static int serial;
        pthread_mutex_lock(&state_lock);
        int mine = ++serial;
        pthread_mutex_unlock(&state_lock);
        m->aned_dir = [[[NSTemporaryDirectory() stringByAppendingPathComponent:@"standin-aned"]
                          stringByAppendingPathComponent:[NSString stringWithFormat:@"%d", mine]]
                          retain];
    }
    /* no store key: the stand-in's aned keeps its own folders, as the device's does */
    orion_compile_options opts = {"vane", [m->aned_dir fileSystemRepresentation],
                                  ORION_NUMERICS_FP16, NULL};
    orion_program p = 0;
    orion_status st = orion_program_compile([d->milText bytes], [d->milText length], files, n,
                                            &opts, &p);
    free(files);
    if (st != ORION_OK) {
        if (error) *error = device_error(1, [NSString stringWithFormat:@"InvalidMILProgram: %@",
                                             inner_error()]);
        return NO;
    }
    m->inner = p;
    m->compiled = 1;
    [m->inner_key release];
    m->inner_key = nil;
    return YES;
}

/* macOS 27, as pmetal reports it: the descriptor hashed the weight entries in one
 * order and the compiler service rehashes the bundle's files in another (here:
 * descending and ascending key order), so a program with several distinct weight
 * files fails verifyBundleAtPath with a hash mismatch, Code=10. One file has one
 * order. */
static BOOL verify_hash_order(_ANEInMemoryModelDescriptor *d, NSError **error) {
    NSArray *keys = sorted_keys(d);
    NSString *theirs = weights_digest(descriptor_weights(d),
                                      [[keys reverseObjectEnumerator] allObjects]);
    NSString *ours = weights_digest(folder_weights(d), keys);
    if ([theirs isEqualToString:ours]) return YES;
    logf_("  verifyBundleAtPath: %lu weight files hashed in another order",
          (unsigned long)[keys count]);
    if (error) *error = device_error(10, [NSString stringWithFormat:@"verifyBundleAtPath: hash "
                                         "mismatch (Code=10): %lu weight files in %@",
                                         (unsigned long)[keys count], temp_folder(d)]);
    return NO;
}

/* aned's cache key for a load. compile-on-miss: the identifier and the weights the
 * temp folder holds (the descriptor's when there is no folder): a folder edited
 * since is a miss. Other modes: the identifier alone. */
static NSString *cache_key(_ANEInMemoryModelDescriptor *d) {
    if (d->mode != MODE_COMPILE_ON_MISS) return d->hexId;
    BOOL is_dir = NO;
    BOOL present = [[NSFileManager defaultManager] fileExistsAtPath:temp_folder(d)
                                                        isDirectory:&is_dir] && is_dir;
    NSDictionary *w = present ? folder_weights(d) : descriptor_weights(d);
    return [NSString stringWithFormat:@"%@#%@", d->hexId, weights_digest(w, sorted_keys(d))];
}

/* The files of the bundle that verify mode checks, with their SHA-256. */
static NSDictionary *bundle_digests(_ANEInMemoryModelDescriptor *d) {
    NSString *folder = temp_folder(d);
    NSMutableArray *names = [NSMutableArray arrayWithObjects:@"model.mil", @"net.plist", @"data", nil];
    NSArray *keys = [d->weights allKeys];
    for (NSUInteger i = 0; i < [keys count]; i++) [names addObject:relative([keys objectAtIndex:i])];
    NSMutableDictionary *out = [NSMutableDictionary dictionary];
    for (NSUInteger i = 0; i < [names count]; i++) {
        NSData *bytes = [NSData dataWithContentsOfFile:
                                    [folder stringByAppendingPathComponent:[names objectAtIndex:i]]];
        uint8_t digest[32] = {0};
        if (bytes) {
            sha256_ctx ctx;
            sha256_init(&ctx);
            sha256_update(&ctx, [bytes bytes], [bytes length]);
            sha256_final(&ctx, digest);
        }
        [out setObject:[NSData dataWithBytes:digest length:32] forKey:[names objectAtIndex:i]];
    }
    return out;
}

@implementation _ANEInMemoryModel
+ (id)inMemoryModelWithDescriptor:(id)descriptor {
    logf_("+[_ANEInMemoryModel inMemoryModelWithDescriptor:]");
    if (take_fault("inMemoryModelWithDescriptor:") >= 0) return nil;
    if (![descriptor isKindOfClass:[_ANEInMemoryModelDescriptor class]]) return nil;
    _ANEInMemoryModel *m = [[_ANEInMemoryModel alloc] init];
    m->descriptor = [descriptor retain];
    count(&live_objects, 1);
    return [m autorelease];
}

- (NSString *)hexStringIdentifier {
    logf_("-[_ANEInMemoryModel hexStringIdentifier]");
    if (take_fault("hexStringIdentifier") >= 0)
        return [descriptor->hexId stringByAppendingString:@"0"];
    return descriptor->hexId;
}

/* The framework's own staging (saveModelFiles): model.mil from the descriptor,
 * and each entry's first value written under its first key, so every weight
 * entry lands in `data` and the last one written wins. */
static void save_model_files(_ANEInMemoryModelDescriptor *d, NSString *folder) {
    [[NSFileManager defaultManager] createDirectoryAtPath:folder withIntermediateDirectories:YES
                                               attributes:nil error:NULL];
    [d->milText writeToFile:[folder stringByAppendingPathComponent:@"model.mil"] atomically:YES];
    NSArray *keys = [d->weights allKeys];
    for (NSUInteger i = 0; i < [keys count]; i++) {
        NSDictionary *entry = [d->weights objectForKey:[keys objectAtIndex:i]];
        NSString *first = [[entry allKeys] objectAtIndex:0];
        [[entry objectForKey:first] writeToFile:[folder stringByAppendingPathComponent:first]
                                     atomically:YES];
    }
}

- (BOOL)compileWithQoS:(unsigned int)qos options:(NSDictionary *)options error:(NSError **)error {
    logf_("-[_ANEInMemoryModel compileWithQoS:options:error:] qos=%u", qos);
    if (!options) violation("compileWithQoS: options is nil (every project passes @{})");
    if (take_fault("compileWithQoS:options:error:") >= 0) {
        if (error) *error = device_error(3, @"_ANECompiler : ANECCompile() FAILED (injected)");
        return NO;
    }
    if (!spend_device_compile(error)) return NO;
    int permissive = descriptor->mode == MODE_PERMISSIVE;
    NSString *folder = temp_folder(descriptor);
    if (!permissive) save_model_files(descriptor, folder);
    /* ANE-C30: the compiler reads model.mil and the weights from the folder. */
    NSData *mil = [NSData dataWithContentsOfFile:[folder stringByAppendingPathComponent:@"model.mil"]];
    if (!mil || ![mil isEqualToData:descriptor->milText]) {
        if (error) *error = device_error(1, [NSString stringWithFormat:@"InvalidMILProgram: %@/"
                                             "model.mil is missing or is not the descriptor's text",
                                             folder]);
        return NO;
    }
    NSArray *keys = [descriptor->weights allKeys];
    for (NSUInteger i = 0; i < [keys count]; i++) {
        NSString *key = [keys objectAtIndex:i];
        NSString *path = [folder stringByAppendingPathComponent:relative(key)];
        NSData *bytes = [NSData dataWithContentsOfFile:path];
        NSData *given = [[descriptor->weights objectForKey:key] objectForKey:@"data"];
        if (!bytes || ![bytes isEqualToData:given]) {
            if (error) *error = device_error(1, [NSString stringWithFormat:@"InvalidMILProgram: "
                                                 "weight file %@ is missing or differs from the "
                                                 "descriptor", path]);
            return NO;
        }
    }
    if (descriptor->mode == MODE_MACOS27 && !verify_hash_order(descriptor, error)) return NO;
    if (!compile_inner(self, descriptor_weights(descriptor), error)) return NO;
    NSString *plist = [NSString stringWithFormat:@"{ identifier = \"%@\"; }\n", descriptor->hexId];
    [plist writeToFile:[folder stringByAppendingPathComponent:@"net.plist"] atomically:YES];
    if (permissive) {
        /* The old belief: `data` is the single weight file itself. */
        if ([keys count] == 1)
            [[[descriptor->weights objectForKey:[keys objectAtIndex:0]] objectForKey:@"data"]
                writeToFile:[folder stringByAppendingPathComponent:@"data"] atomically:NO];
        return YES;
    }
    NSString *key = cache_key(descriptor);
    cache_put(key, 1);
    inner_key = [key retain];
    if (verifies(descriptor->mode)) {
        [bundle release];
        bundle = [bundle_digests(descriptor) retain];
    }
    return YES;
}

/* permissive: the weights are read again from the temp folder, where there is one
 * (a client may remove it once compiled: the program keeps the weights it has). */
static BOOL reread_weights(_ANEInMemoryModel *m, NSError **error) {
    NSString *folder = temp_folder(m->descriptor);
    if (![[NSFileManager defaultManager] fileExistsAtPath:folder]) return YES;
    NSArray *keys = [m->descriptor->weights allKeys];
    for (NSUInteger i = 0; i < [keys count]; i++) {
        NSString *key = [keys objectAtIndex:i];
        NSData *bytes = [NSData dataWithContentsOfFile:
                                    [folder stringByAppendingPathComponent:relative(key)]];
        NSData *baked = [[m->descriptor->weights objectForKey:key] objectForKey:@"data"];
        char path[4096];
        if (!bytes || [bytes length] != [baked length] ||
            orion_program_weight_path(m->inner, [key UTF8String], path, sizeof path) != ORION_OK ||
            replace_file(path, [bytes bytes], [bytes length]) != 0) {
            if (error) *error = device_error(0x50004, [NSString stringWithFormat:@"Program load "
                                                 "failure (0x50004): weight file for %@ is missing "
                                                 "or changed size", key]);
            return NO;
        }
    }
    return YES;
}

/* observed, verify, macos27: what aned holds for the identifier, compiled at load
 * (counted as a device compile, and slow) when it holds nothing. compile-on-miss:
 * what aned holds for the identifier and the temp folder's weights, compiled at
 * load from the folder as it stands when it holds nothing: an edited folder takes
 * effect, each time at the price of a compile nobody asked for. */
static BOOL serve_from_cache(_ANEInMemoryModel *m, NSError **error) {
    _ANEInMemoryModelDescriptor *d = m->descriptor;
    NSString *key = cache_key(d);
    if (m->compiled && cached(key) && m->inner_key && [m->inner_key isEqualToString:key])
        return YES;
    BOOL from_folder = d->mode == MODE_COMPILE_ON_MISS &&
                       [[NSFileManager defaultManager] fileExistsAtPath:temp_folder(d)];
    if (!cached(key)) {
        logf_("  compile at load: %s not in aned's cache",
              d->mode == MODE_COMPILE_ON_MISS ? "these weights" : "identifier");
        if (!spend_device_compile(error)) return NO;
        if (!from_folder) save_model_files(d, temp_folder(d));
        if (d->mode == MODE_MACOS27 && !verify_hash_order(d, error)) return NO;
        cache_put(key, 1);
    }
    /* the cached program, for this model object */
    if (!compile_inner(m, from_folder ? folder_weights(d) : descriptor_weights(d), error))
        return NO;
    m->inner_key = [key retain];
    return YES;
}

/* A bundle file changed since compile fails the load. No temp folder at all (a
 * client removed it once compiled) is no bundle to check: the load is served from
 * aned's cache, as pmetal observes. */
static BOOL verify_bundle(_ANEInMemoryModel *m, NSError **error) {
    if (!m->bundle || ![[NSFileManager defaultManager] fileExistsAtPath:temp_folder(m->descriptor)])
        return YES;
    NSDictionary *now = bundle_digests(m->descriptor);
    NSArray *names = [m->bundle allKeys];
    for (NSUInteger i = 0; i < [names count]; i++) {
        NSString *name = [names objectAtIndex:i];
        if (![[m->bundle objectForKey:name] isEqualToData:[now objectForKey:name]]) {
            if (error) *error = device_error(0x50004, [NSString stringWithFormat:@"Program load "
                                                 "failure (0x50004): verifyBundleAtPath: hash "
                                                 "mismatch for %@", name]);
            return NO;
        }
    }
    return YES;
}

- (BOOL)loadWithQoS:(unsigned int)qos options:(NSDictionary *)options error:(NSError **)error {
    logf_("-[_ANEInMemoryModel loadWithQoS:options:error:] qos=%u", qos);
    if (!options) violation("loadWithQoS: options is nil (every project passes @{})");
    if (take_fault("loadWithQoS:options:error:") >= 0) {
        if (error) *error = device_error(0x50004, @"Program load failure (0x50004) (injected)");
        return NO;
    }
    if (loaded) return YES;
    if (descriptor->mode == MODE_PERMISSIVE) {
        if (!compiled) {
            if (error)
                *error = device_error(0x50004, @"Program load failure: the model is not compiled");
            return NO;
        }
        if (!reread_weights(self, error)) return NO;
    } else {
        if (verifies(descriptor->mode) && !verify_bundle(self, error)) return NO;
        if (!serve_from_cache(self, error)) return NO;
    }
    if (orion_program_load(inner) != ORION_OK) {
        if (error) *error = device_error(0x50004, [NSString stringWithFormat:@"Program load failure "
                                             "(0x50004): %@", inner_error()]);
        return NO;
    }
    loaded = 1;
    count(&loads, 1);
    return YES;
}

- (void)purgeCompiledModel {
    logf_("-[_ANEInMemoryModel purgeCompiledModel]");
    if (descriptor->mode != MODE_PERMISSIVE) cache_put(cache_key(descriptor), 0);
}
static NSError *status_1d(const char *why) {
    logf_("  0x1d: %s", why);
    return device_error(0x1d, @STATUS_0X1D);
}

/* Checks one group and binds it: surface k -> symbol index[k]. */
static const char *bind_group(NSArray *objects, NSArray *indices, orion_program p, int is_output,
                              StandinIOSurface **bound) {
    uint32_t n_in, n_out;
    orion_program_io_count(p, &n_in, &n_out);
    uint32_t n = is_output ? n_out : n_in;
    if ([objects count] != n) return "the request has the wrong number of surfaces";
    for (uint32_t j = 0; j < n; j++) bound[j] = nil;
    size_t size0 = 0;
    for (uint32_t k = 0; k < n; k++) {
        _ANEIOSurfaceObject *o = [objects objectAtIndex:k];
        long j = [[indices objectAtIndex:k] longValue];
        if (j < 0 || j >= (long)n || bound[j]) return "indices are not a permutation of 0..n-1";
        bound[j] = o->surface;
        size_t size = o->surface->alloc;
        if (k == 0) size0 = size;
        if (size != size0) return "surfaces of one group differ in size (ANE-C17, ANE-C18)";
        if (size < MIN_SURFACE_BYTES) return "a surface is under 49152 bytes (ANE-C23)";
        orion_io_info info;
        orion_program_io(p, is_output, (uint32_t)j, &info);
        if (size < info.nbytes) return "a surface is smaller than its tensor (ANE-C25)";
    }
    return NULL;
}

- (BOOL)evaluateWithQoS:(unsigned int)qos options:(NSDictionary *)options request:(id)request
                  error:(NSError **)error {
    logf_("-[_ANEInMemoryModel evaluateWithQoS:options:request:error:] qos=%u", qos);
    if (!options) violation("evaluateWithQoS: options is nil (every project passes @{})");
    if (take_fault("evaluateWithQoS:options:request:error:") >= 0) {
        if (error) *error = status_1d("injected");
        return NO;
    }
    Class request_class = NSClassFromString(@"_ANERequest");
    if (!request_class || ![request isKindOfClass:request_class]) {
        if (error) *error = status_1d("not an _ANERequest");
        return NO;
    }
    if (!loaded) {
        if (error) *error = status_1d("the model is not loaded");
        return NO;
    }
    NSArray *ins = [request valueForKey:@"inputs"], *in_idx = [request valueForKey:@"inputIndices"];
    NSArray *outs = [request valueForKey:@"outputs"], *out_idx = [request valueForKey:@"outputIndices"];
    uint32_t n_in, n_out;
    orion_program_io_count(inner, &n_in, &n_out);
    StandinIOSurface **bound = calloc((size_t)n_in + n_out + 1, sizeof *bound);
    const char *why = bind_group(ins, in_idx, inner, 0, bound);
    if (!why) why = bind_group(outs, out_idx, inner, 1, bound + n_in);
    if (why) {
        free(bound);
        if (error) *error = status_1d(why);
        return NO;
    }
    int cpu_locked = 0;
    for (uint32_t j = 0; j < n_in + n_out; j++) cpu_locked += bound[j]->depth > 0;
    logf_("  bound %u inputs, %u outputs; %d held a CPU lock", n_in, n_out, cpu_locked);
    /* The device's reads and writes: copies to and from the inner surfaces. */
    orion_surface *s = calloc((size_t)n_in + n_out + 1, sizeof *s);
    orion_status st = ORION_OK;
    for (uint32_t j = 0; j < n_in + n_out && st == ORION_OK; j++) {
        void *base = NULL;
        st = orion_surface_create(bound[j]->alloc, &s[j]);
        if (st == ORION_OK) st = orion_surface_base_address(s[j], &base);
        if (st == ORION_OK && j < n_in) memcpy(base, bound[j]->base, bound[j]->alloc);
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (st == ORION_OK) st = orion_program_eval(inner, s, n_in, s + n_in, n_out);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (st == ORION_OK)
        record_hw_time([request valueForKey:@"perfStats"],
                       (unsigned long long)((t1.tv_sec - t0.tv_sec) * 1000000000LL +
                                            (t1.tv_nsec - t0.tv_nsec)));
    for (uint32_t j = n_in; st == ORION_OK && j < n_in + n_out; j++) {
        orion_io_info info;
        void *base = NULL;
        orion_program_io(inner, 1, j - n_in, &info);
        if ((st = orion_surface_base_address(s[j], &base)) == ORION_OK)
            memcpy(bound[j]->base, base, (size_t)info.nbytes);
    }
    NSString *message = st == ORION_OK ? nil : inner_error();
    for (uint32_t j = 0; j < n_in + n_out; j++)
        if (s[j]) orion_surface_release(s[j]);
    free(s);
    free(bound);
    if (st != ORION_OK) {
        if (error) *error = device_error(0x1d, [NSString stringWithFormat:@"%s (%@)", STATUS_0X1D,
                                                message]);
        return NO;
    }
    return YES;
}

- (BOOL)unloadWithQoS:(unsigned int)qos error:(NSError **)error {
    logf_("-[_ANEInMemoryModel unloadWithQoS:error:] qos=%u", qos);
    if (take_fault("unloadWithQoS:error:") >= 0) {
        if (error) *error = device_error(0x50004, @"Program unload failure (injected)");
        return NO;
    }
    if (loaded) orion_program_unload(inner);
    loaded = 0;
    return YES;
}

- (void)dealloc {
    logf_("-[_ANEInMemoryModel dealloc]");
    if (loaded) violation("a model was released while loaded (the device keeps its resources)");
    if (inner) orion_program_release(inner);
    if (aned_dir) rmdir([aned_dir fileSystemRepresentation]);   /* empty once inner is gone */
    [aned_dir release];
    [inner_key release];
    [descriptor release];
    [bundle release];
    count(&live_objects, -1);
    [super dealloc];
}
@end

/* The private copy of the core counts only what the stand-in does; the device
 * limit above is the budget that matters here. */
__attribute__((constructor)) static void standin_init(void) { orion_set_compile_budget(1000000); }
