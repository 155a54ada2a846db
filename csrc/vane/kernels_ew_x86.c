/* kernels_ew_x86.c -- elementwise ops over fp16 rows on AVX-512 and AVX2 (F16C), in one
 * pass: each value converted to fp32 as it is loaded, the op in fp32, the result rounded
 * to fp16 as it is stored. vane's generic path converts a chunk into a float buffer,
 * computes into another and converts that back (three passes and a fill for a broadcast
 * scalar); a GPT-2 8-row step's [3072, 8] product by a constant took 6.3 us that way.
 * Each op is the fp32 expression of vane_exec.c's ew_compute, NaN and signed zeros
 * included, so the bits are the same (tests/c/test_kernels.c checks every op on every
 * path against the scalar expressions). */
#include "kernels_impl.h"

#if defined(__x86_64__)

#include <immintrin.h>

#include "kernels_x86.h"

/* A loop per op, each with its op a constant folded in. */
#define VK_EW_BY_OP(loop, j)                                   \
    switch ((j)->op) {                                         \
    case VK_EW_ADD: loop(VK_EW_ADD, j); break;                 \
    case VK_EW_SUB: loop(VK_EW_SUB, j); break;                 \
    case VK_EW_MUL: loop(VK_EW_MUL, j); break;                 \
    case VK_EW_DIV: loop(VK_EW_DIV, j); break;                 \
    case VK_EW_MAX: loop(VK_EW_MAX, j); break;                 \
    case VK_EW_MIN: loop(VK_EW_MIN, j); break;                 \
    case VK_EW_RELU: loop(VK_EW_RELU, j); break;               \
    case VK_EW_NEG: loop(VK_EW_NEG, j); break;                 \
    case VK_EW_CLIP: loop(VK_EW_CLIP, j); break;               \
    }

/* ---- AVX-512 ------------------------------------------------------------ */

/* ew_compute's expressions, 16 lanes: a > b is false for NaN (ordered, quiet compares). */
VK_T_AVX512 VK_INLINE __m512 avx512_ew_apply(const vk_ew_op op, __m512 a, __m512 b, __m512 lo,
                                             __m512 hi) {
    switch (op) {
    case VK_EW_ADD: return _mm512_add_ps(a, b);
    case VK_EW_SUB: return _mm512_sub_ps(a, b);
    case VK_EW_MUL: return _mm512_mul_ps(a, b);
    case VK_EW_DIV: return _mm512_div_ps(a, b);
    case VK_EW_MAX:     /* (a > b || a != a) ? a : b */
        return _mm512_mask_mov_ps(b, _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ) |
                                         _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a);
    case VK_EW_MIN:     /* (a < b || a != a) ? a : b */
        return _mm512_mask_mov_ps(b, _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ) |
                                         _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a);
    case VK_EW_RELU:    /* a < 0 ? 0 : a (so -0 and NaN stay) */
        return _mm512_mask_mov_ps(a, _mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_LT_OQ),
                                  _mm512_setzero_ps());
    case VK_EW_NEG:
        return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a),
                                                    _mm512_set1_epi32((int)0x80000000u)));
    case VK_EW_CLIP: {  /* a < lo ? lo : (a > hi ? hi : a) */
        __m512 t = _mm512_mask_mov_ps(a, _mm512_cmp_ps_mask(a, hi, _CMP_GT_OQ), hi);
        return _mm512_mask_mov_ps(t, _mm512_cmp_ps_mask(a, lo, _CMP_LT_OQ), lo);
    }
    }
    return a;
}

/* The 8 values of two rows of 8 (p and q), or each row's one value 8 times (cs 0). */
VK_T_AVX512 VK_INLINE __m512 avx512_ew_pair8(const fp16_t *p, const fp16_t *q, size_t cs) {
    __m128i lo = cs ? _mm_loadu_si128((const __m128i *)p) : _mm_set1_epi16((short)p[0]);
    __m128i hi = cs ? _mm_loadu_si128((const __m128i *)q) : _mm_set1_epi16((short)q[0]);
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
}

/* One op over the job's rows, its op a constant: a and b each walk a row (column
 * stride 1) or stay on one value of it (0). Rows of 8 (a batched decode's [C, 8] with
 * a bias column) go two to a vector: a row a vector left half its lanes idle, and a
 * [3072, 8] sum took 4.8 us. */
VK_T_AVX512 VK_INLINE void avx512_ew_loop(const vk_ew_op op, const vk_ew_rows *j) {
    const __m512 lo = _mm512_set1_ps(j->p0), hi = _mm512_set1_ps(j->p1);
    const size_t n = j->n, acs = j->a_cs, bcs = j->b_cs;
    const __mmask16 tail = (__mmask16)((1u << (n % 16)) - 1);
    const fp16_t *bb = j->b ? j->b : j->a;       /* unary ops read a for b, unused */
    const size_t brs = j->b ? j->b_rs : j->a_rs;
    fp16_t *o = j->o;
    size_t r = 0;
    for (; n == 8 && r + 2 <= j->rows; r += 2, o += 16) {
        const fp16_t *a = j->a + r * j->a_rs, *b = bb + r * brs;
        __m512 x = avx512_ew_pair8(a, a + j->a_rs, acs), y = avx512_ew_pair8(b, b + brs, bcs);
        _mm256_storeu_si256((__m256i *)o,
                            _mm512_cvtps_ph(avx512_ew_apply(op, x, y, lo, hi), VK_RNE));
    }
    for (; r < j->rows; r++, o += n) {
        const fp16_t *a = j->a + r * j->a_rs, *b = j->b ? j->b + r * j->b_rs : a;
        const __m512 a1 = _mm512_cvtph_ps(_mm256_set1_epi16((short)a[0]));
        const __m512 b1 = _mm512_cvtph_ps(_mm256_set1_epi16((short)b[0]));
        size_t i = 0;
        for (; i + 16 <= n; i += 16) {
            __m512 x = acs ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(a + i))) : a1;
            __m512 y = bcs ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b + i))) : b1;
            _mm256_storeu_si256((__m256i *)(o + i),
                                _mm512_cvtps_ph(avx512_ew_apply(op, x, y, lo, hi), VK_RNE));
        }
        if (tail) {
            __m512 x = acs ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(tail, a + i)) : a1;
            __m512 y = bcs ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(tail, b + i)) : b1;
            _mm256_mask_storeu_epi16(o + i, tail,
                                     _mm512_cvtps_ph(avx512_ew_apply(op, x, y, lo, hi), VK_RNE));
        }
    }
}

VK_T_AVX512 void vk_avx512_ew_f16(const vk_ew_rows *j) {
    VK_EW_BY_OP(avx512_ew_loop, j);
}

/* ---- AVX2 + F16C ---------------------------------------------------------- */

VK_T_AVX2 VK_INLINE __m256 avx2_ew_apply(const vk_ew_op op, __m256 a, __m256 b, __m256 lo,
                                         __m256 hi) {
    switch (op) {
    case VK_EW_ADD: return _mm256_add_ps(a, b);
    case VK_EW_SUB: return _mm256_sub_ps(a, b);
    case VK_EW_MUL: return _mm256_mul_ps(a, b);
    case VK_EW_DIV: return _mm256_div_ps(a, b);
    case VK_EW_MAX:
        return _mm256_blendv_ps(b, a, _mm256_or_ps(_mm256_cmp_ps(a, b, _CMP_GT_OQ),
                                                   _mm256_cmp_ps(a, a, _CMP_UNORD_Q)));
    case VK_EW_MIN:
        return _mm256_blendv_ps(b, a, _mm256_or_ps(_mm256_cmp_ps(a, b, _CMP_LT_OQ),
                                                   _mm256_cmp_ps(a, a, _CMP_UNORD_Q)));
    case VK_EW_RELU:
        return _mm256_blendv_ps(a, _mm256_setzero_ps(),
                                _mm256_cmp_ps(a, _mm256_setzero_ps(), _CMP_LT_OQ));
    case VK_EW_NEG: return _mm256_xor_ps(a, _mm256_set1_ps(-0.0f));
    case VK_EW_CLIP: {
        __m256 t = _mm256_blendv_ps(a, hi, _mm256_cmp_ps(a, hi, _CMP_GT_OQ));
        return _mm256_blendv_ps(t, lo, _mm256_cmp_ps(a, lo, _CMP_LT_OQ));
    }
    }
    return a;
}

VK_T_AVX2 VK_INLINE __m256 avx2_ew_load(const fp16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

VK_T_AVX2 VK_INLINE __m256 avx2_ew_one(const fp16_t *p) {
    return _mm256_cvtph_ps(_mm_set1_epi16((short)p[0]));
}

VK_T_AVX2 VK_INLINE void avx2_ew_loop(const vk_ew_op op, const vk_ew_rows *j) {
    const __m256 lo = _mm256_set1_ps(j->p0), hi = _mm256_set1_ps(j->p1);
    const size_t n = j->n, acs = j->a_cs, bcs = j->b_cs;
    fp16_t *o = j->o;
    for (size_t r = 0; r < j->rows; r++, o += n) {
        const fp16_t *a = j->a + r * j->a_rs, *b = j->b ? j->b + r * j->b_rs : a;
        const __m256 a1 = avx2_ew_one(a), b1 = avx2_ew_one(b);
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
            __m256 x = acs ? avx2_ew_load(a + i) : a1, y = bcs ? avx2_ew_load(b + i) : b1;
            _mm_storeu_si128((__m128i *)(o + i),
                             _mm256_cvtps_ph(avx2_ew_apply(op, x, y, lo, hi), VK_RNE));
        }
        if (i < n) {    /* the tail through a stack copy: AVX2 has no masked 16-bit loads */
            fp16_t ta[8] = {0}, tb[8] = {0}, to[8];
            for (size_t k = i; k < n; k++) {
                ta[k - i] = a[acs ? k : 0];
                tb[k - i] = b[bcs ? k : 0];
            }
            __m256 x = acs ? avx2_ew_load(ta) : a1, y = bcs ? avx2_ew_load(tb) : b1;
            _mm_storeu_si128((__m128i *)to,
                             _mm256_cvtps_ph(avx2_ew_apply(op, x, y, lo, hi), VK_RNE));
            for (size_t k = i; k < n; k++) o[k] = to[k - i];
        }
    }
}

VK_T_AVX2 void vk_avx2_ew_f16(const vk_ew_rows *j) {
    VK_EW_BY_OP(avx2_ew_loop, j);
}

#endif /* __x86_64__ */
