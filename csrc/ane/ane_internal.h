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

/* ---- the framework as loaded -------------------------------------------- */

typedef struct ane_framework {
    char path[1024];               /* what was dlopen'ed */
    void *handle;                  /* the framework (or the stand-in) */
    void *iosurface_handle;        /* IOSurface.framework, if a symbol was not in handle */
    Class descriptor_class;        /* _ANEInMemoryModelDescriptor */
    Class model_class;             /* _ANEInMemoryModel */
    Class request_class;           /* _ANERequest */
    Class iosurface_object_class;  /* _ANEIOSurfaceObject */
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

/* The framework, loaded once per process; NULL if it is unusable, with the
 * reason in `why` (which otherwise says what was found). */
const ane_framework *ane_framework_get(char *why, size_t capacity);

/* Records an Orion error for a failed private call: the selector (as
 * "-[_ANEInMemoryModel compileWithQoS:options:error:]"), then what went wrong:
 * the NSError's text, domain and code; an exception's name and reason; or
 * `what` (e.g. "returned nil") when there is neither. Returns status. */
orion_status ane_fail_call(orion_status status, const char *call, NSError *error,
                           NSException *exception, const char *what);

#endif
