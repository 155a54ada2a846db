/* kernels_quant_neon.c -- fused products with compressed weights on aarch64 NEON
 * (kernels_quant.c picks them; vk_qrows in kernels_impl.h says the contract).
 *
 * Each code becomes its exact fp16 value as it is read: a 4-bit block's 16 values
 * are a table of fp16 (its lut, or fp16(s * fp16(k - o)) computed in four lanes at
 * a time, rounding through FCVTN as the portable decoder rounds), looked up by TBL
 * on byte pairs; an 8-bit code is widened and rounded the same way. The sums are
 * neon_gemv_block's for the decoded row: 16 columns a step into four 4-wide chains
 * (columns k + 4q .. k + 4q + 3 into chain q), reduced as it reduces them, so a
 * column has the same bits alone or among a few (vk_qmat_columns_alone). */
#include "kernels_impl.h"

#if defined(__aarch64__)

#include <arm_neon.h>

static inline float32x4_t round16(float32x4_t v) {
    return vcvt_f32_f16(vcvt_f16_f32(v));
}

/* Code k of lane n in 16 lanes: 0..15, or two's complement for signed codes. */
static inline void code_values(int is_signed, float32x4_t k[4]) {
    static const float u[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    static const float s[16] = {0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1};
    const float *src = is_signed ? s : u;
    for (int q = 0; q < 4; q++)
        k[q] = vld1q_f32(src + 4 * q);
}

/* fp16(s * fp16(k - o)) for four codes k (as floats). */
static inline float32x4_t shift_scale4(float32x4_t k, float32x4_t s, float32x4_t o) {
    return round16(vmulq_f32(s, round16(vsubq_f32(k, o))));
}

/* Block b's 16 values as fp16, the table TBL reads (byte pairs). */
static inline uint8x16x2_t table16(const vk_qmat *m, size_t b, const float32x4_t k[4]) {
    uint8x16x2_t t;
    if (m->lut) {
        t.val[0] = vld1q_u8((const uint8_t *)(m->lut + (b << 4)));
        t.val[1] = vld1q_u8((const uint8_t *)(m->lut + (b << 4) + 8));
        return t;
    }
    float32x4_t s = vdupq_n_f32(vk_f16_to_f32(m->scale[b]));
    float32x4_t o = vdupq_n_f32(m->offset ? vk_f16_to_f32(m->offset[b]) : 0.0f);
    float16x8_t lo = vcombine_f16(vcvt_f16_f32(shift_scale4(k[0], s, o)),
                                  vcvt_f16_f32(shift_scale4(k[1], s, o)));
    float16x8_t hi = vcombine_f16(vcvt_f16_f32(shift_scale4(k[2], s, o)),
                                  vcvt_f16_f32(shift_scale4(k[3], s, o)));
    t.val[0] = vreinterpretq_u8_f16(lo);
    t.val[1] = vreinterpretq_u8_f16(hi);
    return t;
}

/* The fp16 values of 16 4-bit codes (8 bytes, low nibble first) in column order. */
static inline void lookup16(const uint8x16x2_t t, const uint8_t *p, float16x8_t out[2]) {
    uint8x8_t c = vld1_u8(p);
    uint8x8_t lo = vand_u8(c, vdup_n_u8(0x0f)), hi = vshr_n_u8(c, 4);
    uint8x16_t codes = vcombine_u8(vzip1_u8(lo, hi), vzip2_u8(lo, hi));
    uint8x16_t b0 = vshlq_n_u8(codes, 1), b1 = vaddq_u8(b0, vdupq_n_u8(1));
    out[0] = vreinterpretq_f16_u8(vqtbl2q_u8(t, vzip1q_u8(b0, b1)));
    out[1] = vreinterpretq_f16_u8(vqtbl2q_u8(t, vzip2q_u8(b0, b1)));
}

/* 16 consecutive values in fp32, chain by chain, into s (neon_gemv_block's order). */
static inline void fma16(float32x4_t s[4], const float16x8_t h[2], const float *x) {
    s[0] = vfmaq_f32(s[0], vcvt_f32_f16(vget_low_f16(h[0])), vld1q_f32(x));
    s[1] = vfmaq_f32(s[1], vcvt_high_f32_f16(h[0]), vld1q_f32(x + 4));
    s[2] = vfmaq_f32(s[2], vcvt_f32_f16(vget_low_f16(h[1])), vld1q_f32(x + 8));
    s[3] = vfmaq_f32(s[3], vcvt_high_f32_f16(h[1]), vld1q_f32(x + 12));
}

static inline float reduce4(const float32x4_t s[4]) {
    return vaddvq_f32(vaddq_f32(vaddq_f32(s[0], s[1]), vaddq_f32(s[2], s[3])));
}

/* The 16 values of 8-bit codes p[0..15] of block b, as fp16 in column order. */
static inline void values8(const vk_qmat *m, size_t b, const uint8_t *p, float16x8_t out[2]) {
    float32x4_t s = vdupq_n_f32(vk_f16_to_f32(m->scale[b]));
    float32x4_t o = vdupq_n_f32(m->offset ? vk_f16_to_f32(m->offset[b]) : 0.0f);
    uint8x16_t c = vld1q_u8(p);
    int16x8_t w[2];
    if (m->is_signed) {
        int8x16_t sc = vreinterpretq_s8_u8(c);
        w[0] = vmovl_s8(vget_low_s8(sc));
        w[1] = vmovl_high_s8(sc);
    } else {
        w[0] = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(c)));
        w[1] = vreinterpretq_s16_u16(vmovl_high_u8(c));
    }
    for (int h = 0; h < 2; h++) {
        float32x4_t k0 = vcvtq_f32_s32(vmovl_s16(vget_low_s16(w[h])));
        float32x4_t k1 = vcvtq_f32_s32(vmovl_high_s16(w[h]));
        out[h] = vcombine_f16(vcvt_f16_f32(shift_scale4(k0, s, o)),
                              vcvt_f16_f32(shift_scale4(k1, s, o)));
    }
}

static void neon_rows4(const vk_qmat *m, const float *x, float *acc, size_t r0, size_t r1) {
    const size_t cols = m->cols, bc = m->bcols, nb = cols / bc;
    float32x4_t k[4];
    code_values(m->is_signed, k);
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *row = m->codes + r * cols / 2;
        const size_t b0 = (r / m->brows) * nb;
        float32x4_t s[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f),
                            vdupq_n_f32(0.0f)};
        for (size_t b = 0; b < nb; b++) {
            const uint8x16x2_t t = table16(m, b0 + b, k);
            for (size_t c = b * bc; c < (b + 1) * bc; c += 16) {
                float16x8_t h[2];
                __builtin_prefetch(row + c / 2 + 1024);
                lookup16(t, row + c / 2, h);
                fma16(s, h, x + c);
            }
        }
        acc[r - r0] = reduce4(s);
    }
}

static void neon_rows8(const vk_qmat *m, const float *x, float *acc, size_t r0, size_t r1) {
    const size_t cols = m->cols, bc = m->bcols, nb = cols / bc;
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *row = m->codes + r * cols;
        const size_t b0 = (r / m->brows) * nb;
        float32x4_t s[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f),
                            vdupq_n_f32(0.0f)};
        for (size_t b = 0; b < nb; b++)
            for (size_t c = b * bc; c < (b + 1) * bc; c += 16) {
                float16x8_t h[2];
                __builtin_prefetch(row + c + 2048);
                values8(m, b0 + b, row + c, h);
                fma16(s, h, x + c);
            }
        acc[r - r0] = reduce4(s);
    }
}

static void neon_dense4(const vk_qmat *m, fp16_t *dst, size_t r0, size_t r1) {
    const size_t cols = m->cols, bc = m->bcols, nb = cols / bc;
    float32x4_t k[4];
    code_values(m->is_signed, k);
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *row = m->codes + r * cols / 2;
        fp16_t *out = dst + (r - r0) * cols;
        const size_t b0 = (r / m->brows) * nb;
        for (size_t b = 0; b < nb; b++) {
            const uint8x16x2_t t = table16(m, b0 + b, k);
            for (size_t c = b * bc; c < (b + 1) * bc; c += 16) {
                float16x8_t h[2];
                lookup16(t, row + c / 2, h);
                vst1q_u16(out + c, vreinterpretq_u16_f16(h[0]));
                vst1q_u16(out + c + 8, vreinterpretq_u16_f16(h[1]));
            }
        }
    }
}

/* dense8 takes blocks of 8 columns (kernels_quant.c's decode_rows): 8 codes a step. */
static void neon_dense8(const vk_qmat *m, fp16_t *dst, size_t r0, size_t r1) {
    const size_t cols = m->cols, bc = m->bcols, nb = cols / bc;
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *row = m->codes + r * cols;
        fp16_t *out = dst + (r - r0) * cols;
        const size_t b0 = (r / m->brows) * nb;
        for (size_t b = 0; b < nb; b++) {
            const float32x4_t s = vdupq_n_f32(vk_f16_to_f32(m->scale[b0 + b]));
            const float32x4_t o =
                vdupq_n_f32(m->offset ? vk_f16_to_f32(m->offset[b0 + b]) : 0.0f);
            for (size_t c = b * bc; c < (b + 1) * bc; c += 8) {
                uint8x8_t raw = vld1_u8(row + c);
                int16x8_t w = m->is_signed ? vmovl_s8(vreinterpret_s8_u8(raw))
                                           : vreinterpretq_s16_u16(vmovl_u8(raw));
                float32x4_t k0 = vcvtq_f32_s32(vmovl_s16(vget_low_s16(w)));
                float32x4_t k1 = vcvtq_f32_s32(vmovl_high_s16(w));
                float16x8_t h = vcombine_f16(vcvt_f16_f32(shift_scale4(k0, s, o)),
                                             vcvt_f16_f32(shift_scale4(k1, s, o)));
                vst1q_u16(out + c, vreinterpretq_u16_f16(h));
            }
        }
    }
}

static const vk_qrows neon_qrows = {neon_rows4, neon_rows8, neon_dense4, neon_dense8, NULL};

const vk_qrows *vk_qrows_neon(void) { return &neon_qrows; }

#else

const vk_qrows *vk_qrows_neon(void) { return NULL; }

#endif
