/* vane_exec.c -- the vane executor: one function per op family, all with
 * ANE numerics. Every result is stored in its slot's dtype: fp16 results are
 * rounded once from an fp32 computation (overflow gives +-inf exactly as
 * fp16 does); under STRICT numerics fp16 results also lose their denormals.
 * Products and reductions accumulate in fp32. */
/* Nothing here reads the floating-point exception flags, so GCC may treat
 * comparisons as non-trapping: that lets it turn the selects of vexp and of
 * the NaN-propagating max into vector blends instead of branches. Results
 * are unchanged. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "vane_plan.h"

#define CHUNK 256            /* elements converted per inner pass (stack floats) */
#define TASK_ELEMS 16384     /* elements per parallel task of elementwise work */
#define PARALLEL_MIN 32768   /* softmax: below this many elements, run on the calling thread */
#define MATMUL_PARALLEL_MIN (1 << 20)   /* multiply-adds: below, a batched matmul runs inline */
#define EW_PARALLEL_MIN 65536  /* past this the pool pays for its wake-up: 53 -> 37 us for 196K */

/* ---- dims and strides --------------------------------------------------- */

static void contiguous_strides(int rank, const int64_t *shape, int64_t *strides)
{
    int64_t s = 1;
    for (int d = rank - 1; d >= 0; d--) {
        strides[d] = s;
        s *= shape[d];
    }
}

/* Drops extent-1 axes and merges neighbours that every operand walks
 * contiguously, so inner loops run as long as possible. strides[k] are the
 * element strides of operand k over `dims`. Returns the new rank (>= 1). */
static int collapse(int rank, int64_t *dims, int nops, int64_t (*strides)[MIL_MAX_RANK])
{
    int r = 0;
    for (int d = 0; d < rank; d++) {
        if (dims[d] == 1) continue;
        dims[r] = dims[d];
        for (int k = 0; k < nops; k++) strides[k][r] = strides[k][d];
        r++;
    }
    if (r == 0) {
        dims[0] = 1;
        for (int k = 0; k < nops; k++) strides[k][0] = 1;
        return 1;
    }
    int w = 0;
    for (int d = 1; d < r; d++) {
        int ok = 1;
        for (int k = 0; k < nops; k++)
            ok &= strides[k][w] == strides[k][d] * dims[d];
        if (ok) {
            dims[w] *= dims[d];
            for (int k = 0; k < nops; k++) strides[k][w] = strides[k][d];
        } else {
            w++;
            dims[w] = dims[d];
            for (int k = 0; k < nops; k++) strides[k][w] = strides[k][d];
        }
    }
    return w + 1;
}

/* Element offsets of operands at outer row `row` (all axes but the last). The
 * outermost axis takes what is left of `row` without a division: a 2-D walk (a
 * head norm's [16, 128] -> [128, 16] transpose, 128 rows of 16) divides not at all. */
static void row_offsets(int rank, const int64_t *dims, int nops,
                        int64_t (*strides)[MIL_MAX_RANK], int64_t row, int64_t *off)
{
    for (int k = 0; k < nops; k++) off[k] = 0;
    for (int d = rank - 2; d >= 1; d--) {
        int64_t i = row % dims[d];
        row /= dims[d];
        for (int k = 0; k < nops; k++) off[k] += i * strides[k][d];
    }
    if (rank >= 2)
        for (int k = 0; k < nops; k++) off[k] += row * strides[k][0];
}

static void load_f32(const void *base, mil_dtype dt, int64_t off, int64_t stride, size_t n,
                     float *dst)
{
    if (stride == 0) {
        float v = dt == MIL_DT_FP16 ? vk_f16_to_f32(((const fp16_t *)base)[off])
                                    : ((const float *)base)[off];
        for (size_t i = 0; i < n; i++) dst[i] = v;
    } else if (dt == MIL_DT_FP16) {
        vk_f16_to_f32_array((const fp16_t *)base + off, dst, n);
    } else {
        memcpy(dst, (const float *)base + off, n * sizeof(float));
    }
}

static void store_f32(void *base, mil_dtype dt, int64_t off, const float *src, size_t n,
                      vk_numerics num)
{
    if (dt == MIL_DT_FP16) {
        fp16_t *d = (fp16_t *)base + off;
        vk_f32_to_f16_array(src, d, n);
        if (num == VK_NUMERICS_STRICT) vk_f16_flush_denormals(d, n);
    } else {
        memcpy((float *)base + off, src, n * sizeof(float));
    }
}

/* ---- exp ----------------------------------------------------------------- */

/* exp(x) in fp32, written so that the compiler vectorizes loops over it (libm's
 * expf is a call per element). Range reduction x = n ln2 + r, |r| <= ln2/2,
 * and a degree-6 Taylor polynomial: relative error below 2e-7, far inside the
 * fp16 rounding that follows. exp(+inf) = inf, exp(-inf) = 0, NaN stays NaN;
 * results below FLT_MIN (x < -87.33) are flushed to 0, results past FLT_MAX
 * are inf. */
static inline float vexp(float x)
{
    float xc = x < -87.33f ? -87.33f : (x > 88.72f ? 88.72f : x);
    xc = xc != xc ? 0.0f : xc;   /* NaN: computed on 0, replaced below */
    const float shifter = 12582912.0f;   /* 1.5 * 2^23: adding it rounds to an integer */
    float n = (xc * 1.44269504088896341f + shifter) - shifter;
    float r = xc - n * 0.693145751953125f;
    r = r - n * 1.42860682030941723e-6f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.6666667163e-1f + r * (4.1666667908e-2f +
                     r * (8.3333337680e-3f + r * 1.3888889225e-3f)))));
    /* 2^n as 2^a * 2^b with a, b in [-63, 64]: n in [-126, 128] stays normal */
    int32_t ni = (int32_t)n, a = ni / 2, b = ni - a;
    uint32_t ea = (uint32_t)(a + 127) << 23, eb = (uint32_t)(b + 127) << 23;
    float sa, sb;
    memcpy(&sa, &ea, sizeof sa);
    memcpy(&sb, &eb, sizeof sb);
    float y = p * sa * sb;
    y = x < -87.33f ? 0.0f : y;
    y = x > 88.72f ? INFINITY : y;
    return x != x ? x : y;
}

/* ---- tanh ---------------------------------------------------------------- */

/* tanh(x) computed in double and rounded to fp32 once, written so that loops over
 * it vectorize (libm's tanhf is a call per element: 18% of a GPT-2 prefill). Its
 * error, below 1e-14 relative, is far under half an fp32 ulp, so the fp32 result
 * is the correctly rounded tanh (as tanhf's nearly always is) and the fp16 value
 * stored after it matches every reference that rounds an accurate tanh.
 *   |x| < 1/16      odd Taylor series to x^13 (error < (1/16)^14 relative)
 *   otherwise       (e - 1) / (e + 1) with e = exp(2|x|), |x| capped at 20 where
 *                   tanh is 1 in fp32; exp by n ln2 + r, |r| <= ln2/2, and a
 *                   degree-13 Taylor polynomial (error < 1e-16).
 * NaN stays NaN; +-inf give +-1. */
static inline float vtanh(float xf)
{
    double x = xf, ax = x < 0 ? -x : x;
    ax = ax > 20.0 ? 20.0 : ax;
    ax = ax != ax ? 0.0 : ax;                /* NaN: computed on 0, replaced below */
    double x2 = ax * ax;
    double small = ax * (1.0 + x2 * (-1.0 / 3 + x2 * (2.0 / 15 + x2 * (-17.0 / 315 +
                   x2 * (62.0 / 2835 + x2 * (-1382.0 / 155925 + x2 * (21844.0 / 6081075)))))));
    double y = 2.0 * ax;
    const double shifter = 6755399441055744.0;    /* 1.5 * 2^52: adding it rounds to an integer */
    double shifted = y * 1.4426950408889634 + shifter;   /* n in its low mantissa bits */
    double n = shifted - shifter;
    double r = (y - n * 0.693147180369123816490) - n * 1.90821492927058770002e-10;
    double p = 1.0 / 6227020800.0;
    p = 1.0 / 479001600.0 + r * p;
    p = 1.0 / 39916800.0 + r * p;
    p = 1.0 / 3628800.0 + r * p;
    p = 1.0 / 362880.0 + r * p;
    p = 1.0 / 40320.0 + r * p;
    p = 1.0 / 5040.0 + r * p;
    p = 1.0 / 720.0 + r * p;
    p = 1.0 / 120.0 + r * p;
    p = 1.0 / 24.0 + r * p;
    p = 1.0 / 6.0 + r * p;
    p = 0.5 + r * p;
    p = 1.0 + r * p;
    p = 1.0 + r * p;
    /* 2^n from the bits of `shifted` (no double -> int64 conversion, which
     * would need AVX512DQ to vectorize): n in [0, 58] */
    uint64_t bits;
    memcpy(&bits, &shifted, sizeof bits);
    bits = (bits + 1023) << 52;
    double scale;
    memcpy(&scale, &bits, sizeof scale);
    double e = p * scale;
    double t = ax < 0.0625 ? small : (e - 1.0) / (e + 1.0);
    float out = (float)(x < 0 ? -t : t);
    return xf != xf ? xf : out;
}

/* ---- elementwise (unary, binary, cast, clip) ----------------------------- */

VK_CLONES static void ew_compute(vane_op op, const float *a, const float *b, float *o, size_t n,
                       float p0, float p1)
{
    size_t i;
    switch (op) {
    case MIL_OP_ADD: for (i = 0; i < n; i++) o[i] = a[i] + b[i]; break;
    case MIL_OP_SUB: for (i = 0; i < n; i++) o[i] = a[i] - b[i]; break;
    case MIL_OP_MUL: for (i = 0; i < n; i++) o[i] = a[i] * b[i]; break;
    case MIL_OP_REAL_DIV: for (i = 0; i < n; i++) o[i] = a[i] / b[i]; break;
    case MIL_OP_POW: for (i = 0; i < n; i++) o[i] = powf(a[i], b[i]); break;
    case MIL_OP_MAXIMUM:
        for (i = 0; i < n; i++) o[i] = (a[i] > b[i] || a[i] != a[i]) ? a[i] : b[i];
        break;
    case MIL_OP_MINIMUM:
        for (i = 0; i < n; i++) o[i] = (a[i] < b[i] || a[i] != a[i]) ? a[i] : b[i];
        break;
    case MIL_OP_SIGMOID: for (i = 0; i < n; i++) o[i] = 1.0f / (1.0f + vexp(-a[i])); break;
    case MIL_OP_TANH: for (i = 0; i < n; i++) o[i] = vtanh(a[i]); break;
    case MIL_OP_EXP: for (i = 0; i < n; i++) o[i] = vexp(a[i]); break;
    case MIL_OP_SQRT: for (i = 0; i < n; i++) o[i] = sqrtf(a[i]); break;
    case MIL_OP_RELU: for (i = 0; i < n; i++) o[i] = a[i] < 0.0f ? 0.0f : a[i]; break;
    case MIL_OP_NEG: for (i = 0; i < n; i++) o[i] = -a[i]; break;
    case MIL_OP_CLIP:
        for (i = 0; i < n; i++) o[i] = a[i] < p0 ? p0 : (a[i] > p1 ? p1 : a[i]);
        break;
    default: memcpy(o, a, n * sizeof(float)); break;   /* cast, identity */
    }
}

/* ---- fp16 unary functions by table ---------------------------------------- */
/* tanh, sigmoid and exp of an fp16 value, rounded to fp16, are functions of 16 bits:
 * a table of all 65,536 results, each computed by ew_compute as the op computes it,
 * gives the same bits for a load and a store. GELU's tanh over a GPT-2 8-row step's
 * [3072, 8] took 35 us by the polynomial, 8 by the table on 2 threads (whose lines a
 * layer's weights have pushed out of L2 by the next use; a table of magnitudes only, or
 * with the ranges where tanh is x or 1 cut out, was slower: its selects cost more than
 * the misses they saved). Built on first use (about 0.3 ms), 128 KiB an op, never
 * freed. */
enum { UNARY_TANH, UNARY_SIGMOID, UNARY_EXP, UNARY_TABLES };
static _Atomic(fp16_t *) g_unary[UNARY_TABLES];
#define LOOKUP_PARALLEL_MIN 16384   /* a cold lookup costs about 0.7 ns: past this, 2 threads */

static const fp16_t *unary_table(vane_op op)
{
    int k = op == MIL_OP_TANH ? UNARY_TANH : op == MIL_OP_SIGMOID ? UNARY_SIGMOID
                                           : op == MIL_OP_EXP ? UNARY_EXP : -1;
    if (k < 0) return NULL;
    fp16_t *table = atomic_load_explicit(&g_unary[k], memory_order_acquire);
    if (table) return table;
    table = malloc(65536 * sizeof *table);
    if (!table) return NULL;             /* the op computes each value instead */
    fp16_t h[CHUNK];
    float a[CHUNK], o[CHUNK];
    for (uint32_t v0 = 0; v0 < 65536; v0 += CHUNK) {
        for (uint32_t i = 0; i < CHUNK; i++) h[i] = (fp16_t)(v0 + i);
        vk_f16_to_f32_array(h, a, CHUNK);
        ew_compute(op, a, a, o, CHUNK, 0.0f, 0.0f);
        vk_f32_to_f16_array(o, table + v0, CHUNK);
    }
    fp16_t *none = NULL;       /* another thread may have built it first: keep one */
    if (!atomic_compare_exchange_strong(&g_unary[k], &none, table)) {
        free(table);
        table = none;
    }
    return table;
}

typedef struct lookup_ctx {
    const fp16_t *table, *x;
    fp16_t *y;
    size_t n, per_task;
    int strict;
} lookup_ctx;

static void lookup_task(void *vctx, size_t t)
{
    const lookup_ctx *c = vctx;
    size_t i0 = t * c->per_task, i1 = i0 + c->per_task < c->n ? i0 + c->per_task : c->n;
    const fp16_t *restrict table = c->table, *restrict x = c->x;
    fp16_t *restrict y = c->y;
    for (size_t i = i0; i < i1; i++) y[i] = table[x[i]];
    if (c->strict) vk_f16_flush_denormals(y + i0, i1 - i0);
}

typedef struct ew_ctx {
    vane_op op;
    int nops;                       /* operands (1 or 2) */
    int rank;
    int64_t dims[MIL_MAX_RANK];
    int64_t strides[3][MIL_MAX_RANK];   /* [0] output, [1] x, [2] y */
    const void *src[2];
    mil_dtype src_dt[2];
    void *dst;
    mil_dtype dst_dt;
    float p0, p1;
    vk_numerics num;
    int fused;                      /* every operand fp16 and ew_kind holds the op */
    vk_ew_op kind;
    int64_t inner, chunks;          /* inner extent, tasks per row */
    int64_t rows, rows_per_task;    /* outer rows; rows a task takes when chunks == 1 */
} ew_ctx;

/* The one-pass kernel's op for a vane op, if it has one (cast and identity, pow and
 * the transcendental functions go through ew_compute). */
static int ew_kind(vane_op op, vk_ew_op *kind)
{
    switch (op) {
    case MIL_OP_ADD: *kind = VK_EW_ADD; return 1;
    case MIL_OP_SUB: *kind = VK_EW_SUB; return 1;
    case MIL_OP_MUL: *kind = VK_EW_MUL; return 1;
    case MIL_OP_REAL_DIV: *kind = VK_EW_DIV; return 1;
    case MIL_OP_MAXIMUM: *kind = VK_EW_MAX; return 1;
    case MIL_OP_MINIMUM: *kind = VK_EW_MIN; return 1;
    case MIL_OP_RELU: *kind = VK_EW_RELU; return 1;
    case MIL_OP_NEG: *kind = VK_EW_NEG; return 1;
    case MIL_OP_CLIP: *kind = VK_EW_CLIP; return 1;
    default: return 0;
    }
}

/* Rows of the one-pass kernel, where every operand is fp16: rows [r0, r0 + rows) of a
 * two-axis op from element j0 to j1 (a row's operands start at off[] for r0, then each
 * steps by its first axis's stride), or a span of one row of any rank. Returns 0 if it
 * computed them, -1 if the kernel cannot (an operand's values not at stride 0 or 1, or
 * no kernel on this path). */
static int ew_fused(const ew_ctx *c, const int64_t *off, int64_t rows, int64_t j0, int64_t j1)
{
    if (!c->fused) return -1;
    const int last = c->rank - 1;
    const int64_t sa = c->strides[1][last], sb = c->nops > 1 ? c->strides[2][last] : 0;
    vk_ew_rows j = {c->kind, (size_t)rows, (size_t)(j1 - j0),
                    (const fp16_t *)c->src[0] + off[1] + j0 * sa,
                    c->nops > 1 ? (const fp16_t *)c->src[1] + off[2] + j0 * sb : NULL,
                    (size_t)c->strides[1][0], (size_t)sa, (size_t)c->strides[2][0], (size_t)sb,
                    (fp16_t *)c->dst + off[0] + j0, c->p0, c->p1};
    if (vk_ew_f16(&j)) return -1;
    if (c->num == VK_NUMERICS_STRICT) vk_f16_flush_denormals(j.o, (size_t)(rows * (j1 - j0)));
    return 0;
}

/* Elements [j0, j1) of one outer row. */
static void ew_span(const ew_ctx *c, int64_t row, int64_t j0, int64_t j1)
{
    int64_t off[3];
    row_offsets(c->rank, c->dims, c->nops + 1, (int64_t(*)[MIL_MAX_RANK])c->strides, row, off);
    if (ew_fused(c, off, 1, j0, j1) == 0) return;
    float a[CHUNK], b[CHUNK], o[CHUNK];
    int last = c->rank - 1;
    for (int64_t j = j0; j < j1; j += CHUNK) {
        size_t n = (size_t)(j1 - j < CHUNK ? j1 - j : CHUNK);
        load_f32(c->src[0], c->src_dt[0], off[1] + j * c->strides[1][last], c->strides[1][last],
                 n, a);
        if (c->nops > 1)
            load_f32(c->src[1], c->src_dt[1], off[2] + j * c->strides[2][last],
                     c->strides[2][last], n, b);
        ew_compute(c->op, a, b, o, n, c->p0, c->p1);
        store_f32(c->dst, c->dst_dt, off[0] + j, o, n, c->num);
    }
}

/* Whole rows [r0, r1) shorter than CHUNK, as many to a pass as CHUNK holds: a
 * Qwen3 head norm multiplies [128, 16] by a [16] row, which one pass per row
 * took 5 us for (128 passes of 16 elements), 6 such products a layer. An
 * operand's rows that follow each other in memory load in one call; a row that
 * repeats the pass's first (broadcast over rows) is copied from it. Each
 * element is computed as ew_span computes it, so the bits are the same. */
static void ew_short_rows(const ew_ctx *c, int64_t r0, int64_t r1)
{
    const int64_t inner = c->inner, per = CHUNK / inner;
    const int last = c->rank - 1;
    float a[CHUNK], b[CHUNK], o[CHUNK];
    int64_t offs[CHUNK][3];
    for (int64_t g0 = r0; g0 < r1; g0 += per) {
        const int64_t rows = g0 + per < r1 ? per : r1 - g0;
        for (int64_t i = 0; i < rows; i++)
            row_offsets(c->rank, c->dims, c->nops + 1, (int64_t(*)[MIL_MAX_RANK])c->strides,
                        g0 + i, offs[i]);
        for (int k = 0; k < c->nops; k++) {
            float *buf = k ? b : a;
            const int64_t s = c->strides[k + 1][last];
            for (int64_t i = 0, j; i < rows; i = j) {
                const int64_t at = offs[i][k + 1];
                j = i + 1;
                if (s == 1)       /* rows that continue one another */
                    while (j < rows && offs[j][k + 1] == offs[j - 1][k + 1] + inner) j++;
                else              /* one value a row: equal rows are one fill */
                    while (j < rows && offs[j][k + 1] == at) j++;
                if (s == 1 && j == i + 1 && i > 0 && at == offs[0][k + 1])
                    memcpy(buf + i * inner, buf, (size_t)inner * sizeof(float));
                else
                    load_f32(c->src[k], c->src_dt[k], at, s, (size_t)((j - i) * inner),
                             buf + i * inner);
            }
        }
        const size_t n = (size_t)(rows * inner);
        ew_compute(c->op, a, b, o, n, c->p0, c->p1);
        store_f32(c->dst, c->dst_dt, offs[0][0], o, n, c->num);
    }
}

/* Operand k's rows [r0, r0 + rows) of a two-axis op into buf (rows * inner floats),
 * by the shape of its strides: rows that continue one another load in one call;
 * one value a row (a bias over [C, B]) loads the column of values once and spreads
 * each over its row; a repeated row loads once and is copied. */
static void load_rows2(const ew_ctx *c, int k, int64_t r0, int64_t rows, float *buf)
{
    const int64_t inner = c->inner, s0 = c->strides[k + 1][0], s1 = c->strides[k + 1][1];
    const void *src = c->src[k];
    const mil_dtype dt = c->src_dt[k];
    if (s1 == 1 && s0 == inner) {
        load_f32(src, dt, r0 * s0, 1, (size_t)(rows * inner), buf);
    } else if (s1 == 0 && s0 != 0) {
        float col[CHUNK];
        if (s0 == 1)
            load_f32(src, dt, r0, 1, (size_t)rows, col);
        else
            for (int64_t i = 0; i < rows; i++) load_f32(src, dt, (r0 + i) * s0, 0, 1, col + i);
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < inner; j++) buf[i * inner + j] = col[i];
    } else if (s0 == 0) {
        load_f32(src, dt, 0, s1, (size_t)inner, buf);
        for (int64_t i = 1; i < rows; i++)
            memcpy(buf + i * inner, buf, (size_t)inner * sizeof(float));
    } else {
        for (int64_t i = 0; i < rows; i++)
            load_f32(src, dt, (r0 + i) * s0, s1, (size_t)inner, buf + i * inner);
    }
}

/* Whole rows [r0, r1) of a two-axis op (after collapse) with rows shorter than
 * CHUNK: row offsets are multiples of the first axis's stride, so no row needs
 * row_offsets' divisions. A batch of 8 decode rows makes [768, 8] sums with a
 * [768, 1] bias; ew_short_rows took 8 us for one (two loads a row), this 1.5 us.
 * Each element is computed as ew_span computes it: the same bits. */
static void ew_short_rows2(const ew_ctx *c, int64_t r0, int64_t r1)
{
    const int64_t inner = c->inner, per = CHUNK / inner;
    int64_t off[3];
    for (int k = 0; k <= c->nops; k++) off[k] = r0 * c->strides[k][0];
    if (ew_fused(c, off, r1 - r0, 0, inner) == 0) return;   /* all rows in one call */
    float a[CHUNK], b[CHUNK], o[CHUNK];
    for (int64_t g0 = r0; g0 < r1; g0 += per) {
        const int64_t rows = g0 + per < r1 ? per : r1 - g0;
        load_rows2(c, 0, g0, rows, a);
        if (c->nops > 1) load_rows2(c, 1, g0, rows, b);
        const size_t n = (size_t)(rows * inner);
        ew_compute(c->op, a, b, o, n, c->p0, c->p1);
        store_f32(c->dst, c->dst_dt, g0 * inner, o, n, c->num);
    }
}

/* Task t: a chunk of TASK_ELEMS of one long row, or whole short rows (a bias
 * broadcast over [C, S] has rows of S elements: one task per row was 768 tasks
 * of 128 elements, 228 us an op on 2 threads against 35 us on one). */
static void ew_task(void *vctx, size_t t)
{
    const ew_ctx *c = vctx;
    if (c->chunks > 1) {
        int64_t row = (int64_t)t / c->chunks, j0 = (int64_t)t % c->chunks * TASK_ELEMS;
        ew_span(c, row, j0, j0 + TASK_ELEMS < c->inner ? j0 + TASK_ELEMS : c->inner);
        return;
    }
    int64_t r0 = (int64_t)t * c->rows_per_task, r1 = r0 + c->rows_per_task;
    if (r1 > c->rows) r1 = c->rows;
    if (c->inner * 2 <= CHUNK && r1 - r0 > 1) {
        if (c->rank == 2)
            ew_short_rows2(c, r0, r1);
        else
            ew_short_rows(c, r0, r1);
        return;
    }
    for (int64_t row = r0; row < r1; row++) ew_span(c, row, 0, c->inner);
}

static void exec_elementwise(const vane_plan *pl, const vane_step *sp, void *const *ptr)
{
    const vane_slot *R = &pl->slots[sp->out[0]];
    ew_ctx c;
    memset(&c, 0, sizeof c);
    c.op = sp->op;
    c.nops = sp->n_in;
    c.rank = R->rank;
    memcpy(c.dims, R->shape, sizeof c.dims);
    contiguous_strides(R->rank, R->shape, c.strides[0]);
    for (int k = 0; k < sp->n_in; k++) {
        const vane_slot *X = &pl->slots[sp->in[k]];
        int64_t xs[MIL_MAX_RANK];
        contiguous_strides(X->rank, X->shape, xs);
        for (int d = 0; d < R->rank; d++) {
            int xd = d - (R->rank - X->rank);
            c.strides[k + 1][d] = (xd < 0 || X->shape[xd] == 1) ? 0 : xs[xd];
        }
        c.src[k] = ptr[sp->in[k]];
        c.src_dt[k] = X->dtype;
    }
    c.rank = collapse(R->rank, c.dims, c.nops + 1, c.strides);
    const fp16_t *table = NULL;
    if (c.rank == 1 && c.strides[1][0] == 1 && c.src_dt[0] == MIL_DT_FP16 &&
        R->dtype == MIL_DT_FP16 && (table = unary_table(sp->op)) != NULL) {
        size_t n = (size_t)R->numel, threads = vk_threads();
        size_t tasks = n >= LOOKUP_PARALLEL_MIN && threads > 1 ? threads : 1;
        lookup_ctx l = {table, c.src[0], ptr[sp->out[0]], n, (n + tasks - 1) / tasks,
                        pl->numerics == VK_NUMERICS_STRICT};
        if (tasks > 1)
            vk_parallel_for(tasks, lookup_task, &l);
        else
            lookup_task(&l, 0);
        return;
    }
    c.dst = ptr[sp->out[0]];
    c.dst_dt = R->dtype;
    c.fused = R->dtype == MIL_DT_FP16 && ew_kind(sp->op, &c.kind);
    for (int k = 0; k < c.nops; k++) c.fused &= c.src_dt[k] == MIL_DT_FP16;
    c.p0 = sp->f0;
    c.p1 = sp->f1;
    c.num = pl->numerics;
    c.inner = c.dims[c.rank - 1];
    c.chunks = (c.inner + TASK_ELEMS - 1) / TASK_ELEMS;
    c.rows = R->numel / c.inner;
    c.rows_per_task = c.chunks > 1 ? 1 : (TASK_ELEMS + c.inner - 1) / c.inner;
    size_t tasks = c.chunks > 1 ? (size_t)(c.rows * c.chunks)
                                : (size_t)((c.rows + c.rows_per_task - 1) / c.rows_per_task);
    if (R->numel >= EW_PARALLEL_MIN && tasks > 1) {
        vk_parallel_for(tasks, ew_task, &c);
    } else {
        for (size_t t = 0; t < tasks; t++) ew_task(&c, t);
    }
}

/* ---- conv (1x1) and matmul: fp16 GEMM with fp32 accumulation ----------- */

static void exec_conv(const vane_plan *pl, const vane_step *sp, void *const *ptr,
                      const vane_eval_hints *hints)
{
    const vane_slot *X = &pl->slots[sp->in[0]], *W = &pl->slots[sp->in[1]];
    size_t N = (size_t)X->shape[0], C = (size_t)X->shape[1], O = (size_t)W->shape[0];
    size_t S = (size_t)(X->shape[2] * X->shape[3]);
    const fp16_t *x = ptr[sp->in[0]], *w = ptr[sp->in[1]];
    fp16_t *y = ptr[sp->out[0]];
    const vane_quant *q = W->quant >= 0 ? &pl->quants[W->quant] : NULL;
    /* the live columns alone (orion_program_set_live_columns), columns [a, b), the
     * others becoming zeros. Up to VK_GEMV_MULTI_MAX columns each column is its own
     * GEMV, so the live ones keep the bits they have beside the others; past it the
     * product sums in k order, another rounding, so there every column is computed. */
    int hinted = hints && hints->columns == S && S <= VK_GEMV_MULTI_MAX;
    size_t a = hinted ? (size_t)hints->first : 0, b = hinted ? a + (size_t)hints->live : S;
    /* out[O, S] = W[O, C] * x[C, S] per batch item; a compressed W is decoded as the
     * product reads it (vk_qgemm_f16) unless it was decoded whole at load */
    for (size_t n = 0; n < N; n++) {
        fp16_t *yn = y + n * O * S;
        const fp16_t *xn = x + n * C * S;
        if (q && !q->dense)
            vk_qgemm_f16(&q->m, b - a, xn + a, S, yn + a, S, pl->numerics);
        else
            vk_gemm_f16(0, 0, O, b - a, C, w, C, xn + a, S, yn + a, S, pl->numerics);
        for (size_t o = 0; b - a < S && o < O; o++) {
            memset(yn + o * S, 0, a * sizeof *yn);
            memset(yn + o * S + b, 0, (S - b) * sizeof *yn);
        }
    }
}

/* One matmul operand as the matmul sees it: its shape and element strides,
 * through a folded transpose's permutation where there is one. */
typedef struct mm_operand {
    int rank;
    int64_t shape[MIL_MAX_RANK], stride[MIL_MAX_RANK];
} mm_operand;

static void matmul_operand(const vane_plan *pl, const vane_step *sp, int k, mm_operand *o)
{
    const vane_slot *X = &pl->slots[sp->in[k]];
    int64_t xs[MIL_MAX_RANK];
    contiguous_strides(X->rank, X->shape, xs);
    o->rank = X->rank;
    for (int d = 0; d < X->rank; d++) {
        int a = sp->viewed[k] ? sp->view_perm[k][d] : d;
        o->shape[d] = X->shape[a];
        o->stride[d] = xs[a];
    }
}

typedef struct matmul_job {
    const vane_slot *R;
    int br;
    size_t M, N, K;
    size_t n_live, k_live;              /* op(y) is zero from column n_live, row k_live */
    size_t xrs, xcs, yrs, ycs;          /* op(x)(i, k), op(y)(k, j) element strides */
    const int64_t *bx, *by;             /* batch strides in elements, 0 = broadcast */
    const fp16_t *x, *y;
    fp16_t *o;
    vk_numerics numerics;
} matmul_job;

/* One matrix of a batched matmul (e.g. one attention head). */
static void matmul_item(void *ctx, size_t b)
{
    const matmul_job *j = ctx;
    int64_t rem = (int64_t)b, ix = 0, iy = 0;
    for (int d = j->br - 1; d >= 0; d--) {
        int64_t i = rem % j->R->shape[d];
        rem /= j->R->shape[d];
        ix += i * j->bx[d];
        iy += i * j->by[d];
    }
    vk_gemm_f16_live(j->M, j->N, j->K, j->x + ix, j->xrs, j->xcs, j->y + iy, j->yrs, j->ycs,
                     j->o + b * j->M * j->N, j->N, j->numerics, j->n_live, j->k_live);
}

/* The rows of operand y, stored [..., rows, cols] (not a permuted view), that may be
 * nonzero: all of them, unless y is an input whose zero-tail promise has one block per
 * [rows, cols] matrix (a KV cache head), which leaves the rows holding its live part. */
static size_t live_rows(const vane_plan *pl, const vane_step *sp, const mm_operand *Y,
                        const vane_zero_tail *tails)
{
    size_t rows = (size_t)Y->shape[Y->rank - 2], cols = (size_t)Y->shape[Y->rank - 1];
    const vane_slot *root = &pl->slots[vane_slot_root(pl, sp->in[1])];
    if (!tails || sp->viewed[1] || root->storage != VS_INPUT || root->index < 0 || !cols)
        return rows;
    const vane_zero_tail *t = &tails[root->index];
    if (t->block != (uint64_t)rows * cols)
        return rows;
    size_t live = (size_t)((t->live + cols - 1) / cols);
    return live < rows ? live : rows;
}

static void exec_matmul(const vane_plan *pl, const vane_step *sp, void *const *ptr,
                        const vane_zero_tail *tails)
{
    const vane_slot *R = &pl->slots[sp->out[0]];
    mm_operand X, Y;
    matmul_operand(pl, sp, 0, &X);
    matmul_operand(pl, sp, 1, &Y);
    int tx = sp->flag_x, ty = sp->flag_y;
    size_t xr = (size_t)X.shape[X.rank - 2], xc = (size_t)X.shape[X.rank - 1];
    size_t yr = (size_t)Y.shape[Y.rank - 2], yc = (size_t)Y.shape[Y.rank - 1];
    size_t xrs = (size_t)X.stride[X.rank - 2], xcs = (size_t)X.stride[X.rank - 1];
    size_t yrs = (size_t)Y.stride[Y.rank - 2], ycs = (size_t)Y.stride[Y.rank - 1];
    int br = R->rank - 2;
    /* batch strides in elements, 0 where an operand broadcasts */
    int64_t bx[MIL_MAX_RANK], by[MIL_MAX_RANK];
    for (int d = br - 1; d >= 0; d--) {
        int xd = d - (br - (X.rank - 2)), yd = d - (br - (Y.rank - 2));
        bx[d] = xd < 0 || X.shape[xd] == 1 ? 0 : X.stride[xd];
        by[d] = yd < 0 || Y.shape[yd] == 1 ? 0 : Y.stride[yd];
    }
    int64_t batches = 1;
    for (int d = 0; d < br; d++) batches *= R->shape[d];
    size_t N = ty ? yr : yc, K = tx ? xr : xc, y_live = live_rows(pl, sp, &Y, tails);
    matmul_job j = {R, br, tx ? xc : xr, N, K, ty ? y_live : N, ty ? K : y_live,
                    tx ? xcs : xrs, tx ? xrs : xcs, ty ? ycs : yrs, ty ? yrs : ycs,
                    bx, by, ptr[sp->in[0]], ptr[sp->in[1]], ptr[sp->out[0]], pl->numerics};
    /* Many small matrices (attention heads): one per worker, each GEMM on one
     * thread (a nested parallel_for runs inline), instead of splitting every
     * small GEMM over the pool and paying its hand-off once per head. Not for
     * a product too small to pay for the hand-off at all (decode attention:
     * 12 heads of 256 x 64 took 2.3 ms a token on 2 threads, 1.3 ms on one). */
    double macs = (double)batches * (double)j.M * (double)j.N * (double)j.K;
    if (batches >= (int64_t)vk_threads() && batches > 1 && macs >= MATMUL_PARALLEL_MIN)
        vk_parallel_for((size_t)batches, matmul_item, &j);
    else
        for (int64_t b = 0; b < batches; b++) matmul_item(&j, (size_t)b);
}

/* ---- reductions --------------------------------------------------------- */

/* Rows [rows, inner] of b folded into o[inner] in row order: o[k] = o[k] + b[r][k],
 * or the NaN-propagating max. The inner loop is vectorized across k, so a short kept
 * row ([768, 8] reduced over its 768) needs no loop per row; the same operations in
 * the same order per element, the same bits. */
VK_CLONES static void fold_rows(float *restrict o, const float *restrict b, int64_t rows,
                                int64_t inner, int is_max)
{
    for (int64_t r = 0; r < rows; r++, b += inner) {
        if (is_max)
            for (int64_t k = 0; k < inner; k++)
                o[k] = (b[k] > o[k] || b[k] != b[k]) ? b[k] : o[k];
        else
            for (int64_t k = 0; k < inner; k++) o[k] += b[k];
    }
}

static orion_status exec_reduce(const vane_plan *pl, const vane_step *sp, void *const *ptr)
{
    const vane_slot *X = &pl->slots[sp->in[0]], *R = &pl->slots[sp->out[0]];
    /* groups of adjacent axes that are all reduced or all kept */
    int64_t g[MIL_MAX_RANK];
    int red[MIL_MAX_RANK], m = 0;
    int64_t count = 1;
    for (int d = 0; d < X->rank; d++) {
        int r = (int)(sp->axes_mask >> d & 1);
        if (r) count *= X->shape[d];
        if (X->shape[d] == 1) continue;
        if (m > 0 && red[m - 1] == r) {
            g[m - 1] *= X->shape[d];
        } else {
            g[m] = X->shape[d];
            red[m++] = r;
        }
    }
    if (m == 0) {
        g[0] = 1;
        red[0] = 1;
        m = 1;
    }
    /* output strides of the kept groups */
    int64_t ostr[MIL_MAX_RANK], s = 1;
    for (int i = m - 1; i >= 0; i--) {
        ostr[i] = red[i] ? 0 : s;
        if (!red[i]) s *= g[i];
    }
    int is_max = sp->op == MIL_OP_REDUCE_MAX;
    float acc_stack[1024];
    float *acc = R->numel <= 1024 ? acc_stack : malloc((size_t)R->numel * sizeof *acc);
    if (!acc) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: out of memory");
    for (int64_t i = 0; i < R->numel; i++) acc[i] = is_max ? -INFINITY : 0.0f;
    int64_t inner = g[m - 1], rows = X->numel / inner;
    const void *x = ptr[sp->in[0]];
    float buf[1024];
    /* rows shorter than buf convert many to a call (they are contiguous): a Qwen3
     * head norm reduces [128, 16] over its 128, which a call per row of 16 made 2 us */
    int64_t per = inner < 1024 ? 1024 / inner : 1;
    int64_t row = 0;
    if (m == 2 && red[0] && !red[1] && per > 1)     /* [reduced, kept]: one fold a load */
        for (; row < rows; row += per) {
            int64_t n = rows - row < per ? rows - row : per;
            load_f32(x, X->dtype, row * inner, 1, (size_t)(n * inner), buf);
            fold_rows(acc, buf, n, inner, is_max);
        }
    /* the row's index in each outer group, advanced as an odometer: a division per
     * group and row cost a layer norm's [768, 8] mean 7 us, nearly all of its time */
    int64_t at[MIL_MAX_RANK] = {0}, ob = 0, in_buf = per;   /* rows of buf used */
    for (; row < rows; row++) {
        if (row > 0)
            for (int i = m - 2; i >= 0; i--) {
                ob += ostr[i];
                if (++at[i] < g[i]) break;
                ob -= at[i] * ostr[i];
                at[i] = 0;
            }
        if (per > 1 && in_buf == per) {
            load_f32(x, X->dtype, row * inner, 1,
                     (size_t)((rows - row < per ? rows - row : per) * inner), buf);
            in_buf = 0;
        }
        const float *b = per > 1 ? buf + in_buf++ * inner : buf;
        for (int64_t j = 0; j < inner; j += 1024) {
            size_t n = (size_t)(inner - j < 1024 ? inner - j : 1024);
            if (per == 1) load_f32(x, X->dtype, row * inner + j, 1, n, buf);
            if (red[m - 1]) {
                float a = acc[ob];
                if (is_max) {
                    for (size_t k = 0; k < n; k++)
                        a = (b[k] > a || b[k] != b[k]) ? b[k] : a;
                } else {
                    for (size_t k = 0; k < n; k++) a += b[k];
                }
                acc[ob] = a;
            } else {
                fold_rows(acc + ob + j, b, 1, (int64_t)n, is_max);
            }
        }
    }
    if (sp->op == MIL_OP_REDUCE_MEAN) {
        float inv = 1.0f / (float)count;
        for (int64_t i = 0; i < R->numel; i++) acc[i] *= inv;
    }
    store_f32(ptr[sp->out[0]], R->dtype, 0, acc, (size_t)R->numel, pl->numerics);
    if (acc != acc_stack) free(acc);
    return ORION_OK;
}

/* ---- softmax: fp32 on the fp16 input, one rounding ---------------------- */

#define SOFTMAX_COLS 64

typedef struct softmax_ctx {
    const void *x;
    void *y;
    mil_dtype xdt, ydt;
    int64_t outer, n, inner, col_blocks;
    vk_numerics num;
    int failed;
} softmax_ctx;

/* Softmax of one contiguous row, in place. An inf or NaN in the row makes
 * every element NaN (inf - inf), as on the device. */
VK_CLONES static void softmax_row(float *v, int64_t n)
{
    /* eight lanes of max and of sum so the loops vectorize; fp32 either way */
    float m8[8], s8[8];
    int nan = 0;
    for (int j = 0; j < 8; j++) m8[j] = -INFINITY;
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        for (int j = 0; j < 8; j++) {
            m8[j] = v[k + j] > m8[j] ? v[k + j] : m8[j];
            nan |= v[k + j] != v[k + j];
        }
    float mx = -INFINITY;
    for (int j = 0; j < 8; j++) mx = m8[j] > mx ? m8[j] : mx;
    for (; k < n; k++) {
        mx = v[k] > mx ? v[k] : mx;
        nan |= v[k] != v[k];
    }
    if (nan) mx = NAN;
    for (k = 0; k < n; k++) v[k] = vexp(v[k] - mx);
    for (int j = 0; j < 8; j++) s8[j] = 0.0f;
    for (k = 0; k + 8 <= n; k += 8)
        for (int j = 0; j < 8; j++) s8[j] += v[k + j];
    float sum = ((s8[0] + s8[1]) + (s8[2] + s8[3])) + ((s8[4] + s8[5]) + (s8[6] + s8[7]));
    for (; k < n; k++) sum += v[k];
    float inv = 1.0f / sum;
    for (k = 0; k < n; k++) v[k] *= inv;
}

/* Softmax of `cols` interleaved columns: v[k * cols + c] is element k of column c. */
static void softmax_cols(float *v, int64_t n, int64_t cols)
{
    if (cols == 1) {
        softmax_row(v, n);
        return;
    }
    for (int64_t c = 0; c < cols; c++) {
        float mx = -INFINITY;
        for (int64_t k = 0; k < n; k++) {
            float a = v[k * cols + c];
            mx = (a > mx || a != a) ? a : mx;
        }
        float sum = 0.0f;
        for (int64_t k = 0; k < n; k++) {
            float e = vexp(v[k * cols + c] - mx);
            v[k * cols + c] = e;
            sum += e;
        }
        for (int64_t k = 0; k < n; k++) v[k * cols + c] /= sum;
    }
}

static void softmax_task(void *vctx, size_t t)
{
    softmax_ctx *c = vctx;
    int64_t o = (int64_t)t / c->col_blocks, cb = (int64_t)t % c->col_blocks;
    int64_t c0 = cb * SOFTMAX_COLS, cols = c->inner - c0 < SOFTMAX_COLS ? c->inner - c0
                                                                        : SOFTMAX_COLS;
    float stackbuf[4096];
    float *v = (size_t)(c->n * cols) <= 4096 ? stackbuf
                                             : malloc((size_t)(c->n * cols) * sizeof(float));
    if (!v) {
        c->failed = 1;
        return;
    }
    int64_t base = o * c->n * c->inner + c0;
    if (c->inner == 1) {
        load_f32(c->x, c->xdt, base, 1, (size_t)c->n, v);
    } else {
        for (int64_t k = 0; k < c->n; k++)
            load_f32(c->x, c->xdt, base + k * c->inner, 1, (size_t)cols, v + k * cols);
    }
    softmax_cols(v, c->n, cols);
    if (c->inner == 1) {
        store_f32(c->y, c->ydt, base, v, (size_t)c->n, c->num);
    } else {
        for (int64_t k = 0; k < c->n; k++)
            store_f32(c->y, c->ydt, base + k * c->inner, v + k * cols, (size_t)cols, c->num);
    }
    if (v != stackbuf) free(v);
}

static orion_status exec_softmax(const vane_plan *pl, const vane_step *sp, void *const *ptr)
{
    const vane_slot *X = &pl->slots[sp->in[0]], *R = &pl->slots[sp->out[0]];
    softmax_ctx c = {ptr[sp->in[0]], ptr[sp->out[0]], X->dtype, R->dtype, 1, X->shape[sp->axis],
                     1, 1, pl->numerics, 0};
    for (int d = 0; d < sp->axis; d++) c.outer *= X->shape[d];
    for (int d = sp->axis + 1; d < X->rank; d++) c.inner *= X->shape[d];
    c.col_blocks = (c.inner + SOFTMAX_COLS - 1) / SOFTMAX_COLS;
    size_t tasks = (size_t)(c.outer * c.col_blocks);
    if (X->numel >= PARALLEL_MIN && tasks > 1) vk_parallel_for(tasks, softmax_task, &c);
    else
        for (size_t t = 0; t < tasks; t++) softmax_task(&c, t);
    if (c.failed) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: out of memory in softmax");
    return ORION_OK;
}

/* ---- data movement: transpose, slice, split, pad ------------------------ */

/* dst[i] = src[i] over `dims`, with element strides per side. */
static void copy_nd(void *dst, const int64_t *dstride, const void *src, const int64_t *sstride,
                    const int64_t *dims_in, int rank, size_t es)
{
    int64_t dims[MIL_MAX_RANK], st[2][MIL_MAX_RANK];
    if (rank == 0) {
        memcpy(dst, src, es);
        return;
    }
    memcpy(dims, dims_in, (size_t)rank * sizeof *dims);
    memcpy(st[0], dstride, (size_t)rank * sizeof(int64_t));
    memcpy(st[1], sstride, (size_t)rank * sizeof(int64_t));
    rank = collapse(rank, dims, 2, st);
    int64_t inner = dims[rank - 1], ds = st[0][rank - 1], ss = st[1][rank - 1];
    int64_t rows = 1;
    for (int d = 0; d < rank - 1; d++) rows *= dims[d];
    if (rank == 2 && es == 2 && ds == 1 && st[0][0] == inner && ss == dims[0] &&
        st[1][0] == 1) {   /* a whole matrix transposed ([V, 8] logits to [8, V]) */
        vk_f16_transpose(src, (size_t)inner, (size_t)dims[0], dst);
        return;
    }
    char *dp = dst;
    const char *sp = src;
    for (int64_t r = 0; r < rows; r++) {
        int64_t off[2];
        row_offsets(rank, dims, 2, st, r, off);
        if (ds == 1 && ss == 1) {
            memcpy(dp + off[0] * (int64_t)es, sp + off[1] * (int64_t)es, (size_t)inner * es);
        } else if (es == 2) {
            uint16_t *d = (uint16_t *)dp + off[0];
            const uint16_t *s = (const uint16_t *)sp + off[1];
            for (int64_t j = 0; j < inner; j++) d[j * ds] = s[j * ss];
        } else {
            uint32_t *d = (uint32_t *)dp + off[0];
            const uint32_t *s = (const uint32_t *)sp + off[1];
            for (int64_t j = 0; j < inner; j++) d[j * ds] = s[j * ss];
        }
    }
}

static void exec_transpose(const vane_plan *pl, const vane_step *sp, void *const *ptr)
{
    const vane_slot *X = &pl->slots[sp->in[0]], *R = &pl->slots[sp->out[0]];
    int64_t xs[MIL_MAX_RANK], ss[MIL_MAX_RANK], ds[MIL_MAX_RANK];
    contiguous_strides(X->rank, X->shape, xs);
    contiguous_strides(R->rank, R->shape, ds);
    for (int d = 0; d < R->rank; d++) ss[d] = xs[sp->perm[d]];
    copy_nd(ptr[sp->out[0]], ds, ptr[sp->in[0]], ss, R->shape, R->rank, vane_dtype_size(X->dtype));
}

static void exec_slice(const vane_plan *pl, const vane_step *sp, void *const *ptr)
{
    const vane_slot *X = &pl->slots[sp->in[0]];
    int r = X->rank;
    size_t es = vane_dtype_size(X->dtype);
    int64_t xs[MIL_MAX_RANK], ss[MIL_MAX_RANK], ds[MIL_MAX_RANK], dims[MIL_MAX_RANK];
    contiguous_strides(r, X->shape, xs);
    int64_t base = 0;
    for (int d = 0; d < r; d++) {
        dims[d] = sp->perm[d];
        base += sp->begin[d] * xs[d];
        ss[d] = xs[d] * sp->stride[d];
    }
    contiguous_strides(r, dims, ds);
    copy_nd(ptr[sp->out[0]], ds, (const char *)ptr[sp->in[0]] + base * (int64_t)es, ss, dims, r,
            es);
}

static void exec_split(const vane_plan *pl, const vane_step *sp, void *const *ptr)
{
    const vane_slot *X = &pl->slots[sp->in[0]];
    size_t es = vane_dtype_size(X->dtype);
    int64_t xs[MIL_MAX_RANK], ds[MIL_MAX_RANK], dims[MIL_MAX_RANK];
    contiguous_strides(X->rank, X->shape, xs);
    int64_t at = 0;
    for (int i = 0; i < sp->n_out; i++) {
        memcpy(dims, X->shape, sizeof dims);
        dims[sp->axis] = sp->sizes[i];
        contiguous_strides(X->rank, dims, ds);
        copy_nd(ptr[sp->out[i]], ds, (const char *)ptr[sp->in[0]] + at * xs[sp->axis] * (int64_t)es,
                xs, dims, X->rank, es);
        at += sp->sizes[i];
    }
}

/* Elements [from, to) of y set to v (es bytes each). */
static void pad_fill(void *y, size_t es, int64_t from, int64_t to, float v)
{
    if (to <= from) return;
    if (v == 0.0f && !signbit(v)) {
        memset((char *)y + from * (int64_t)es, 0, (size_t)(to - from) * es);
    } else if (es == 2) {
        fp16_t h = vk_f32_to_f16(v);
        for (int64_t i = from; i < to; i++) ((fp16_t *)y)[i] = h;
    } else {
        for (int64_t i = from; i < to; i++) ((float *)y)[i] = v;
    }
}

/* The padding is filled around the input where the input lands as one run of the
 * output (a batch step's 8 rows of keys padded to the 32 of the output surface: its
 * 48 KiB were written twice, zeros and then the rows); else everywhere, then the
 * input copied over. */
static void exec_pad(const vane_plan *pl, const vane_step *sp, void *const *ptr)
{
    const vane_slot *X = &pl->slots[sp->in[0]], *R = &pl->slots[sp->out[0]];
    size_t es = vane_dtype_size(X->dtype);
    void *y = ptr[sp->out[0]];
    int64_t xs[MIL_MAX_RANK], ys[MIL_MAX_RANK], base = 0;
    contiguous_strides(X->rank, X->shape, xs);
    contiguous_strides(R->rank, R->shape, ys);
    for (int d = 0; d < R->rank; d++) base += sp->begin[d] * ys[d];
    int one_run = 1, outer = 1;   /* past the input's first axis longer than 1, no padding */
    for (int d = 0; d < X->rank; d++) {
        if (!outer && X->shape[d] != R->shape[d]) one_run = 0;
        if (X->shape[d] > 1) outer = 0;
    }
    if (one_run) {
        pad_fill(y, es, 0, base, sp->f0);
        memcpy((char *)y + base * (int64_t)es, ptr[sp->in[0]], (size_t)X->numel * es);
        pad_fill(y, es, base + X->numel, R->numel, sp->f0);
        return;
    }
    pad_fill(y, es, 0, R->numel, sp->f0);
    copy_nd((char *)y + base * (int64_t)es, ys, ptr[sp->in[0]], xs, X->shape, X->rank, es);
}

/* ---- dispatch ------------------------------------------------------------ */

orion_status vane_exec_step(const vane_plan *pl, const vane_step *sp, void *const *ptr,
                            const vane_eval_hints *hints)
{
    const vane_zero_tail *tails = hints ? hints->tails : NULL;
    if (sp->folded) return ORION_OK;   /* no work of its own (vane_step.folded) */
    switch (sp->op) {
    case MIL_OP_RESHAPE:
    case MIL_OP_IDENTITY:
        return ORION_OK;   /* aliases: the bytes are already there */
    case MIL_OP_CONV: exec_conv(pl, sp, ptr, hints); return ORION_OK;
    case MIL_OP_MATMUL: exec_matmul(pl, sp, ptr, tails); return ORION_OK;
    case MIL_OP_REDUCE_SUM:
    case MIL_OP_REDUCE_MEAN:
    case MIL_OP_REDUCE_MAX: return exec_reduce(pl, sp, ptr);
    case MIL_OP_SOFTMAX: return exec_softmax(pl, sp, ptr);
    case MIL_OP_TRANSPOSE: exec_transpose(pl, sp, ptr); return ORION_OK;
    case MIL_OP_SLICE_BY_INDEX:
    case MIL_OP_SLICE_BY_SIZE: exec_slice(pl, sp, ptr); return ORION_OK;
    case MIL_OP_SPLIT: exec_split(pl, sp, ptr); return ORION_OK;
    case MIL_OP_PAD: exec_pad(pl, sp, ptr); return ORION_OK;
    case MIL_OP_UNKNOWN:
        return orion_fail(ORION_ERR_INTERNAL, "vane: invalid step at line %d", sp->line);
    default: exec_elementwise(pl, sp, ptr); return ORION_OK;
    }
}
