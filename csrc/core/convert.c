/* convert.c -- fp32 <-> fp16 arrays and fp16 transposes for the host side, on
 * vane's kernels. numpy's astype converts at about 1 GB/s here, and a numpy
 * copy of a transposed fp16 view runs at about the same; F16C / AVX-512
 * conversion and a blocked transpose (vane/kernels_transpose.c) split over the
 * kernel threads are an order of magnitude faster, and the training loop rounds
 * every weight to fp16 (and transposes those that programs hold as W^T) on every
 * step. */
#include <string.h>

#include "../vane/kernels.h"
#include "error.h"

#define CHUNK ((size_t)1 << 18)   /* elements per work item */

typedef struct convert_job {
    const void *src;
    void *dst;
    size_t n;
} convert_job;

static void to_f16_item(void *ctx, size_t i) {
    const convert_job *j = ctx;
    size_t at = i * CHUNK, len = j->n - at < CHUNK ? j->n - at : CHUNK;
    vk_f32_to_f16_array((const float *)j->src + at, (fp16_t *)j->dst + at, len);
}

static void to_f32_item(void *ctx, size_t i) {
    const convert_job *j = ctx;
    size_t at = i * CHUNK, len = j->n - at < CHUNK ? j->n - at : CHUNK;
    vk_f16_to_f32_array((const fp16_t *)j->src + at, (float *)j->dst + at, len);
}

static orion_status convert(const void *src, void *dst, uint64_t n,
                            void (*item)(void *, size_t)) {
    orion_clear_error();
    if (n && (!src || !dst)) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "convert: NULL array");
    convert_job j = {src, dst, (size_t)n};
    size_t items = ((size_t)n + CHUNK - 1) / CHUNK;
    vk_parallel_for(items, item, &j);
    return ORION_OK;
}

orion_status orion_f32_to_f16(const float *src, uint16_t *dst, uint64_t n) {
    return convert(src, dst, n, to_f16_item);
}

orion_status orion_f16_to_f32(const uint16_t *src, float *dst, uint64_t n) {
    return convert(src, dst, n, to_f32_item);
}

orion_status orion_f16_transpose(const uint16_t *src, uint64_t rows, uint64_t cols,
                                 uint16_t *dst) {
    orion_clear_error();
    if (rows && cols && (!src || !dst))
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "transpose: NULL array");
    if (rows && cols && (const void *)src == (void *)dst)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "transpose: not in place");
    vk_f16_transpose(src, (size_t)rows, (size_t)cols, dst);
    return ORION_OK;
}
