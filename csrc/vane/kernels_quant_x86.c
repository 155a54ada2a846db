/* kernels_quant_x86.c -- fused decode-and-multiply rows of compressed weights
 * (kernels_impl.h, vk_qrows) for AVX2 and AVX-512; each function carries its
 * own target attribute, as in kernels_x86.c.
 *
 * 4-bit codes: per block, the 16 values a code can take are computed first
 * (fp16(scale * fp16(k - offset)), or read from the lut), exactly as the
 * portable decoder does (vcvtps2ph rounds to nearest even, as vk_f32_to_f16);
 * then each code is a table lookup (vpermps), its product with x an FMA. A
 * block of 64 weights costs one table; reading 32 codes costs one 16-byte
 * load. 8-bit codes are converted and rounded one vector at a time. Rows are
 * summed in several fp32 chains (the order differs from the portable path's
 * by fp32 additions only). */
#include "kernels_impl.h"

#if defined(__x86_64__)

#include <immintrin.h>

#define VK_T_AVX2 __attribute__((target("avx2,fma,f16c")))
#define VK_T_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define VK_INLINE static inline __attribute__((always_inline))
#define VK_RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define QPF 512   /* bytes of codes prefetched ahead */

/* ---- AVX-512 ------------------------------------------------------------------ */

VK_T_AVX512 VK_INLINE __m512 r16_512(__m512 v) {
    return _mm512_cvtph_ps(_mm512_cvtps_ph(v, VK_RNE));
}

/* The 16 values of block b: lane n is the value of the nibble n. */
VK_T_AVX512 VK_INLINE __m512 table16_512(const vk_qmat *m, size_t b) {
    if (m->lut)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(m->lut + (b << 4))));
    const __m512 k = m->is_signed
                         ? _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1)
                         : _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    float o = m->offset ? vk_f16_to_f32(m->offset[b]) : 0.0f;
    __m512 d = r16_512(_mm512_sub_ps(k, _mm512_set1_ps(o)));
    return r16_512(_mm512_mul_ps(d, _mm512_set1_ps(vk_f16_to_f32(m->scale[b]))));
}

/* 32 codes (16 bytes) as two vectors of nibble indices, in element order. */
VK_T_AVX512 VK_INLINE void nibbles_512(const uint8_t *p, __m512i *i0, __m512i *i1) {
    __m128i bytes = _mm_loadu_si128((const __m128i *)p);
    __m128i lo = _mm_and_si128(bytes, _mm_set1_epi8(0x0F));
    __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0F));
    *i0 = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi));
    *i1 = _mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi));
}

VK_T_AVX512 static void avx512_rows4(const vk_qmat *m, const float *x, float *acc, size_t r0,
                                     size_t r1) {
    const size_t cols = m->cols, bc = m->bcols, nb = cols / bc;
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *row = m->codes + r * cols / 2;
        const size_t b0 = (r / m->brows) * nb;
        __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
        for (size_t b = 0; b < nb; b++) {
            const __m512 t = table16_512(m, b0 + b);
            size_t c = b * bc;
            const size_t end = c + bc;
            for (; c + 32 <= end; c += 32) {
                _mm_prefetch((const char *)(row + c / 2 + QPF), _MM_HINT_T0);
                __m512i i0, i1;
                nibbles_512(row + c / 2, &i0, &i1);
                s0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(i0, t), _mm512_loadu_ps(x + c), s0);
                s1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(i1, t), _mm512_loadu_ps(x + c + 16),
                                     s1);
            }
            if (c < end) {           /* a block of 16 more: 8 bytes */
                __m128i bytes = _mm_loadl_epi64((const __m128i *)(row + c / 2));
                __m128i lo = _mm_and_si128(bytes, _mm_set1_epi8(0x0F));
                __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0F));
                __m512i i0 = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi));
                s0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(i0, t), _mm512_loadu_ps(x + c), s0);
            }
        }
        acc[r - r0] = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
    }
}

VK_T_AVX512 static void avx512_rows8(const vk_qmat *m, const float *x, float *acc, size_t r0,
                                     size_t r1) {
    const size_t cols = m->cols, bc = m->bcols, nb = cols / bc;
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *row = m->codes + r * cols;
        const size_t b0 = (r / m->brows) * nb;
        __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
        for (size_t b = 0; b < nb; b++) {
            const __m512 sc = _mm512_set1_ps(vk_f16_to_f32(m->scale[b0 + b]));
            const float of = m->offset ? vk_f16_to_f32(m->offset[b0 + b]) : 0.0f;
            const __m512 o = _mm512_set1_ps(of);
            for (size_t c = b * bc; c < (b + 1) * bc; c += 16) {
                _mm_prefetch((const char *)(row + c + QPF), _MM_HINT_T0);
                __m128i q = _mm_loadu_si128((const __m128i *)(row + c));
                __m512i k = m->is_signed ? _mm512_cvtepi8_epi32(q) : _mm512_cvtepu8_epi32(q);
                __m512 d = _mm512_sub_ps(_mm512_cvtepi32_ps(k), o);
                if (m->offset)
                    d = r16_512(d);
                __m512 w = r16_512(_mm512_mul_ps(d, sc));
                if ((c / 16) & 1)
                    s1 = _mm512_fmadd_ps(w, _mm512_loadu_ps(x + c), s1);
                else
                    s0 = _mm512_fmadd_ps(w, _mm512_loadu_ps(x + c), s0);
            }
        }
        acc[r - r0] = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
    }
}

/* ---- AVX2 ----------------------------------------------------------------------- */

VK_T_AVX2 VK_INLINE __m256 r16_256(__m256 v) {
    return _mm256_cvtph_ps(_mm256_cvtps_ph(v, VK_RNE));
}

VK_T_AVX2 VK_INLINE float hsum_256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* Block b's table as two halves: values of nibbles 0-7 and 8-15. */
VK_T_AVX2 VK_INLINE void table16_256(const vk_qmat *m, size_t b, __m256 *t0, __m256 *t1) {
    if (m->lut) {
        *t0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(m->lut + (b << 4))));
        *t1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(m->lut + (b << 4) + 8)));
        return;
    }
    const __m256 k0 = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 k1 = m->is_signed ? _mm256_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1)
                                   : _mm256_setr_ps(8, 9, 10, 11, 12, 13, 14, 15);
    const __m256 o = _mm256_set1_ps(m->offset ? vk_f16_to_f32(m->offset[b]) : 0.0f);
    const __m256 s = _mm256_set1_ps(vk_f16_to_f32(m->scale[b]));
    *t0 = r16_256(_mm256_mul_ps(r16_256(_mm256_sub_ps(k0, o)), s));
    *t1 = r16_256(_mm256_mul_ps(r16_256(_mm256_sub_ps(k1, o)), s));
}

/* 8 nibble indices -> their values: two permutes, picked by bit 3. */
VK_T_AVX2 VK_INLINE __m256 lookup_256(__m256i idx, __m256 t0, __m256 t1) {
    __m256 hi_bit = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28));
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(t0, idx), _mm256_permutevar8x32_ps(t1, idx),
                            hi_bit);
}

VK_T_AVX2 static void avx2_rows4(const vk_qmat *m, const float *x, float *acc, size_t r0,
                                 size_t r1) {
    const size_t cols = m->cols, bc = m->bcols, nb = cols / bc;
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *row = m->codes + r * cols / 2;
        const size_t b0 = (r / m->brows) * nb;
        __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
        for (size_t b = 0; b < nb; b++) {
            __m256 t0, t1;
            table16_256(m, b0 + b, &t0, &t1);
            for (size_t c = b * bc; c < (b + 1) * bc; c += 16) {
                _mm_prefetch((const char *)(row + c / 2 + QPF), _MM_HINT_T0);
                __m128i bytes = _mm_loadl_epi64((const __m128i *)(row + c / 2));
                __m128i lo = _mm_and_si128(bytes, _mm_set1_epi8(0x0F));
                __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0F));
                __m128i codes = _mm_unpacklo_epi8(lo, hi);        /* 16 codes in order */
                __m256i i0 = _mm256_cvtepu8_epi32(codes);
                __m256i i1 = _mm256_cvtepu8_epi32(_mm_srli_si128(codes, 8));
                s0 = _mm256_fmadd_ps(lookup_256(i0, t0, t1), _mm256_loadu_ps(x + c), s0);
                s1 = _mm256_fmadd_ps(lookup_256(i1, t0, t1), _mm256_loadu_ps(x + c + 8), s1);
            }
        }
        acc[r - r0] = hsum_256(_mm256_add_ps(s0, s1));
    }
}

VK_T_AVX2 static void avx2_rows8(const vk_qmat *m, const float *x, float *acc, size_t r0,
                                 size_t r1) {
    const size_t cols = m->cols, bc = m->bcols, nb = cols / bc;
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *row = m->codes + r * cols;
        const size_t b0 = (r / m->brows) * nb;
        __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
        for (size_t b = 0; b < nb; b++) {
            const __m256 sc = _mm256_set1_ps(vk_f16_to_f32(m->scale[b0 + b]));
            const __m256 o = _mm256_set1_ps(m->offset ? vk_f16_to_f32(m->offset[b0 + b]) : 0.0f);
            for (size_t c = b * bc; c < (b + 1) * bc; c += 16) {
                _mm_prefetch((const char *)(row + c + QPF), _MM_HINT_T0);
                __m128i q = _mm_loadu_si128((const __m128i *)(row + c));
                __m256i k0 = m->is_signed ? _mm256_cvtepi8_epi32(q) : _mm256_cvtepu8_epi32(q);
                __m128i q1 = _mm_srli_si128(q, 8);
                __m256i k1 = m->is_signed ? _mm256_cvtepi8_epi32(q1) : _mm256_cvtepu8_epi32(q1);
                __m256 d0 = _mm256_sub_ps(_mm256_cvtepi32_ps(k0), o);
                __m256 d1 = _mm256_sub_ps(_mm256_cvtepi32_ps(k1), o);
                if (m->offset) {
                    d0 = r16_256(d0);
                    d1 = r16_256(d1);
                }
                s0 = _mm256_fmadd_ps(r16_256(_mm256_mul_ps(d0, sc)), _mm256_loadu_ps(x + c), s0);
                s1 = _mm256_fmadd_ps(r16_256(_mm256_mul_ps(d1, sc)), _mm256_loadu_ps(x + c + 8),
                                     s1);
            }
        }
        acc[r - r0] = hsum_256(_mm256_add_ps(s0, s1));
    }
}

static const vk_qrows avx512_qrows = {avx512_rows4, avx512_rows8};
static const vk_qrows avx2_qrows = {avx2_rows4, avx2_rows8};

const vk_qrows *vk_qrows_avx512(void) { return &avx512_qrows; }
const vk_qrows *vk_qrows_avx2(void) { return &avx2_qrows; }

#else

const vk_qrows *vk_qrows_avx512(void) { return 0; }
const vk_qrows *vk_qrows_avx2(void) { return 0; }

#endif
