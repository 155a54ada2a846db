/* vane_profile.c -- per-op-kind step timing for vane (see vane_profile.h). */
#include <stdatomic.h>
#include <time.h>

#include "../core/error.h"
#include "vane_profile.h"

/* bucket = op kind * 2 + (1 for a product with more than one live column) */
#define N_BUCKETS (2 * MIL_OP_COUNT)

static atomic_int g_on;
static atomic_uint_fast64_t g_steps[N_BUCKETS];
static atomic_uint_fast64_t g_ns[N_BUCKETS];

int vane_profile_on(void) { return atomic_load_explicit(&g_on, memory_order_relaxed); }

uint64_t vane_profile_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* conv: columns = spatial size; matmul: the result's last axis. */
static int is_many_columns(const vane_plan *pl, const vane_step *sp)
{
    const vane_slot *R = &pl->slots[sp->out[0]];
    if (sp->op == MIL_OP_CONV) return R->shape[2] * R->shape[3] > 1;
    if (sp->op == MIL_OP_MATMUL)
        return R->rank >= 2 && R->shape[R->rank - 1] > 1 && R->shape[R->rank - 2] > 1;
    return 0;
}

void vane_profile_add(const vane_plan *pl, const vane_step *sp, uint64_t ns)
{
    if ((int)sp->op < 0 || sp->op >= MIL_OP_COUNT) return;
    int b = (int)sp->op * 2 + is_many_columns(pl, sp);
    atomic_fetch_add_explicit(&g_steps[b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&g_ns[b], ns, memory_order_relaxed);
}

orion_status orion_vane_profile(int enable)
{
    orion_clear_error();
    for (int b = 0; enable && b < N_BUCKETS; b++) {    /* off keeps the figures to read */
        atomic_store(&g_steps[b], 0);
        atomic_store(&g_ns[b], 0);
    }
    atomic_store(&g_on, enable ? 1 : 0);
    return ORION_OK;
}

uint32_t orion_vane_profile_read(orion_vane_op_time *out, uint32_t cap)
{
    uint32_t n = 0;
    for (int b = 0; b < N_BUCKETS; b++) {
        uint64_t steps = atomic_load(&g_steps[b]);
        if (!steps) continue;
        if (out && n < cap) {
            out[n].op = mil_op_name((mil_op_kind)(b / 2));
            int product = b / 2 == MIL_OP_CONV || b / 2 == MIL_OP_MATMUL;
            out[n].shape = !product ? "" : (b & 1) ? "gemm" : "gemv";
            out[n].steps = steps;
            out[n].ns = atomic_load(&g_ns[b]);
        }
        n++;
    }
    return n;
}
