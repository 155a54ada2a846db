/* backend.h -- what a backend (vane, ane) implements behind the runtime.
 *
 * The runtime does everything the two backends share: argument checks, the
 * handle table, parsing and verifying the MIL (csrc/mil), the identifier and
 * the program folder (model.mil + weights/ written before compile, as the
 * device requires), the compile budget, eval-time surface checks and the
 * in-place weight patch. A backend only compiles, loads, evaluates, unloads. */
#ifndef ORION_CORE_BACKEND_H
#define ORION_CORE_BACKEND_H

#include <stddef.h>
#include "../orion.h"
#include "../mil/mil.h"
#include "surface.h"

typedef struct orion_backend {
    const char *name;
    /* 1: a program opened from the program store is the compiled program already
     * (no compile is spent); 0: opening one compiles it again, counted. */
    int reuses_stored;
    /* 1: compile copies what the program needs of `program` later, and the runtime
     * frees the parsed MIL once compiled (a 28-layer program's parse holds
     * megabytes); 0: `program` stays alive until release. */
    int keeps_no_mil;
    /* 1 if usable in this process; otherwise 0 and a reason in `why`. */
    int (*available)(char *why, size_t capacity);
    /* `program` is verified and owned by the runtime (alive until release unless
     * keeps_no_mil). `folder` holds model.mil and the weight files. */
    orion_status (*compile)(const mil_program *program, const char *folder,
                            const orion_weight_file *weights, size_t n_weights,
                            uint32_t numerics, void **impl_out);
    /* Reads the weights from the folder's files (so a patch is seen). */
    orion_status (*load)(void *impl);
    orion_status (*unload)(void *impl);
    /* Surfaces in binding order, already checked for count and size (ANE-C17,
     * C18, C23, C25) and not locked: a backend that touches them with the CPU
     * locks them itself (surface_lock_impl). */
    orion_status (*eval)(void *impl, surface_impl *const *inputs, size_t n_inputs,
                         surface_impl *const *outputs, size_t n_outputs);
    void (*release)(void *impl);
    /* Optional (NULL: nothing to do): orion_program_prefetch on a loaded program. */
    void (*prefetch)(void *impl);
    /* Optional (NULL: every column is computed): orion_program_set_live_columns,
     * its arguments checked. */
    void (*set_live_columns)(void *impl, uint64_t columns, uint64_t first, uint64_t live);
    /* Optional: one line on how this program's weight updates go and why
     * (orion_program_update_path); NULL: "delta". */
    void (*describe_update)(void *impl, char *buf, size_t capacity);
    /* Optional: the device time of the last eval in ns (orion_program_hw_time);
     * 0 and a reason in `why` when there is none. NULL: never any. */
    int (*hw_time)(void *impl, uint64_t *ns, char *why, size_t capacity);
} orion_backend;

/* A backend that compiles again on its own (ane: a weight update through a new
 * descriptor, which the device compiles) spends one compile of the process
 * budget (ANE-C31) here first, so the counter sees every device compile. */
orion_status backend_spend_compile(void);
/* A load that took a compile's time (ane: timed against the program's own compile
 * and plain loads): the device compiled unseen, so that compile is counted too,
 * past the budget if need be (it happened), and recorded as hidden. */
void backend_count_hidden_compile(void);

/* What a backend's weight-update path did (orion_update_stats). */
typedef enum {
    BACKEND_CANARY_PROBE,
    BACKEND_SPOT_PROBE,
    BACKEND_PROBE_FAILED,
    BACKEND_DEMOTION
} backend_event;
void backend_note(backend_event event);

extern const orion_backend orion_backend_vane;
#ifdef ORION_WITH_ANE
extern const orion_backend orion_backend_ane;
#endif

#endif
