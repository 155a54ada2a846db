/* tuning.c -- the public knobs of vane's kernels (threads, instruction set, warm-up). */
#include "../vane/kernels.h"
#include "error.h"

#define MAX_THREADS 64u

orion_status orion_set_num_threads(uint32_t n) {
    orion_clear_error();
    if (n == 0 || n > MAX_THREADS)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "thread count %u is not in 1..%u", n, MAX_THREADS);
    vk_set_threads(n);
    return ORION_OK;
}

uint32_t orion_num_threads(void) { return vk_threads(); }

const char *orion_vane_isa(void) { return vk_isa(); }

orion_status orion_vane_warm(int enable) {
    orion_clear_error();
    vk_set_warm(enable);
    return ORION_OK;
}
