/* standin_device.m -- what the stand-in says about the machine it pretends to be:
 * +[_ANEDeviceInfo hasANE] and +[_ANEDeviceInfo isVirtualMachine] (class methods of
 * the framework; the latter reads kern.hv_vmm_present, as the decompiled class does),
 * and sysctlbyname for the keys the ane backend reads. macOS has sysctlbyname in
 * libSystem, which the backend finds through the framework's handle; glibc has none,
 * so defining it here interposes nothing on Linux.
 *
 *   ANE_STANDIN_HAS_ANE=0        hasANE answers NO (an Intel Mac, or a VM build)
 *   ANE_STANDIN_VM=1             kern.hv_vmm_present = 1 (a macOS virtual machine)
 *   ANE_STANDIN_TRANSLATED=1     sysctl.proc_translated = 1 (an x86-64 process under Rosetta)
 *   ANE_STANDIN_MACOS=14.6       kern.osproductversion (default 15.5) */
#import <Foundation/Foundation.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int env_flag(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

static int answer(const void *value, size_t n, void *oldp, size_t *oldlenp) {
    if (!oldlenp) {
        errno = EINVAL;
        return -1;
    }
    if (oldp) {
        if (*oldlenp < n) {
            errno = ENOMEM;
            return -1;
        }
        memcpy(oldp, value, n);
    }
    *oldlenp = n;
    return 0;
}

int sysctlbyname(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen);
int sysctlbyname(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen) {
    if (newp || newlen) {
        errno = EPERM;
        return -1;
    }
    if (strcmp(name, "kern.osproductversion") == 0) {
        const char *v = getenv("ANE_STANDIN_MACOS");
        if (!v || !*v) v = "15.5";
        return answer(v, strlen(v) + 1, oldp, oldlenp);
    }
    int32_t flag;
    if (strcmp(name, "kern.hv_vmm_present") == 0) flag = env_flag("ANE_STANDIN_VM");
    else if (strcmp(name, "sysctl.proc_translated") == 0) flag = env_flag("ANE_STANDIN_TRANSLATED");
    else {
        errno = ENOENT;
        return -1;
    }
    return answer(&flag, sizeof flag, oldp, oldlenp);
}

@interface _ANEDeviceInfo : NSObject
+ (BOOL)hasANE;
+ (BOOL)isVirtualMachine;
@end

@implementation _ANEDeviceInfo
+ (BOOL)hasANE {
    const char *v = getenv("ANE_STANDIN_HAS_ANE");
    return !(v && strcmp(v, "0") == 0);
}
+ (BOOL)isVirtualMachine {
    int32_t vm = 0;
    size_t n = sizeof vm;
    return sysctlbyname("kern.hv_vmm_present", &vm, &n, NULL, 0) == 0 && vm != 0;
}
@end
