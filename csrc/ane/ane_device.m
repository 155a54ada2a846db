/* ane_device.m -- whether this process can use the Neural Engine at all, decided
 * by the device, not by the framework's classes resolving (they resolve in a macOS
 * virtual machine, under Rosetta and on an Intel Mac too, and compile or eval fails
 * there later). In order:
 *   - macOS 15 or later: the MIL the emitter writes targets func main<ios18>, the
 *     macOS 15 opset (kern.osproductversion);
 *   - a native process: sysctl.proc_translated is 1 under Rosetta;
 *   - not a virtual machine: +[_ANEDeviceInfo isVirtualMachine] (which reads
 *     kern.hv_vmm_present), or that sysctl where the class lacks the method;
 *   - +[_ANEDeviceInfo hasANE].
 * sysctlbyname is resolved through the framework's handle like the IOSurface
 * functions (libSystem on macOS; the stand-in's on Linux). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ane_internal.h"

/* kern.osproductversion's major number, or 0 when it cannot be read. */
static int macos_major(const ane_framework *f, char *text, size_t capacity) {
    size_t n = capacity;
    text[0] = '\0';
    if (f->sysctlbyname("kern.osproductversion", text, &n, NULL, 0) != 0) return 0;
    text[capacity - 1] = '\0';
    return atoi(text);
}

/* A 0/1 sysctl; -1 when the key does not exist (older systems, or not macOS). */
static int sysctl_flag(const ane_framework *f, const char *name) {
    int32_t v = 0;
    size_t n = sizeof v;
    if (f->sysctlbyname(name, &v, &n, NULL, 0) != 0) return -1;
    return v != 0;
}

/* +[_ANEDeviceInfo sel] as a BOOL: 1, 0, or -1 when the class or method is missing
 * (or raises). */
static int device_info(const char *sel) {
    Class cls = NSClassFromString(@"_ANEDeviceInfo");
    int out = -1;
    @try {
        if (cls && [cls respondsToSelector:NSSelectorFromString([NSString stringWithUTF8String:sel])])
            out = strcmp(sel, SEL_HAS_ANE) == 0 ? [(id<OrionANEDeviceInfoClass>)cls hasANE]
                                                : [(id<OrionANEDeviceInfoClass>)cls isVirtualMachine];
    } @catch (NSException *e) {
        out = -1;
    }
    return out;
}

int ane_device_usable(const ane_framework *f, char *why, size_t capacity) {
    if (!f->sysctlbyname) {
        snprintf(why, capacity, "sysctlbyname was not found (in %s or IOSurface.framework): the "
                 "macOS version cannot be checked", f->path);
        return 0;
    }
    char version[64];
    int major = macos_major(f, version, sizeof version);
    if (major < ANE_MACOS_FLOOR) {
        snprintf(why, capacity, "the ane backend needs macOS %d or later (its MIL targets "
                 "func main<ios18>, the macOS %d opset); this is macOS %s", ANE_MACOS_FLOOR,
                 ANE_MACOS_FLOOR, major ? version : "of unknown version");
        return 0;
    }
    if (sysctl_flag(f, "sysctl.proc_translated") == 1) {
        snprintf(why, capacity, "this is an x86-64 process under Rosetta "
                 "(sysctl.proc_translated = 1): the Neural Engine needs a native arm64 build");
        return 0;
    }
    int vm = device_info(SEL_IS_VM);
    if (vm < 0) vm = sysctl_flag(f, "kern.hv_vmm_present");
    if (vm == 1) {
        snprintf(why, capacity, "this is a virtual machine (+[_ANEDeviceInfo isVirtualMachine], "
                 "kern.hv_vmm_present): its Neural Engine is not one the in-memory path can use");
        return 0;
    }
    int has = device_info(SEL_HAS_ANE);
    if (has == 0) {
        snprintf(why, capacity, "+[_ANEDeviceInfo hasANE] says this Mac has no Neural Engine");
        return 0;
    }
    snprintf(why, capacity, "macOS %s, native, not a virtual machine, %s", version,
             has == 1 ? "+[_ANEDeviceInfo hasANE]" : "hasANE not offered by this framework");
    return 1;
}
