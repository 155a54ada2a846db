/* convert.c -- fp32 <-> fp16 arrays and fp16 transposes for the host side, on
 * vane's kernels. numpy's astype converts at about 1 GB/s here, and a numpy
 * copy of a transposed fp16 view runs at about the same; F16C / AVX-512
 * conversion and a blocked transpose split over the kernel threads are an
 * order of magnitude faster, and the training loop rounds every weight to fp16
 * (and transposes those that programs hold as W^T) on every step. */
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
    if (items > 1) vk_parallel_for(items, item, &j);
    else if (items == 1) item(&j, 0);
    return ORION_OK;
}

orion_status orion_f32_to_f16(const float *src, uint16_t *dst, uint64_t n) {
    return convert(src, dst, n, to_f16_item);
}

orion_status orion_f16_to_f32(const uint16_t *src, float *dst, uint64_t n) {
    return convert(src, dst, n, to_f32_item);
}

/* ---- transpose ---- */

#define TCOLS 64     /* source columns per work item (destination rows) */
#define TROWS 32     /* source rows per pass: each destination row gets a whole 64-byte line */

typedef struct transpose_job {
    const uint16_t *src;
    uint16_t *dst;
    size_t rows, cols;            /* of the source */
} transpose_job;

/* Destination rows [c0, c0 + TCOLS) = source columns, over every source row, in
 * passes of TROWS source rows through a small tile: every read is a run along a
 * source row and every write a whole line of a destination row. Walking a source
 * column instead reads at a stride that is often a multiple of 4 KiB, where every
 * read lands in the same cache set (measured 2x slower, numpy's .T copy 4x). */
static void transpose_item(void *ctx, size_t i) {
    const transpose_job *j = ctx;
    size_t c0 = i * TCOLS, nc = j->cols - c0 < TCOLS ? j->cols - c0 : TCOLS;
    uint16_t tile[TCOLS][TROWS];
    for (size_t r0 = 0; r0 < j->rows; r0 += TROWS) {
        size_t nr = j->rows - r0 < TROWS ? j->rows - r0 : TROWS;
        for (size_t k = 0; k < nr; k++) {
            const uint16_t *row = j->src + (r0 + k) * j->cols + c0;
            for (size_t c = 0; c < nc; c++)
                tile[c][k] = row[c];
        }
        for (size_t c = 0; c < nc; c++)
            memcpy(j->dst + (c0 + c) * j->rows + r0, tile[c], nr * sizeof(uint16_t));
    }
}

orion_status orion_f16_transpose(const uint16_t *src, uint64_t rows, uint64_t cols,
                                 uint16_t *dst) {
    orion_clear_error();
    if (rows && cols && (!src || !dst))
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "transpose: NULL array");
    if (rows && cols && (const void *)src == (void *)dst)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "transpose: not in place");
    transpose_job j = {src, dst, (size_t)rows, (size_t)cols};
    size_t items = rows ? ((size_t)cols + TCOLS - 1) / TCOLS : 0;
    if (items > 1) vk_parallel_for(items, transpose_item, &j);
    else if (items == 1) transpose_item(&j, 0);
    return ORION_OK;
}
