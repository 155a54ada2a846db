/* kernels_neon.c -- the aarch64 NEON path of vane's kernels.
 *
 * Baseline ARMv8 Advanced SIMD only: fp16 <-> fp32 through FCVTL/FCVTN
 * (nearest even under the default FPCR, NaNs quieted as on x86), fp32 FMA.
 * Strict numerics round each product through FCVTN and back. Results match
 * the scalar path up to the order of fp32 additions (see kernels.c). */
#include "kernels_impl.h"

#if defined(__aarch64__)

#include <arm_neon.h>

#define VK_PRAGMA(x) _Pragma(#x)
#define VK_UNROLL VK_PRAGMA(GCC unroll 16)

int vk_cpu_has_neon(void) { return 1; }   /* Advanced SIMD is part of AArch64 */

static void neon_f16_to_f32(const fp16_t *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(src + i));
        vst1q_f32(dst + i, vcvt_f32_f16(vget_low_f16(h)));
        vst1q_f32(dst + i + 4, vcvt_high_f32_f16(h));
    }
    for (; i < n; i++)
        dst[i] = vk_f16_to_f32(src[i]);
}

static void neon_f32_to_f16(const float *src, fp16_t *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float16x4_t lo = vcvt_f16_f32(vld1q_f32(src + i));
        float16x8_t h = vcvt_high_f16_f32(lo, vld1q_f32(src + i + 4));
        vst1q_u16(dst + i, vreinterpretq_u16_f16(h));
    }
    for (; i < n; i++)
        dst[i] = vk_f32_to_f16(src[i]);
}

/* |v| < 2^-14 -> 0, NaN kept (the compare is false for NaN). */
static inline float32x4_t neon_flush(float32x4_t v) {
    uint32x4_t tiny = vcaltq_f32(v, vdupq_n_f32(0x1p-14f));
    return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(v), tiny));
}

/* A product already formed in fp32 (exact), rounded to fp16, flushed. */
static inline float32x4_t neon_strict_round(float32x4_t p) {
    return neon_flush(vcvt_f32_f16(vcvt_f16_f32(p)));
}

static inline float32x4_t neon_load_ph4(const fp16_t *p) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}

static inline __attribute__((always_inline)) void neon_gemv_block(const vk_gemv_job *j, size_t i,
                                                                  const int nrows, const int strict) {
    const size_t K = j->K, lda = j->lda;
    const float *x = j->x;
    const fp16_t *a[4];
    float32x4_t s[4][4];
    VK_UNROLL
    for (int r = 0; r < 4; r++) {
        a[r] = j->a + (i + (r < nrows ? r : nrows - 1)) * lda;  /* short blocks repeat a row */
        VK_UNROLL
        for (int q = 0; q < 4; q++)
            s[r][q] = vdupq_n_f32(0.0f);
    }
    size_t k = 0;
    for (; k + 16 <= K; k += 16) {
        float32x4_t xv[4];
        VK_UNROLL
        for (int q = 0; q < 4; q++)
            xv[q] = vld1q_f32(x + k + 4 * q);
        VK_UNROLL
        for (int r = 0; r < 4; r++) {
            __builtin_prefetch(a[r] + k + 2048);
            VK_UNROLL
            for (int q = 0; q < 4; q++) {
                float32x4_t av = neon_load_ph4(a[r] + k + 4 * q);
                if (strict)
                    s[r][q] = vaddq_f32(s[r][q], neon_strict_round(vmulq_f32(neon_flush(av), xv[q])));
                else
                    s[r][q] = vfmaq_f32(s[r][q], av, xv[q]);
            }
        }
    }
    VK_UNROLL
    for (int r = 0; r < 4; r++) {
        if (r >= nrows)
            break;
        float acc = vaddvq_f32(vaddq_f32(vaddq_f32(s[r][0], s[r][1]), vaddq_f32(s[r][2], s[r][3])));
        for (size_t t = k; t < K; t++) {
            float av = vk_f16_to_f32(a[r][t]);
            acc += strict ? vk_strict_mul(vk_flush_f32(av), x[t]) : av * x[t];
        }
        fp16_t h = vk_f32_to_f16(acc);
        if (strict && (h & 0x7c00u) == 0)
            h &= 0x8000u;
        j->y[(i + r) * j->incy] = h;
    }
}

static void neon_gemv_rows(const vk_gemv_job *j, size_t r0, size_t r1) {
    /* 4-row blocks with constant trip counts (so every compiler keeps the
     * accumulators in registers); the last block may be short */
    for (size_t i = r0; i < r1; i += 4) {
        int n = r1 - i < 4 ? (int)(r1 - i) : 4;
        if (j->strict)
            neon_gemv_block(j, i, n, 1);
        else
            neon_gemv_block(j, i, n, 0);
    }
}

/* GEMM microkernel 8 x 8: 16 accumulators, products by lane of A. */
#define NEON_MR 8
#define NEON_NR 8

static inline __attribute__((always_inline)) void neon_micro_body(size_t K, const float *ap,
                                                                  const float *bp, float *tile,
                                                                  const int strict) {
    float32x4_t c[NEON_MR][2];
    VK_UNROLL
    for (int r = 0; r < NEON_MR; r++) {     /* continue the tile's sums */
        c[r][0] = vld1q_f32(tile + r * NEON_NR);
        c[r][1] = vld1q_f32(tile + r * NEON_NR + 4);
    }
    for (size_t k = 0; k < K; k++) {
        float32x4_t b0 = vld1q_f32(bp + k * NEON_NR), b1 = vld1q_f32(bp + k * NEON_NR + 4);
        float32x4_t a0 = vld1q_f32(ap + k * NEON_MR), a1 = vld1q_f32(ap + k * NEON_MR + 4);
#define NEON_ROW(r, av, lane)                                                                  \
    do {                                                                                       \
        if (strict) {                                                                          \
            c[r][0] = vaddq_f32(c[r][0], neon_strict_round(vmulq_laneq_f32(b0, av, lane)));   \
            c[r][1] = vaddq_f32(c[r][1], neon_strict_round(vmulq_laneq_f32(b1, av, lane)));   \
        } else {                                                                               \
            c[r][0] = vfmaq_laneq_f32(c[r][0], b0, av, lane);                                  \
            c[r][1] = vfmaq_laneq_f32(c[r][1], b1, av, lane);                                  \
        }                                                                                      \
    } while (0)
        NEON_ROW(0, a0, 0);
        NEON_ROW(1, a0, 1);
        NEON_ROW(2, a0, 2);
        NEON_ROW(3, a0, 3);
        NEON_ROW(4, a1, 0);
        NEON_ROW(5, a1, 1);
        NEON_ROW(6, a1, 2);
        NEON_ROW(7, a1, 3);
#undef NEON_ROW
    }
    VK_UNROLL
    for (int r = 0; r < NEON_MR; r++) {
        vst1q_f32(tile + r * NEON_NR, c[r][0]);
        vst1q_f32(tile + r * NEON_NR + 4, c[r][1]);
    }
}

static void neon_micro(size_t K, const void *ap, const void *bp, float *tile, int strict) {
    if (strict)
        neon_micro_body(K, ap, bp, tile, 1);
    else
        neon_micro_body(K, ap, bp, tile, 0);
}

static void neon_pack_a(const vk_mat *a, size_t i0, size_t rows, size_t K, void *dst,
                        int strict) {
    vk_pack_a_f32(a, i0, rows, K, dst, NEON_MR, strict, neon_f16_to_f32);
}

static void neon_pack_b(const vk_mat *b, size_t j0, size_t cols, size_t K, void *dst,
                        int strict) {
    vk_pack_b_f32(b, j0, cols, K, dst, NEON_NR, strict, neon_f16_to_f32);
}

static const vk_gemm_kernel neon_gemm = {NEON_MR, NEON_NR, 4, neon_pack_a, neon_pack_b,
                                         neon_micro};

static const vk_isa_ops neon_ops = {"neon", neon_f16_to_f32, neon_f32_to_f16, neon_gemv_rows,
                                    NULL, &neon_gemm, &neon_gemm, NULL, NULL, NULL, NULL};

const vk_isa_ops *vk_ops_neon(void) { return &neon_ops; }

#endif /* __aarch64__ */
