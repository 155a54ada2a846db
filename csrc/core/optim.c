/* optim.c -- the optimizer step of training, fused into one pass.
 * Written out as a numpy expression AdamW is ten passes over the parameters
 * (each a temporary as large as the model): 0.5-1.2 s a step for Stories110M
 * on two cores, more than the device programs' GEMMs. One pass reads p, g,
 * m, v and writes p, m, v once (and, when asked, p rounded to fp16: the copy
 * the programs compute with), split over vane's kernel threads. */
/* Built with -fno-math-errno -ffp-contract=off (CMakeLists.txt): the loop
 * vectorizes, and every x86-64 level gives the same bits. */

#include <math.h>
#include <stdlib.h>

#include "../vane/kernels.h"
#include "error.h"

#define CHUNK ((size_t)1 << 16)   /* elements per work item (1 MiB of state) */
#define BLOCK 1024                /* elements updated before their fp16 copy is written */

typedef struct adamw_job {
    float *p, *m, *v;
    const float *g;
    uint16_t *half;
    size_t n;
    float grad_scale, beta1, beta2, eps, decay, step_size, inv_bias2;
} adamw_job;

/* The hot loop: plain float arithmetic the compiler vectorizes. */
VK_CLONES static void adamw_block(float *restrict p, float *restrict m, float *restrict v,
                                  const float *restrict g, size_t n, const adamw_job *j) {
    const float b1 = j->beta1, b2 = j->beta2, a1 = 1.0f - j->beta1, a2 = 1.0f - j->beta2;
    const float scale = j->grad_scale, decay = j->decay, step = j->step_size;
    const float inv_bias2 = j->inv_bias2, eps = j->eps;
    for (size_t k = 0; k < n; k++) {
        float gk = g[k] * scale;
        float mk = b1 * m[k] + a1 * gk;
        float vk = b2 * v[k] + a2 * (gk * gk);
        m[k] = mk;
        v[k] = vk;
        p[k] = p[k] * decay - step * mk / (sqrtf(vk * inv_bias2) + eps);
    }
}

static void adamw_item(void *ctx, size_t i) {
    const adamw_job *j = ctx;
    size_t end = j->n - i * CHUNK < CHUNK ? j->n : (i + 1) * CHUNK;
    for (size_t at = i * CHUNK; at < end; at += BLOCK) {
        size_t len = end - at < BLOCK ? end - at : BLOCK;
        adamw_block(j->p + at, j->m + at, j->v + at, j->g + at, len, j);
        if (j->half)    /* while the block is still in L1 */
            vk_f32_to_f16_array(j->p + at, j->half + at, len);
    }
}

orion_status orion_adamw_f32(float *param, const float *grad, float *m, float *v, uint64_t n,
                             float grad_scale, float beta1, float beta2, float eps,
                             float decay, float step_size, float bias2, uint16_t *half) {
    orion_clear_error();
    if (n && (!param || !grad || !m || !v))
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "adamw: NULL array");
    if (!(bias2 > 0.0f) || !(eps >= 0.0f) || !(beta1 >= 0.0f && beta1 < 1.0f) ||
        !(beta2 >= 0.0f && beta2 < 1.0f))
        return orion_fail(ORION_ERR_INVALID_ARGUMENT,
                          "adamw: need 0 <= beta < 1, eps >= 0 and bias2 > 0 "
                          "(beta1 %g, beta2 %g, eps %g, bias2 %g)",
                          beta1, beta2, eps, bias2);
    adamw_job j = {param, m, v, grad, half, (size_t)n, grad_scale, beta1, beta2, eps, decay,
                   step_size, 1.0f / bias2};
    size_t items = ((size_t)n + CHUNK - 1) / CHUNK;
    vk_parallel_for(items, adamw_item, &j);
    return ORION_OK;
}

/* ---- sum of squares (the global gradient norm for clipping) ---- */

#define LANES 8     /* fixed accumulators: the same sums whatever the vector width */

typedef struct sumsq_job {
    const float *x;
    size_t n;
    double *partial;      /* one per work item, added in item order */
} sumsq_job;

VK_CLONES static double sum_squares(const float *restrict x, size_t n) {
    double acc[LANES] = {0};
    size_t k = 0;
    for (; k + LANES <= n; k += LANES)
        for (int l = 0; l < LANES; l++)
            acc[l] += (double)x[k + l] * (double)x[k + l];   /* exact products */
    double tail = 0.0;
    for (; k < n; k++)
        tail += (double)x[k] * (double)x[k];
    double total = tail;
    for (int l = 0; l < LANES; l++)
        total += acc[l];
    return total;
}

static void sumsq_item(void *ctx, size_t i) {
    const sumsq_job *j = ctx;
    size_t at = i * CHUNK, len = j->n - at < CHUNK ? j->n - at : CHUNK;
    j->partial[i] = sum_squares(j->x + at, len);
}

orion_status orion_sum_squares_f32(const float *x, uint64_t n, double *out) {
    orion_clear_error();
    if (!out || (n && !x))
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "sum_squares: NULL argument");
    size_t items = ((size_t)n + CHUNK - 1) / CHUNK;
    double small[64], *partial = items <= 64 ? small : malloc(items * sizeof *partial);
    if (!partial)
        return orion_fail(ORION_ERR_OUT_OF_MEMORY, "sum_squares: %zu partial sums", items);
    sumsq_job j = {x, (size_t)n, partial};
    vk_parallel_for(items, sumsq_item, &j);
    double total = 0.0;
    for (size_t i = 0; i < items; i++)
        total += partial[i];
    if (partial != small) free(partial);
    *out = total;
    return ORION_OK;
}
