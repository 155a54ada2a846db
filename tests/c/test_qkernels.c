/* test_qkernels.c -- checks vane's products with compressed weights
 * (csrc/vane/kernels_quant*.c, vk_qmat).
 *
 *   cc -O2 -std=gnu11 -pthread -Icsrc tests/c/test_qkernels.c csrc/vane/kernels*.c -lm
 *
 * The reference decodes each code on its own (bit by bit from the stream) and
 * computes fp16(scale * fp16(code - offset)) with an fp16 rounding found by
 * nearest search, not the kernels' converter; products are summed in double.
 * For every layout (1-8 bits, signed or not, lut or shift-scale, with or
 * without an offset, blocks along rows and columns) and every SIMD path the
 * CPU has:
 *   vk_qmat_decode / vk_qmat_dense equal the reference bit for bit;
 *   the fused GEMV (N = 1) is within fp32 summation of the double sum;
 *   where vk_qmat_columns_alone says so, the fused GEMV equals the dense GEMV bit
 *   for bit (so a column has the same bits alone or among a few);
 *   every other product equals vk_gemm_f16 on the dense weight bit for bit.
 * AVX-512 runs twice where the CPU has AVX512-FP16: with fp16 arithmetic and with
 * F16C's roundings, which decode and round the same values by different code. */
#include "vane/kernels.h"

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static atomic_int g_failures, g_checks;

#define CHECK(cond, ...)                                              \
    do {                                                              \
        g_checks++;                                                   \
        if (!(cond) && g_failures++ < 40) {                           \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);      \
            fprintf(stderr, __VA_ARGS__);                             \
            fputc('\n', stderr);                                      \
        }                                                             \
    } while (0)

static const char *const k_isas[] = {"scalar", "avx2", "avx512", "neon"};

static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static uint32_t rnd(void) {
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return (uint32_t)((g_rng * 0x2545f4914f6cdd1dull) >> 32);
}

/* ---- fp16 by its definition ----------------------------------------------------- */

static double f16_value(fp16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
    return (h & 0x8000) ? -v : v;
}

/* the fp16 nearest to x (ties to even), by bisection over the ordered positive codes */
static fp16_t nearest_f16(double x) {
    double a = fabs(x);
    fp16_t sign = x < 0 ? 0x8000 : 0;
    if (a >= 65520.0) return sign | 0x7c00;
    unsigned lo = 0, hi = 0x7bff;
    while (lo < hi) {              /* the first code whose value is >= a */
        unsigned mid = (lo + hi) / 2;
        if (f16_value((fp16_t)mid) < a) lo = mid + 1; else hi = mid;
    }
    unsigned best = lo;
    if (lo > 0) {
        double up = f16_value((fp16_t)lo) - a, down = a - f16_value((fp16_t)(lo - 1));
        if (down < up || (down == up && ((lo - 1) & 1) == 0)) best = lo - 1;
    }
    return sign | (fp16_t)best;
}

static double round16(double x) { return f16_value(nearest_f16(x)); }

/* ---- a random compressed weight -------------------------------------------------- */

typedef struct layout {
    unsigned bits;
    int is_signed, lut, offset;
    size_t rows, cols, brows, bcols;
} layout;

typedef struct qcase {
    vk_qmat m;
    uint8_t *codes;
    fp16_t *scale, *offset, *lut;
    int *code;      /* the codes as the reference wrote them, row-major */
} qcase;

static void make_case(qcase *c, const layout *L) {
    memset(c, 0, sizeof *c);
    size_t n = L->rows * L->cols, blocks = (L->rows / L->brows) * (L->cols / L->bcols);
    c->code = malloc(n * sizeof *c->code);
    c->codes = calloc((n * L->bits + 7) / 8 + 1, 1);
    for (size_t e = 0; e < n; e++) {
        unsigned u = rnd() & ((1u << L->bits) - 1);
        c->code[e] = (L->is_signed && (u >> (L->bits - 1))) ? (int)u - (1 << L->bits) : (int)u;
        for (unsigned b = 0; b < L->bits; b++)      /* bit by bit, LSB first */
            if ((u >> b) & 1) c->codes[(e * L->bits + b) / 8] |= (uint8_t)(1u << ((e * L->bits + b) % 8));
    }
    if (L->lut) {
        c->lut = malloc((blocks << L->bits) * sizeof *c->lut);
        for (size_t i = 0; i < (blocks << L->bits); i++)
            c->lut[i] = nearest_f16(((int)(rnd() % 2001) - 1000) * 1e-3);
    } else {
        c->scale = malloc(blocks * sizeof *c->scale);
        for (size_t i = 0; i < blocks; i++)
            c->scale[i] = nearest_f16((1 + rnd() % 1000) * ((rnd() & 1) ? 1e-5 : -3e-3));
        if (L->offset) {
            c->offset = malloc(blocks * sizeof *c->offset);
            for (size_t i = 0; i < blocks; i++)
                c->offset[i] = nearest_f16(((int)(rnd() % 4001) - 2000) * 0.0137);
        }
    }
    c->m = (vk_qmat){L->rows, L->cols, c->codes, L->bits, L->is_signed, L->brows, L->bcols,
                     c->scale, c->offset, c->lut};
}

static void free_case(qcase *c) {
    free(c->codes); free(c->scale); free(c->offset); free(c->lut); free(c->code);
}

static double ref_value(const qcase *c, size_t r, size_t col) {
    const vk_qmat *m = &c->m;
    size_t b = (r / m->brows) * (m->cols / m->bcols) + col / m->bcols;
    int k = c->code[r * m->cols + col];
    if (m->lut) return f16_value(m->lut[(b << m->bits) + (unsigned)k]);
    double o = m->offset ? f16_value(m->offset[b]) : 0.0;
    return round16(f16_value(m->scale[b]) * round16(k - o));
}

/* ---- checks ---------------------------------------------------------------------- */

static void check_decode(const qcase *c, const char *isa) {
    const vk_qmat *m = &c->m;
    fp16_t *dense = malloc(m->rows * m->cols * sizeof *dense);
    vk_qmat_dense(m, dense);
    int bad = 0;
    for (size_t r = 0; r < m->rows; r++)
        for (size_t k = 0; k < m->cols; k++)
            bad += f16_value(dense[r * m->cols + k]) != ref_value(c, r, k);
    CHECK(!bad, "%s: %u-bit %s: %d decoded values differ from the reference", isa, m->bits,
          m->lut ? "lut" : "shift-scale", bad);
    free(dense);
}

static void check_products(const qcase *c, const char *isa) {
    const vk_qmat *m = &c->m;
    const size_t N = 5;
    fp16_t *B = malloc(m->cols * N * sizeof *B), *C = malloc(m->rows * N * sizeof *C);
    fp16_t *D = malloc(m->rows * N * sizeof *D), *W = malloc(m->rows * m->cols * sizeof *W);
    for (size_t i = 0; i < m->cols * N; i++) B[i] = nearest_f16(((int)(rnd() % 2001) - 1000) * 1e-3);
    vk_qmat_dense(m, W);
    /* the GEMV: one column of B (stride N), against a double sum */
    vk_qgemm_f16(m, 1, B, N, C, 1, VK_NUMERICS_FP16);
    int bad = 0;
    for (size_t r = 0; r < m->rows; r++) {
        double sum = 0, mag = 0;
        for (size_t k = 0; k < m->cols; k++) {
            double p = ref_value(c, r, k) * f16_value(B[k * N]);
            sum += p;
            mag += fabs(p);
        }
        double got = f16_value(C[r]);
        double tol = fabs(round16(sum) - sum) + fabs(sum) * 0x1p-11 + m->cols * 0x1p-23 * mag;
        bad += !(fabs(got - sum) <= tol + 1e-30);
    }
    CHECK(!bad, "%s: %u-bit GEMV: %d of %zu rows outside fp32 summation of the exact sum", isa,
          m->bits, bad, m->rows);
    /* where the path says so, the GEMV is the dense one-column GEMV bit for bit (so a
     * column has the same bits alone or among a few, which equal the dense ones below) */
    if (vk_qmat_columns_alone(m)) {
        /* 64 x of wide exponents and both signs: sums that cancel, so that an fp16
         * result now and then depends on the order of the fp32 additions (with x as
         * above it seldom did; one chain for both halves fails this) */
        fp16_t *X = malloc(m->cols * sizeof *X);
        int diff = 0;
        for (int t = 0; t < 64; t++) {
            for (size_t k = 0; k < m->cols; k++)
                X[k] = nearest_f16(((rnd() & 1) ? -1 : 1) *
                                   ldexp(1 + (rnd() % 1024) / 1024.0, (int)(rnd() % 20) - 10));
            vk_qgemm_f16(m, 1, X, 1, C, 1, VK_NUMERICS_FP16);
            vk_gemm_f16(0, 0, m->rows, 1, m->cols, W, m->cols, X, 1, D, 1, VK_NUMERICS_FP16);
            for (size_t r = 0; r < m->rows; r++) diff += C[r] != D[r];
        }
        free(X);
        CHECK(!diff, "%s: %u-bit GEMV: %d of %zu row sums (64 vectors) differ from the dense "
              "GEMV's bits", isa, m->bits, diff, 64 * m->rows);
    }
    /* everything else: vk_gemm_f16 on the dense weight, bit for bit */
    for (int strict = 0; strict < 4; strict++) {   /* bit 1: one column */
        vk_numerics num = strict & 1 ? VK_NUMERICS_STRICT : VK_NUMERICS_FP16;
        size_t n = strict & 2 ? 1 : N;
        if (n == 1 && num == VK_NUMERICS_FP16)
            continue;                                   /* the fused GEMV, above */
        vk_qgemm_f16(m, n, B, N, C, N, num);
        vk_gemm_f16(0, 0, m->rows, n, m->cols, W, m->cols, B, N, D, N, num);
        int diff = 0;
        for (size_t r = 0; r < m->rows; r++)
            for (size_t j = 0; j < n; j++) diff += C[r * N + j] != D[r * N + j];
        CHECK(!diff, "%s: %u-bit %s product with N=%zu: %d values differ from the dense one",
              isa, m->bits, strict & 1 ? "strict" : "fp16", n, diff);
    }
    free(B); free(C); free(D); free(W);
}

static void test_layouts(const char *isa) {
    static const layout layouts[] = {
        /* bits, signed, lut, offset, rows, cols, brows, bcols */
        {4, 0, 0, 1, 67, 256, 1, 64},     /* MLX 4-bit: uint4, fp16 offset per group */
        {4, 0, 0, 1, 67, 3072, 1, 64},    /* a few columns: decoded 10 rows at a time */
        {8, 1, 0, 0, 37, 4096, 1, 32},    /* the same, 8 rows at a time */
        {4, 1, 0, 0, 40, 512, 1, 32},     /* GGUF Q4_0: int4, scale per 32 */
        {4, 0, 0, 1, 33, 96, 1, 32},      /* Q4_K's form */
        {8, 1, 0, 0, 50, 256, 1, 32},     /* Q8_0 */
        {8, 1, 0, 0, 20, 256, 1, 16},     /* Q6_K's form */
        {8, 0, 0, 1, 17, 192, 1, 64},     /* MLX 8-bit */
        {8, 1, 0, 1, 9, 80, 9, 80},       /* one block (a per-tensor scale) */
        {4, 0, 0, 0, 64, 64, 16, 64},     /* blocks along rows (W^T of a column layout) */
        {4, 1, 0, 1, 32, 64, 32, 16},     /* blocks along rows, offset */
        {4, 0, 1, 0, 24, 128, 1, 32},     /* LUT palettization, 16 entries */
        {4, 0, 1, 0, 64, 96, 8, 96},      /* LUT per 8 output channels */
        {4, 0, 1, 0, 35, 64, 5, 32},      /* groups of 5 rows: a pair of rows spans two */
        {4, 0, 0, 1, 45, 128, 3, 64},     /* the same with scales and offsets */
        {4, 1, 0, 0, 3, 33792, 1, 32},    /* 1,056 blocks a row: one row at a time */
        {1, 0, 1, 0, 16, 72, 4, 72},
        {2, 0, 1, 0, 19, 128, 1, 64},     /* MLX 2-bit as LUT */
        {3, 0, 1, 0, 13, 128, 1, 32},     /* MLX 3-bit as LUT: codes cross bytes */
        {6, 0, 1, 0, 7, 64, 7, 64},
        {8, 0, 1, 0, 5, 64, 5, 32},
        {4, 0, 0, 1, 3, 40, 1, 8},        /* narrow blocks: the portable decoder */
        {8, 1, 0, 0, 6, 64, 1, 8},        /* 8-wide blocks: fused panels, portable GEMV */
        {2, 1, 0, 1, 5, 64, 1, 32},       /* signed 2-bit with offset: the value table */
        {3, 0, 0, 0, 4, 96, 2, 32},       /* 3-bit scales along two rows */
    };
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        qcase c;
        make_case(&c, &layouts[i]);
        check_decode(&c, isa);
        check_products(&c, isa);
        free_case(&c);
    }
}

/* Scales a file may hold that random ones never are: zeros of both signs, infinities,
 * NaN, the largest fp16 (whose products overflow) and subnormals. The fused rows build
 * some tables by shortcuts (AVX2: a signed block's values from half of them, by
 * symmetry) that hold only for finite scales; each value must still be the
 * reference's, and the GEMV the dense GEMV's bits (NaN-aware: any NaN is a NaN). */
static int same_f16(fp16_t a, fp16_t b) {
    int nan_a = (a & 0x7c00) == 0x7c00 && (a & 0x3ff), nan_b = (b & 0x7c00) == 0x7c00 && (b & 0x3ff);
    return nan_a || nan_b ? nan_a && nan_b : a == b;
}

static void test_special_scales(const char *isa, int pass) {
    /* pass 0: finite (products never overflow), so that the GEMV's sums are numbers;
     * pass 1: infinities, NaN and overflowing products too */
    static const fp16_t special[] = {0x0000, 0x8000, 0x0001, 0x83ff, 0x3c00, 0xb800, 0x6c00,
                                     0xec00, 0x7c00, 0xfc00, 0x7e00, 0x7bff, 0xfbff};
    const size_t n_special = pass ? sizeof special / sizeof special[0] : 8;
    static const layout layouts[] = {
        {4, 1, 0, 0, 24, 512, 1, 32},   /* Q4_0 */
        {4, 1, 0, 0, 8, 256, 1, 128},
        {8, 1, 0, 0, 24, 256, 1, 32},   /* Q8_0 */
        {4, 0, 0, 1, 24, 256, 1, 64},   /* MLX, with an offset */
    };
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        qcase c;
        make_case(&c, &layouts[i]);
        vk_qmat *m = &c.m;
        size_t nb = m->cols / m->bcols, blocks = (m->rows / m->brows) * nb;
        for (size_t b = 0; b < blocks; b++)   /* rows of all-special blocks, rows mixed */
            if (rnd() % 3 == 0 || (b / nb) % 4 == 1)
                c.scale[b] = special[rnd() % n_special];
        fp16_t *W = malloc(m->rows * m->cols * sizeof *W), *X = malloc(m->cols * sizeof *X);
        fp16_t *C = malloc(m->rows * sizeof *C), *D = malloc(m->rows * sizeof *D);
        vk_qmat_dense(m, W);
        int bad = 0;
        for (size_t r = 0; r < m->rows; r++)
            for (size_t k = 0; k < m->cols; k++) {
                size_t b = r * nb + k / m->bcols;
                double o = m->offset ? f16_value(m->offset[b]) : 0.0;
                fp16_t sc = c.scale[b];
                double v = (sc & 0x7c00) == 0x7c00
                    ? ((sc & 0x3ff) ? NAN : ((sc & 0x8000) ? -INFINITY : INFINITY))
                    : f16_value(sc);
                double want = v * round16(c.code[r * m->cols + k] - o);
                fp16_t expect = want != want ? 0x7e00
                                             : want == 0 ? (signbit(want) ? 0x8000 : 0)
                                                         : nearest_f16(want);
                bad += !same_f16(W[r * m->cols + k], expect);
            }
        CHECK(!bad, "%s: %u-bit, special scales (pass %d): %d decoded values differ from the "
              "reference", isa, m->bits, pass, bad);
        if (vk_qmat_columns_alone(m)) {
            int diff = 0;
            for (int t = 0; t < 8; t++) {
                for (size_t k = 0; k < m->cols; k++)
                    X[k] = nearest_f16(((int)(rnd() % 2001) - 1000) * 1e-3);
                vk_qgemm_f16(m, 1, X, 1, C, 1, VK_NUMERICS_FP16);
                vk_gemm_f16(0, 0, m->rows, 1, m->cols, W, m->cols, X, 1, D, 1,
                            VK_NUMERICS_FP16);
                for (size_t r = 0; r < m->rows; r++) diff += !same_f16(C[r], D[r]);
            }
            CHECK(!diff, "%s: %u-bit GEMV, special scales (pass %d): %d row sums differ from "
                  "the dense GEMV's", isa, m->bits, pass, diff);
        }
        free(W); free(X); free(C); free(D);
        free_case(&c);
    }
}

int main(void) {
    printf("paths:");
    for (int t = 0; t < 4; t++)
        if (vk_force_isa(k_isas[t]) == 0) {
            printf(" %s", k_isas[t]);
            test_layouts(k_isas[t]);
            test_special_scales(k_isas[t], 0);
            test_special_scales(k_isas[t], 1);
        }
    printf("\n");
    /* AVX-512 with fp16 arithmetic (its own fused rows) where the CPU has it, and
     * without: F16C's roundings */
    if (vk_set_native_fp16(1) == 0 && vk_force_isa("avx512") == 0) {
        test_layouts("avx512-fp16");
        test_special_scales("avx512-fp16", 0);
        test_special_scales("avx512-fp16", 1);
    }
    if (vk_set_native_fp16(0) == 0 && vk_force_isa("avx512") == 0) {
        test_layouts("avx512-f16c");
        test_special_scales("avx512-f16c", 0);
        test_special_scales("avx512-f16c", 1);
    }
    vk_set_native_fp16(1);
    vk_force_isa(NULL);
    printf("%d checks, %d failures\n", (int)g_checks, (int)g_failures);
    return g_failures ? 1 : 0;
}
