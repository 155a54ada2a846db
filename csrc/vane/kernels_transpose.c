/* kernels_transpose.c -- the transpose of a row-major fp16 matrix, blocked and split
 * over the kernel threads: the host's transposes (orion_f16_transpose: the training loop
 * transposes the weights that programs hold as W^T every step) and vane's transpose ops
 * that are one ([V, 8] logits of a batch step to [8, V]). */
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "kernels.h"

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

void vk_f16_transpose(const fp16_t *src, size_t rows, size_t cols, fp16_t *dst) {
    transpose_job j = {src, dst, rows, cols};
    size_t items = rows ? (cols + TCOLS - 1) / TCOLS : 0;
    vk_parallel_for(items, transpose_item, &j);
}
