/* optim.c -- the optimizer step of training, fused into one pass.
 * Written out as a numpy expression AdamW is ten passes over the parameters
 * (each a temporary as large as the model): 0.5-1.2 s a step for Stories110M
 * on two cores, more than the device programs' GEMMs. One pass reads p, g,
 * m, v and writes p, m, v once, split over vane's kernel threads. */
#include <math.h>

#include "../vane/kernels.h"
#include "error.h"

#define CHUNK ((size_t)1 << 16)   /* elements per work item (1 MiB of state) */

typedef struct adamw_job {
    float *p, *m, *v;
    const float *g;
    size_t n;
    float grad_scale, beta1, beta2, eps, decay, step_size, inv_bias2;
} adamw_job;

/* The hot loop: plain float arithmetic the compiler vectorizes. */
static void adamw_item(void *ctx, size_t i) {
    const adamw_job *j = ctx;
    size_t at = i * CHUNK, end = j->n - at < CHUNK ? j->n : at + CHUNK;
    const float b1 = j->beta1, b2 = j->beta2, a1 = 1.0f - j->beta1, a2 = 1.0f - j->beta2;
    for (size_t k = at; k < end; k++) {
        float g = j->g[k] * j->grad_scale;
        float m = b1 * j->m[k] + a1 * g;
        float v = b2 * j->v[k] + a2 * (g * g);
        j->m[k] = m;
        j->v[k] = v;
        j->p[k] = j->p[k] * j->decay - j->step_size * m / (sqrtf(v * j->inv_bias2) + j->eps);
    }
}

orion_status orion_adamw_f32(float *param, const float *grad, float *m, float *v, uint64_t n,
                             float grad_scale, float beta1, float beta2, float eps,
                             float decay, float step_size, float bias2) {
    orion_clear_error();
    if (n && (!param || !grad || !m || !v))
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "adamw: NULL array");
    if (!(bias2 > 0.0f) || !(eps >= 0.0f) || !(beta1 >= 0.0f && beta1 < 1.0f) ||
        !(beta2 >= 0.0f && beta2 < 1.0f))
        return orion_fail(ORION_ERR_INVALID_ARGUMENT,
                          "adamw: need 0 <= beta < 1, eps >= 0 and bias2 > 0 "
                          "(beta1 %g, beta2 %g, eps %g, bias2 %g)",
                          beta1, beta2, eps, bias2);
    adamw_job j = {param, m, v, grad, (size_t)n, grad_scale, beta1, beta2, eps, decay,
                   step_size, 1.0f / bias2};
    size_t items = ((size_t)n + CHUNK - 1) / CHUNK;
    if (items > 1) vk_parallel_for(items, adamw_item, &j);
    else if (items == 1) adamw_item(&j, 0);
    return ORION_OK;
}
