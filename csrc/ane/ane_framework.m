/* ane_framework.m -- loads AppleNeuralEngine.framework at run time (§1.1):
 * dlopen by its documented path, the four classes by NSClassFromString, the
 * selectors the backend sends checked up front, and the IOSurface functions
 * resolved with dlsym; then asks the device whether this process can use it
 * (ane_device.m: macOS floor, Rosetta, virtual machine, hasANE). Any gap makes
 * the backend unavailable with a reason that names what is missing; nothing
 * here is linked at build time. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "ane_internal.h"

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static ane_framework framework;
static int framework_ok;
static char framework_why[1024];

/* A symbol from the framework's handle (its dependencies on macOS; the
 * stand-in on Linux), else from IOSurface.framework. */
static void *resolve(const char *name) {
    void *p = dlsym(framework.handle, name);
    if (p) return p;
    if (!framework.iosurface_handle) {
        const char *path = getenv("ORION_ANE_IOSURFACE");
        framework.iosurface_handle =
            dlopen(path && *path ? path : ANE_DEFAULT_IOSURFACE, RTLD_NOW | RTLD_LOCAL);
    }
    return framework.iosurface_handle ? dlsym(framework.iosurface_handle, name) : NULL;
}

static int missing(const char *fmt, const char *a, const char *b) {
    snprintf(framework_why, sizeof framework_why, fmt, a, b);
    return 0;
}

static int check_class(Class *out, const char *name) {
    *out = NSClassFromString([NSString stringWithUTF8String:name]);
    if (!*out)
        return missing("class %s not found in %s (every class of the in-memory path must "
                       "resolve)", name, framework.path);
    return 1;
}

static int check_class_method(Class cls, const char *cls_name, const char *sel) {
    if ([cls respondsToSelector:NSSelectorFromString([NSString stringWithUTF8String:sel])])
        return 1;
    return missing("+[%s %s] is not implemented by this framework", cls_name, sel);
}

static int check_instance_method(Class cls, const char *cls_name, const char *sel) {
    if ([cls instancesRespondToSelector:NSSelectorFromString([NSString stringWithUTF8String:sel])])
        return 1;
    return missing("-[%s %s] is not implemented by this framework", cls_name, sel);
}

static int resolve_function(void **out, const char *name) {
    *out = resolve(name);
    if (!*out) return missing("function %s not found (in %s or IOSurface.framework)", name,
                              framework.path);
    return 1;
}

static int resolve_key(id *out, const char *name) {
    id *p = resolve(name);
    if (!p || !*p) return missing("constant %s not found (in %s or IOSurface.framework)", name,
                                  framework.path);
    *out = *p;
    return 1;
}

static int load_classes_and_functions(void) {
    ane_framework *f = &framework;
    return check_class(&f->descriptor_class, "_ANEInMemoryModelDescriptor") &&
           check_class(&f->model_class, "_ANEInMemoryModel") &&
           check_class(&f->request_class, "_ANERequest") &&
           check_class(&f->iosurface_object_class, "_ANEIOSurfaceObject") &&
           check_class_method(f->descriptor_class, "_ANEInMemoryModelDescriptor", SEL_DESCRIPTOR) &&
           check_class_method(f->model_class, "_ANEInMemoryModel", SEL_MODEL) &&
           check_instance_method(f->model_class, "_ANEInMemoryModel", SEL_HEXID) &&
           check_instance_method(f->model_class, "_ANEInMemoryModel", SEL_COMPILE) &&
           check_instance_method(f->model_class, "_ANEInMemoryModel", SEL_LOAD) &&
           check_instance_method(f->model_class, "_ANEInMemoryModel", SEL_EVAL) &&
           check_instance_method(f->model_class, "_ANEInMemoryModel", SEL_UNLOAD) &&
           check_class_method(f->request_class, "_ANERequest", SEL_REQUEST) &&
           check_class_method(f->iosurface_object_class, "_ANEIOSurfaceObject",
                              SEL_IOSURFACE_OBJECT) &&
           resolve_function((void **)&f->IOSurfaceCreate, "IOSurfaceCreate") &&
           resolve_function((void **)&f->IOSurfaceLock, "IOSurfaceLock") &&
           resolve_function((void **)&f->IOSurfaceUnlock, "IOSurfaceUnlock") &&
           resolve_function((void **)&f->IOSurfaceGetBaseAddress, "IOSurfaceGetBaseAddress") &&
           resolve_function((void **)&f->IOSurfaceGetAllocSize, "IOSurfaceGetAllocSize") &&
           resolve_function((void **)&f->CFRelease, "CFRelease") &&
           resolve_key(&f->kWidth, "kIOSurfaceWidth") &&
           resolve_key(&f->kHeight, "kIOSurfaceHeight") &&
           resolve_key(&f->kBytesPerElement, "kIOSurfaceBytesPerElement") &&
           resolve_key(&f->kBytesPerRow, "kIOSurfaceBytesPerRow") &&
           resolve_key(&f->kAllocSize, "kIOSurfaceAllocSize") &&
           resolve_key(&f->kPixelFormat, "kIOSurfacePixelFormat");
}

/* Runs +initialize of the collection classes the backend uses, once, here.
 * GNUstep Base keeps one placeholder object per class from then on, which a
 * leak checker reports (see tests/ane/lsan.supp, which names this function);
 * on macOS it changes nothing. */
__attribute__((noinline)) static void initialize_foundation_classes(void) {
    [NSArray class];
    [NSMutableArray class];
    [NSDictionary class];
    [NSMutableDictionary class];
    /* the first sort of strings initializes what string comparison keeps (the
     * stand-in sorts weight keys); the arrays themselves are autoreleased */
    [[NSArray arrayWithObjects:@"b", @"a", nil] sortedArrayUsingSelector:@selector(compare:)];
}

static void load_framework(void) {
    const char *path = getenv("ORION_ANE_FRAMEWORK");
    if (!path || !*path) path = ANE_DEFAULT_FRAMEWORK;
    snprintf(framework.path, sizeof framework.path, "%s", path);
    framework.handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!framework.handle) {
        const char *e = dlerror();
        missing("cannot load %s: %s", path, e ? e : "dlopen failed");
        return;
    }
    NSAutoreleasePool *pool = [[NSAutoreleasePool alloc] init];
    initialize_foundation_classes();
    int ok = 0;
    @try {
        ok = load_classes_and_functions();
    } @catch (NSException *e) {
        ok = missing("loading the classes raised %s: %s", [[e name] UTF8String],
                     [[e reason] UTF8String]);
    }
    if (ok) {
        /* optional: a framework without them still runs programs */
        framework.perf_stats_class = NSClassFromString(@"_ANEPerformanceStats");
        *(void **)&framework.sysctlbyname = resolve("sysctlbyname");
        char device[512];
        ok = ane_device_usable(&framework, device, sizeof device);
        if (!ok)
            snprintf(framework_why, sizeof framework_why, "%s (framework %s)", device, path);
        else
            snprintf(framework_why, sizeof framework_why,
                     "AppleNeuralEngine.framework classes from %s; IOSurface from %s; %s", path,
                     framework.iosurface_handle ? "IOSurface.framework" : "the same image", device);
    }
    if (ok) {
        /* The property keys are constant strings of the loaded images; the
         * handles stay open for the life of the process. */
        framework_ok = 1;
    }
    [pool drain];
}

const ane_framework *ane_framework_get(char *why, size_t capacity) {
    pthread_once(&load_once, load_framework);
    if (why && capacity) snprintf(why, capacity, "%s", framework_why);
    return framework_ok ? &framework : NULL;
}

orion_status ane_fail_call(orion_status status, const char *call, NSError *error,
                           NSException *exception, const char *what) {
    if (error) {
        NSString *text = [error localizedDescription];
        return orion_fail(status, "ane: %s failed: %s (NSError domain %s, code %ld)", call,
                          text ? [text UTF8String] : "(no description)",
                          [error domain] ? [[error domain] UTF8String] : "(none)",
                          (long)[error code]);
    }
    if (exception)
        return orion_fail(status, "ane: %s raised %s: %s", call,
                          [exception name] ? [[exception name] UTF8String] : "an exception",
                          [exception reason] ? [[exception reason] UTF8String] : "(no reason)");
    return orion_fail(status, "ane: %s %s", call, what ? what : "failed with no NSError");
}
