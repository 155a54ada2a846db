/* kernels_quant.c -- products with compressed weights (kernels.h, vk_qmat):
 * the portable decoder that defines every value, and the drivers.
 *
 * A GEMV (decode) runs row by row over the pool: each row's codes are read
 * once and multiplied as they are decoded, by the fused SIMD kernels of
 * kernels_quant_x86.c and kernels_quant_neon.c where the layout is theirs (4-bit and
 * 8-bit codes), else
 * by the portable decoder a chunk at a time. A few columns (batched decode) decode
 * blocks of rows into cache and run vk_gemm_f16's few-column GEMVs over them
 * (vk_gemv_multi_made); every other product (prefill's GEMM, strict numerics) decodes
 * panels of rows to fp16 and hands them to vk_gemm_f16. Both sum exactly as the dense
 * product of the decoded weights. The weight is never held whole.
 *
 * The fused GEMV's sums are ordered as vk_gemm_f16's one-column GEMV of the decoded
 * weights on the scalar path (k order), for AVX2's 4-bit and 8-bit rows (two 8-wide
 * chains per 16 columns), for AVX-512's (two 16-wide chains per 32 columns) and for
 * NEON's (four 4-wide chains per 16 columns), so there a column has the same bits
 * alone or among a few (vk_qmat_columns_alone; tests/c/test_qkernels.c checks it bit
 * for bit); not for the portable decoder under a SIMD path (k order against the SIMD
 * GEMV's lanes). */
#include <stdlib.h>
#include <string.h>

#include "kernels_impl.h"

/* ---- decoding (the reference) ---------------------------------------------- */

static inline float r16(float v) { return vk_f16_to_f32(vk_f32_to_f16(v)); }

/* The code of element e (bits LSB first across bytes). */
static inline int code_at(const vk_qmat *m, size_t e) {
    size_t bit = e * m->bits;
    unsigned v = m->codes[bit >> 3];
    if ((bit & 7) + m->bits > 8)
        v |= (unsigned)m->codes[(bit >> 3) + 1] << 8;
    v = (v >> (bit & 7)) & ((1u << m->bits) - 1);
    if (m->is_signed && (v >> (m->bits - 1)))
        return (int)v - (1 << m->bits);
    return (int)v;
}

static inline size_t block_of(const vk_qmat *m, size_t r, size_t c) {
    return (r / m->brows) * (m->cols / m->bcols) + c / m->bcols;
}

/* The value of code k in block b. */
static inline float value_of(const vk_qmat *m, size_t b, int k) {
    if (m->lut)
        return vk_f16_to_f32(m->lut[(b << m->bits) + (unsigned)k]);
    float o = m->offset ? vk_f16_to_f32(m->offset[b]) : 0.0f;
    return r16(vk_f16_to_f32(m->scale[b]) * r16((float)k - o));
}

void vk_qmat_decode(const vk_qmat *m, size_t r, size_t c0, size_t n, float *dst) {
    size_t e = r * m->cols + c0;
    for (size_t i = 0; i < n; i++)
        dst[i] = value_of(m, block_of(m, r, c0 + i), code_at(m, e + i));
}

void vk_qmat_dense(const vk_qmat *m, fp16_t *dst) {
    float buf[256];
    for (size_t r = 0; r < m->rows; r++)
        for (size_t c = 0; c < m->cols; c += 256) {
            size_t n = m->cols - c < 256 ? m->cols - c : 256;
            vk_qmat_decode(m, r, c, n, buf);
            for (size_t i = 0; i < n; i++)
                dst[r * m->cols + c + i] = vk_f32_to_f16(buf[i]);
        }
}

size_t vk_qmat_bytes(const vk_qmat *m) {
    size_t blocks = (m->rows / m->brows) * (m->cols / m->bcols);
    size_t codes = (m->rows * m->cols * m->bits + 7) / 8;
    if (m->lut)
        return codes + blocks * ((size_t)1 << m->bits) * 2;
    return codes + blocks * 2 * (m->offset ? 2 : 1);
}

/* ---- GEMV: rows over the pool ----------------------------------------------- */

/* The fused kernels of the path in use (vk_isa), or NULL. */
static const vk_qrows *fused(void) {
    const char *isa = vk_isa();
    if (!strcmp(isa, "avx512")) {
        const vk_qrows *f = vk_native_fp16() ? vk_qrows_avx512fp16() : NULL;
        return f ? f : vk_qrows_avx512();
    }
    if (!strcmp(isa, "avx2"))
        return vk_qrows_avx2();
    if (!strcmp(isa, "neon"))
        return vk_qrows_neon();
    return NULL;
}

static void portable_rows(const vk_qmat *m, const float *x, float *acc, size_t r0, size_t r1) {
    float buf[256];
    for (size_t r = r0; r < r1; r++) {
        float sum = 0.0f;
        for (size_t c = 0; c < m->cols; c += 256) {
            size_t n = m->cols - c < 256 ? m->cols - c : 256;
            vk_qmat_decode(m, r, c, n, buf);
            for (size_t i = 0; i < n; i++)
                sum += buf[i] * x[c + i];
        }
        acc[r - r0] = sum;
    }
}

typedef void (*rows_fn)(const vk_qmat *, const float *, float *, size_t, size_t);

typedef struct {
    const vk_qmat *m;
    const float *x;
    fp16_t *y;
    size_t incy, chunk;
    rows_fn rows;
} qgemv_ctx;

#define QROWS 64   /* rows summed into one stack buffer at a time */

static void qgemv_item(void *ctx_, size_t i) {
    const qgemv_ctx *g = ctx_;
    size_t r0 = i * g->chunk, r1 = r0 + g->chunk;
    if (r1 > g->m->rows)
        r1 = g->m->rows;
    float acc[QROWS];
    for (size_t a = r0; a < r1; a += QROWS) {
        size_t b = r1 - a < QROWS ? r1 : a + QROWS;
        g->rows(g->m, g->x, acc, a, b);
        if (g->incy == 1)   /* the SIMD converter: one call per row was 4% of a decode */
            vk_f32_to_f16_array(acc, g->y + a, b - a);
        else
            for (size_t r = a; r < b; r++)
                g->y[r * g->incy] = vk_f32_to_f16(acc[r - a]);
    }
}

/* The fused rows qgemv runs for m on the path in use, or NULL (the portable decoder). */
static rows_fn fused_rows(const vk_qmat *m) {
    const vk_qrows *f = fused();
    if (!f || m->cols / m->bcols > VK_QMAXB)   /* the fused rows keep a row's scales */
        return NULL;
    if (m->bits == 4 && m->cols % 32 == 0 && m->bcols % 16 == 0)
        return f->rows4;
    if (m->bits == 8 && !m->lut && m->bcols % 16 == 0 && m->cols % 32 == 0)
        return f->rows8;
    return NULL;
}

int vk_qmat_columns_alone(const vk_qmat *m) {
    const char *isa = vk_isa();
    if (!strcmp(isa, "scalar"))
        return 1;                    /* the portable decoder sums in k order, as the GEMV */
    return fused_rows(m) != NULL;    /* else k order against the SIMD GEMV's lanes */
}

static void qgemv(const vk_qmat *m, const fp16_t *x16, size_t incx, fp16_t *y, size_t incy) {
    float stack[2048];
    float *x = m->cols <= 2048 ? stack : malloc(m->cols * sizeof *x);
    if (!x) {                        /* no scratch: one row at a time, x converted per use */
        for (size_t r = 0; r < m->rows; r++) {
            float sum = 0.0f, w;
            for (size_t c = 0; c < m->cols; c++) {
                vk_qmat_decode(m, r, c, 1, &w);
                sum += w * vk_f16_to_f32(x16[c * incx]);
            }
            y[r * incy] = vk_f32_to_f16(sum);
        }
        return;
    }
    for (size_t c = 0; c < m->cols; c++)
        x[c] = vk_f16_to_f32(x16[c * incx]);
    rows_fn rows = fused_rows(m);
    float ordered_stack[2048], *ordered = NULL;   /* x in the order the rows read it */
    const vk_qrows *f = fused();
    if (rows && rows == f->rows4 && f->order4) {
        ordered = m->cols <= 2048 ? ordered_stack : malloc(m->cols * sizeof *ordered);
        if (!ordered) {
            rows = NULL;             /* no scratch: the portable decoder reads x as given */
        } else if (!f->order4(m, x, ordered)) {
            if (ordered != ordered_stack) free(ordered);
            ordered = NULL;          /* a layout rows4 reads in column order */
        }
    }
    qgemv_ctx g = {m, ordered ? ordered : x, y, incy, 0, rows ? rows : portable_rows};
    /* items of a multiple of 16 rows, about 8 per thread, at least 32 KiB of codes each */
    unsigned t = vk_threads();
    size_t row_bytes = m->cols * m->bits / 8 + 1;
    size_t min_rows = (32u << 10) / row_bytes + 1;
    size_t chunk = (m->rows + t * 8 - 1) / (t * 8);
    if (chunk < min_rows)
        chunk = min_rows;
    g.chunk = (chunk + 15) & ~(size_t)15;
    vk_parallel_for((m->rows + g.chunk - 1) / g.chunk, qgemv_item, &g);
    if (ordered && ordered != ordered_stack)
        free(ordered);
    if (x != stack)
        free(x);
}

/* ---- everything else: fp16 panels of decoded rows ---------------------------- */

#define PANEL_BYTES (2u << 20)   /* decoded rows per vk_gemm_f16 call */
#define PANEL_ITEM 8             /* rows decoded by one pool item */

/* Rows [r0, r0 + n) in fp16: by the fused decoder where the layout is its, else
 * through each block's table of values (up to 64 codes), else element by element. */
static void decode_rows(const vk_qmat *m, size_t r0, size_t n, fp16_t *panel) {
    const vk_qrows *f = fused();
    if (f && f->dense4 && m->bits == 4 && m->cols % 32 == 0 && m->bcols % 16 == 0 &&
        m->cols / m->bcols <= VK_QMAXB) {
        f->dense4(m, panel, r0, r0 + n);
        return;
    }
    if (f && f->dense8 && m->bits == 8 && !m->lut && m->bcols % 8 == 0 &&
        m->cols / m->bcols <= VK_QMAXB) {
        f->dense8(m, panel, r0, r0 + n);
        return;
    }
    fp16_t table[64];
    const size_t nb = m->cols / m->bcols;
    for (size_t r = 0; r < n; r++) {
        fp16_t *out = panel + r * m->cols;
        size_t e = (r0 + r) * m->cols;
        for (size_t b = 0; b < nb; b++) {
            size_t blk = ((r0 + r) / m->brows) * nb + b, c0 = b * m->bcols;
            if (m->bits <= 6) {
                int lo = m->is_signed ? -(1 << (m->bits - 1)) : 0;
                for (int k = 0; k < (1 << m->bits); k++)
                    table[k] = vk_f32_to_f16(value_of(m, blk, k + lo));
                for (size_t c = c0; c < c0 + m->bcols; c++)
                    out[c] = table[code_at(m, e + c) - lo];
            } else {
                for (size_t c = c0; c < c0 + m->bcols; c++)
                    out[c] = vk_f32_to_f16(value_of(m, blk, code_at(m, e + c)));
            }
        }
    }
}

typedef struct {
    const vk_qmat *m;
    fp16_t *panel;
    size_t r0, n;
} panel_ctx;

static void panel_item(void *ctx_, size_t i) {
    const panel_ctx *p = ctx_;
    size_t a = i * PANEL_ITEM, k = p->n - a < PANEL_ITEM ? p->n - a : PANEL_ITEM;
    decode_rows(p->m, p->r0 + a, k, p->panel + a * p->m->cols);
}

/* No memory for a panel: element by element, as the dense kernels' scalar path. */
static void qgemm_unbuffered(const vk_qmat *A, size_t N, const fp16_t *B, size_t ldb,
                             fp16_t *C, size_t ldc, int strict) {
    for (size_t r = 0; r < A->rows; r++)
        for (size_t j = 0; j < N; j++) {
            float acc = 0.0f, w;
            for (size_t c = 0; c < A->cols; c++) {
                vk_qmat_decode(A, r, c, 1, &w);
                float b = vk_f16_to_f32(B[c * ldb + j]);
                acc += strict ? vk_strict_mul(vk_flush_f32(w), vk_flush_f32(b)) : w * b;
            }
            fp16_t h = vk_f32_to_f16(acc);
            C[r * ldc + j] = (strict && (h & 0x7c00u) == 0) ? (h & 0x8000u) : h;
        }
}

static void make_rows(void *m, size_t r0, size_t n, fp16_t *dst) {
    decode_rows(m, r0, n, dst);
}

void vk_qgemm_f16(const vk_qmat *A, size_t N, const fp16_t *B, size_t ldb, fp16_t *C,
                  size_t ldc, vk_numerics numerics) {
    if (N == 1 && numerics == VK_NUMERICS_FP16) {
        qgemv(A, B, ldb, C, ldc);
        return;
    }
    /* a few columns: rows decoded a block at a time, in cache, for all of them */
    if (vk_gemv_multi_made(A->rows, N, A->cols, make_rows, (void *)A, B, ldb, C, ldc,
                           numerics) == 0)
        return;
    size_t per = PANEL_BYTES / (A->cols * 2);
    per = per < PANEL_ITEM ? PANEL_ITEM : per - per % PANEL_ITEM;
    if (per > A->rows)
        per = A->rows;
    fp16_t *panel = malloc(per * A->cols * sizeof *panel);
    if (!panel) {
        qgemm_unbuffered(A, N, B, ldb, C, ldc, numerics == VK_NUMERICS_STRICT);
        return;
    }
    for (size_t r0 = 0; r0 < A->rows; r0 += per) {
        size_t n = A->rows - r0 < per ? A->rows - r0 : per;
        panel_ctx p = {A, panel, r0, n};
        vk_parallel_for((n + PANEL_ITEM - 1) / PANEL_ITEM, panel_item, &p);
        vk_gemm_f16(0, 0, n, N, A->cols, panel, A->cols, B, ldb, C + r0 * ldc, ldc, numerics);
    }
    free(panel);
}
