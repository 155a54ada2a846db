/* test_kernels.c -- checks vane's CPU kernels (csrc/vane/kernels*.c).
 *
 *   cc -O2 -std=gnu11 -pthread -Icsrc tests/c/test_kernels.c csrc/vane/kernels*.c -lm
 *   ./a.out            run every check, exit status 1 on any failure
 *   ./a.out --isa      print the path in use (to test ORION_VANE_ISA)
 *
 * References that do not share code with the kernels sit beside each check:
 * fp16 values decoded with ldexp, fp32 -> fp16 by nearest search over the
 * fp16 table, products summed in double. Every SIMD path the CPU has is
 * forced in turn and compared with the scalar path and the references. */
#include "vane/kernels.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <unistd.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static atomic_int g_failures;   /* CHECK runs on pool workers too */
static atomic_int g_checks;

#define CHECK(cond, ...)                                          \
    do {                                                          \
        g_checks++;                                               \
        if (!(cond)) {                                            \
            if (g_failures++ < 40) {                              \
                fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
                fprintf(stderr, __VA_ARGS__);                     \
                fputc('\n', stderr);                              \
            }                                                     \
        }                                                         \
    } while (0)

static const char *const k_isas[] = {"scalar", "avx2", "avx512", "neon"};

static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {     /* xorshift64* */
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return (uint32_t)((g_rng * 0x2545f4914f6cdd1dull) >> 32);
}
static double rnd_unit(void) { return rnd() / 4294967296.0; }

/* ---- conversion references ---------------------------------------------- */

/* The value of an fp16 as a double, NaN as NAN. */
static double ref_f16_decode(fp16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 31)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp(m, -24);
    else
        v = ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

static double g_f16_value[65536];
static double ref_f16_value(fp16_t h) { return g_f16_value[h]; }

/* Nearest fp16 to x by search over the positive finite fp16 values, ties to
 * the even bit pattern, >= 65520 to inf. NaN not handled here. */
static fp16_t ref_f32_to_f16(float x) {
    fp16_t sign = signbit(x) ? 0x8000 : 0;
    double ax = fabs((double)x);
    if (ax >= 65520.0)
        return sign | 0x7c00;
    unsigned lo = 0, hi = 0x7bff;       /* value(lo) <= ax < value(hi) or hi == 0x7bff */
    if (ax >= 65504.0)
        return sign | 0x7bff;
    while (hi - lo > 1) {
        unsigned mid = (lo + hi) / 2;
        if (ref_f16_value((fp16_t)mid) <= ax)
            lo = mid;
        else
            hi = mid;
    }
    double dl = ax - ref_f16_value((fp16_t)lo), dh = ref_f16_value((fp16_t)hi) - ax;
    unsigned r = dl < dh ? lo : dh < dl ? hi : ((lo & 1) ? hi : lo);
    return (fp16_t)(sign | r);
}

static void test_scalar_conversion(void) {
    /* fp16 -> fp32, all 65536 values */
    for (unsigned i = 0; i < 65536; i++) {
        fp16_t h = (fp16_t)i;
        float f = vk_f16_to_f32(h);
        double v = ref_f16_value(h);
        if (isnan(v)) {
            uint32_t b = f32_bits(f);
            CHECK(isnan(f) && (b >> 31) == (i >> 15u) && ((b >> 13) & 0x1ff) == (i & 0x1ffu) &&
                      (b & 0x400000u),
                  "f16 %04x -> %08x: NaN sign/payload not kept, or not quiet", i, b);
        } else {
            CHECK((double)f == v && !signbit(f) == !signbit(v), "f16 %04x -> %a, want %a", i,
                  (double)f, v);
        }
    }
    /* fp32 -> fp16: every fp16 value, the midpoints between neighbours (ties),
     * one fp32 ulp either side of each midpoint, and random bit patterns */
    for (unsigned i = 0; i < 0x7c00; i++) {
        for (int s = 0; s < 2; s++) {
            fp16_t h = (fp16_t)(i | (s ? 0x8000 : 0));
            float f = vk_f16_to_f32(h);
            CHECK(vk_f32_to_f16(f) == h, "roundtrip %04x gives %04x", h, vk_f32_to_f16(f));
            double mid = (ref_f16_value((fp16_t)i) + (i == 0x7bff ? 65536.0 : ref_f16_value((fp16_t)(i + 1)))) / 2;
            float m = (float)(s ? -mid : mid);      /* midpoints are exact in fp32 */
            float probes[3] = {m, nextafterf(m, -INFINITY), nextafterf(m, INFINITY)};
            for (int p = 0; p < 3; p++) {
                fp16_t want = ref_f32_to_f16(probes[p]), got = vk_f32_to_f16(probes[p]);
                CHECK(got == want, "f32 %a -> %04x, want %04x", (double)probes[p], got, want);
            }
        }
    }
    for (int n = 0; n < 200000; n++) {
        uint32_t b = rnd();
        float f = bits_f32(b);
        if (isnan(f)) {
            fp16_t got = vk_f32_to_f16(f);
            CHECK((got & 0x7c00) == 0x7c00 && (got & 0x3ff) && (got >> 15) == (b >> 31),
                  "NaN %08x -> %04x", b, got);
            continue;
        }
        CHECK(vk_f32_to_f16(f) == ref_f32_to_f16(f), "f32 %08x -> %04x, want %04x", b,
              vk_f32_to_f16(f), ref_f32_to_f16(f));
    }
    static const struct { float f; fp16_t h; } edges[] = {
        {0.0f, 0x0000}, {-0.0f, 0x8000}, {INFINITY, 0x7c00}, {-INFINITY, 0xfc00},
        {65504.0f, 0x7bff}, {65519.996f, 0x7bff}, {65520.0f, 0x7c00}, {-65520.0f, 0xfc00},
        {1e10f, 0x7c00}, {FLT_MAX, 0x7c00}, {0x1p-24f, 0x0001}, {0x1p-25f, 0x0000},
        {0x1.000002p-25f, 0x0001}, {0x1.8p-24f, 0x0002}, {0x1.4p-23f, 0x0002},
        {0x1p-14f, 0x0400}, {0x1.ff8p-15f, 0x03ff}, {0x1.ffcp-15f, 0x0400},
        {0x1.ffap-15f, 0x03ff},
        {1.0f, 0x3c00}, {1.0f + 0x1p-11f, 0x3c00}, {1.0f + 0x3p-11f, 0x3c02},
        {0x1p-149f, 0x0000}, {-0x1p-149f, 0x8000}, {2048.0f + 1.0f, 0x6800},
        {2048.0f + 3.0f, 0x6802}, {-2.5f, 0xc100},
    };
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++)
        CHECK(vk_f32_to_f16(edges[i].f) == edges[i].h, "edge %a -> %04x, want %04x",
              (double)edges[i].f, vk_f32_to_f16(edges[i].f), edges[i].h);
    /* NaNs keep sign and top payload bits, and stay NaN when only low bits are set */
    CHECK(vk_f32_to_f16(bits_f32(0x7fc00000u)) == 0x7e00, "qNaN");
    CHECK(vk_f32_to_f16(bits_f32(0xffc00000u)) == 0xfe00, "-qNaN");
    CHECK((vk_f32_to_f16(bits_f32(0x7f800001u)) & 0x7fff) > 0x7c00, "sNaN with low payload");
    CHECK(vk_f32_to_f16(bits_f32(0x7fa00000u)) == 0x7f00, "sNaN payload kept, quieted");
    /* flushing */
    fp16_t fl[6] = {0x0001, 0x83ff, 0x0400, 0x8000, 0x7c01, 0x3c00};
    vk_f16_flush_denormals(fl, 6);
    CHECK(fl[0] == 0 && fl[1] == 0x8000 && fl[2] == 0x0400 && fl[3] == 0x8000 &&
              fl[4] == 0x7c01 && fl[5] == 0x3c00,
          "flush_denormals");
}

/* Every path's array converters agree bit for bit with the scalar ones, at
 * every tail length and misalignment. */
static void test_array_conversion(const char *isa) {
    enum { N = 65536 + 77 };
    fp16_t *h = malloc(N * sizeof *h), *h2 = malloc(N * sizeof *h2);
    float *f = malloc(N * sizeof *f), *f2 = malloc(N * sizeof *f2);
    for (unsigned i = 0; i < N; i++)
        h[i] = (fp16_t)(i * 40503u);    /* odd multiplier: a permutation of all values */
    vk_f16_to_f32_array(h, f, N);
    for (unsigned i = 0; i < N; i++) {
        float want = vk_f16_to_f32(h[i]);
        CHECK(!memcmp(&want, &f[i], 4), "%s f16->f32 [%u] %04x -> %08x want %08x", isa, i, h[i],
              f32_bits(f[i]), f32_bits(want));
    }
    /* fp32 inputs: fp16 values, ties, neighbours of ties, random bits incl. NaN */
    for (unsigned i = 0; i < N; i++) {
        switch (i % 4) {
        case 0: f2[i] = vk_f16_to_f32(h[i]); break;
        case 1: f2[i] = (vk_f16_to_f32(h[i] & 0x7bfe) + vk_f16_to_f32((h[i] & 0x7bfe) + 1)) / 2; break;
        case 2: f2[i] = nextafterf(f2[i - 1], INFINITY); break;
        default: f2[i] = bits_f32(rnd()); break;
        }
    }
    vk_f32_to_f16_array(f2, h2, N);
    for (unsigned i = 0; i < N; i++)
        CHECK(h2[i] == vk_f32_to_f16(f2[i]), "%s f32->f16 [%u] %08x -> %04x want %04x", isa, i,
              f32_bits(f2[i]), h2[i], vk_f32_to_f16(f2[i]));
    for (size_t off = 0; off < 3; off++)
        for (size_t n = 0; n < 140; n++) {
            float out[160];
            fp16_t back[160];
            for (size_t i = 0; i < 160; i++) {
                out[i] = -7.0f;
                back[i] = 0xabcd;
            }
            vk_f16_to_f32_array(h + 1000 + off, out + off, n);
            vk_f32_to_f16_array(f2 + 3 + off, back + off, n);
            for (size_t i = 0; i < 160; i++) {
                int inside = i >= off && i < off + n;
                if (inside) {
                    float want = vk_f16_to_f32(h[1000 + i]);
                    CHECK(!memcmp(&want, &out[i], 4), "%s tail n=%zu", isa, n);
                    CHECK(back[i] == vk_f32_to_f16(f2[3 + i]), "%s tail n=%zu", isa, n);
                } else {
                    CHECK(out[i] == -7.0f && back[i] == 0xabcd, "%s wrote outside n=%zu off=%zu",
                          isa, n, off);
                }
            }
        }
    free(h);
    free(h2);
    free(f);
    free(f2);
}

/* ---- matrix products ---------------------------------------------------- */

typedef struct {
    size_t M, N, K;
    int ta, tb;
    size_t lda, ldb, ldc;
    fp16_t *A, *B;
} problem;

static fp16_t rnd_f16(int kind) {
    double v;
    switch (kind) {
    case 1:     /* small: many products underflow fp16 (strict flushing) */
        v = (rnd_unit() - 0.5) * 0.02;
        break;
    case 2:     /* wide exponent range, denormals and exact zeros included */
        if (rnd() % 16 == 0)
            return (fp16_t)((rnd() & 0x8000) | (rnd() % 1024));     /* denormal or zero */
        v = (rnd_unit() - 0.5) * ldexp(1.0, (int)(rnd() % 12) - 6);
        break;
    default:
        v = rnd_unit() * 2 - 1;
        break;
    }
    return vk_f32_to_f16((float)v);
}

static fp16_t op_a(const problem *p, size_t i, size_t k) {
    return p->ta ? p->A[k * p->lda + i] : p->A[i * p->lda + k];
}
static fp16_t op_b(const problem *p, size_t k, size_t j) {
    return p->tb ? p->B[j * p->ldb + k] : p->B[k * p->ldb + j];
}

static double flush16(double v) { return fabs(v) < 0x1p-14 ? 0.0 : v; }

/* Strict product by the rule (ANE-C42), independent of the kernels: inputs
 * flushed, product rounded to fp16 by the search reference, flushed. */
static double ref_strict_product(fp16_t a, fp16_t b) {
    double x = flush16(ref_f16_value(a)), y = flush16(ref_f16_value(b));
    double p = x * y;                   /* exact: 22 significant bits */
    if (isnan(p) || isinf(p))
        return p;
    if (fabs(p) >= 65520.0)
        return p > 0 ? INFINITY : -INFINITY;
    return flush16(ref_f16_value(ref_f32_to_f16((float)p)));
}

static double ulp16(double v) {
    double a = fabs(v);
    if (a < 0x1p-14)
        return 0x1p-24;
    int e;
    frexp(a, &e);                       /* a in [2^(e-1), 2^e) */
    return ldexp(1.0, e - 1 - 10);
}

static void make_problem(problem *p, size_t M, size_t N, size_t K, int ta, int tb,
                         size_t pad, int kind) {
    p->M = M; p->N = N; p->K = K; p->ta = ta; p->tb = tb;
    p->lda = (ta ? M : K) + pad;
    p->ldb = (tb ? K : N) + pad;
    p->ldc = N + pad;
    size_t na = p->lda * (ta ? K : M), nb = p->ldb * (tb ? N : K);
    p->A = malloc((na ? na : 1) * sizeof(fp16_t));
    p->B = malloc((nb ? nb : 1) * sizeof(fp16_t));
    for (size_t i = 0; i < na; i++)
        p->A[i] = rnd_f16(kind);
    for (size_t i = 0; i < nb; i++)
        p->B[i] = rnd_f16(kind);
}

static void free_problem(problem *p) {
    free(p->A);
    free(p->B);
}

/* C with a guard value in the padding, so writes outside C[:, :N] show. */
static fp16_t *run_gemm(const problem *p, vk_numerics num) {
    size_t n = p->M * p->ldc;
    fp16_t *C = malloc((n ? n : 1) * sizeof(fp16_t));
    for (size_t i = 0; i < n; i++)
        C[i] = 0x7e5a;
    vk_gemm_f16(p->ta, p->tb, p->M, p->N, p->K, p->A, p->lda, p->B, p->ldb, C, p->ldc, num);
    return C;
}

/* The double reference of a problem: ref[i*N+j] = sum_k p_k, mag = sum |p_k|. */
typedef struct { double *ref, *mag; } reference;

static reference make_reference(const problem *p, vk_numerics num) {
    reference r = {malloc((p->M * p->N + 1) * sizeof(double)),
                   malloc((p->M * p->N + 1) * sizeof(double))};
    for (size_t i = 0; i < p->M; i++)
        for (size_t j = 0; j < p->N; j++) {
            double ref = 0, mag = 0;
            for (size_t k = 0; k < p->K; k++) {
                double prod = num == VK_NUMERICS_STRICT
                                  ? ref_strict_product(op_a(p, i, k), op_b(p, k, j))
                                  : ref_f16_value(op_a(p, i, k)) * ref_f16_value(op_b(p, k, j));
                ref += prod;
                mag += fabs(prod);
            }
            r.ref[i * p->N + j] = ref;
            r.mag[i * p->N + j] = mag;
        }
    return r;
}

static void free_reference(reference *r) {
    free(r->ref);
    free(r->mag);
}

/* Compares C from one path with the double reference and with the scalar
 * path's C0, within the documented tolerance:
 *   |c - c'| <= ulp16(c) + K * 2^-23 * sum_k |p_k|   (+ 2^-14 flush in strict). */
static void check_gemm(const problem *p, vk_numerics num, const reference *r, const char *isa,
                       const fp16_t *C, const fp16_t *C0) {
    int strict = num == VK_NUMERICS_STRICT;
    for (size_t i = 0; i < p->M; i++) {
        for (size_t j = p->N; j < p->ldc; j++)
            CHECK(C[i * p->ldc + j] == 0x7e5a, "%s wrote into C padding", isa);
        for (size_t j = 0; j < p->N; j++) {
            double ref = r->ref[i * p->N + j], mag = r->mag[i * p->N + j];
            double c = ref_f16_value(C[i * p->ldc + j]);
            double c0 = ref_f16_value(C0[i * p->ldc + j]);
            double tol = ulp16(fmax(fabs(ref), fabs(c))) + p->K * 0x1p-23 * mag;
            if (strict && fabs(ref) < 0x1p-13)
                tol += 0x1p-14;
            CHECK(fabs(c - ref) <= tol,
                  "%s %s M=%zu N=%zu K=%zu ta=%d tb=%d C[%zu,%zu] = %.8g, reference %.8g (tol %.3g)",
                  isa, strict ? "strict" : "fp16", p->M, p->N, p->K, p->ta, p->tb, i, j, c, ref, tol);
            CHECK(fabs(c - c0) <= 2 * tol,
                  "%s %s M=%zu N=%zu K=%zu ta=%d tb=%d C[%zu,%zu] = %.8g, scalar %.8g", isa,
                  strict ? "strict" : "fp16", p->M, p->N, p->K, p->ta, p->tb, i, j, c, c0);
            if (strict)
                CHECK((C[i * p->ldc + j] & 0x7c00) || !(C[i * p->ldc + j] & 0x3ff),
                      "%s strict result is denormal", isa);
        }
    }
}

static const size_t k_shapes[][3] = {
    {1, 1, 1},      {1, 1, 7},       {5, 1, 1},      {1, 9, 1},      {3, 5, 2},
    {7, 1, 33},     {1, 13, 31},     {17, 1, 64},    {33, 17, 65},   {8, 32, 16},
    {9, 33, 17},    {100, 1, 300},   {1, 70, 129},   {64, 64, 64},   {3, 200, 20},
    {77, 45, 100},  {130, 3, 47},    {2, 515, 9},    {65, 66, 67},   {300, 1, 768},
    {1, 300, 256},  {768, 1, 131},   {40, 130, 1},   {15, 15, 1000}, {129, 70, 12},
};

static void test_gemm_shapes(void) {
    int navail = 0;
    const char *avail[4];
    for (int t = 0; t < 4; t++)
        if (vk_force_isa(k_isas[t]) == 0)
            avail[navail++] = k_isas[t];
    for (size_t s = 0; s < sizeof k_shapes / sizeof k_shapes[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int num = 0; num < 2; num++) {
                    problem p;
                    size_t pad = (s + ta + 2 * tb) % 3 == 0 ? 0 : (s % 5) + 1;
                    int kind = num ? (int)(s % 3) : (int)(s % 2) * 2;
                    make_problem(&p, k_shapes[s][0], k_shapes[s][1], k_shapes[s][2], ta, tb,
                                 pad, kind);
                    reference r = make_reference(&p, (vk_numerics)num);
                    vk_force_isa("scalar");
                    fp16_t *C0 = run_gemm(&p, (vk_numerics)num);
                    check_gemm(&p, (vk_numerics)num, &r, "scalar", C0, C0);
                    for (int t = 1; t < navail; t++) {
                        vk_force_isa(avail[t]);
                        vk_set_native_fp16(0);      /* AVX-512: strict through F16C */
                        fp16_t *C = run_gemm(&p, (vk_numerics)num);
                        check_gemm(&p, (vk_numerics)num, &r, avail[t], C, C0);
                        free(C);
                        if (num && !strcmp(avail[t], "avx512") && vk_set_native_fp16(1) == 0) {
                            /* AVX512-FP16 vmulph against the F16C emulation */
                            C = run_gemm(&p, (vk_numerics)num);
                            check_gemm(&p, (vk_numerics)num, &r, "avx512fp16", C, C0);
                            free(C);
                        }
                        vk_set_native_fp16(1);      /* back to the default where possible */
                    }
                    free(C0);
                    free_reference(&r);
                    free_problem(&p);
                }
    vk_force_isa(NULL);
}

/* The vector x matrix kernels (one row times a matrix with contiguous rows, FP16
 * numerics) give the bits of the portable k-order loop on every ISA, tails included. */
static void test_vecmat_bits(void) {
    static const size_t ns[] = {1, 7, 8, 9, 31, 32, 33, 64, 100, 256, 300};
    static const size_t ks[] = {1, 17, 256};
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (size_t b = 0; b < sizeof ks / sizeof ks[0]; b++) {
            problem p;
            make_problem(&p, 1, ns[a], ks[b], 0, 0, a % 3, (int)(a % 2) * 2);
            vk_force_isa("scalar");
            fp16_t *C0 = run_gemm(&p, VK_NUMERICS_FP16);
            for (int t = 1; t < 4; t++) {
                if (vk_force_isa(k_isas[t]) != 0)
                    continue;
                fp16_t *C = run_gemm(&p, VK_NUMERICS_FP16);
                CHECK(!memcmp(C, C0, p.N * sizeof(fp16_t)),
                      "%s vector x matrix N=%zu K=%zu differs from the portable loop",
                      k_isas[t], p.N, p.K);
                free(C);
            }
            free(C0);
            free_problem(&p);
        }
    vk_force_isa(NULL);
}

/* The vector x matrix with x read at a stride (a transposed one-row operand) gives the
 * bits of the same x read contiguously: its gather, in chunks, feeds the same values. */
static void test_vecmat_strided_x(void) {
    static const size_t ks[] = {17, 256, 300, 1030};
    for (int t = 0; t < 4; t++) {
        if (vk_force_isa(k_isas[t]) != 0)
            continue;
        for (size_t b = 0; b < sizeof ks / sizeof ks[0]; b++) {
            size_t N = 70, K = ks[b], stride = 3;
            fp16_t *x = malloc(K * stride * sizeof(fp16_t)), *xc = malloc(K * sizeof(fp16_t));
            fp16_t *B = malloc(K * N * sizeof(fp16_t)), C0[70], C1[70];
            for (size_t i = 0; i < K * N; i++)
                B[i] = rnd_f16(0);
            for (size_t k = 0; k < K; k++)
                x[k * stride] = xc[k] = rnd_f16(0);
            vk_gemm_f16_strided(1, N, K, xc, K, 1, B, N, 1, C0, N, VK_NUMERICS_FP16);
            vk_gemm_f16_strided(1, N, K, x, K * stride, stride, B, N, 1, C1, N,
                                VK_NUMERICS_FP16);
            CHECK(!memcmp(C0, C1, sizeof C0), "%s vector x matrix K=%zu: x at stride %zu "
                  "differs from x contiguous", k_isas[t], K, stride);
            free(x);
            free(xc);
            free(B);
        }
    }
    vk_force_isa(NULL);
}

/* One product of vk_gemm_f16_live against the full product: the cache operand B
 * ([T, hd], rows from `live` on zero) as keys (scores = A B^T) or values (A B). */
static void check_live_product(const char *isa, vk_numerics num, int values, size_t M,
                               size_t T, size_t hd, size_t live, int nonfinite) {
    size_t K = values ? T : hd, N = values ? hd : T;
    fp16_t *A = malloc(M * K * sizeof(fp16_t)), *B = malloc(T * hd * sizeof(fp16_t));
    fp16_t *Bz = malloc(T * hd * sizeof(fp16_t)), *C0 = malloc(M * N * sizeof(fp16_t));
    fp16_t *C1 = malloc(M * N * sizeof(fp16_t));
    for (size_t i = 0; i < M * K; i++)
        A[i] = rnd_f16(num == VK_NUMERICS_STRICT ? 2 : 0);
    if (nonfinite)      /* an inf past the live rows of a value's weights, or in a query */
        A[(M - 1) * K + (values ? K - 1 : K / 2)] = 0x7c00;
    for (size_t i = 0; i < T * hd; i++) {
        B[i] = rnd_f16(0);   /* rows past `live`: what a broken promise would leave */
        Bz[i] = i / hd < live ? B[i] : 0;
    }
    /* op(B)(k, j): keys read B[j, k] (rsb 1, csb hd); values B[k, j] (rsb hd, csb 1) */
    size_t rsb = values ? hd : 1, csb = values ? 1 : hd;
    vk_gemm_f16_strided(M, N, K, A, K, 1, Bz, rsb, csb, C0, N, num);
    vk_gemm_f16_live(M, N, K, A, K, 1, Bz, rsb, csb, C1, N, num, values ? N : live,
                     values ? live : K);
    CHECK(!memcmp(C0, C1, M * N * sizeof(fp16_t)), "%s %s live %s M=%zu T=%zu hd=%zu "
          "live=%zu%s: differs from the full product", isa,
          num == VK_NUMERICS_STRICT ? "strict" : "fp16", values ? "values" : "keys", M, T, hd,
          live, nonfinite ? " (an inf in A)" : "");
    if (!nonfinite && live < T) {   /* the rows past `live` were not read */
        vk_gemm_f16_live(M, N, K, A, K, 1, B, rsb, csb, C1, N, num, values ? N : live,
                         values ? live : K);
        CHECK(!memcmp(C0, C1, M * N * sizeof(fp16_t)), "%s live %s M=%zu T=%zu live=%zu: "
              "read the rows past the live ones", isa, values ? "values" : "keys", M, T, live);
    }
    free(A);
    free(B);
    free(Bz);
    free(C0);
    free(C1);
}

/* Decode attention over the live rows of a KV cache (vk_gemm_f16_live) keeps every bit
 * of the full product, on every ISA and both numerics: scores for the rows past the
 * live ones are +0, and their values' products are never added; a query or a weight
 * that is not finite computes in full. */
static void test_live_rows_keep_bits(void) {
    static const size_t Ts[] = {1, 37, 256}, hds[] = {64, 100, 128}, Ms[] = {1, 2, 3, 12};
    for (int t = 0; t < 4; t++) {
        if (vk_force_isa(k_isas[t]) != 0)
            continue;
        for (int strict = 0; strict < 2; strict++)
            for (size_t a = 0; a < 3; a++)
                for (size_t b = 0; b < 3; b++)
                    for (size_t c = 0; c < 4; c++) {
                        size_t T = Ts[a], lives[] = {0, 1, T / 3, T - 1, T};
                        for (size_t l = 0; l < 5; l++)
                            for (int values = 0; values < 2; values++)
                                for (int nonfinite = 0; nonfinite < 2; nonfinite++)
                                    check_live_product(k_isas[t], strict ? VK_NUMERICS_STRICT
                                                       : VK_NUMERICS_FP16, values, Ms[c], T,
                                                       hds[b], lives[l], nonfinite);
                    }
    }
    vk_force_isa(NULL);
}

/* A GEMV's rows reduced sixteen at a time (avx512_reduce16) give the bits of each
 * row computed alone, which takes the one-row path: over K that fills whole 32-wide
 * steps, leaves masked tails, or is shorter than one step, and M with a remainder. */
static void test_gemv_rows_match_single_rows(void) {
    static const size_t ks[] = {8, 64, 100, 128, 1024};
    for (int t = 0; t < 4; t++) {
        if (vk_force_isa(k_isas[t]) != 0)
            continue;
        for (size_t b = 0; b < sizeof ks / sizeof ks[0]; b++) {
            size_t M = 16 * 3 + 5, K = ks[b];
            fp16_t *A = malloc(M * K * sizeof(fp16_t)), x[1024], y[53], one;
            for (size_t i = 0; i < M * K; i++)
                A[i] = rnd_f16(i % 7 == 0 ? 2 : 0);
            for (size_t k = 0; k < K; k++)
                x[k] = rnd_f16(0);
            vk_gemm_f16(0, 0, M, 1, K, A, K, x, 1, y, 1, VK_NUMERICS_FP16);
            for (size_t i = 0; i < M; i++) {
                vk_gemm_f16(0, 0, 1, 1, K, A + i * K, K, x, 1, &one, 1, VK_NUMERICS_FP16);
                CHECK(one == y[i], "%s GEMV K=%zu row %zu: %04x alone, %04x among %zu rows",
                      k_isas[t], K, i, one, y[i], M);
            }
            free(A);
        }
    }
    vk_force_isa(NULL);
}

/* A product of a few rows (grouped-query decode attention) gives each row the bits
 * of that row alone: a row's values do not depend on how many rows share the call. */
static void test_few_rows_match_single_rows(void) {
    static const size_t rows[] = {2, 3, 8}, ks[] = {128, 100};
    for (int t = 0; t < 4; t++) {
        if (vk_force_isa(k_isas[t]) != 0)
            continue;
        for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++)
            for (int tb = 0; tb < 4; tb++) {   /* bit 0: op(B) transposed; bit 1: K */
                problem p;
                make_problem(&p, rows[r], 300, ks[tb >> 1], 0, tb & 1, 3, 0);
                fp16_t *C = run_gemm(&p, VK_NUMERICS_FP16);
                fp16_t one[300];
                for (size_t i = 0; i < p.M; i++) {
                    vk_gemm_f16(0, tb & 1, 1, p.N, p.K, p.A + i * p.lda, p.lda, p.B, p.ldb,
                                one, p.N, VK_NUMERICS_FP16);
                    CHECK(!memcmp(one, C + i * p.ldc, sizeof one),
                          "%s M=%zu K=%zu tb=%d: row %zu differs from the same row alone",
                          k_isas[t], p.M, p.K, tb & 1, i);
                }
                free(C);
                free_problem(&p);
            }
    }
    vk_force_isa(NULL);
}

/* A product of a few columns with rows of op(A) contiguous (a 1x1 conv over a few
 * tokens: batched decode, speculative verification) gives every column the bits of
 * that column alone, a GEMV, on every ISA and both numerics: K with and without a
 * 16-wide tail, M not a multiple of the kernels' row blocks, column counts that do
 * and do not fill the vector groups, op(B) either way round, vectors gathered on
 * the stack and on the heap, K past AVX-512's two-row blocks (2064, 3000, 3072). Past
 * VK_GEMV_MULTI_MAX columns the GEMM path is only within tolerance (test_gemm_shapes). */
static void check_multi_cols(const char *isa, vk_numerics num, size_t M, size_t N, size_t K,
                             int tb) {
    problem p;
    make_problem(&p, M, N, K, 0, tb, 3, 2);   /* wide exponents: order-dependent sums */
    fp16_t *C = run_gemm(&p, num), *one = malloc(M * sizeof(fp16_t));
    size_t bad = 0;
    for (size_t j = 0; j < N; j++) {
        /* column j of op(B): B[k * ldb + j] (tb 0) or B[j * ldb + k] (tb 1) */
        if (tb)
            vk_gemm_f16(0, 0, M, 1, K, p.A, p.lda, p.B + j * p.ldb, 1, one, 1, num);
        else
            vk_gemm_f16(0, 0, M, 1, K, p.A, p.lda, p.B + j, p.ldb, one, 1, num);
        for (size_t i = 0; i < M; i++)
            bad += one[i] != C[i * p.ldc + j];
    }
    CHECK(bad == 0, "%s %s M=%zu N=%zu K=%zu tb=%d: %zu elements differ from their column "
          "alone", isa, num == VK_NUMERICS_STRICT ? "strict" : "fp16", M, N, K, tb, bad);
    for (size_t i = 0; i < M; i++)
        for (size_t j = N; j < p.ldc; j++)
            CHECK(C[i * p.ldc + j] == 0x7e5a, "%s few columns wrote into C padding", isa);
    free(one);
    free(C);
    free_problem(&p);
}

static void test_multi_cols_match_single_columns(void) {
    static const size_t Ms[] = {9, 37, 130}, Ks[] = {16, 33, 100, 768, 1100, 2064, 3000, 3072},
                        Ns[] = {2, 3, 4, 5, 7, 8, 16, 31, VK_GEMV_MULTI_MAX};
    for (int t = 0; t < 4; t++) {
        if (vk_force_isa(k_isas[t]) != 0)
            continue;
        for (int native = 0; native < 2; native++) {
            if (native && (strcmp(k_isas[t], "avx512") || vk_set_native_fp16(1) != 0))
                continue;
            if (!native)
                vk_set_native_fp16(0);
            for (int num = 0; num < 2; num++)
                for (size_t a = 0; a < sizeof Ms / sizeof Ms[0]; a++)
                    for (size_t b = 0; b < sizeof Ks / sizeof Ks[0]; b++)
                        for (size_t c = 0; c < sizeof Ns / sizeof Ns[0]; c++)
                            check_multi_cols(native ? "avx512fp16" : k_isas[t],
                                             (vk_numerics)num, Ms[a], Ns[c], Ks[b],
                                             (int)((a + b + c) % 2));
            vk_set_native_fp16(1);
        }
    }
    vk_force_isa(NULL);
}

/* Special values: inf, NaN, overflow of the fp32 sum to fp16 inf, K = 0. */
static void test_gemm_special(void) {
    for (int t = 0; t < 4; t++) {
        if (vk_force_isa(k_isas[t]) != 0)
            continue;
        for (int num = 0; num < 2; num++) {
            problem p;
            make_problem(&p, 37, 1, 70, 0, 0, 1, 0);
            for (size_t k = 0; k < 70; k++) {
                p.A[0 * p.lda + k] = 0x7800;            /* 32768 * 1: row sum overflows */
                p.A[1 * p.lda + k] = 0xf800;
                p.B[k * p.ldb] = 0x3c00;
            }
            p.A[2 * p.lda + 5] = 0x7e00;                /* NaN */
            p.A[3 * p.lda + 69] = 0x7c00;               /* inf in the tail */
            fp16_t *C = run_gemm(&p, (vk_numerics)num);
            CHECK(C[0] == 0x7c00 && C[p.ldc] == 0xfc00, "%s overflow to inf: %04x %04x",
                  k_isas[t], C[0], C[p.ldc]);
            CHECK((C[2 * p.ldc] & 0x7c00) == 0x7c00 && (C[2 * p.ldc] & 0x3ff), "%s NaN kept",
                  k_isas[t]);
            CHECK((C[3 * p.ldc] & 0x7fff) == 0x7c00 || (C[3 * p.ldc] & 0x7fff) > 0x7c00,
                  "%s inf kept", k_isas[t]);
            free(C);
            /* the same as a GEMM (N > 1) */
            problem q;
            make_problem(&q, 3, 20, 70, 0, 0, 0, 0);
            for (size_t k = 0; k < 70; k++) {
                q.A[k] = 0x7800;
                for (size_t j = 0; j < 20; j++)
                    q.B[k * q.ldb + j] = 0x3c00;
            }
            C = run_gemm(&q, (vk_numerics)num);
            for (size_t j = 0; j < 20; j++)
                CHECK(C[j] == 0x7c00, "%s gemm overflow to inf", k_isas[t]);
            free(C);
            free_problem(&q);
            free_problem(&p);
        }
        /* strict: every product is denormal -> zero; fp16 mode keeps them */
        fp16_t a[40], b[40], c[2] = {1, 1};
        for (int k = 0; k < 40; k++) {
            a[k] = 0x1c00;      /* 2^-8 */
            b[k] = 0x1c00;      /* products 2^-16: fp16 denormal */
        }
        vk_gemm_f16(0, 0, 1, 1, 40, a, 40, b, 1, c, 1, VK_NUMERICS_STRICT);
        vk_gemm_f16(0, 0, 1, 1, 40, a, 40, b, 1, c + 1, 1, VK_NUMERICS_FP16);
        CHECK(c[0] == 0, "%s strict flushes denormal products: %04x", k_isas[t], c[0]);
        CHECK(c[1] == vk_f32_to_f16(40 * 0x1p-16f), "%s fp16 keeps small products: %04x",
              k_isas[t], c[1]);
        /* strict: a denormal input is flushed even when the product is normal */
        a[0] = 0x0200;          /* 2^-15 */
        b[0] = 0x7000;          /* 2^13: product 2^-2 */
        vk_gemm_f16(0, 0, 1, 1, 1, a, 1, b, 1, c, 1, VK_NUMERICS_STRICT);
        vk_gemm_f16(0, 0, 1, 1, 1, a, 1, b, 1, c + 1, 1, VK_NUMERICS_FP16);
        CHECK(c[0] == 0 && c[1] == 0x3400, "%s denormal input: strict %04x fp16 %04x",
              k_isas[t], c[0], c[1]);
        /* strict rounds each product: (1 + 2^-10)(1 + 2^-10) = 1 + 2^-9 + 2^-20 -> 1 + 2^-9,
         * summed 1024 times: fp16 mode sees the 2^-20 terms (1024 * 2^-20 = 2^-10) */
        fp16_t x[1024], y[1024], r[2];
        for (int k = 0; k < 1024; k++)
            x[k] = y[k] = 0x3c01;
        vk_gemm_f16(0, 1, 1, 1, 1024, x, 1024, y, 1024, r, 1, VK_NUMERICS_STRICT);
        CHECK(r[0] == vk_f32_to_f16(1024.0f * (1.0f + 0x1p-9f)), "%s strict rounding %04x",
              k_isas[t], r[0]);
        /* K = 0 writes zeros */
        fp16_t z[4] = {1, 2, 3, 4};
        vk_gemm_f16(0, 0, 2, 2, 0, a, 1, b, 2, z, 2, VK_NUMERICS_FP16);
        CHECK(!z[0] && !z[1] && !z[2] && !z[3], "%s K=0", k_isas[t]);
    }
    vk_force_isa(NULL);
}

/* The decode shapes, at two thread counts, against the scalar path. */
static void test_gemv_large(void) {
    static const size_t shapes[][2] = {{768, 3072}, {3072, 768}, {1031, 1000}};
    for (size_t s = 0; s < 3; s++) {
        problem p;
        make_problem(&p, shapes[s][0], 1, shapes[s][1], 0, 0, s == 2 ? 24 : 0, 0);
        reference rf = make_reference(&p, VK_NUMERICS_FP16);
        reference rs = make_reference(&p, VK_NUMERICS_STRICT);
        vk_force_isa("scalar");
        fp16_t *C0 = run_gemm(&p, VK_NUMERICS_FP16);
        fp16_t *S0 = run_gemm(&p, VK_NUMERICS_STRICT);
        for (int t = 1; t < 4; t++) {
            if (vk_force_isa(k_isas[t]) != 0)
                continue;
            for (unsigned th = 1; th <= 3; th += 2) {
                vk_set_threads(th);
                fp16_t *C = run_gemm(&p, VK_NUMERICS_FP16);
                check_gemm(&p, VK_NUMERICS_FP16, &rf, k_isas[t], C, C0);
                free(C);
                C = run_gemm(&p, VK_NUMERICS_STRICT);
                check_gemm(&p, VK_NUMERICS_STRICT, &rs, k_isas[t], C, S0);
                free(C);
            }
        }
        vk_set_threads(0);
        free(C0);
        free(S0);
        free_reference(&rf);
        free_reference(&rs);
        free_problem(&p);
    }
    vk_force_isa(NULL);
}

/* ---- thread pool -------------------------------------------------------- */

typedef struct {
    atomic_int *hits;
    size_t n;
    int nested;
} pf_ctx;

static void pf_count(void *ctx_, size_t i) {
    pf_ctx *c = ctx_;
    atomic_fetch_add(&c->hits[i], 1);
    if (c->nested && i % 97 == 0) {     /* nested calls run inline */
        atomic_int inner[5] = {0};
        pf_ctx ic = {inner, 5, 0};
        vk_parallel_for(5, pf_count, &ic);
        for (int k = 0; k < 5; k++)
            CHECK(inner[k] == 1, "nested parallel_for item %d ran %d times", k, (int)inner[k]);
    }
}

static void *pf_thread(void *arg) {
    (void)arg;
    for (int rep = 0; rep < 50; rep++) {
        atomic_int hits[300] = {0};
        pf_ctx c = {hits, 300, 0};
        vk_parallel_for(300, pf_count, &c);
        for (int i = 0; i < 300; i++)
            CHECK(hits[i] == 1, "concurrent parallel_for item %d ran %d times", i, (int)hits[i]);
    }
    return NULL;
}

/* Kernels called from inside pool jobs (an interpreter splitting work over
 * heads) run inline and give the same results as outside. */
typedef struct {
    problem *p;
    fp16_t *out[6];
} nested_gemm_ctx;

static void nested_gemm_item(void *ctx_, size_t i) {
    nested_gemm_ctx *c = ctx_;
    c->out[i] = run_gemm(&c->p[i % 2], (vk_numerics)(i / 2 % 2));
}

static void test_kernels_inside_jobs(void) {
    problem p[2];
    make_problem(&p[0], 300, 1, 200, 0, 0, 0, 0);     /* GEMV */
    make_problem(&p[1], 70, 90, 50, 0, 1, 3, 0);      /* GEMM */
    nested_gemm_ctx c = {p, {0}};
    vk_set_threads(3);
    vk_parallel_for(6, nested_gemm_item, &c);
    for (size_t i = 0; i < 6; i++) {
        fp16_t *want = run_gemm(&p[i % 2], (vk_numerics)(i / 2 % 2));
        CHECK(!memcmp(want, c.out[i], p[i % 2].M * p[i % 2].ldc * sizeof(fp16_t)),
              "gemm inside a pool job differs (item %zu)", i);
        free(want);
        free(c.out[i]);
    }
    vk_set_threads(0);
    free_problem(&p[0]);
    free_problem(&p[1]);
}

static void test_pool(void) {
    CHECK(vk_threads() >= 1 && vk_threads() <= 8, "default threads %u", vk_threads());
    static const unsigned counts[] = {1, 2, 3, 5, 0};
    for (size_t t = 0; t < 5; t++) {
        vk_set_threads(counts[t]);
        if (counts[t])
            CHECK(vk_threads() == counts[t], "vk_threads %u after set %u", vk_threads(), counts[t]);
        static const size_t ns[] = {0, 1, 2, 7, 1000, 10007};
        for (size_t s = 0; s < 6; s++)
            for (int rep = 0; rep < 20; rep++) {
                size_t n = ns[s];
                atomic_int *hits = calloc(n + 1, sizeof *hits);
                pf_ctx c = {hits, n, rep == 0};
                vk_parallel_for(n, pf_count, &c);
                for (size_t i = 0; i < n; i++)
                    CHECK(hits[i] == 1, "threads=%u n=%zu item %zu ran %d times", counts[t], n, i,
                          (int)hits[i]);
                free(hits);
            }
    }
    /* callers on several application threads at once */
    vk_set_threads(3);
    pthread_t th[3];
    for (int i = 0; i < 3; i++)
        pthread_create(&th[i], NULL, pf_thread, NULL);
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    vk_set_threads(0);
}

/* Warm-up: a worker reads the ranges it is given while it has no job; once
 * vk_warm_cancel returns it reads none of them, so they may be freed (the ASan
 * and TSan builds of this file check the reads). Jobs in between still run
 * every item once. */
static void test_warm(void) {
    vk_set_threads(2);
    for (int rep = 0; rep < 300; rep++) {
        size_t bytes[2] = {((size_t)rep % 7 + 1) << 18, 4096 * ((size_t)rep % 3) + 100};
        unsigned char *a = malloc(bytes[0]), *b = malloc(bytes[1]);
        memset(a, rep, bytes[0]);
        memset(b, rep, bytes[1]);
        const void *base[2] = {a, b};
        vk_warm_async(base, bytes, 2);
        if (rep % 3 == 0) {
            atomic_int hits[64] = {0};
            pf_ctx c = {hits, 64, 0};
            vk_parallel_for(64, pf_count, &c);
            for (int i = 0; i < 64; i++)
                CHECK(hits[i] == 1, "job during a warm-up: item %d ran %d times", i, (int)hits[i]);
            vk_warm_async(base, bytes, 2);
        }
        if (rep % 4 == 0)
            usleep(20);         /* the worker well into the ranges */
        vk_warm_cancel();
        memset(a, 0, bytes[0]); /* the caller owns them again */
        free(a);
        free(b);
    }
    vk_set_warm(0);
    CHECK(!vk_warm(), "warm-up off");
    vk_set_warm(1);
    vk_set_threads(0);
}

static void test_dispatch(void) {
    CHECK(vk_force_isa("scalar") == 0 && !strcmp(vk_isa(), "scalar"), "force scalar");
    CHECK(vk_force_isa("no-such-isa") == -1 && !strcmp(vk_isa(), "scalar"),
          "unknown name refused, path unchanged");
    for (int t = 1; t < 4; t++)
        if (vk_force_isa(k_isas[t]) == 0)
            CHECK(!strcmp(vk_isa(), k_isas[t]), "forced %s, in use %s", k_isas[t], vk_isa());
    vk_force_isa(NULL);
    printf("best path: %s, native fp16 arithmetic: %s\n", vk_isa(),
           vk_native_fp16() ? "yes" : "no");
}

/* ---- elementwise over fp16 rows (vk_ew_f16) --------------------------------- */

/* vane_exec.c's expressions in fp32 on decoded values; the result by nearest search. */
static fp16_t ref_ew(vk_ew_op op, fp16_t ha, fp16_t hb, float lo, float hi) {
    float a = (float)ref_f16_value(ha), b = (float)ref_f16_value(hb), r = 0.0f;
    switch (op) {
    case VK_EW_ADD: r = a + b; break;
    case VK_EW_SUB: r = a - b; break;
    case VK_EW_MUL: r = a * b; break;
    case VK_EW_DIV: r = a / b; break;
    case VK_EW_MAX: r = (a > b || a != a) ? a : b; break;
    case VK_EW_MIN: r = (a < b || a != a) ? a : b; break;
    case VK_EW_RELU: r = a < 0.0f ? 0.0f : a; break;
    case VK_EW_NEG: r = -a; break;
    case VK_EW_CLIP: r = a < lo ? lo : (a > hi ? hi : a); break;
    }
    return r != r ? 0x7e00 : ref_f32_to_f16(r);
}

static int f16_same(fp16_t x, fp16_t y) {   /* the same bits, or both NaN */
    int nx = (x & 0x7c00) == 0x7c00 && (x & 0x3ff), ny = (y & 0x7c00) == 0x7c00 && (y & 0x3ff);
    return nx || ny ? nx && ny : x == y;
}

/* Every op, on values a file or an overflow may hold (signed zeros, infinities, NaN,
 * 65504, subnormals) and random ones, over rows of any length (masked and stack-copied
 * tails), each operand a row, one value a row, or one row for all; against ref_ew bit
 * for bit on every path that has the kernel. The scalar and NEON paths have none. */
static void test_elementwise_rows(void) {
    static const fp16_t special[] = {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0xfe01, 0x7bff,
                                     0xfbff, 0x0001, 0x8001, 0x03ff, 0x0400, 0x3c00, 0xbc00,
                                     0x5bff, 0x5c00, 0x3555, 0xc100};
    enum { NS = sizeof special / sizeof special[0] };
    static const size_t lens[] = {1, 7, 8, 9, 15, 16, 17, 33, 100};
    const vk_ew_op ops_[] = {VK_EW_ADD, VK_EW_SUB, VK_EW_MUL, VK_EW_DIV, VK_EW_MAX,
                             VK_EW_MIN, VK_EW_RELU, VK_EW_NEG, VK_EW_CLIP};
    fp16_t a[4096], b[4096], o[2048];
    for (size_t i = 0; i < 4096; i++) {
        a[i] = rnd() % 3 ? special[rnd() % NS] : (fp16_t)(rnd() & 0xffff);
        b[i] = rnd() % 3 ? special[rnd() % NS] : (fp16_t)(rnd() & 0xffff);
    }
    int ran = 0;
    for (int t = 0; t < 4; t++) {
        if (vk_force_isa(k_isas[t]) != 0)
            continue;
        vk_ew_rows probe = {VK_EW_ADD, 1, 1, a, a, 0, 1, 0, 1, o, 0.0f, 0.0f};
        int has = vk_ew_f16(&probe) == 0;
        CHECK(has == (!strcmp(k_isas[t], "avx2") || !strcmp(k_isas[t], "avx512")),
              "%s: vk_ew_f16 %s", k_isas[t], has ? "ran" : "refused");
        if (!has)
            continue;
        ran++;
        vk_ew_rows strided = probe;
        strided.a_cs = 2;
        CHECK(vk_ew_f16(&strided) == -1, "%s: a column stride of 2 is refused", k_isas[t]);
        for (size_t op = 0; op < sizeof ops_ / sizeof ops_[0]; op++)
            for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
                for (int form = 0; form < 6; form++) {
                    const size_t n = lens[li], rows = form < 3 ? 1 : 1 + rnd() % 13;
                    /* a: a row per row (with a gap), one row for all, or one value a
                     * row; b: a row, one value a row (a bias column), one value for all,
                     * or absent */
                    size_t acs = form == 2 || form == 5 ? 0 : 1;
                    size_t ars = form == 5 ? 1 : form % 2 ? 0 : n + 3;
                    size_t bcs = form >= 4 ? 0 : 1, brs = form == 4 ? 1 : form == 5 ? 0 : n;
                    const int unary = ops_[op] >= VK_EW_RELU;
                    vk_ew_rows j = {ops_[op], rows, n, a, unary ? NULL : b, ars, acs, brs, bcs,
                                    o, -2.5f, 3.0f};
                    memset(o, 0x55, sizeof o);
                    CHECK(vk_ew_f16(&j) == 0, "%s: vk_ew_f16 refused", k_isas[t]);
                    for (size_t r = 0; r < rows; r++)
                        for (size_t i = 0; i < n; i++) {
                            fp16_t ha = a[r * ars + i * acs], hb = b[r * brs + i * bcs];
                            fp16_t want = ref_ew(ops_[op], ha, hb, -2.5f, 3.0f);
                            fp16_t got = o[r * n + i];
                            CHECK(f16_same(got, want),
                                  "%s: op %d form %d [%zu x %zu] at (%zu, %zu): %04x, %04x -> "
                                  "%04x, want %04x", k_isas[t], (int)ops_[op], form, rows, n, r,
                                  i, ha, hb, got, want);
                        }
                    CHECK(o[rows * n] == 0x5555, "%s: wrote past the rows", k_isas[t]);
                }
    }
    vk_force_isa(NULL);
    printf("elementwise rows: %d paths with the kernel\n", ran);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--isa")) {
        printf("%s\n", vk_isa());
        return 0;
    }
    for (unsigned i = 0; i < 65536; i++)
        g_f16_value[i] = ref_f16_decode((fp16_t)i);
    test_dispatch();
    test_scalar_conversion();
    for (int t = 0; t < 4; t++)
        if (vk_force_isa(k_isas[t]) == 0)
            test_array_conversion(k_isas[t]);
    vk_force_isa(NULL);
    test_pool();
    test_warm();
    test_kernels_inside_jobs();
    test_gemm_special();
    test_gemm_shapes();
    test_few_rows_match_single_rows();
    test_multi_cols_match_single_columns();
    test_vecmat_bits();
    test_vecmat_strided_x();
    test_gemv_rows_match_single_rows();
    test_gemv_large();
    test_live_rows_keep_bits();
    test_elementwise_rows();
    printf("%d checks, %d failures\n", (int)g_checks, (int)g_failures);
    return g_failures ? 1 : 0;
}
