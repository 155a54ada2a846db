/* standin.h -- the control interface of libANEStandin, the test stand-in for
 * AppleNeuralEngine.framework (tests only; never shipped).
 *
 * The stand-in implements the four private classes of the in-memory path and
 * the IOSurface functions the ane backend resolves, on top of a private copy
 * of Orion's core (backend "vane"). Tests reach these C functions with dlopen
 * of the same library the backend loaded (ORION_ANE_FRAMEWORK). */
#ifndef ANE_STANDIN_H
#define ANE_STANDIN_H

#include <stddef.h>

/* The mode, from the environment variable ANE_STANDIN_MODE, read at every
 * call (a descriptor keeps the mode it was made in):
 *   observed   (default) what public reverse engineering of the framework
 *              shows: hexStringIdentifier = upper-case hex SHA256(MIL text) _
 *              SHA256(weight data, sorted keys) _ SHA256(options), fixed when
 *              the descriptor is made; compile writes model.mil and the
 *              staging `data` itself and caches the program by identifier;
 *              load serves that cache and ignores later edits of the temp
 *              folder, or its absence (pmetal removes it once compiled); a load
 *              whose identifier is not cached compiles (counted in
 *              ane_standin_compiles, ANE_STANDIN_COMPILE_MS slow).
 *   verify     observed, and a load fails ("verifyBundleAtPath: hash
 *              mismatch") if model.mil, net.plist, data or a weight file
 *              changed after compile (newer framework builds); no folder at all
 *              is not checked.
 *   permissive the first belief: keys-only identifier, load re-reads the
 *              weight files from the temp folder when it is there (a delta
 *              reload works).
 *   macos27    verify, and what pmetal reports for macOS 27: the descriptor
 *              hashes the weight entries in one order and the compiler service
 *              rehashes the bundle's files in another, so a compile of a
 *              program with several distinct weight files fails
 *              "verifyBundleAtPath: hash mismatch" (Code=10); and a request
 *              given an _ANEPerformanceStats raises (its validation sends -count
 *              to perfStats).
 *   compile-on-miss  observed, but aned keys its cache by the identifier and
 *              the weights the temp folder holds: a load after the folder was
 *              edited compiles it as it stands (counted, slow), so an edit takes
 *              effect at the price of a compile nobody asked for.
 * Other knobs, read at every call:
 *   ANE_STANDIN_COMPILE_MS   each device compile takes this long (0)
 *   ANE_STANDIN_COMPILE_LIMIT the device's compile limit (119)
 *   ANE_STANDIN_HW_TIME=0    evaluations report a device time of 0 ns
 *   ANE_STANDIN_PERF_STATS=absent  +[_ANEPerformanceStats statsWith...] gives nil
 *   ANE_STANDIN_HAS_ANE=0, ANE_STANDIN_VM=1, ANE_STANDIN_TRANSLATED=1,
 *   ANE_STANDIN_MACOS=<version>   the machine (standin_device.m)
 * Returns the mode's name. */
const char *ane_standin_mode(void);

/* The call log: one line per private call or IOSurface function, in order,
 * e.g. "-[_ANEInMemoryModel compileWithQoS:options:error:] qos=21". Returns
 * the length of the whole log; copies what fits (NUL-terminated). */
size_t ane_standin_log(char *buf, size_t capacity);
void ane_standin_log_clear(void);

/* Fault injection: the next `count` calls of `selector` (a selector such as
 * "compileWithQoS:options:error:", or "IOSurfaceCreate") fail. mode 0: as the
 * device fails (NO with an NSError, or nil / NULL); mode 1: by raising an
 * NSException. For "hexStringIdentifier", mode 0 returns a changed identifier. */
#define ANE_STANDIN_FAIL 0
#define ANE_STANDIN_RAISE 1
void ane_standin_fail(const char *selector, int count, int mode);
void ane_standin_clear_faults(void);

/* The device's per-process compile limit (ANE-C31; default 119, or
 * ANE_STANDIN_COMPILE_LIMIT), and the compiles attempted so far. */
void ane_standin_set_compile_limit(int limit);
int ane_standin_compiles(void);
/* Successful loads; IOSurfaceLock calls (CPU access brackets). */
int ane_standin_loads(void);
int ane_standin_locks(void);

/* Instances of the stand-in's classes alive (models, descriptors, requests,
 * surface objects), and IOSurfaces alive: 0 once everything is released. */
int ane_standin_live_objects(void);
int ane_standin_live_surfaces(void);

/* Misuse that the device would not report but that is a bug: unbalanced or
 * mismatched IOSurface locks, a surface freed while locked, a model released
 * while loaded, IOSurface properties other than §1.4's, a nil options
 * dictionary. Returns the count; copies the messages, one a line. */
int ane_standin_violations(char *buf, size_t capacity);
void ane_standin_violations_clear(void);

#endif
