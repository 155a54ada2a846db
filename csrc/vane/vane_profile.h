/* vane_profile.h -- where vane's eval time goes, per op kind (off by default).
 *
 * When on, the backend times every step and adds it to the bucket of its op
 * kind; conv and matmul are split by shape class (one live column = a GEMV,
 * else a GEMM) because the two run different kernels. Counters are global to
 * the process and updated atomically (programs may run on several threads). */
#ifndef ORION_VANE_PROFILE_H
#define ORION_VANE_PROFILE_H

#include <stdint.h>
#include "vane_plan.h"

/* 1 when steps are to be timed (a relaxed load: checked once per eval). */
int vane_profile_on(void);
/* Adds one step's wall time to its bucket. */
void vane_profile_add(const vane_plan *plan, const vane_step *step, uint64_t ns);
/* Monotonic nanoseconds. */
uint64_t vane_profile_now(void);

#endif
