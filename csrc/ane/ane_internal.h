/* ane_internal.h -- what the ane backend's Objective-C files share: the
 * private framework as loaded at run time, and the method signatures of the
 * private classes (docs/ane-facts.md §1).
 *
 * The framework is never linked: it is dlopen'ed by its documented path (or
 * by ORION_ANE_FRAMEWORK, which is how Linux CI loads the stand-in under
 * tests/ane_standin), its classes are found with NSClassFromString, and the
 * IOSurface / CoreFoundation functions are resolved with dlsym, from the
 * framework's handle first (its dependencies on macOS; the stand-in itself on
 * Linux), then from IOSurface.framework. So this source includes no private
 * header and no IOSurface header, and compiles with Apple's clang and with
 * GCC's Objective-C against GNUstep Base: manual retain/release (no ARC), no
 * object literals, no @autoreleasepool blocks. */
#ifndef ORION_ANE_INTERNAL_H
#define ORION_ANE_INTERNAL_H

#import <Foundation/Foundation.h>

#include <stddef.h>
#include <stdint.h>

#include "../orion.h"
#include "../core/surface.h"
#include "../mil/mil.h"

#define ANE_DEFAULT_FRAMEWORK \
    "/System/Library/PrivateFrameworks/AppleNeuralEngine.framework/AppleNeuralEngine"
#define ANE_DEFAULT_IOSURFACE "/System/Library/Frameworks/IOSurface.framework/IOSurface"
#define ANE_QOS 21u                 /* §1.3: the QoS every project uses */
#define ANE_LOCK_READ_ONLY 1u       /* kIOSurfaceLockReadOnly */

/* ---- the private classes' methods, as used (§1.2) ----------------------- */

/* Class methods are declared as instance methods of protocols: a class object
 * receives them like any object, and the declarations give the compiler the
 * exact argument types without any private header. */
@protocol OrionANEDescriptorClass
- (id)modelWithMILText:(NSData *)milText weights:(NSDictionary *)weights optionsPlist:(id)options;
@end

@protocol OrionANEModelClass
- (id)inMemoryModelWithDescriptor:(id)descriptor;
@end

@protocol OrionANEModel
- (NSString *)hexStringIdentifier;
- (BOOL)compileWithQoS:(unsigned int)qos options:(NSDictionary *)options error:(NSError **)error;
- (BOOL)loadWithQoS:(unsigned int)qos options:(NSDictionary *)options error:(NSError **)error;
- (BOOL)evaluateWithQoS:(unsigned int)qos options:(NSDictionary *)options request:(id)request
                  error:(NSError **)error;
- (BOOL)unloadWithQoS:(unsigned int)qos error:(NSError **)error;
@end

/* Optional: not every framework build is known to have it (sent only after
 * respondsToSelector:, by the ane_smoke "purge" variant). */
@protocol OrionANEModelPurge
- (void)purgeCompiledModel;
@end

/* +[_ANEDeviceInfo hasANE] and +isVirtualMachine: class methods of the framework
 * (the decompiled class reads kern.hv_vmm_present for the latter). */
@protocol OrionANEDeviceInfoClass
- (BOOL)hasANE;
- (BOOL)isVirtualMachine;
@end

/* _ANEPerformanceStats as pmetal uses it before macOS 27: made by the factory, passed
 * as the request's perfStats, read after the evaluation. */
@protocol OrionANEPerfStatsClass
- (id)statsWithHardwareExecutionNS:(NSNumber *)ns;
@end

@protocol OrionANEPerfStats
- (unsigned long long)hwExecutionTime;
@end

@protocol OrionANERequestClass
- (id)requestWithInputs:(NSArray *)inputs inputIndices:(NSArray *)inputIndices
                outputs:(NSArray *)outputs outputIndices:(NSArray *)outputIndices
          weightsBuffer:(id)weightsBuffer perfStats:(id)perfStats
         procedureIndex:(NSNumber *)procedureIndex;
@end

@protocol OrionANEIOSurfaceObjectClass
- (id)objectWithIOSurface:(void *)surface;
@end

/* Selector spellings, for availability checks and error messages. */
#define SEL_DESCRIPTOR "modelWithMILText:weights:optionsPlist:"
#define SEL_MODEL "inMemoryModelWithDescriptor:"
#define SEL_HEXID "hexStringIdentifier"
#define SEL_COMPILE "compileWithQoS:options:error:"
#define SEL_LOAD "loadWithQoS:options:error:"
#define SEL_EVAL "evaluateWithQoS:options:request:error:"
#define SEL_UNLOAD "unloadWithQoS:error:"
#define SEL_REQUEST \
    "requestWithInputs:inputIndices:outputs:outputIndices:weightsBuffer:perfStats:procedureIndex:"
#define SEL_IOSURFACE_OBJECT "objectWithIOSurface:"
#define SEL_HAS_ANE "hasANE"
#define SEL_IS_VM "isVirtualMachine"
#define SEL_PERF_STATS "statsWithHardwareExecutionNS:"
#define SEL_HW_TIME "hwExecutionTime"
#define ANE_MACOS_FLOOR 15   /* the MIL says func main<ios18>: the macOS 15 opset */

/* ---- the framework as loaded -------------------------------------------- */

typedef struct ane_framework {
    char path[1024];               /* what was dlopen'ed */
    void *handle;                  /* the framework (or the stand-in) */
    void *iosurface_handle;        /* IOSurface.framework, if a symbol was not in handle */
    Class descriptor_class;        /* _ANEInMemoryModelDescriptor */
    Class model_class;             /* _ANEInMemoryModel */
    Class request_class;           /* _ANERequest */
    Class iosurface_object_class;  /* _ANEIOSurfaceObject */
    Class perf_stats_class;        /* _ANEPerformanceStats, or Nil: no device time offered */
    /* sysctlbyname (libSystem, through the framework's handle; the stand-in's on Linux) */
    int (*sysctlbyname)(const char *name, void *oldp, size_t *oldlenp, void *newp,
                        size_t newlen);
    /* IOSurface.framework and CoreFoundation (C functions, resolved with dlsym) */
    void *(*IOSurfaceCreate)(const void *properties);
    int (*IOSurfaceLock)(void *surface, uint32_t options, uint32_t *seed);
    int (*IOSurfaceUnlock)(void *surface, uint32_t options, uint32_t *seed);
    void *(*IOSurfaceGetBaseAddress)(void *surface);
    size_t (*IOSurfaceGetAllocSize)(void *surface);
    void (*CFRelease)(const void *object);
    /* the property keys (CFStringRef, toll-free bridged to NSString) */
    id kWidth, kHeight, kBytesPerElement, kBytesPerRow, kAllocSize, kPixelFormat;
} ane_framework;

/* The framework, loaded once per process; NULL if it is unusable, or this
 * machine cannot use it (ane_device.m), with the reason in `why` (which otherwise
 * says what was found). */
const ane_framework *ane_framework_get(char *why, size_t capacity);

/* ---- this machine (ane_device.m) ----------------------------------------------- */

/* 1 if the process can use the device: macOS 15 or later (ANE_MACOS_FLOOR), a
 * native arm64 process (not under Rosetta), not a virtual machine, and
 * +[_ANEDeviceInfo hasANE]. Otherwise 0 with the reason in `why`; on success `why`
 * says what was checked. */
int ane_device_usable(const ane_framework *f, char *why, size_t capacity);

/* Records an Orion error for a failed private call: the selector (as
 * "-[_ANEInMemoryModel compileWithQoS:options:error:]"), then what went wrong:
 * the NSError's text, domain and code; an exception's name and reason; or
 * `what` (e.g. "returned nil") when there is neither. Returns status. */
orion_status ane_fail_call(orion_status status, const char *call, NSError *error,
                           NSException *exception, const char *what);

/* ---- one device program (ane_model.m) -------------------------------------- */

typedef struct ane_model {
    id model;                 /* _ANEInMemoryModel, retained */
    char hex_id[256];         /* hexStringIdentifier, fixed when the model was made */
    char *tmp_dir;            /* NSTemporaryDirectory()/<hex_id> */
    int users_fd;             /* shared flock on tmp_dir/.orion-users while we hold it, or -1 */
    long staged;              /* which weight file the staging `data` copy holds, or -1 */
    int loaded, registered;
    /* timings, for telling a load that compiled from one that did not */
    uint64_t compile_ns;      /* the compile that made this device program */
    uint64_t plain_load_ns;   /* its fastest load that compiled nothing (0: none yet) */
    uint64_t last_load_ns;    /* the last successful load */
    int loads_seen;           /* successful loads so far */
    struct ane_model *next;   /* the registry of identifiers in use */
} ane_model;

/* Descriptor and model from the MIL text and the weight files, the temp
 * folder written (model.mil, weights/), and, with `compile`, compiled (timed).
 * Without `keep_folder` the temp folder is left once compiled (the device keeps
 * the program; docs/ane-backend.md, "Disk"). */
orion_status ane_model_create(const ane_framework *f, const uint8_t *mil_text, uint64_t mil_len,
                              const orion_weight_file *weights, size_t n, int compile,
                              int keep_folder, ane_model **out);
orion_status ane_model_load(ane_model *m);     /* loadWithQoS:, one retry; timed */
/* 1 when the last load took a compile's time (`why` says by how much): at least
 * halfway from this program's plain load to its compile, which must itself be
 * clearly slower than a plain load. With `may_be_baseline`, the first load after
 * the compile is never one: it measures the plain load. */
int ane_model_load_compiled(ane_model *m, int may_be_baseline, char *why, size_t capacity);
orion_status ane_model_unload(ane_model *m);
/* purgeCompiledModel, where the framework has it; 1 if it was sent. */
int ane_model_purge(ane_model *m);
/* The temp folder written again (model.mil, the weight files, and `data` where
 * compile staged one), held for this process; and left (removed by its last user). */
orion_status ane_model_stage(ane_model *m, const uint8_t *mil_text, uint64_t mil_len,
                             const orion_weight_file *weights, size_t n);
void ane_model_unstage(ane_model *m);
int ane_model_staged(const ane_model *m);
/* Unloads if loaded, releases, leaves (and, if last, removes) the temp folder. */
void ane_model_free(ane_model *m);

/* ---- the temp folder, shared between processes (ane_temp.m) --------------------- */

/* Creates (if need be) and holds tmp_dir for this process: a shared flock on
 * tmp_dir/.orion-users, taken under the user's lock on temp-folder changes. */
orion_status ane_temp_enter(const char *tmp_dir, int *users_fd);
/* Drops the hold; the last holder removes the folder, under the same lock, so no
 * process ever holds a lock on a users file that another is deleting. */
void ane_temp_leave(const char *tmp_dir, int *users_fd);

char *ane_join(const char *dir, const char *rel);
orion_status ane_read_file(const char *path, uint8_t **out, uint64_t *size);
orion_status ane_write_in_place(const char *path, const uint8_t *data, uint64_t n);
orion_status ane_write_atomic(const char *path, const uint8_t *data, uint64_t n);

/* ---- the canary of the delta path (ane_probe.m) -------------------------- */

/* One evaluation on the device of the program being probed. */
typedef orion_status (*ane_eval_fn)(void *ctx, surface_impl *const *inputs, size_t n_inputs,
                                    surface_impl *const *outputs, size_t n_outputs);

/* Flips the sign of a fixed pattern of the fp16 / fp32 elements of a blob
 * file, in place: weights whose outputs differ from the originals'. */
orion_status ane_canary_bytes(uint8_t *blob, uint64_t n, const char *what);
/* The program's outputs (all of them, as float) for the fixed probe input:
 * on the device through `eval`, or on vane with the weight files of `folder`. */
orion_status ane_probe_device(const mil_program *program, ane_eval_fn eval, void *ctx, float **out,
                              size_t *n);
orion_status ane_probe_reference(const mil_program *program, const char *folder, float **out,
                                 size_t *n);
/* 1 if the device output matches vane's with the canary weights (`canary`) and the
 * probe can tell them from the weights the canary was made from (`plain`, vane's
 * outputs for those); `why` says what was seen either way. */
int ane_probe_judge(const float *device, const float *canary, const float *plain, size_t n,
                    char *why, size_t capacity);

/* ---- one program of the runtime on the device (ane_backend.m, ane_update.m) ---- */

typedef enum { DELTA_UNPROVEN, DELTA_PROVEN, DELTA_DEMOTED } delta_state;

typedef struct ane_program {
    ane_model *dev;           /* the device program now in use */
    const mil_program *mil;   /* the runtime's, alive until release (the canary's reference) */
    char *folder;             /* the runtime's program folder: the weights as they should be */
    size_t n_files;
    char **rel;               /* weight files, relative to the folders: "weights/w.bin" */
    uint8_t (*digest)[32];    /* SHA-256 of each weight file as the device program holds it */
    delta_state delta;        /* of the auto policy (ORION_ANE_DELTA) */
    char delta_why[512];      /* what decided it */
    uint32_t since_probe;     /* delta updates since the last probe (ORION_ANE_REPROBE) */
    uint32_t probes;          /* probes of this program */
    uint32_t hidden;          /* loads of it that took a compile's time (counted) */
    char hidden_why[256];     /* the last of them */
    int perf_stats;           /* ORION_ANE_PERF_STATS=1 at compile: device time asked per eval */
    int hw_offered;           /* the last eval read a device time into hw_ns */
    uint64_t hw_ns;
    char hw_why[256];         /* why no device time is read */
} ane_program;

/* ORION_ANE_DELTA: "auto" (unset), "recompile", "refuse", or a raw variant for
 * benchmarks/ane_smoke.py ("files", "data", "atomic", "purge", "descriptor"); NULL
 * for anything else. */
const char *ane_delta_policy(void);
int ane_delta_is_raw(const char *policy);
/* Keep a program's temp folder after its compile: for a raw variant, or with
 * ORION_ANE_KEEP_TEMP=1 (a framework that would read it at every load). */
int ane_keep_temp(void);

/* Loads the program (ane_update.m): as it is when the runtime's weight files still
 * hold what the device program was made from, otherwise as ORION_ANE_DELTA says. */
orion_status ane_update_load(const ane_framework *f, ane_program *ap);
/* How this program's updates go now, and why (orion_program_update_path). */
void ane_update_describe(const ane_program *ap, char *buf, size_t capacity);
/* One evaluation of the device program now in use, without perf stats (ane_backend.m). */
orion_status ane_eval_plain(const ane_framework *f, ane_model *m, surface_impl *const *inputs,
                            size_t n_inputs, surface_impl *const *outputs, size_t n_outputs);

#endif
