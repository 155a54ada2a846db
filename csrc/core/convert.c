/* convert.c -- fp32 <-> fp16 arrays and fp16 transposes for the host side, on
 * vane's kernels. numpy's astype converts at about 1 GB/s here, and a numpy
 * copy of a transposed fp16 view runs at about the same; F16C / AVX-512
 * conversion and a blocked transpose split over the kernel threads are an
 * order of magnitude faster, and the training loop rounds every weight to fp16
 * (and transposes those that programs hold as W^T) on every step. */
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

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

/* ---- transpose ---- */

#define TCOLS 64     /* source columns per work item (destination rows) */
#define TROWS 32     /* source rows per pass: each destination row gets a whole 64-byte line */

typedef struct transpose_job {
    const uint16_t *src;
    uint16_t *dst;
    size_t rows, cols;            /* of the source */
} transpose_job;

/* Destination rows [c0, c0 + TCOLS) = source columns, over every source row, in
 * passes of TROWS source rows: every read is a run along a source row and every
 * write a whole line of a destination row. Walking a source column instead reads
 * at a stride that is often a multiple of 4 KiB, where every read lands in the
 * same cache set (measured 2x slower, numpy's .T copy 4x). */
static void transpose_scalar(const transpose_job *j, size_t r0, size_t r1, size_t c0,
                             size_t c1) {
    uint16_t tile[TCOLS][TROWS];
    for (; r0 < r1; r0 += TROWS) {
        size_t nr = r1 - r0 < TROWS ? r1 - r0 : TROWS;
        for (size_t k = 0; k < nr; k++) {
            const uint16_t *row = j->src + (r0 + k) * j->cols;
            for (size_t c = c0; c < c1; c++)
                tile[c - c0][k] = row[c];
        }
        for (size_t c = c0; c < c1; c++)
            memcpy(j->dst + c * j->rows + r0, tile[c - c0], nr * sizeof(uint16_t));
    }
}

#if defined(__SSE2__)
/* One 8 x 8 block in registers: three rounds of interleaves (16-, 32-, 64-bit). */
static inline void transpose_8x8(const uint16_t *src, size_t ld_src, uint16_t *dst,
                                 size_t ld_dst) {
    __m128i a[8], t[8], u[8];
    for (int k = 0; k < 8; k++)
        a[k] = _mm_loadu_si128((const __m128i *)(src + k * ld_src));
    for (int k = 0; k < 4; k++) {
        t[2 * k] = _mm_unpacklo_epi16(a[2 * k], a[2 * k + 1]);
        t[2 * k + 1] = _mm_unpackhi_epi16(a[2 * k], a[2 * k + 1]);
    }
    for (int k = 0; k < 2; k++) {
        u[4 * k] = _mm_unpacklo_epi32(t[4 * k], t[4 * k + 2]);
        u[4 * k + 1] = _mm_unpackhi_epi32(t[4 * k], t[4 * k + 2]);
        u[4 * k + 2] = _mm_unpacklo_epi32(t[4 * k + 1], t[4 * k + 3]);
        u[4 * k + 3] = _mm_unpackhi_epi32(t[4 * k + 1], t[4 * k + 3]);
    }
    for (int k = 0; k < 4; k++) {
        _mm_storeu_si128((__m128i *)(dst + (2 * k) * ld_dst), _mm_unpacklo_epi64(u[k], u[k + 4]));
        _mm_storeu_si128((__m128i *)(dst + (2 * k + 1) * ld_dst),
                         _mm_unpackhi_epi64(u[k], u[k + 4]));
    }
}
#endif

static void transpose_item(void *ctx, size_t i) {
    const transpose_job *j = ctx;
    size_t c0 = i * TCOLS, c1 = j->cols - c0 < TCOLS ? j->cols : c0 + TCOLS;
#if defined(__SSE2__)
    /* 8 x 8 blocks; per pass, each group of 8 destination rows gets TROWS
     * elements (a whole line) before the next group */
    size_t r8 = j->rows & ~(size_t)7, c8 = c0 + ((c1 - c0) & ~(size_t)7);
    for (size_t r0 = 0; r0 < r8; r0 += TROWS) {
        size_t r1 = r8 - r0 < TROWS ? r8 : r0 + TROWS;
        for (size_t c = c0; c < c8; c += 8)
            for (size_t r = r0; r < r1; r += 8)
                transpose_8x8(j->src + r * j->cols + c, j->cols, j->dst + c * j->rows + r,
                              j->rows);
    }
    if (c8 < c1) transpose_scalar(j, 0, r8, c8, c1);          /* last columns */
    if (r8 < j->rows) transpose_scalar(j, r8, j->rows, c0, c1); /* last rows */
#else
    transpose_scalar(j, 0, j->rows, c0, c1);
#endif
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
    vk_parallel_for(items, transpose_item, &j);
    return ORION_OK;
}
