/* kernels_x86.c -- the x86-64 SIMD paths of vane's kernels.
 *
 * Each function carries its own target attribute, so the library is built
 * without -m flags and runs on any x86-64; kernels.c picks a table at run
 * time from CPUID.
 *   avx2    AVX2 + FMA + F16C: 8-lane fp32 FMA, vcvtph2ps/vcvtps2ph
 *   avx512  AVX-512 F/BW/VL/DQ: 16-lane fp32 FMA, masked tails; strict mode
 *           rounds products with vcvtps2ph, or with AVX512-FP16 (vmulph)
 *           where the CPU has it.
 * Products of two fp16 values are exact in fp32, so FMA and mul+add agree;
 * results differ from the scalar path only in the order of fp32 additions
 * (the GEMV splits each row into partial sums; the GEMM sums in k order). */
#include "kernels_impl.h"

#if defined(__x86_64__)

#include <immintrin.h>
#include <string.h>

#include "kernels_x86.h"

/* Loops over the rows of a register block must be unrolled in full, or the
 * accumulators live on the stack (a 5x loss in the GEMM microkernel). */
#define VK_PRAGMA(x) _Pragma(#x)
#define VK_UNROLL VK_PRAGMA(GCC unroll 16)
/* Software prefetch distance along each row of a 4-row GEMV block (the AVX2 and
 * AVX512-FP16 paths), in elements (8 KiB). Measured when every path read 4 rows: the
 * hardware prefetcher alone left the LM-head GEMV (77 MB of A) at ~0.6x memcpy,
 * with it the GEMV reads faster than memcpy copies. Prefetches past the end of
 * A are harmless (they never fault). Into L2 (T1), not L1: L1 has few miss
 * buffers, so T0 prefetches stalled behind each other; on the EPYC here a
 * GPT-2 decode's 49 GEMVs (235 MB, cold) went from 11.2 to 8.5 ms on 2 threads
 * (22 -> 29 GB/s, past a plain read loop's 25), the distance mattering little. */
#ifndef VK_GEMV_HINT
#define VK_GEMV_HINT _MM_HINT_T1
#endif
#ifndef VK_GEMV_PF
#define VK_GEMV_PF 4096
#endif
/* The AVX-512 GEMV reads one row at a time, a single sequential stream per
 * thread. On the EPYC first measured, the hardware prefetcher followed it and 512
 * bytes ahead was best (a prefetch 8 KiB ahead competed with it). On a Xeon with
 * 2 vCPUs and a 480 MiB L3, 512 bytes left GPT-2 small fp16 decode at 11.3 ms a
 * token; 8 KiB ahead, 7.6 ms (2 KiB 8.9, 16 KiB 7.5), and batched decode of 8
 * sequences 23.4 -> 19.9 ms a step. 8 KiB, as the 4-row paths. */
#ifndef VK_GEMV_ROW_PF
#define VK_GEMV_ROW_PF 4096
#endif

/* One fp32 sum to fp16 by F16C (the same bits as vk_f32_to_f16, which the array
 * conversions already rely on): a GEMV stores one per row, 134K a GPT-2 decode
 * token, and the portable function's call and branches cost ~2.7% of decode. */
VK_T_AVX2 VK_INLINE fp16_t x86_f32_to_f16(float f)
{
    return (fp16_t)_cvtss_sh(f, VK_RNE);
}

/* ---- CPU features ------------------------------------------------------- */
/* Read from CPUID and XGETBV directly (compilers differ in the names
 * __builtin_cpu_supports knows): a feature counts only if the OS also saves
 * its registers. */

#include <cpuid.h>
#include <stdatomic.h>
#include <unistd.h>

enum { VK_F_AVX2 = 1, VK_F_AVX512 = 2, VK_F_AVX512FP16 = 4 };

static unsigned long long vk_xgetbv0(void) {
    unsigned lo, hi;
    __asm__ __volatile__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

static int vk_x86_features(void) {
    static atomic_int cached = -1;
    int seen = atomic_load_explicit(&cached, memory_order_relaxed);
    if (seen >= 0)
        return seen;
    unsigned a, b, c, d;
    int f = 0;
    if (__get_cpuid(1, &a, &b, &c, &d)) {
        int fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, f16c = (c >> 29) & 1;
        unsigned long long xcr0 = osxsave ? vk_xgetbv0() : 0;
        int os_avx = (xcr0 & 0x6) == 0x6;               /* XMM and YMM state */
        int os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0; /* opmask, ZMM_Hi256, Hi16_ZMM */
        if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
            int avx2 = (b >> 5) & 1;
            int avx512 = ((b >> 16) & 1) && ((b >> 17) & 1) && ((b >> 30) & 1) && ((b >> 31) & 1);
            int fp16 = (d >> 23) & 1;
            if (fma && avx && f16c && avx2 && os_avx)
                f |= VK_F_AVX2;
            if ((f & VK_F_AVX2) && avx512 && os_avx512)
                f |= VK_F_AVX512;
            if ((f & VK_F_AVX512) && fp16)
                f |= VK_F_AVX512FP16;
        }
    }
    atomic_store_explicit(&cached, f, memory_order_relaxed);   /* every thread finds the same */
    return f;
}

int vk_cpu_has_avx2(void) { return (vk_x86_features() & VK_F_AVX2) != 0; }

/* A core's L1 data cache in bytes (the system's figure; 32 KiB where it gives none),
 * which sizes the few-column kernel's groups of vectors (avx512_multi_plan). */
static size_t vk_l1d_bytes(void) {
    static atomic_long cached = 0;
    long seen = atomic_load_explicit(&cached, memory_order_relaxed);
    if (seen > 0)
        return (size_t)seen;
#ifdef _SC_LEVEL1_DCACHE_SIZE
    long n = sysconf(_SC_LEVEL1_DCACHE_SIZE);
#else
    long n = 0;   /* a libc without the name (macOS): the default */
#endif
    if (n < 8192 || n > (1L << 22))
        n = 32768;
    atomic_store_explicit(&cached, n, memory_order_relaxed);   /* every thread finds the same */
    return (size_t)n;
}

int vk_cpu_has_avx512(void) { return (vk_x86_features() & VK_F_AVX512) != 0; }

int vk_cpu_has_avx512fp16(void) {
#if VK_HAVE_FP16
    return (vk_x86_features() & VK_F_AVX512FP16) != 0;
#else
    return 0;                   /* this compiler cannot build the vmulph kernels */
#endif
}

/* ==== AVX2 + FMA + F16C ================================================== */

VK_T_AVX2 static void avx2_f16_to_f32(const fp16_t *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256 v0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i)));
        __m256 v1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i + 8)));
        __m256 v2 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i + 16)));
        __m256 v3 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i + 24)));
        _mm256_storeu_ps(dst + i, v0);
        _mm256_storeu_ps(dst + i + 8, v1);
        _mm256_storeu_ps(dst + i + 16, v2);
        _mm256_storeu_ps(dst + i + 24, v3);
    }
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    if (i < n) {
        fp16_t h[8] = {0};
        float f[8];
        memcpy(h, src + i, (n - i) * sizeof(fp16_t));
        _mm256_storeu_ps(f, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h)));
        memcpy(dst + i, f, (n - i) * sizeof(float));
    }
}

VK_T_AVX2 static void avx2_f32_to_f16(const float *src, fp16_t *dst, size_t n) {
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m128i h0 = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), VK_RNE);
        __m128i h1 = _mm256_cvtps_ph(_mm256_loadu_ps(src + i + 8), VK_RNE);
        __m128i h2 = _mm256_cvtps_ph(_mm256_loadu_ps(src + i + 16), VK_RNE);
        __m128i h3 = _mm256_cvtps_ph(_mm256_loadu_ps(src + i + 24), VK_RNE);
        _mm_storeu_si128((__m128i *)(dst + i), h0);
        _mm_storeu_si128((__m128i *)(dst + i + 8), h1);
        _mm_storeu_si128((__m128i *)(dst + i + 16), h2);
        _mm_storeu_si128((__m128i *)(dst + i + 24), h3);
    }
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), VK_RNE));
    if (i < n) {
        float f[8] = {0};
        fp16_t h[8];
        memcpy(f, src + i, (n - i) * sizeof(float));
        _mm_storeu_si128((__m128i *)h, _mm256_cvtps_ph(_mm256_loadu_ps(f), VK_RNE));
        memcpy(dst + i, h, (n - i) * sizeof(fp16_t));
    }
}

VK_T_AVX2 VK_INLINE float avx2_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Strict product of 8 lanes: a (flushed) * x, rounded to fp16, denormals
 * flushed, back in fp32. */
VK_T_AVX2 VK_INLINE __m256 avx2_strict_mul(__m256 a, __m256 x) {
    __m256 p = _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_mul_ps(a, x), VK_RNE));
    __m256 absp = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), p);
    /* keep |p| >= 2^-14, and NaN (unordered compares true with NLT) */
    __m256 keep = _mm256_cmp_ps(absp, _mm256_set1_ps(0x1p-14f), _CMP_NLT_UQ);
    return _mm256_and_ps(p, keep);
}

VK_T_AVX2 VK_INLINE __m256 avx2_flush(__m256 a) {
    __m256 absa = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a);
    return _mm256_and_ps(a, _mm256_cmp_ps(absa, _mm256_set1_ps(0x1p-14f), _CMP_NLT_UQ));
}

VK_T_AVX2 VK_INLINE __m256 avx2_load_ph(const fp16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* R rows of the GEMV, 16 columns per step with two accumulators per row. */
VK_T_AVX2 VK_INLINE void avx2_gemv_block(const vk_gemv_job *j, size_t i, const int nrows,
                                         const int strict) {
    const size_t K = j->K, lda = j->lda;
    const float *x = j->x;
    const fp16_t *a[4];
    __m256 s0[4], s1[4];
    VK_UNROLL
    for (int r = 0; r < 4; r++) {
        a[r] = j->a + (i + (r < nrows ? r : nrows - 1)) * lda;  /* short blocks repeat a row */
        s0[r] = _mm256_setzero_ps();
        s1[r] = _mm256_setzero_ps();
    }
    size_t k = 0;
    for (; k + 16 <= K; k += 16) {
        __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
        if (k % 32 == 0)        /* one prefetch per 64-byte line */
            VK_UNROLL
            for (int r = 0; r < 4; r++)
                _mm_prefetch((const char *)(a[r] + k + VK_GEMV_PF), VK_GEMV_HINT);
        VK_UNROLL
        for (int r = 0; r < 4; r++) {
            __m256 a0 = avx2_load_ph(a[r] + k), a1 = avx2_load_ph(a[r] + k + 8);
            if (strict) {
                s0[r] = _mm256_add_ps(s0[r], avx2_strict_mul(avx2_flush(a0), x0));
                s1[r] = _mm256_add_ps(s1[r], avx2_strict_mul(avx2_flush(a1), x1));
            } else {
                s0[r] = _mm256_fmadd_ps(a0, x0, s0[r]);
                s1[r] = _mm256_fmadd_ps(a1, x1, s1[r]);
            }
        }
    }
    if (k < K) {                /* the tail through zero-padded copies */
        size_t n = K - k;
        float xt[16] = {0};
        memcpy(xt, x + k, n * sizeof(float));
        __m256 x0 = _mm256_loadu_ps(xt), x1 = _mm256_loadu_ps(xt + 8);
        VK_UNROLL
        for (int r = 0; r < 4; r++) {
            fp16_t at[16] = {0};
            memcpy(at, a[r] + k, n * sizeof(fp16_t));
            __m256 a0 = avx2_load_ph(at), a1 = avx2_load_ph(at + 8);
            if (strict) {
                s0[r] = _mm256_add_ps(s0[r], avx2_strict_mul(avx2_flush(a0), x0));
                s1[r] = _mm256_add_ps(s1[r], avx2_strict_mul(avx2_flush(a1), x1));
            } else {
                s0[r] = _mm256_fmadd_ps(a0, x0, s0[r]);
                s1[r] = _mm256_fmadd_ps(a1, x1, s1[r]);
            }
        }
    }
    VK_UNROLL
    for (int r = 0; r < 4; r++) {
        if (r >= nrows)
            break;
        fp16_t h = x86_f32_to_f16(avx2_hsum(_mm256_add_ps(s0[r], s1[r])));
        if (strict && (h & 0x7c00u) == 0)
            h &= 0x8000u;
        j->y[(i + r) * j->incy] = h;
    }
}

VK_T_AVX2 static void avx2_gemv_rows(const vk_gemv_job *j, size_t r0, size_t r1) {
    /* 4-row blocks with constant trip counts (so every compiler keeps the
     * accumulators in registers); the last block may be short */
    for (size_t i = r0; i < r1; i += 4) {
        int n = r1 - i < 4 ? (int)(r1 - i) : 4;
        if (j->strict)
            avx2_gemv_block(j, i, n, 1);
        else
            avx2_gemv_block(j, i, n, 0);
    }
}

/* Several vectors (batched decode): rows i .. i + R - 1 (nrows of them; a short block
 * repeats row i) times the job's vectors v0 .. v0 + V - 1 (nv of them; a short group
 * repeats v0), each row's 16-column block converted once for all of them. For each row
 * and vector the chains s0, s1 of avx2_gemv_block, added in the same order, the tail
 * through the same zero-padded copies, the same reduction: the same bits. */
#ifndef AVX2_MULTI_R
#define AVX2_MULTI_R 2
#endif
#ifndef AVX2_MULTI_V
#define AVX2_MULTI_V 3
#endif
VK_T_AVX2 VK_INLINE void avx2_multi_block(const vk_gemv_job *j, size_t i, const int nrows,
                                          size_t v0, const int nv, const int strict) {
    enum { R = AVX2_MULTI_R, V = AVX2_MULTI_V };
    const size_t K = j->K;
    const fp16_t *a[R];
    const float *x[V];
    __m256 s0[R][V], s1[R][V];
    VK_UNROLL
    for (int r = 0; r < R; r++)
        a[r] = j->a + (i + (r < nrows ? r : 0)) * j->lda;
    VK_UNROLL
    for (int v = 0; v < V; v++)
        x[v] = j->xm + (v0 + (v < nv ? v : 0)) * j->ldx;
    VK_UNROLL
    for (int r = 0; r < R; r++)
        VK_UNROLL
        for (int v = 0; v < V; v++)
            s0[r][v] = s1[r][v] = _mm256_setzero_ps();
    size_t k = 0;
    for (; k + 16 <= K; k += 16) {
        if (v0 == 0 && k % 32 == 0)     /* one prefetch per 64-byte line */
            VK_UNROLL
            for (int r = 0; r < R; r++)
                _mm_prefetch((const char *)(a[r] + k + VK_GEMV_PF), VK_GEMV_HINT);
        __m256 a0[R], a1[R];
        VK_UNROLL
        for (int r = 0; r < R; r++) {
            a0[r] = avx2_load_ph(a[r] + k);
            a1[r] = avx2_load_ph(a[r] + k + 8);
            if (strict) {
                a0[r] = avx2_flush(a0[r]);
                a1[r] = avx2_flush(a1[r]);
            }
        }
        VK_UNROLL
        for (int v = 0; v < V; v++) {
            if (v >= nv)
                break;
            __m256 x0 = _mm256_loadu_ps(x[v] + k), x1 = _mm256_loadu_ps(x[v] + k + 8);
            VK_UNROLL
            for (int r = 0; r < R; r++) {
                if (strict) {
                    s0[r][v] = _mm256_add_ps(s0[r][v], avx2_strict_mul(a0[r], x0));
                    s1[r][v] = _mm256_add_ps(s1[r][v], avx2_strict_mul(a1[r], x1));
                } else {
                    s0[r][v] = _mm256_fmadd_ps(a0[r], x0, s0[r][v]);
                    s1[r][v] = _mm256_fmadd_ps(a1[r], x1, s1[r][v]);
                }
            }
        }
    }
    if (k < K) {                /* the tail through zero-padded copies, as the GEMV's */
        size_t n = K - k;
        __m256 a0[R], a1[R];
        VK_UNROLL
        for (int r = 0; r < R; r++) {
            fp16_t at[16] = {0};
            memcpy(at, a[r] + k, n * sizeof(fp16_t));
            a0[r] = avx2_load_ph(at);
            a1[r] = avx2_load_ph(at + 8);
            if (strict) {
                a0[r] = avx2_flush(a0[r]);
                a1[r] = avx2_flush(a1[r]);
            }
        }
        VK_UNROLL
        for (int v = 0; v < V; v++) {
            if (v >= nv)
                break;
            float xt[16] = {0};
            memcpy(xt, x[v] + k, n * sizeof(float));
            __m256 x0 = _mm256_loadu_ps(xt), x1 = _mm256_loadu_ps(xt + 8);
            VK_UNROLL
            for (int r = 0; r < R; r++) {
                if (strict) {
                    s0[r][v] = _mm256_add_ps(s0[r][v], avx2_strict_mul(a0[r], x0));
                    s1[r][v] = _mm256_add_ps(s1[r][v], avx2_strict_mul(a1[r], x1));
                } else {
                    s0[r][v] = _mm256_fmadd_ps(a0[r], x0, s0[r][v]);
                    s1[r][v] = _mm256_fmadd_ps(a1[r], x1, s1[r][v]);
                }
            }
        }
    }
    VK_UNROLL
    for (int r = 0; r < R; r++) {
        if (r >= nrows)
            break;
        VK_UNROLL
        for (int v = 0; v < V; v++) {
            if (v >= nv)
                break;
            fp16_t h = x86_f32_to_f16(avx2_hsum(_mm256_add_ps(s0[r][v], s1[r][v])));
            if (strict && (h & 0x7c00u) == 0)
                h &= 0x8000u;
            j->ym[(v0 + (size_t)v) * j->ldy + (i + (size_t)r) * j->incy] = h;
        }
    }
}

/* One block of rows over every vector, a group of V at a time (the rows stay in L1). */
VK_T_AVX2 VK_INLINE void avx2_multi_rows_body(const vk_gemv_job *j, size_t i, const int nrows,
                                              const int strict) {
    size_t v = 0;
    for (; v + AVX2_MULTI_V <= j->nx; v += AVX2_MULTI_V)
        avx2_multi_block(j, i, nrows, v, AVX2_MULTI_V, strict);
    switch (j->nx - v) {    /* a last group of fewer (AVX2_MULTI_V <= 4) */
    case 3: avx2_multi_block(j, i, nrows, v, 3, strict); break;
    case 2: avx2_multi_block(j, i, nrows, v, 2, strict); break;
    case 1: avx2_multi_block(j, i, nrows, v, 1, strict); break;
    default: break;
    }
}

VK_T_AVX2 static void avx2_gemv_multi_rows(const vk_gemv_job *j, size_t r0, size_t r1) {
    size_t i = r0;
    for (; i + AVX2_MULTI_R <= r1; i += AVX2_MULTI_R) {
        if (j->strict)
            avx2_multi_rows_body(j, i, AVX2_MULTI_R, 1);
        else
            avx2_multi_rows_body(j, i, AVX2_MULTI_R, 0);
    }
    for (; i < r1; i++) {
        if (j->strict)
            avx2_multi_rows_body(j, i, 1, 1);
        else
            avx2_multi_rows_body(j, i, 1, 0);
    }
}

/* GEMM microkernel 6 x 16: 12 accumulators, two B vectors, one broadcast. */
#define AVX2_MR 6
#define AVX2_NR 16

VK_T_AVX2 VK_INLINE void avx2_micro_body(size_t K, const float *ap, const float *bp,
                                         float *tile, const int strict) {
    __m256 c[AVX2_MR][2];
    VK_UNROLL
    for (int r = 0; r < AVX2_MR; r++) {     /* continue the tile's sums */
        c[r][0] = _mm256_loadu_ps(tile + r * AVX2_NR);
        c[r][1] = _mm256_loadu_ps(tile + r * AVX2_NR + 8);
    }
    for (size_t k = 0; k < K; k++) {
        __m256 b0 = _mm256_load_ps(bp + k * AVX2_NR), b1 = _mm256_load_ps(bp + k * AVX2_NR + 8);
        VK_UNROLL
        for (int r = 0; r < AVX2_MR; r++) {
            __m256 a = _mm256_broadcast_ss(ap + k * AVX2_MR + r);
            if (strict) {
                c[r][0] = _mm256_add_ps(c[r][0], avx2_strict_mul(a, b0));
                c[r][1] = _mm256_add_ps(c[r][1], avx2_strict_mul(a, b1));
            } else {
                c[r][0] = _mm256_fmadd_ps(a, b0, c[r][0]);
                c[r][1] = _mm256_fmadd_ps(a, b1, c[r][1]);
            }
        }
    }
    VK_UNROLL
    for (int r = 0; r < AVX2_MR; r++) {
        _mm256_storeu_ps(tile + r * AVX2_NR, c[r][0]);
        _mm256_storeu_ps(tile + r * AVX2_NR + 8, c[r][1]);
    }
}

VK_T_AVX2 static void avx2_micro(size_t K, const void *ap, const void *bp, float *tile,
                                 int strict) {
    if (strict)
        avx2_micro_body(K, ap, bp, tile, 1);
    else
        avx2_micro_body(K, ap, bp, tile, 0);
}

static void avx2_pack_a(const vk_mat *a, size_t i0, size_t rows, size_t K, void *dst,
                        int strict) {
    vk_pack_a_f32(a, i0, rows, K, dst, AVX2_MR, strict, avx2_f16_to_f32);
}

static void avx2_pack_b(const vk_mat *b, size_t j0, size_t cols, size_t K, void *dst,
                        int strict) {
    vk_pack_b_f32(b, j0, cols, K, dst, AVX2_NR, strict, avx2_f16_to_f32);
}

static const vk_gemm_kernel avx2_gemm = {AVX2_MR, AVX2_NR, 4, avx2_pack_a, avx2_pack_b,
                                         avx2_micro};

/* Vector x matrix, 32 columns at a time (AVX-512's kernel at half the width): x[k]
 * broadcast times a row of B, added in k order into four accumulators. A last group
 * of fewer than 8 columns goes through a zero-padded copy of its row (AVX2 has no
 * masked 16-bit load), which adds the same products in the same order. */
VK_T_AVX2 static void avx2_vecmat(size_t K, const float *x, const fp16_t *B, size_t rsb,
                                  size_t N, float *acc) {
    size_t j0 = 0;
    for (; j0 + 32 <= N; j0 += 32) {
        __m256 s[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                       _mm256_setzero_ps()};
        for (size_t k = 0; k < K; k++) {
            __m256 xk = _mm256_set1_ps(x[k]);
            const fp16_t *b = B + k * rsb + j0;
            VK_UNROLL
            for (int q = 0; q < 4; q++) {
                __m128i h = _mm_loadu_si128((const __m128i *)(b + 8 * q));
                s[q] = _mm256_fmadd_ps(xk, _mm256_cvtph_ps(h), s[q]);
            }
        }
        VK_UNROLL
        for (int q = 0; q < 4; q++)
            _mm256_storeu_ps(acc + j0 + 8 * q, s[q]);
    }
    for (; j0 < N; j0 += 8) {
        size_t cols = N - j0 < 8 ? N - j0 : 8;
        __m256 s = _mm256_setzero_ps();
        for (size_t k = 0; k < K; k++) {
            const fp16_t *b = B + k * rsb + j0;
            __m128i h;
            if (cols == 8) {
                h = _mm_loadu_si128((const __m128i *)b);
            } else {
                fp16_t row[8] = {0};
                memcpy(row, b, cols * sizeof(fp16_t));
                h = _mm_loadu_si128((const __m128i *)row);
            }
            s = _mm256_fmadd_ps(_mm256_set1_ps(x[k]), _mm256_cvtph_ps(h), s);
        }
        float out[8];
        _mm256_storeu_ps(out, s);
        memcpy(acc + j0, out, cols * sizeof(float));
    }
}

static const vk_isa_ops avx2_ops = {"avx2", avx2_f16_to_f32, avx2_f32_to_f16, avx2_gemv_rows,
                                    NULL, &avx2_gemm, &avx2_gemm, avx2_vecmat, NULL,
                                    avx2_gemv_multi_rows, vk_avx2_ew_f16};

const vk_isa_ops *vk_ops_avx2(void) { return &avx2_ops; }

/* ==== AVX-512 ============================================================ */

VK_T_AVX512 static void avx512_f16_to_f32(const fp16_t *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512 v0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i)));
        __m512 v1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i + 16)));
        __m512 v2 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i + 32)));
        __m512 v3 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i + 48)));
        _mm512_storeu_ps(dst + i, v0);
        _mm512_storeu_ps(dst + i + 16, v1);
        _mm512_storeu_ps(dst + i + 32, v2);
        _mm512_storeu_ps(dst + i + 48, v3);
    }
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i,
                         _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(dst + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, src + i)));
    }
}

VK_T_AVX512 static void avx512_f32_to_f16(const float *src, fp16_t *dst, size_t n) {
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m256i h0 = _mm512_cvtps_ph(_mm512_loadu_ps(src + i), VK_RNE);
        __m256i h1 = _mm512_cvtps_ph(_mm512_loadu_ps(src + i + 16), VK_RNE);
        __m256i h2 = _mm512_cvtps_ph(_mm512_loadu_ps(src + i + 32), VK_RNE);
        __m256i h3 = _mm512_cvtps_ph(_mm512_loadu_ps(src + i + 48), VK_RNE);
        _mm256_storeu_si256((__m256i *)(dst + i), h0);
        _mm256_storeu_si256((__m256i *)(dst + i + 16), h1);
        _mm256_storeu_si256((__m256i *)(dst + i + 32), h2);
        _mm256_storeu_si256((__m256i *)(dst + i + 48), h3);
    }
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtps_ph(_mm512_loadu_ps(src + i), VK_RNE));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm256_mask_storeu_epi16(dst + i, m, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + i), VK_RNE));
    }
}

/* fp16 lanes whose exponent is non-zero (normal, inf, NaN): the rest are
 * zeros and denormals, which strict numerics flush. */
VK_T_AVX512 VK_INLINE __mmask16 avx512_normal16(__m256i h) {
    return _mm256_test_epi16_mask(h, _mm256_set1_epi16(0x7c00));
}

/* acc + strict(a * x) over 16 lanes, a and x already flushed, in fp32. */
VK_T_AVX512 VK_INLINE __m512 avx512_strict_fma(__m512 a, __m512 x, __m512 acc) {
    __m256i p = _mm512_cvtps_ph(_mm512_mul_ps(a, x), VK_RNE);
    return _mm512_mask_add_ps(acc, avx512_normal16(p), acc, _mm512_cvtph_ps(p));
}

/* 16 fp16 of a row (count lanes under mask m), as fp32, flushed if strict. */
VK_T_AVX512 VK_INLINE __m512 avx512_load_row(const fp16_t *p, __mmask16 m, const int strict) {
    __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return strict ? _mm512_maskz_cvtph_ps(avx512_normal16(h), h) : _mm512_cvtph_ps(h);
}

/* Row i's two chains added, for nv (1 or 2) vectors (j->x, then j->x2): out[v] holds
 * the 16 lanes whose sum is y[i] (y2[i]). The row is converted once for both vectors
 * (grouped-query decode attention: the two queries of a key head score the same cached
 * keys); each vector's chains are the same, in the same order, whatever nv is. Two
 * vectors only with FP16 numerics. */
VK_T_AVX512 VK_INLINE void avx512_gemv_lanes_n(const vk_gemv_job *j, size_t i,
                                               const int strict, const int nv, __m512 *out) {
    const size_t K = j->K;
    const float *x[2] = {j->x, j->x2};
    const fp16_t *a = j->a + i * j->lda;
    __m512 s0[2], s1[2];
    VK_UNROLL
    for (int v = 0; v < nv; v++)
        s0[v] = s1[v] = _mm512_setzero_ps();
    size_t k = 0;
    for (; k + 32 <= K; k += 32) {
        _mm_prefetch((const char *)(a + k + VK_GEMV_ROW_PF), VK_GEMV_HINT);
        __m512 a0 = avx512_load_row(a + k, 0xffff, strict);
        __m512 a1 = avx512_load_row(a + k + 16, 0xffff, strict);
        VK_UNROLL
        for (int v = 0; v < nv; v++) {
            __m512 x0 = _mm512_loadu_ps(x[v] + k), x1 = _mm512_loadu_ps(x[v] + k + 16);
            if (strict) {
                s0[v] = avx512_strict_fma(a0, x0, s0[v]);
                s1[v] = avx512_strict_fma(a1, x1, s1[v]);
            } else {
                s0[v] = _mm512_fmadd_ps(a0, x0, s0[v]);
                s1[v] = _mm512_fmadd_ps(a1, x1, s1[v]);
            }
        }
    }
    for (; k < K; k += 16) {    /* up to two masked steps */
        __mmask16 m = K - k >= 16 ? 0xffff : (__mmask16)((1u << (K - k)) - 1);
        __m512 a0 = avx512_load_row(a + k, m, strict);
        VK_UNROLL
        for (int v = 0; v < nv; v++) {
            __m512 x0 = _mm512_maskz_loadu_ps(m, x[v] + k);
            s0[v] = strict ? avx512_strict_fma(a0, x0, s0[v]) : _mm512_fmadd_ps(a0, x0, s0[v]);
        }
    }
    VK_UNROLL
    for (int v = 0; v < nv; v++)
        out[v] = _mm512_add_ps(s0[v], s1[v]);
}

VK_T_AVX512 VK_INLINE __m512 avx512_gemv_lanes(const vk_gemv_job *j, size_t i, const int strict) {
    __m512 lanes;
    avx512_gemv_lanes_n(j, i, strict, 1, &lanes);
    return lanes;
}

/* One row of the GEMV, 32 columns per step with two accumulators. A row at a
 * time, not a block of rows: the rows of A are contiguous, so each thread reads
 * one sequential stream, which the prefetchers follow better than four streams a
 * row apart (cold matrices of GPT-2 and Qwen3 shapes: 5-25% faster; the head
 * 50257 x 768 30.4 -> 32.9 GB/s, against 36.3 for a plain read loop). Each row's
 * sum is computed as in a block (the same two chains, the same reduction), so the
 * bits do not change. Two chains of FMAs per row are enough for memory speed. */
VK_T_AVX512 VK_INLINE void avx512_gemv_row(const vk_gemv_job *j, size_t i, const int strict) {
    fp16_t h = x86_f32_to_f16(_mm512_reduce_add_ps(avx512_gemv_lanes(j, i, strict)));
    if (strict && (h & 0x7c00u) == 0)
        h &= 0x8000u;
    j->y[i * j->incy] = h;
}

/* Eight rows' lane sums folded as far as they go side by side: 128-bit block b of the
 * result holds [t0 + t2, t1 + t3] of rows b and b + 4, where t are the row's four sums
 * of its 256-bit halves' 128-bit halves; pair for pair the additions of
 * _mm512_reduce_add_ps (halves of 256, then of 128 bits, then lanes 2 apart). */
VK_T_AVX512 VK_INLINE __m512 avx512_fold8(const __m512 *v) {
    __m512 u[4], w[2];
    VK_UNROLL
    for (int r = 0; r < 4; r++)      /* rows 2r, 2r+1: [hi + lo of 2r | of 2r+1] */
        u[r] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * r], v[2 * r + 1], 0xEE),
                             _mm512_shuffle_f32x4(v[2 * r], v[2 * r + 1], 0x44));
    VK_UNROLL
    for (int r = 0; r < 2; r++)      /* 128-bit block b: row 4r + b, its hi128 + lo128 */
        w[r] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * r], u[2 * r + 1], 0xDD),
                             _mm512_shuffle_f32x4(u[2 * r], u[2 * r + 1], 0x88));
    return _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x44),
                         _mm512_shuffle_ps(w[0], w[1], 0xEE));
}

/* Sixteen rows' lane sums reduced together: lane r of the result is
 * _mm512_reduce_add_ps(v[r]), pair for pair the same additions (then lanes 1 apart),
 * so the same values; the shuffles that line the rows up are shared. Rows with a
 * short K (decode attention's scores: 256 rows of 128) spent most of their time
 * reducing one row at a time and storing its fp16 alone. */
VK_T_AVX512 VK_INLINE __m512 avx512_reduce16(const __m512 *v) {
    __m512 y0 = avx512_fold8(v), y1 = avx512_fold8(v + 8);
    /* block b: [s0 + s1] of rows b, b + 4, b + 8, b + 12 */
    __m512 z = _mm512_add_ps(_mm512_shuffle_ps(y0, y1, 0x88), _mm512_shuffle_ps(y0, y1, 0xDD));
    const __m512i rows = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    return _mm512_permutexvar_ps(rows, z);
}

/* Eight rows' lane sums reduced together: lane r of the result is
 * _mm512_reduce_add_ps(v[r]), as avx512_reduce16 for half as many. */
VK_T_AVX512 VK_INLINE __m256 avx512_reduce8(const __m512 *v) {
    __m512 y = avx512_fold8(v);
    /* block b: [s0 + s1] of rows b, b + 4 (twice) */
    __m512 z = _mm512_add_ps(_mm512_shuffle_ps(y, y, 0x88), _mm512_shuffle_ps(y, y, 0xDD));
    const __m512i rows = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 13, 9, 5, 1, 12, 8, 4, 0);
    return _mm512_castps512_ps256(_mm512_permutexvar_ps(rows, z));
}

VK_T_AVX512 static void avx512_gemv_rows(const vk_gemv_job *j, size_t r0, size_t r1) {
    size_t i = r0;
    if (!j->strict && j->incy == 1) {
        for (; i + 16 <= r1; i += 16) {
            __m512 v[16];
            VK_UNROLL
            for (int r = 0; r < 16; r++)
                v[r] = avx512_gemv_lanes(j, i + (size_t)r, 0);
            _mm256_storeu_si256((__m256i *)(j->y + i),
                                _mm512_cvtps_ph(avx512_reduce16(v), VK_RNE));
        }
    }
    for (; i < r1; i++) {
        if (j->strict)
            avx512_gemv_row(j, i, 1);
        else
            avx512_gemv_row(j, i, 0);
    }
}

/* avx512_gemv_rows for two vectors (grouped-query decode attention: the two queries
 * of a key head score the same cached keys), converting each key row once. Qwen3's
 * 8 heads x 2 queries x 256 x 128, hot: 22 -> 16.5 us a layer. */
VK_T_AVX512 static void avx512_gemv_pair_rows(const vk_gemv_job *j, size_t r0, size_t r1) {
    size_t i = r0;
    if (j->incy == 1) {
        for (; i + 16 <= r1; i += 16) {
            __m512 v[16], v2[16], l[2];
            VK_UNROLL
            for (int r = 0; r < 16; r++) {
                avx512_gemv_lanes_n(j, i + (size_t)r, 0, 2, l);
                v[r] = l[0];
                v2[r] = l[1];
            }
            _mm256_storeu_si256((__m256i *)(j->y + i),
                                _mm512_cvtps_ph(avx512_reduce16(v), VK_RNE));
            _mm256_storeu_si256((__m256i *)(j->y2 + i),
                                _mm512_cvtps_ph(avx512_reduce16(v2), VK_RNE));
        }
    }
    for (; i < r1; i++) {
        __m512 l[2];
        avx512_gemv_lanes_n(j, i, 0, 2, l);
        j->y[i * j->incy] = x86_f32_to_f16(_mm512_reduce_add_ps(l[0]));
        j->y2[i * j->incy] = x86_f32_to_f16(_mm512_reduce_add_ps(l[1]));
    }
}

/* Several vectors (batched decode), FP16 numerics: rows i .. i + R - 1 (nrows of them;
 * a short block repeats row i) times vectors v0 .. v0 + V - 1 (nv of them; a short
 * group repeats v0), each row's 32-column step converted once for all of them. For
 * each row and vector the chains s0, s1 of avx512_gemv_lanes_n, the same masked tail
 * steps, the same reduction (avx512_reduce8 equals _mm512_reduce_add_ps): the bits
 * gemv_rows gives each vector alone. One row by 8 vectors: 16 accumulators, and the
 * fewest conversions a multiply (they share a port with the FMAs); a GPT-2 small step
 * of 16 rows, its convs: 2 x 4 27 ms, 2 x 6 25 ms, 3 x 4 25 ms, 1 x 8 23 ms. Past
 * AVX512_MULTI_WIDE_K columns the 8 vectors (96 KiB at K = 3072) no longer fit in L1
 * and each row read them from L2: two rows by 8 share each load (768 x 3072, 8
 * vectors: 48 -> 68 GMAC/s; at K = 768, 1 x 8 stays the faster). */
#ifndef AVX512_MULTI_V
#define AVX512_MULTI_V 8
#endif
#define AVX512_MULTI_RMAX 2
#ifndef AVX512_MULTI_ROW_BLOCK
#define AVX512_MULTI_ROW_BLOCK 16
#endif
#ifndef AVX512_MULTI_WIDE_K
#define AVX512_MULTI_WIDE_K 2048
#endif
VK_T_AVX512 VK_INLINE void avx512_multi_block(const vk_gemv_job *j, size_t i, const int nrows,
                                              size_t v0, const int nv, const int R) {
    enum { V = AVX512_MULTI_V };
    const size_t K = j->K;
    const fp16_t *a[AVX512_MULTI_RMAX];
    const float *x[V];
    __m512 s0[AVX512_MULTI_RMAX][V], s1[AVX512_MULTI_RMAX][V];
    VK_UNROLL
    for (int r = 0; r < R; r++)
        a[r] = j->a + (i + (r < nrows ? r : 0)) * j->lda;
    VK_UNROLL
    for (int v = 0; v < V; v++)
        x[v] = j->xm + (v0 + (v < nv ? v : 0)) * j->ldx;
    VK_UNROLL
    for (int r = 0; r < R; r++)
        VK_UNROLL
        for (int v = 0; v < V; v++)
            s0[r][v] = s1[r][v] = _mm512_setzero_ps();
    size_t k = 0;
    /* A 32-column step in two halves, chain s0 over its first 16 columns, then s1 over
     * the next: only one half's weight vectors are live, so two rows of 6 vectors (24
     * chains) keep theirs in registers; at 8 vectors a few chains spill, and that walk
     * still measured fastest at K = 768. Each chain gets the same FMAs in the same
     * order. */
    for (; k + 32 <= K; k += 32) {
        __m512 w[AVX512_MULTI_RMAX];
        VK_UNROLL
        for (int half = 0; half < 2; half++) {
            VK_UNROLL
            for (int r = 0; r < R; r++) {
                if (v0 == 0 && half == 0)    /* a prefetch a 64-byte line, by the first group */
                    _mm_prefetch((const char *)(a[r] + k + VK_GEMV_ROW_PF), VK_GEMV_HINT);
                w[r] = _mm512_cvtph_ps(
                    _mm256_loadu_si256((const __m256i *)(a[r] + k + 16 * half)));
            }
            VK_UNROLL
            for (int v = 0; v < V; v++) {
                if (v >= nv)
                    break;
                __m512 xh = _mm512_loadu_ps(x[v] + k + 16 * half);
                VK_UNROLL
                for (int r = 0; r < R; r++) {
                    if (half == 0)
                        s0[r][v] = _mm512_fmadd_ps(w[r], xh, s0[r][v]);
                    else
                        s1[r][v] = _mm512_fmadd_ps(w[r], xh, s1[r][v]);
                }
            }
        }
    }
    for (; k < K; k += 16) {    /* up to two masked steps, into s0 as the GEMV's */
        __mmask16 m = K - k >= 16 ? 0xffff : (__mmask16)((1u << (K - k)) - 1);
        __m512 a0[AVX512_MULTI_RMAX];
        VK_UNROLL
        for (int r = 0; r < R; r++)
            a0[r] = avx512_load_row(a[r] + k, m, 0);
        VK_UNROLL
        for (int v = 0; v < V; v++) {
            if (v >= nv)
                break;
            __m512 x0 = _mm512_maskz_loadu_ps(m, x[v] + k);
            VK_UNROLL
            for (int r = 0; r < R; r++)
                s0[r][v] = _mm512_fmadd_ps(a0[r], x0, s0[r][v]);
        }
    }
    /* Each row's nv sums reduced together, in registers (through memory, sixteen at a
     * time, a Zen 4's convs ran 3-6% slower), and stored at once where they are adjacent
     * (a conv's [rows, columns] output: a group's columns of a row). */
    VK_UNROLL
    for (int r = 0; r < R; r++) {
        if (r >= nrows)
            break;
        __m512 lanes[8];
        VK_UNROLL
        for (int v = 0; v < 8; v++)
            lanes[v] = v < nv ? _mm512_add_ps(s0[r][v], s1[r][v]) : _mm512_setzero_ps();
        __m128i h = _mm256_cvtps_ph(avx512_reduce8(lanes), VK_RNE);
        fp16_t *dst = j->ym + v0 * j->ldy + (i + (size_t)r) * j->incy;
        if (j->ldy == 1) {
            _mm_mask_storeu_epi16(dst, (__mmask8)((1u << nv) - 1), h);
        } else {
            fp16_t out[8];
            _mm_storeu_si128((__m128i *)out, h);
            for (int v = 0; v < nv; v++)
                dst[(size_t)v * j->ldy] = out[v];
        }
    }
}

/* Rows i .. i + nrows - 1 (R a block) over vectors v .. v + nv - 1 (1 <= nv <=
 * AVX512_MULTI_V <= 8): avx512_multi_block with nv a constant. */
VK_T_AVX512 VK_INLINE void avx512_multi_group(const vk_gemv_job *j, size_t i, const int nrows,
                                              const int R, size_t v, size_t nv) {
    switch (nv) {
    case 8: avx512_multi_block(j, i, nrows, v, 8, R); break;
    case 7: avx512_multi_block(j, i, nrows, v, 7, R); break;
    case 6: avx512_multi_block(j, i, nrows, v, 6, R); break;
    case 5: avx512_multi_block(j, i, nrows, v, 5, R); break;
    case 4: avx512_multi_block(j, i, nrows, v, 4, R); break;
    case 3: avx512_multi_block(j, i, nrows, v, 3, R); break;
    case 2: avx512_multi_block(j, i, nrows, v, 2, R); break;
    case 1: avx512_multi_block(j, i, nrows, v, 1, R); break;
    default: break;
    }
}

/* How the few-column kernel walks a job: vectors `group` at a time (the last group
 * fewer), and two rows at a time past `wide_k` columns. AVX512_MULTI_V and _WIDE_K
 * were tuned on an Intel Xeon with a 48 KiB L1. With a smaller L1 (AMD EPYC Zen 4:
 * 32 KiB) two rows always share each vector load, and a group is the most vectors
 * that fill 3/4 of L1, from 6 to 8 (all of them where there are at most 8), spread
 * over as few groups (16 vectors at K = 1024: 6, 6 and 4). A Zen 4's convs were then load-bound: at one row a step, every FMA loaded its
 * vector from L1 or L2. 2 threads, GMAC/s, before -> after: 16 vectors of 2048 x 1024
 * 81 -> 89, of 1024 x 2048 75 -> 85, of 768 x 3072 77 -> 85, of 3072 x 768 86 -> 93;
 * 8 of 2048 x 1024 75 -> 80; 2 of it 39 -> 52. The grouping changes no bit: each
 * vector's chains are its own. */
typedef struct avx512_multi_plan {
    size_t group, wide_k;
} avx512_multi_plan;

static avx512_multi_plan avx512_multi_plan_for(const vk_gemv_job *j) {
    avx512_multi_plan p = {AVX512_MULTI_V, AVX512_MULTI_WIDE_K};
    size_t l1 = vk_l1d_bytes();
    if (l1 >= 48 * 1024 || j->nx <= 1 || j->K == 0)
        return p;
    enum { FEWEST = 6 };    /* fewer vectors convert each weight row too often */
    size_t fit = (l1 * 3 / 4) / (j->K * sizeof(float));
    size_t most = fit >= AVX512_MULTI_V ? AVX512_MULTI_V : fit < FEWEST ? FEWEST : fit;
    size_t groups = (j->nx + most - 1) / most;
    p.group = j->nx <= AVX512_MULTI_V ? j->nx : (j->nx + groups - 1) / groups;
    p.wide_k = 0;
    return p;
}

/* The vectors' group (`group` of them, fewer in the last) from v, and its size. */
static inline size_t avx512_group(const vk_gemv_job *j, size_t v, size_t group) {
    return j->nx - v < group ? j->nx - v : group;
}

static const vk_isa_ops avx512_ops;

/* Strict numerics (the rarer case, and the FP16 ISA rounds products its own way) go
 * through each vector's gemv_rows; FP16 numerics through the blocks above. */
VK_T_AVX512 static void avx512_gemv_multi_rows_with(const vk_isa_ops *o, const vk_gemv_job *j,
                                                    size_t r0, size_t r1) {
    if (j->strict) {
        vk_gemv_multi_each(o, j, r0, r1);
        return;
    }
    size_t i = r0;
    const avx512_multi_plan plan = avx512_multi_plan_for(j);
    const size_t g = plan.group;
    if (j->K > plan.wide_k)   /* two rows at a time, every group (the rows in L1) */
        for (; i + 2 <= r1; i += 2)
            for (size_t v = 0; v < j->nx; v += g)
                avx512_multi_group(j, i, 2, 2, v, avx512_group(j, v, g));
    /* a row at a time, each group over a block of rows, so that the group's vectors stay
     * in L1 (each row through every group took them from L2: 32 columns of 3072 x 1024
     * ran at 71 GMAC/s against 8 columns' 104) */
    for (; i < r1; i += AVX512_MULTI_ROW_BLOCK) {
        size_t i1 = i + AVX512_MULTI_ROW_BLOCK < r1 ? i + AVX512_MULTI_ROW_BLOCK : r1;
        for (size_t v = 0; v < j->nx; v += g)
            for (size_t ii = i; ii < i1; ii++)
                avx512_multi_group(j, ii, 1, 1, v, avx512_group(j, v, g));
    }
}

VK_T_AVX512 static void avx512_gemv_multi_rows(const vk_gemv_job *j, size_t r0, size_t r1) {
    avx512_gemv_multi_rows_with(&avx512_ops, j, r0, r1);
}

/* GEMM microkernel 8 x 32: 16 accumulators, two B vectors, broadcast A. */
#define AVX512_MR 8
#define AVX512_NR 32

VK_T_AVX512 VK_INLINE void avx512_micro_body(size_t K, const float *ap, const float *bp,
                                             float *tile, const int strict) {
    __m512 c[AVX512_MR][2];
    VK_UNROLL
    for (int r = 0; r < AVX512_MR; r++) {   /* continue the tile's sums */
        c[r][0] = _mm512_loadu_ps(tile + r * AVX512_NR);
        c[r][1] = _mm512_loadu_ps(tile + r * AVX512_NR + 16);
    }
    for (size_t k = 0; k < K; k++) {
        __m512 b0 = _mm512_load_ps(bp + k * AVX512_NR);
        __m512 b1 = _mm512_load_ps(bp + k * AVX512_NR + 16);
        VK_UNROLL
        for (int r = 0; r < AVX512_MR; r++) {
            __m512 a = _mm512_set1_ps(ap[k * AVX512_MR + r]);
            if (strict) {
                c[r][0] = avx512_strict_fma(a, b0, c[r][0]);
                c[r][1] = avx512_strict_fma(a, b1, c[r][1]);
            } else {
                c[r][0] = _mm512_fmadd_ps(a, b0, c[r][0]);
                c[r][1] = _mm512_fmadd_ps(a, b1, c[r][1]);
            }
        }
    }
    VK_UNROLL
    for (int r = 0; r < AVX512_MR; r++) {
        _mm512_storeu_ps(tile + r * AVX512_NR, c[r][0]);
        _mm512_storeu_ps(tile + r * AVX512_NR + 16, c[r][1]);
    }
}

VK_T_AVX512 static void avx512_micro(size_t K, const void *ap, const void *bp, float *tile,
                                     int strict) {
    if (strict)
        avx512_micro_body(K, ap, bp, tile, 1);
    else
        avx512_micro_body(K, ap, bp, tile, 0);
}

/* Packs 8 rows of op(A), contiguous along k, through 8 x 8 transposes. */
VK_T_AVX512 static void avx512_pack_a(const vk_mat *a, size_t i0, size_t rows, size_t K,
                                      void *dst_, int strict) {
    float *dst = dst_;
    if (a->rs == 1 && a->cs != 1 && rows == AVX512_MR) {
        /* op(A) = A^T (a weight fed as an input): each k's 8 rows are contiguous,
         * one load and one convert per k (a call per k cost 15% of the GEMM) */
        for (size_t k = 0; k < K; k++) {
            __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a->p + k * a->cs + i0)));
            if (strict) {
                __m256 av = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v);
                v = _mm256_and_ps(v, _mm256_cmp_ps(av, _mm256_set1_ps(0x1p-14f), _CMP_NLT_UQ));
            }
            _mm256_store_ps(dst + k * AVX512_MR, v);
        }
        return;
    }
    if (a->cs != 1 || rows != AVX512_MR) {
        vk_pack_a_f32(a, i0, rows, K, dst, AVX512_MR, strict, avx512_f16_to_f32);
        return;
    }
    const fp16_t *p[8];
    VK_UNROLL
    for (int r = 0; r < 8; r++)
        p[r] = a->p + (i0 + r) * a->rs;
    size_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 v[8], t[8];
        VK_UNROLL
        for (int r = 0; r < 8; r++) {
            v[r] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p[r] + k)));
            if (strict) {
                __m256 av = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v[r]);
                v[r] = _mm256_and_ps(v[r], _mm256_cmp_ps(av, _mm256_set1_ps(0x1p-14f), _CMP_NLT_UQ));
            }
        }
        t[0] = _mm256_unpacklo_ps(v[0], v[1]);
        t[1] = _mm256_unpackhi_ps(v[0], v[1]);
        t[2] = _mm256_unpacklo_ps(v[2], v[3]);
        t[3] = _mm256_unpackhi_ps(v[2], v[3]);
        t[4] = _mm256_unpacklo_ps(v[4], v[5]);
        t[5] = _mm256_unpackhi_ps(v[4], v[5]);
        t[6] = _mm256_unpacklo_ps(v[6], v[7]);
        t[7] = _mm256_unpackhi_ps(v[6], v[7]);
        v[0] = _mm256_shuffle_ps(t[0], t[2], 0x44);
        v[1] = _mm256_shuffle_ps(t[0], t[2], 0xee);
        v[2] = _mm256_shuffle_ps(t[1], t[3], 0x44);
        v[3] = _mm256_shuffle_ps(t[1], t[3], 0xee);
        v[4] = _mm256_shuffle_ps(t[4], t[6], 0x44);
        v[5] = _mm256_shuffle_ps(t[4], t[6], 0xee);
        v[6] = _mm256_shuffle_ps(t[5], t[7], 0x44);
        v[7] = _mm256_shuffle_ps(t[5], t[7], 0xee);
        /* v[0..3] hold k = 0..3 (low half) and 4..7 (high half) for rows 0..3 */
        _mm256_store_ps(dst + (k + 0) * 8, _mm256_permute2f128_ps(v[0], v[4], 0x20));
        _mm256_store_ps(dst + (k + 1) * 8, _mm256_permute2f128_ps(v[1], v[5], 0x20));
        _mm256_store_ps(dst + (k + 2) * 8, _mm256_permute2f128_ps(v[2], v[6], 0x20));
        _mm256_store_ps(dst + (k + 3) * 8, _mm256_permute2f128_ps(v[3], v[7], 0x20));
        _mm256_store_ps(dst + (k + 4) * 8, _mm256_permute2f128_ps(v[0], v[4], 0x31));
        _mm256_store_ps(dst + (k + 5) * 8, _mm256_permute2f128_ps(v[1], v[5], 0x31));
        _mm256_store_ps(dst + (k + 6) * 8, _mm256_permute2f128_ps(v[2], v[6], 0x31));
        _mm256_store_ps(dst + (k + 7) * 8, _mm256_permute2f128_ps(v[3], v[7], 0x31));
    }
    for (; k < K; k++)
        VK_UNROLL
        for (int r = 0; r < 8; r++) {
            float f = vk_f16_to_f32(p[r][k]);
            dst[k * 8 + r] = strict ? vk_flush_f32(f) : f;
        }
}

static void avx512_pack_b(const vk_mat *b, size_t j0, size_t cols, size_t K, void *dst,
                          int strict) {
    vk_pack_b_f32(b, j0, cols, K, dst, AVX512_NR, strict, avx512_f16_to_f32);
}

static const vk_gemm_kernel avx512_gemm = {AVX512_MR, AVX512_NR, 4, avx512_pack_a,
                                           avx512_pack_b, avx512_micro};

/* Vector x matrix over columns [j0, j0 + 16 nq) for nv (1 or 2) vectors x[v]: x[v][k]
 * broadcast times a row of B, added in k order, one accumulator per 16 columns and
 * vector (decode attention: probabilities times the cached values). Each 16 values of B
 * are converted once for all nv vectors (the two queries of a key head in grouped
 * attention); each vector's chains are the same, in the same order, whatever nv is.
 * Plain loads where the block is whole: masked 16-bit loads issue slowly on Zen. */
VK_T_AVX512 VK_INLINE void avx512_vecmat_block(size_t K, const float *const *x,
                                               const fp16_t *B, size_t rsb, size_t N,
                                               size_t j0, float *const *acc, const int nv,
                                               const int nq, const int whole) {
    __mmask16 m[8];
    __m512 s[2][8];
    VK_UNROLL
    for (int q = 0; q < nq; q++) {
        size_t c = j0 + 16 * (size_t)q, left = c < N ? N - c : 0;
        m[q] = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        VK_UNROLL
        for (int v = 0; v < nv; v++)
            s[v][q] = _mm512_setzero_ps();
    }
    for (size_t k = 0; k < K; k++) {
        __m512 xk[2];
        VK_UNROLL
        for (int v = 0; v < nv; v++)
            xk[v] = _mm512_set1_ps(x[v][k]);
        const fp16_t *b = B + k * rsb + j0;
        VK_UNROLL
        for (int q = 0; q < nq; q++) {
            __m256i h = whole ? _mm256_loadu_si256((const __m256i *)(b + 16 * q))
                              : _mm256_maskz_loadu_epi16(m[q], b + 16 * q);
            __m512 bv = _mm512_cvtph_ps(h);
            VK_UNROLL
            for (int v = 0; v < nv; v++)
                s[v][q] = _mm512_fmadd_ps(xk[v], bv, s[v][q]);
        }
    }
    VK_UNROLL
    for (int v = 0; v < nv; v++) {
        VK_UNROLL
        for (int q = 0; q < nq; q++)
            _mm512_mask_storeu_ps(acc[v] + j0 + 16 * q, m[q], s[v][q]);
    }
}

/* 128 columns a pass while they last (eight chains a vector: with four, each k waited
 * on the FMA latency of the last; Qwen3's 8 heads x 2 queries x 256 x 128, hot: 21.1 ->
 * 19.7 us a layer with the plain loads; the two queries together 19.0 -> 12.0), then
 * 64. A column's sum is the same chain in the same order whatever the block, so the
 * bits do not change. */
VK_T_AVX512 VK_INLINE void avx512_vecmat_passes(size_t K, const float *const *x,
                                                const fp16_t *B, size_t rsb, size_t N,
                                                float *const *acc, const int nv) {
    size_t j0 = 0;
    for (; N - j0 >= 128; j0 += 128)
        avx512_vecmat_block(K, x, B, rsb, N, j0, acc, nv, 8, 1);
    for (; j0 < N; j0 += 64) {
        if (N - j0 >= 64)
            avx512_vecmat_block(K, x, B, rsb, N, j0, acc, nv, 4, 1);
        else
            avx512_vecmat_block(K, x, B, rsb, N, j0, acc, nv, 4, 0);
    }
}

VK_T_AVX512 static void avx512_vecmat(size_t K, const float *x, const fp16_t *B, size_t rsb,
                                      size_t N, float *acc) {
    avx512_vecmat_passes(K, &x, B, rsb, N, &acc, 1);
}

VK_T_AVX512 static void avx512_vecmat_pair(size_t K, const float *x, const float *x2,
                                           const fp16_t *B, size_t rsb, size_t N, float *acc,
                                           float *acc2) {
    const float *xs[2] = {x, x2};
    float *accs[2] = {acc, acc2};
    avx512_vecmat_passes(K, xs, B, rsb, N, accs, 2);
}

static const vk_isa_ops avx512_ops = {"avx512", avx512_f16_to_f32, avx512_f32_to_f16,
                                      avx512_gemv_rows, avx512_gemv_pair_rows,
                                      &avx512_gemm, &avx512_gemm, avx512_vecmat,
                                      avx512_vecmat_pair, avx512_gemv_multi_rows,
                                      vk_avx512_ew_f16};

/* ==== AVX512-FP16: strict numerics with vmulph ========================== */
#if VK_HAVE_FP16

/* 32 fp16 products a * x, rounded by the multiply; denormal products (and
 * those of flushed inputs) dropped; added to two fp32 accumulators. */
VK_T_FP16 VK_INLINE void fp16_strict_acc(__m512i a, __m512i x, __m512 *s0, __m512 *s1) {
    const __m512i expm = _mm512_set1_epi16(0x7c00);
    a = _mm512_maskz_mov_epi16(_mm512_test_epi16_mask(a, expm), a);
    __m512i p = _mm512_castph_si512(_mm512_mul_ph(_mm512_castsi512_ph(a), _mm512_castsi512_ph(x)));
    __mmask32 kp = _mm512_test_epi16_mask(p, expm);
    *s0 = _mm512_add_ps(*s0, _mm512_maskz_cvtph_ps((__mmask16)kp, _mm512_castsi512_si256(p)));
    *s1 = _mm512_add_ps(*s1, _mm512_maskz_cvtph_ps((__mmask16)(kp >> 16),
                                                  _mm512_extracti64x4_epi64(p, 1)));
}

VK_T_FP16 VK_INLINE void fp16_gemv_block(const vk_gemv_job *j, size_t i, const int nrows) {
    const size_t K = j->K, lda = j->lda;
    const fp16_t *x = j->x16;
    const fp16_t *a[4];
    __m512 s0[4], s1[4];
    VK_UNROLL
    for (int r = 0; r < 4; r++) {
        a[r] = j->a + (i + (r < nrows ? r : nrows - 1)) * lda;  /* short blocks repeat a row */
        s0[r] = _mm512_setzero_ps();
        s1[r] = _mm512_setzero_ps();
    }
    for (size_t k = 0; k < K; k += 32) {
        __mmask32 m = K - k >= 32 ? 0xffffffffu : (__mmask32)((1u << (K - k)) - 1);
        __m512i xv = _mm512_maskz_loadu_epi16(m, x + k);
        VK_UNROLL
        for (int r = 0; r < 4; r++)
            _mm_prefetch((const char *)(a[r] + k + VK_GEMV_PF), VK_GEMV_HINT);
        VK_UNROLL
        for (int r = 0; r < 4; r++)
            fp16_strict_acc(_mm512_maskz_loadu_epi16(m, a[r] + k), xv, &s0[r], &s1[r]);
    }
    VK_UNROLL
    for (int r = 0; r < 4; r++) {
        if (r >= nrows)
            break;
        fp16_t h = x86_f32_to_f16(_mm512_reduce_add_ps(_mm512_add_ps(s0[r], s1[r])));
        if ((h & 0x7c00u) == 0)
            h &= 0x8000u;
        j->y[(i + r) * j->incy] = h;
    }
}

VK_T_FP16 static void fp16_gemv_rows(const vk_gemv_job *j, size_t r0, size_t r1) {
    if (!j->strict) {
        avx512_gemv_rows(j, r0, r1);
        return;
    }
    for (size_t i = r0; i < r1; i += 4)
        fp16_gemv_block(j, i, r1 - i < 4 ? (int)(r1 - i) : 4);
}

/* Strict GEMM on fp16 panels: 8 x 32, one vmulph per row and k. */
static void fp16_pack_a(const vk_mat *a, size_t i0, size_t rows, size_t K, void *dst_,
                        int strict) {
    fp16_t *dst = dst_;
    (void)strict;               /* only the strict kernel packs fp16: always flushed */
    for (size_t k = 0; k < K; k++)
        for (size_t r = 0; r < AVX512_MR; r++) {
            fp16_t h = r < rows ? a->p[(i0 + r) * a->rs + k * a->cs] : 0;
            dst[k * AVX512_MR + r] = (h & 0x7c00u) ? h : 0;
        }
}

static void fp16_pack_b(const vk_mat *b, size_t j0, size_t cols, size_t K, void *dst_,
                        int strict) {
    fp16_t *dst = dst_;
    (void)strict;
    for (size_t k = 0; k < K; k++)
        for (size_t c = 0; c < AVX512_NR; c++) {
            fp16_t h = c < cols ? b->p[k * b->rs + (j0 + c) * b->cs] : 0;
            dst[k * AVX512_NR + c] = (h & 0x7c00u) ? h : 0;
        }
}

VK_T_FP16 static void fp16_micro(size_t K, const void *ap_, const void *bp_, float *tile,
                                 int strict) {
    const fp16_t *ap = ap_, *bp = bp_;
    (void)strict;
    const __m512i expm = _mm512_set1_epi16(0x7c00);
    __m512 c[AVX512_MR][2];
    VK_UNROLL
    for (int r = 0; r < AVX512_MR; r++) {   /* continue the tile's sums */
        c[r][0] = _mm512_loadu_ps(tile + r * AVX512_NR);
        c[r][1] = _mm512_loadu_ps(tile + r * AVX512_NR + 16);
    }
    for (size_t k = 0; k < K; k++) {
        __m512h b = _mm512_castsi512_ph(_mm512_load_si512(bp + k * AVX512_NR));
        VK_UNROLL
        for (int r = 0; r < AVX512_MR; r++) {
            __m512i a = _mm512_set1_epi16((short)ap[k * AVX512_MR + r]);
            __m512i p = _mm512_castph_si512(_mm512_mul_ph(_mm512_castsi512_ph(a), b));
            __mmask32 kp = _mm512_test_epi16_mask(p, expm);
            c[r][0] = _mm512_add_ps(c[r][0], _mm512_maskz_cvtph_ps((__mmask16)kp,
                                                                   _mm512_castsi512_si256(p)));
            c[r][1] = _mm512_add_ps(c[r][1], _mm512_maskz_cvtph_ps((__mmask16)(kp >> 16),
                                                                   _mm512_extracti64x4_epi64(p, 1)));
        }
    }
    VK_UNROLL
    for (int r = 0; r < AVX512_MR; r++) {
        _mm512_storeu_ps(tile + r * AVX512_NR, c[r][0]);
        _mm512_storeu_ps(tile + r * AVX512_NR + 16, c[r][1]);
    }
}

static const vk_gemm_kernel fp16_gemm_strict = {AVX512_MR, AVX512_NR, 2, fp16_pack_a,
                                                fp16_pack_b, fp16_micro};

static const vk_isa_ops avx512fp16_ops;

VK_T_AVX512 static void fp16_gemv_multi_rows(const vk_gemv_job *j, size_t r0, size_t r1) {
    avx512_gemv_multi_rows_with(&avx512fp16_ops, j, r0, r1);
}

static const vk_isa_ops avx512fp16_ops = {"avx512", avx512_f16_to_f32, avx512_f32_to_f16,
                                          fp16_gemv_rows, avx512_gemv_pair_rows,
                                          &avx512_gemm, &fp16_gemm_strict, avx512_vecmat,
                                          avx512_vecmat_pair, fp16_gemv_multi_rows,
                                          vk_avx512_ew_f16};
#endif

const vk_isa_ops *vk_ops_avx512(int native_fp16) {
#if VK_HAVE_FP16
    if (native_fp16)
        return &avx512fp16_ops;
#endif
    (void)native_fp16;
    return &avx512_ops;
}

#endif /* __x86_64__ */
