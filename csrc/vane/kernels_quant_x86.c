/* kernels_quant_x86.c -- fused decode-and-multiply rows of compressed weights
 * (kernels_impl.h, vk_qrows) for AVX2 and AVX-512; each function carries its
 * own target attribute (kernels_x86.h).
 *
 * 4-bit codes: per block, the 16 values a code can take are computed first
 * (fp16(scale * fp16(k - offset)), or read from the lut), exactly as the
 * portable decoder does (vcvtps2ph rounds to nearest even, as vk_f32_to_f16);
 * then each code is a table lookup (AVX-512: vpermps; AVX2: byte shuffles over the
 * values' low and high bytes), its product with x an FMA. A block costs one table
 * (with fp16 arithmetic, kept in fp16 and converted as it is read; a lut is read in
 * place); reading 32 codes costs one 16-byte load and, where blocks are 32 columns
 * or more, two shifts (rows4_wide) or one (avx2_wide4). 8-bit codes are converted
 * and rounded one vector at a time. Rows are summed in the dense one-column GEMV's
 * chains (the order differs from the portable path's by fp32 additions only). */
#include "kernels_impl.h"

#if defined(__x86_64__)

#include <immintrin.h>
#include <string.h>

#include "kernels_x86.h"

#define QPF 4096  /* bytes of codes prefetched ahead: 512 left 8-bit rows at 13 GB/s, 4096 reads 20 */

/* body(m, x, acc, r0, r1, signed, offset) with the kind of m's codes as constants, so
 * that an inlined row loop has no test left in it. */
#define ROWS_BY_KIND(body, m, x, acc, r0, r1)                  \
    do {                                                        \
        if ((m)->is_signed && (m)->offset)                      \
            body(m, x, acc, r0, r1, 1, 1);                      \
        else if ((m)->is_signed)                                \
            body(m, x, acc, r0, r1, 1, 0);                      \
        else if ((m)->offset)                                   \
            body(m, x, acc, r0, r1, 0, 1);                      \
        else                                                    \
            body(m, x, acc, r0, r1, 0, 0);                      \
    } while (0)

/* ---- AVX-512 ------------------------------------------------------------------ */

VK_T_AVX512 VK_INLINE __m512 r16_512(__m512 v) {
    return _mm512_cvtph_ps(_mm512_cvtps_ph(v, VK_RNE));
}

/* n fp16 values as fp32 (a row's scales or offsets, converted once a row). */
VK_T_AVX512 VK_INLINE void cvt_row_512(const fp16_t *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    if (i < n) {
        __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(dst + i, k, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, src + i)));
    }
}

/* s * fp16(k - o) for the 16 codes k of a shift-scale block (lane n: the nibble n's),
 * before its last rounding to fp16. */
VK_T_AVX512 VK_INLINE __m512 product16_512(const vk_qmat *m, float s, float o) {
    const __m512 k = m->is_signed
                         ? _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1)
                         : _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 d = m->offset ? r16_512(_mm512_sub_ps(k, _mm512_set1_ps(o))) : k;   /* exact */
    return _mm512_mul_ps(d, _mm512_set1_ps(s));
}

/* The 16 values of a block of scale s and offset o (lane n: the nibble n's value),
 * or of its lut. */
VK_T_AVX512 VK_INLINE __m512 table16_512(const vk_qmat *m, size_t b, float s, float o) {
    if (m->lut)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(m->lut + (b << 4))));
    return r16_512(product16_512(m, s, o));
}

/* A row's block scales and offsets in fp32 (at most VK_QMAXB blocks a row; the
 * portable decoder takes wider rows). */
#define QMAXB VK_QMAXB

/* 32 codes (16 bytes) as two vectors of table indices in column order, lane j of
 * the first the code of column j, of the second column 16 + j. The 16 bytes are
 * broadcast to every 128-bit lane (a load), a byte shuffle within each lane puts
 * byte j / 2 (8 + j / 2) at the bottom of 32-bit lane j, and a variable shift the
 * high nibble of odd lanes; vpermps reads only the low 4 bits. Two shuffles where
 * unpacking nibbles took four; column order, so each row sums as vk_gemm_f16's
 * one-column GEMV sums the decoded row (avx512_gemv_lanes_n: two chains, columns
 * c .. c + 15 and c + 16 .. c + 31). */
VK_T_AVX512 VK_INLINE void codes32_512(const uint8_t *p, __m512i *i0, __m512i *i1) {
    static const uint8_t pick[2][64] = {   /* pick[h]: lane j <- byte 8 h + j / 2 */
#define PICK4(a, b) a, 0x80, 0x80, 0x80, a, 0x80, 0x80, 0x80, b, 0x80, 0x80, 0x80, b, 0x80, 0x80, 0x80
        {PICK4(0, 1), PICK4(2, 3), PICK4(4, 5), PICK4(6, 7)},
        {PICK4(8, 9), PICK4(10, 11), PICK4(12, 13), PICK4(14, 15)},
#undef PICK4
    };
    const __m512i odd = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
    __m512i w = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)p));
    *i0 = _mm512_srlv_epi32(_mm512_shuffle_epi8(w, _mm512_loadu_si512(pick[0])), odd);
    *i1 = _mm512_srlv_epi32(_mm512_shuffle_epi8(w, _mm512_loadu_si512(pick[1])), odd);
}

/* A row's nb 4-bit tables with F16C roundings (sc, of: scratch for its scales and
 * offsets in fp32). */
VK_T_AVX512 VK_INLINE void tables_f16c(const vk_qmat *m, size_t b0, size_t nb, float *sc,
                                       float *of, __m512 *tables) {
    if (!m->lut) {
        cvt_row_512(m->scale + b0, sc, nb);
        if (m->offset) cvt_row_512(m->offset + b0, of, nb);
    }
    for (size_t b = 0; b < nb; b++)
        tables[b] = table16_512(m, b0 + b, m->lut ? 0.0f : sc[b], m->offset ? of[b] : 0.0f);
}

#if VK_HAVE_FP16
/* 4-bit tables (no lut) with fp16 arithmetic: vsubph and vmulph round once, as the
 * device does, so fp16(s * fp16(k - o)) takes two instructions where F16C needs a
 * round trip through fp32 for each rounding. */

/* Blocks b and b + 1's 16 values each in fp16, b's in the low half: lanes 2i and
 * 2i + 1 hold code i of each (their scales and offsets are one 32-bit broadcast),
 * then vpermw puts each block's values in one half. */
VK_T_FP16 VK_INLINE __m512i pair_values_fp16(const vk_qmat *m, size_t b) {
    const __m512h k2 = m->is_signed
        ? _mm512_setr_ph(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, -8, -8, -7, -7, -6, -6,
                         -5, -5, -4, -4, -3, -3, -2, -2, -1, -1)
        : _mm512_setr_ph(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11,
                         11, 12, 12, 13, 13, 14, 14, 15, 15);
    static const uint16_t apart_idx[32] = {0, 2,  4,  6,  8,  10, 12, 14, 16, 18, 20,
                                           22, 24, 26, 28, 30, 1,  3,  5,  7,  9,  11,
                                           13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
    uint32_t sp, op = 0;
    memcpy(&sp, m->scale + b, 4);
    if (m->offset) memcpy(&op, m->offset + b, 4);
    __m512h d = k2;   /* code - 0 is exact */
    if (m->offset) d = _mm512_sub_ph(k2, _mm512_castsi512_ph(_mm512_set1_epi32((int)op)));
    __m512i t = _mm512_castph_si512(_mm512_mul_ph(d, _mm512_castsi512_ph(_mm512_set1_epi32((int)sp))));
    return _mm512_permutexvar_epi16(_mm512_loadu_si512(apart_idx), t);
}

/* Block b's 16 values in fp16. */
VK_T_FP16 VK_INLINE __m256i values_fp16(const vk_qmat *m, size_t b) {
    const __m256h k = m->is_signed
        ? _mm256_setr_ph(0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1)
        : _mm256_setr_ph(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m256h d = k;
    if (m->offset)
        d = _mm256_sub_ph(k, _mm256_castsi256_ph(_mm256_set1_epi16((short)m->offset[b])));
    return _mm256_castph_si256(
        _mm256_mul_ph(d, _mm256_castsi256_ph(_mm256_set1_epi16((short)m->scale[b]))));
}

/* A row's nb tables in fp32. */
VK_T_FP16 static void tables_fp16(const vk_qmat *mat, size_t b0, size_t nb, __m512 *tables) {
    const vk_qmat local = *mat, *m = &local;   /* the stores cannot alias a local copy:
                                                * its fields stay in registers */
    size_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        const __m512i t = pair_values_fp16(m, b0 + b);
        tables[b] = _mm512_cvtph_ps(_mm512_castsi512_si256(t));
        tables[b + 1] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(t, 1));
    }
    if (b < nb) tables[b] = _mm512_cvtph_ps(values_fp16(m, b0 + b));
}

/* The same tables left in fp16, 16 values a block (rows4_wide converts each as it
 * reads it: the memory form of vcvtph2ps needs no shuffle port, where converting
 * here took three shuffles for two blocks). */
VK_T_FP16 static void tables_fp16_half(const vk_qmat *mat, size_t b0, size_t nb,
                                       fp16_t *out) {
    const vk_qmat local = *mat, *m = &local;   /* as tables_fp16 */
    size_t b = 0;
    for (; b + 2 <= nb; b += 2) _mm512_storeu_si512(out + 16 * b, pair_values_fp16(m, b0 + b));
    if (b < nb) _mm256_storeu_si256((__m256i *)(out + 16 * b), values_fp16(m, b0 + b));
}
#endif

/* A thread's scratch for rows4_512 (and avx2_rows4's tables): a row's tables (128
 * KiB, off the stack) and its scales and offsets in fp32. Reached through a call
 * that is never inlined: in a shared library each thread-local access is a call to
 * __tls_get_addr, which GCC repeated after every call in the row loop (8% of a 4-bit
 * decode); a returned pointer it keeps. */
typedef struct row_scratch {
    __m512 tables[QMAXB];
    float sc[QMAXB], of[QMAXB];
} row_scratch;

__attribute__((noinline)) static row_scratch *thread_scratch(void) {
    static _Thread_local row_scratch s;
    return &s;
}

/* A row's tables into t (by F16C, or by fp16 arithmetic where native). */
VK_T_AVX512 VK_INLINE void row_tables_512(const vk_qmat *m, size_t b0, size_t nb,
                                          row_scratch *scratch, __m512 *t, const int native) {
#if VK_HAVE_FP16
    if (native && !m->lut) {
        tables_fp16(m, b0, nb, t);
        return;
    }
#endif
    (void)native;
    tables_f16c(m, b0, nb, scratch->sc, scratch->of, t);
}

/* Wide blocks (bcols a multiple of 32: one table a step of 32 columns) without a
 * byte shuffle: the step's 16 bytes are broadcast to the four 128-bit lanes and two
 * variable shifts put a code at the bottom of every 32-bit lane, lane j of the first
 * vector holding column 8 (j % 4) + j / 4 of the step, of the second that + 4
 * (X_ORDER4). x is read in that order (order4_512 arranges it once a product), and
 * at the end of the row the two chains are put back in column order (UNDO0/1), so
 * each lane has summed the same products in the same order as the dense
 * one-column GEMV's chains (columns c .. c + 15 and c + 16 .. c + 31): the same bits,
 * with two shuffles a step fewer. Two rows at a time, so that four chains overlap. */
#define X_ORDER4 0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27, \
                 4, 12, 20, 28, 5, 13, 21, 29, 6, 14, 22, 30, 7, 15, 23, 31
static const uint32_t x_order4[32] = {X_ORDER4};
static const uint32_t undo4[32] = {0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29,
                                   2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31};
static const uint32_t shift4[32] = {0,  0,  0,  0,  4,  4,  4,  4,  8,  8,  8,  8,  12, 12, 12, 12,
                                    16, 16, 16, 16, 20, 20, 20, 20, 24, 24, 24, 24, 28, 28, 28, 28};

/* x in the order rows4_wide reads it, for m; 0 (x as given) where it is not used. */
VK_T_AVX512 static int order4_512(const vk_qmat *m, const float *x, float *xo) {
    if (m->bcols % 32)
        return 0;
    const __m512i lo = _mm512_loadu_si512(x_order4), hi = _mm512_loadu_si512(x_order4 + 16);
    for (size_t c = 0; c < m->cols; c += 32) {
        const __m512 a = _mm512_loadu_ps(x + c), b = _mm512_loadu_ps(x + c + 16);
        _mm512_storeu_ps(xo + c, _mm512_permutex2var_ps(a, lo, b));
        _mm512_storeu_ps(xo + c + 16, _mm512_permutex2var_ps(a, hi, b));
    }
    return 1;
}

/* The row's sum from its two chains in code order (the dense GEMV's reduction). */
VK_T_AVX512 VK_INLINE float undo4_sum(__m512 a, __m512 b, __m512i u0, __m512i u1) {
    return _mm512_reduce_add_ps(
        _mm512_add_ps(_mm512_permutex2var_ps(a, u0, b), _mm512_permutex2var_ps(a, u1, b)));
}

/* A row's 4-bit tables (no lut) in fp16 with F16C roundings, 16 values a block into
 * out, the last rounding by vcvtps2ph as the table is stored (sc, of: scratch for the
 * row's scales and offsets in fp32). */
VK_T_AVX512 VK_INLINE void tables_f16c_half(const vk_qmat *mat, size_t b0, size_t nb,
                                            float *sc, float *of, fp16_t *out) {
    const vk_qmat local = *mat, *m = &local;   /* as tables_fp16: the stores cannot alias
                                                * a local copy, whose tests leave the loop */
    cvt_row_512(m->scale + b0, sc, nb);
    if (m->offset) {   /* a loop each way, the test outside */
        cvt_row_512(m->offset + b0, of, nb);
        for (size_t b = 0; b < nb; b++)
            _mm256_storeu_si256((__m256i *)(out + 16 * b),
                                _mm512_cvtps_ph(product16_512(m, sc[b], of[b]), VK_RNE));
    } else {
        for (size_t b = 0; b < nb; b++)
            _mm256_storeu_si256((__m256i *)(out + 16 * b),
                                _mm512_cvtps_ph(product16_512(m, sc[b], 0.0f), VK_RNE));
    }
}

/* A row's tables for rows4_wide, in fp16 (the lut itself, or built by fp16 arithmetic
 * where native, else with F16C's roundings); the pointer to block b0's. fp16 tables
 * cost one conversion a block fewer than fp32 ones, and the step's conversion is the
 * memory form of vcvtph2ps, which takes no shuffle port (F16C, GPT-2's classifier as
 * Q4_0: 22.9 -> 33 billion weights a second). */
VK_T_AVX512 VK_INLINE const fp16_t *wide_tables(const vk_qmat *m, size_t b0, size_t nb,
                                                row_scratch *scratch, __m512 *t,
                                                const int native) {
    if (m->lut)
        return m->lut + (b0 << 4);
#if VK_HAVE_FP16
    if (native) {
        tables_fp16_half(m, b0, nb, (fp16_t *)t);
        return (const fp16_t *)t;
    }
#endif
    (void)native;
    tables_f16c_half(m, b0, nb, scratch->sc, scratch->of, (fp16_t *)t);
    return (const fp16_t *)t;
}

VK_T_AVX512 VK_INLINE __m512 wide_table(const fp16_t *t, size_t b) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(t + 16 * b)));
}

/* One step (32 columns) of R rows (1 or 2) into their chains, row i's codes at
 * row[i] + c / 2 and its table t[i]. */
VK_T_AVX512 VK_INLINE void wide_step(const uint8_t *const *row, const float *xo, size_t c,
                                     const __m512 *t, __m512i sha, __m512i shb, __m512 *s0,
                                     __m512 *s1, const int R) {
    const __m512 x0 = _mm512_loadu_ps(xo + c), x1 = _mm512_loadu_ps(xo + c + 16);
    for (int i = 0; i < R; i++) {
        const __m512i w = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(row[i] + c / 2)));
        s0[i] = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srlv_epi32(w, sha), t[i]), x0, s0[i]);
        s1[i] = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srlv_epi32(w, shb), t[i]), x1, s1[i]);
    }
}

/* R rows' sums over all columns, tables[i] row i's. Blocks of 32 or 64 columns, or a
 * multiple of 128 (per: steps a table serves within 128 columns: 1, 2 or 4), run 128
 * columns a pass (one prefetch a row, no per-step loop); other widths step by step. */
VK_T_AVX512 VK_INLINE void wide_rows(const vk_qmat *m, const uint8_t *const *row,
                                     const float *xo, const fp16_t *const *tables, float *out,
                                     const int per, const int R) {
    const size_t cols = m->cols, bc = m->bcols;
    const __m512i sha = _mm512_loadu_si512(shift4), shb = _mm512_loadu_si512(shift4 + 16);
    const __m512i u0 = _mm512_loadu_si512(undo4), u1 = _mm512_loadu_si512(undo4 + 16);
    __m512 s0[2], s1[2], t[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int i = 0; i < R; i++) s0[i] = s1[i] = _mm512_setzero_ps();
    size_t c = 0;
    if (per) {
        const size_t passes_a_table = per == 4 ? bc / 128 : 1;
        size_t b = 0, in = 0;
        for (; c + 128 <= cols; c += 128) {
            for (int i = 0; i < R; i++)
                _mm_prefetch((const char *)(row[i] + c / 2 + QPF), _MM_HINT_T0);
            for (int k = 0; k < 4; k++) {
                if (k % per == 0) {
                    for (int i = 0; i < R; i++) t[i] = wide_table(tables[i], b);
                    if (per < 4) b++;
                }
                wide_step(row, xo, c + 32 * (size_t)k, t, sha, shb, s0, s1, R);
            }
            if (per == 4 && ++in == passes_a_table) in = 0, b++;
        }
    }
    for (; c < cols; c += 32) {   /* the rest (or every step) one at a time */
        if (!(c & 127))
            for (int i = 0; i < R; i++)
                _mm_prefetch((const char *)(row[i] + c / 2 + QPF), _MM_HINT_T0);
        for (int i = 0; i < R; i++) t[i] = wide_table(tables[i], c / bc);
        wide_step(row, xo, c, t, sha, shb, s0, s1, R);
    }
    for (int i = 0; i < R; i++) out[i] = undo4_sum(s0[i], s1[i], u0, u1);
}

VK_T_AVX512 VK_INLINE void wide_rows_per(const vk_qmat *m, const uint8_t *const *row,
                                         const float *xo, const fp16_t *const *tables,
                                         float *out, const int R) {
    const size_t bc = m->bcols;
    if (bc == 32)
        wide_rows(m, row, xo, tables, out, 1, R);
    else if (bc == 64)
        wide_rows(m, row, xo, tables, out, 2, R);
    else if (bc % 128 == 0)
        wide_rows(m, row, xo, tables, out, 4, R);
    else
        wide_rows(m, row, xo, tables, out, 0, R);
}

VK_T_AVX512 VK_INLINE void rows4_wide(const vk_qmat *m, const float *xo, float *acc, size_t r0,
                                      size_t r1, const int native) {
    const size_t cols = m->cols, nb = cols / m->bcols;
    row_scratch *const scratch = thread_scratch();
    __m512 *const ta = scratch->tables, *const tb = scratch->tables + QMAXB / 2;
    size_t for_a = (size_t)-1, for_b = (size_t)-1;   /* the b0 each table set holds */
    const fp16_t *pa = NULL, *pb = NULL;
    size_t r = r0;
    for (; nb <= QMAXB / 2 && r + 2 <= r1; r += 2) {
        const uint8_t *rows[2] = {m->codes + r * cols / 2, m->codes + (r + 1) * cols / 2};
        const size_t ba = (r / m->brows) * nb, bb = ((r + 1) / m->brows) * nb;
        if (ba != for_a) pa = wide_tables(m, ba, nb, scratch, ta, native), for_a = ba;
        const fp16_t *tables[2] = {pa, pa};
        if (bb != ba) {
            if (bb != for_b) pb = wide_tables(m, bb, nb, scratch, tb, native), for_b = bb;
            tables[1] = pb;
        }
        wide_rows_per(m, rows, xo, tables, acc + (r - r0), 2);
    }
    for (; r < r1; r++) {
        const uint8_t *rows[1] = {m->codes + r * cols / 2};
        const size_t b0 = (r / m->brows) * nb;
        if (b0 != for_a) pa = wide_tables(m, b0, nb, scratch, ta, native), for_a = b0;
        const fp16_t *tables[1] = {pa};
        wide_rows_per(m, rows, xo, tables, acc + (r - r0), 1);
    }
}

/* Narrow blocks (bcols 16, 48, ...): codes looked up 32 at a time in column order,
 * each half in its block's table (blocks counted in 16-column units, not divided:
 * a division a step cost 2x). */
VK_T_AVX512 VK_INLINE void rows4_narrow(const vk_qmat *m, const float *x, float *acc,
                                        size_t r0, size_t r1, const int native) {
    const size_t cols = m->cols, nb = cols / m->bcols, per = m->bcols / 16;
    row_scratch *const scratch = thread_scratch();
    __m512 *const tables = scratch->tables;
    size_t scaled_for = (size_t)-1;
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *row = m->codes + r * cols / 2;
        const size_t b0 = (r / m->brows) * nb;
        if (b0 != scaled_for) row_tables_512(m, b0, nb, scratch, tables, native), scaled_for = b0;
        __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
        size_t b = 0, in = 0;
        for (size_t c = 0; c < cols; c += 32) {
            if (!(c & 127)) _mm_prefetch((const char *)(row + c / 2 + QPF), _MM_HINT_T0);
            const __m512 t0 = _mm512_load_ps((const float *)&tables[b]);
            if (++in == per) in = 0, b++;
            const __m512 t1 = _mm512_load_ps((const float *)&tables[b]);
            if (++in == per) in = 0, b++;
            __m512i i0, i1;
            codes32_512(row + c / 2, &i0, &i1);
            s0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(i0, t0), _mm512_loadu_ps(x + c), s0);
            s1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(i1, t1), _mm512_loadu_ps(x + c + 16), s1);
        }
        acc[r - r0] = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
    }
}

/* rows4's body; x is as order4_512 left it. */
VK_T_AVX512 VK_INLINE void rows4_512(const vk_qmat *m, const float *x, float *acc, size_t r0,
                                     size_t r1, const int native) {
    if (m->bcols % 32 == 0)
        rows4_wide(m, x, acc, r0, r1, native);
    else
        rows4_narrow(m, x, acc, r0, r1, native);
}

VK_T_AVX512 static void avx512_rows4(const vk_qmat *m, const float *x, float *acc, size_t r0,
                                     size_t r1) {
    rows4_512(m, x, acc, r0, r1, 0);
}

#if VK_HAVE_FP16
VK_T_FP16 static void fp16_rows4(const vk_qmat *m, const float *x, float *acc, size_t r0,
                                 size_t r1) {
    rows4_512(m, x, acc, r0, r1, 1);
}

/* 8-bit rows with fp16 arithmetic: 16 codes widen to 16-bit integers, convert to
 * fp16 exactly (|k| <= 255), and vsubph / vmulph give fp16(s * fp16(k - o)) with
 * the device's two roundings; only the product with x is in fp32. */
VK_T_FP16 VK_INLINE __m512 values16_fp16(const uint8_t *p, __m256h sc, __m256h o,
                                         const int is_signed, const int offset) {
    __m128i q = _mm_loadu_si128((const __m128i *)p);
    __m256h d = _mm256_cvtepi16_ph(is_signed ? _mm256_cvtepi8_epi16(q) : _mm256_cvtepu8_epi16(q));
    if (offset) d = _mm256_sub_ph(d, o);
    return _mm512_cvtph_ps(_mm256_castph_si256(_mm256_mul_ph(d, sc)));
}

/* *p in every lane: a broadcast the multiply reads from memory ({1to16}), where a
 * word broadcast to a register took a shuffle-port uop. */
VK_T_FP16 VK_INLINE __m256h splat_ph(const fp16_t *p) {
    _Float16 h;
    memcpy(&h, p, sizeof h);
    return _mm256_set1_ph(h);
}

/* The loops of fp16_rows8 for one kind of code (signed or not, offset or not), so
 * that no test is left inside them: 32 codes a step, into the two chains of the
 * dense one-column GEMV (columns c .. c + 15 and c + 16 .. c + 31); one block's
 * scale for both halves where blocks are 32 wide or more, each half its own (its
 * block counted, not divided) where they are 16. */
VK_T_FP16 VK_INLINE void rows8_fp16(const vk_qmat *m, const float *x, float *acc, size_t r0,
                                    size_t r1, const int is_signed, const int offset) {
    const size_t cols = m->cols, bc = m->bcols, nb = cols / bc;
    const __m256h zero = _mm256_setzero_ph();
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *row = m->codes + r * cols;
        const size_t b0 = (r / m->brows) * nb;
        const fp16_t *sc = m->scale + b0, *of = offset ? m->offset + b0 : NULL;
        __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
        if (bc % 32 == 0) {
            for (size_t b = 0; b < nb; b++) {
                const __m256h sb = splat_ph(sc + b), o = offset ? splat_ph(of + b) : zero;
                for (size_t c = b * bc; c < (b + 1) * bc; c += 32) {
                    if (!(c & 63)) _mm_prefetch((const char *)(row + c + QPF), _MM_HINT_T0);
                    s0 = _mm512_fmadd_ps(values16_fp16(row + c, sb, o, is_signed, offset),
                                         _mm512_loadu_ps(x + c), s0);
                    s1 = _mm512_fmadd_ps(values16_fp16(row + c + 16, sb, o, is_signed, offset),
                                         _mm512_loadu_ps(x + c + 16), s1);
                }
            }
        } else {
            const size_t per = bc / 16;
            size_t b = 0, in = 0;
            for (size_t c = 0; c < cols; c += 32) {   /* cols % 32 == 0 (qgemv checks) */
                const size_t h0 = b;
                if (++in == per) in = 0, b++;
                const size_t h1 = b;
                if (++in == per) in = 0, b++;
                if (!(c & 63)) _mm_prefetch((const char *)(row + c + QPF), _MM_HINT_T0);
                s0 = _mm512_fmadd_ps(values16_fp16(row + c, splat_ph(sc + h0),
                                                   offset ? splat_ph(of + h0) : zero, is_signed,
                                                   offset),
                                     _mm512_loadu_ps(x + c), s0);
                s1 = _mm512_fmadd_ps(values16_fp16(row + c + 16, splat_ph(sc + h1),
                                                   offset ? splat_ph(of + h1) : zero, is_signed,
                                                   offset),
                                     _mm512_loadu_ps(x + c + 16), s1);
            }
        }
        acc[r - r0] = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
    }
}

VK_T_FP16 static void fp16_rows8(const vk_qmat *m, const float *x, float *acc, size_t r0,
                                 size_t r1) {
    ROWS_BY_KIND(rows8_fp16, m, x, acc, r0, r1);
}
#endif

/* 16 weights of codes k (32-bit lanes) with F16C's roundings: fp16(s * fp16(k - o)), or
 * fp16(s * k) with no offset (k - 0 is exact: the same bits). (Rounding through memory,
 * as AVX2's rows do, was slower here: 19.6 -> 16.3 billion weights a second.) */
VK_T_AVX512 VK_INLINE __m512 weights16_512(__m512i k, __m512 s, __m512 o, const int off) {
    __m512 d = _mm512_cvtepi32_ps(k);
    if (off) d = r16_512(_mm512_sub_ps(d, o));
    return r16_512(_mm512_mul_ps(d, s));
}

/* 8-bit rows with F16C roundings for one kind of code (signed or not, offset or not),
 * so that no test is left in the loop: 16 codes a step into the dense GEMV's two chains
 * (columns c .. c + 15 and c + 16 .. c + 31). */
VK_T_AVX512 VK_INLINE void rows8_512(const vk_qmat *m, const float *x, float *acc, size_t r0,
                                     size_t r1, const int sgn, const int off) {
    const size_t cols = m->cols, bc = m->bcols, nb = cols / bc;
    float scs[QMAXB], ofs[QMAXB];
    size_t scaled_for = (size_t)-1;
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *row = m->codes + r * cols;
        const size_t b0 = (r / m->brows) * nb;
        if (b0 != scaled_for) {
            cvt_row_512(m->scale + b0, scs, nb);
            if (off) cvt_row_512(m->offset + b0, ofs, nb);
            scaled_for = b0;
        }
        __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
        for (size_t b = 0; b < nb; b++) {
            const __m512 sc = _mm512_set1_ps(scs[b]);
            const __m512 o = off ? _mm512_set1_ps(ofs[b]) : _mm512_setzero_ps();
            for (size_t c = b * bc; c < (b + 1) * bc; c += 16) {
                _mm_prefetch((const char *)(row + c + QPF), _MM_HINT_T0);
                const __m128i q = _mm_loadu_si128((const __m128i *)(row + c));
                const __m512i k = sgn ? _mm512_cvtepi8_epi32(q) : _mm512_cvtepu8_epi32(q);
                const __m512 w = weights16_512(k, sc, o, off);
                if ((c / 16) & 1)
                    s1 = _mm512_fmadd_ps(w, _mm512_loadu_ps(x + c), s1);
                else
                    s0 = _mm512_fmadd_ps(w, _mm512_loadu_ps(x + c), s0);
            }
        }
        acc[r - r0] = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
    }
}

VK_T_AVX512 static void avx512_rows8(const vk_qmat *m, const float *x, float *acc, size_t r0,
                                     size_t r1) {
    ROWS_BY_KIND(rows8_512, m, x, acc, r0, r1);
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

VK_T_AVX2 VK_INLINE void cvt_row_256(const fp16_t *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++)
        dst[i] = vk_f16_to_f32(src[i]);
}

/* A block's 16 values as fp16 in code order: *h0 codes 0-7, *h1 codes 8-15. */
VK_T_AVX2 VK_INLINE void values16_256(const vk_qmat *m, size_t b, float sf, float of,
                                      __m128i *h0_out, __m128i *h1_out) {
    __m128i h0, h1;
    if (m->lut) {
        h0 = _mm_loadu_si128((const __m128i *)(m->lut + (b << 4)));
        h1 = _mm_loadu_si128((const __m128i *)(m->lut + (b << 4) + 8));
    } else {
        const __m256 k0 = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
        const __m256 k1 = m->is_signed ? _mm256_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1)
                                       : _mm256_setr_ps(8, 9, 10, 11, 12, 13, 14, 15);
        const __m256 s = _mm256_set1_ps(sf);
        __m256 d0 = k0, d1 = k1;          /* code - 0 is exact */
        if (m->offset) {
            const __m256 o = _mm256_set1_ps(of);
            d0 = r16_256(_mm256_sub_ps(k0, o));
            d1 = r16_256(_mm256_sub_ps(k1, o));
        }
        h0 = _mm256_cvtps_ph(_mm256_mul_ps(d0, s), VK_RNE);   /* the last rounding */
        h1 = _mm256_cvtps_ph(_mm256_mul_ps(d1, s), VK_RNE);
    }
    *h0_out = h0;
    *h1_out = h1;
}

/* A block's 16 values as fp16, split into their low bytes (*lo, lane n: value n's)
 * and high bytes (*hi), in both 128-bit lanes: the lookups below are byte shuffles,
 * cheap everywhere (a float permute costs several cycles on some AMD cores). */
VK_T_AVX2 VK_INLINE void table16_256(const vk_qmat *m, size_t b, float sf, float of, __m256i *lo,
                                     __m256i *hi) {
    __m128i h0, h1;
    values16_256(m, b, sf, of, &h0, &h1);
    const __m128i split = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    h0 = _mm_shuffle_epi8(h0, split);   /* [low bytes of values 0-7 | high bytes] */
    h1 = _mm_shuffle_epi8(h1, split);
    *lo = _mm256_broadcastsi128_si256(_mm_unpacklo_epi64(h0, h1));
    *hi = _mm256_broadcastsi128_si256(_mm_unpackhi_epi64(h0, h1));
}

/* 16 codes (16 bytes, one a lane, the same in both halves of idx) -> their fp16 values,
 * interleaved per 128-bit lane by unpack: the caller converts what it needs. */
VK_T_AVX2 VK_INLINE void lookup_256(__m256i idx, __m256i lo, __m256i hi, __m256i *a, __m256i *b) {
    __m256i l = _mm256_shuffle_epi8(lo, idx), h = _mm256_shuffle_epi8(hi, idx);
    *a = _mm256_unpacklo_epi8(l, h);
    *b = _mm256_unpackhi_epi8(l, h);
}

/* Wide blocks (bcols a multiple of 32: one table a step of 32 columns). A block's
 * table is kept as two 16-byte planes, its values' low bytes then their high bytes
 * (32 bytes a block, packed from the fp16 values with no byte shuffle). A step
 * broadcasts its 16 bytes of codes to both 128-bit lanes, and one variable shift
 * leaves the low nibbles (the even columns) in the low lane and the high nibbles (the
 * odd columns) in the high one: two byte shuffles look the values up, two unpacks
 * interleave the planes into fp16, and the four vectors of 8 are converted by the
 * memory form of vcvtph2ps, which takes no shuffle port (the register form takes one
 * a vector, and two extracts). That leaves the columns in the order
 *   0 2 .. 14 | 1 3 .. 15 | 16 18 .. 30 | 17 19 .. 31
 * in which x is arranged once a product (avx2_order4). The even vectors add into one
 * chain, the odd into another, so lane i of the even chain sums columns 2i, 16 + 2i,
 * 32 + 2i, ... in that order, as lane 2i of the dense one-column GEMV's first chain
 * does (avx2_gemv_block: columns c .. c + 7 and c + 8 .. c + 15 a step); at the end
 * of a row two unpacks and two lane permutes put the chains back in that order, and
 * the row sums with the dense GEMV's bits. Two rows at a time, so that four chains
 * overlap. */
static const uint8_t x_order2[32] = {0,  2,  4,  6,  8,  10, 12, 14, 1,  3,  5,
                                     7,  9,  11, 13, 15, 16, 18, 20, 22, 24, 26,
                                     28, 30, 17, 19, 21, 23, 25, 27, 29, 31};

/* x in the order avx2_wide4 reads it, for m; 0 (x as given) where it is not used. */
static int avx2_order4(const vk_qmat *m, const float *x, float *xo) {
    if (m->bcols % 32)
        return 0;
    for (size_t c = 0; c < m->cols; c += 32)
        for (int i = 0; i < 32; i++) xo[c + i] = x[c + x_order2[i]];
    return 1;
}

/* The planes of a signed block with no offset or lut (GGUF's Q4_0) and a finite scale
 * s: fp16(s k) for k = 1 .. 8 is one conversion, and the other values follow, since
 * rounding to nearest even is symmetric: fp16(s (-k)) = -fp16(s k) (its low byte is
 * fp16(s k)'s, its high byte has the sign flipped), and fp16(s 0) is a zero with the
 * sign of s (that of fp16(s 1)). Half the conversions of values16_256, no unpacking. */
VK_T_AVX2 VK_INLINE void planes16_symmetric(float sf, uint8_t *out) {
    const __m128i v = _mm256_cvtps_ph(
        _mm256_mul_ps(_mm256_set1_ps(sf), _mm256_setr_ps(1, 2, 3, 4, 5, 6, 7, 8)), VK_RNE);
    /* code j: 0 .. 7 is k = j, 8 .. 15 is k = j - 16; value k's bytes are 2 (|k| - 1) and
     * the one after (0x80: a zero byte) */
    const __m128i pick_lo = _mm_setr_epi8((char)0x80, 0, 2, 4, 6, 8, 10, 12, 14, 12, 10, 8, 6,
                                          4, 2, 0);
    const __m128i pick_hi = _mm_setr_epi8(1, 1, 3, 5, 7, 9, 11, 13, 15, 13, 11, 9, 7, 5, 3, 1);
    const __m128i keep = _mm_setr_epi8((char)0x80, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                       -1, -1, -1, -1);   /* code 0: the sign alone */
    const __m128i flip = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, (char)0x80, (char)0x80,
                                       (char)0x80, (char)0x80, (char)0x80, (char)0x80,
                                       (char)0x80, (char)0x80);
    _mm_storeu_si128((__m128i *)out, _mm_shuffle_epi8(v, pick_lo));
    _mm_storeu_si128((__m128i *)(out + 16),
                     _mm_xor_si128(_mm_and_si128(_mm_shuffle_epi8(v, pick_hi), keep), flip));
}

/* Block b's two planes into out (32 bytes), from its values in fp16. */
VK_T_AVX2 VK_INLINE void planes16(const vk_qmat *m, size_t b, float sf, float of, uint8_t *out) {
    __m128i h0, h1;
    values16_256(m, b, sf, of, &h0, &h1);
    const __m128i low = _mm_set1_epi16(0xFF);
    _mm_storeu_si128((__m128i *)out,
                     _mm_packus_epi16(_mm_and_si128(h0, low), _mm_and_si128(h1, low)));
    _mm_storeu_si128((__m128i *)(out + 16),
                     _mm_packus_epi16(_mm_srli_epi16(h0, 8), _mm_srli_epi16(h1, 8)));
}

/* The planes of a row's nb blocks from b0 into out (sc, of: scratch for its scales
 * and offsets in fp32); built in a loop of their own, so they overlap each other. */
VK_T_AVX2 static void row_planes(const vk_qmat *mat, size_t b0, size_t nb, float *sc, float *of,
                                 uint8_t *out) {
    const vk_qmat local = *mat, *m = &local;   /* the stores cannot alias a local copy:
                                                * its fields stay in registers */
    if (m->lut) {
        for (size_t b = 0; b < nb; b++) planes16(m, b0 + b, 0.0f, 0.0f, out + 32 * b);
        return;
    }
    cvt_row_256(m->scale + b0, sc, nb);
    if (m->offset) {
        cvt_row_256(m->offset + b0, of, nb);
        for (size_t b = 0; b < nb; b++) planes16(m, b0 + b, sc[b], of[b], out + 32 * b);
    } else if (m->is_signed) {
        size_t b = 0;
        for (; b + 8 <= nb; b += 8) {   /* eight finite scales: no test a block */
            const __m256 s8 = _mm256_loadu_ps(sc + b);
            if (_mm256_movemask_ps(_mm256_cmp_ps(_mm256_sub_ps(s8, s8), _mm256_setzero_ps(),
                                                 _CMP_EQ_OQ)) != 0xFF)
                break;
            for (size_t i = b; i < b + 8; i++) planes16_symmetric(sc[i], out + 32 * i);
        }
        for (; b < nb; b++)
            if (sc[b] - sc[b] == 0.0f)   /* finite */
                planes16_symmetric(sc[b], out + 32 * b);
            else
                planes16(m, b0 + b, sc[b], 0.0f, out + 32 * b);
    } else {
        for (size_t b = 0; b < nb; b++) planes16(m, b0 + b, sc[b], 0.0f, out + 32 * b);
    }
}

/* 8 fp16 values at p (just stored) as fp32, by the memory form of vcvtph2ps: asm, as
 * a compiler would take the stored vector from its register (an extract and the
 * register form, two shuffle-port uops where this takes none). */
VK_T_AVX2 VK_INLINE __m256 cvt_stored_256(const __m128i *p) {
    __m256 r;
    __asm__("vcvtph2ps %1, %0" : "=x"(r) : "m"(*p));
    return r;
}

/* One step (32 columns) of a row into its chains t0 (even vectors) and t1 (odd). */
VK_T_AVX2 VK_INLINE void wide4_step(const uint8_t *codes, const float *xo, __m256i lo,
                                    __m256i hi, __m256 *t0, __m256 *t1) {
    const __m256i nib = _mm256_set1_epi8(0x0F), odd = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    const __m256i w = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)codes));
    const __m256i idx = _mm256_and_si256(_mm256_srlv_epi32(w, odd), nib);
    const __m256i l = _mm256_shuffle_epi8(lo, idx), h = _mm256_shuffle_epi8(hi, idx);
    __m256i v[2];
    _mm256_store_si256(&v[0], _mm256_unpacklo_epi8(l, h));   /* 0 2 .. 14 | 1 3 .. 15 */
    _mm256_store_si256(&v[1], _mm256_unpackhi_epi8(l, h));   /* 16 .. 30 | 17 .. 31 */
    const __m128i *p = (const __m128i *)v;
    *t0 = _mm256_fmadd_ps(cvt_stored_256(p), _mm256_loadu_ps(xo), *t0);
    *t1 = _mm256_fmadd_ps(cvt_stored_256(p + 1), _mm256_loadu_ps(xo + 8), *t1);
    *t0 = _mm256_fmadd_ps(cvt_stored_256(p + 2), _mm256_loadu_ps(xo + 16), *t0);
    *t1 = _mm256_fmadd_ps(cvt_stored_256(p + 3), _mm256_loadu_ps(xo + 24), *t1);
}

/* A row's sum from its chains: t0 holds lanes 0 2 4 6 of the dense GEMV's two
 * chains, t1 lanes 1 3 5 7; put back, they sum as avx2_gemv_block's do. */
VK_T_AVX2 VK_INLINE float wide4_sum(__m256 t0, __m256 t1) {
    const __m256 u = _mm256_unpacklo_ps(t0, t1), w = _mm256_unpackhi_ps(t0, t1);
    return hsum_256(_mm256_add_ps(_mm256_permute2f128_ps(u, w, 0x20),
                                  _mm256_permute2f128_ps(u, w, 0x31)));
}

/* R rows (1 or 2) over all columns, row i's codes at row[i] and planes at planes[i]. */
VK_T_AVX2 VK_INLINE void wide4_rows(const vk_qmat *m, const uint8_t *const *row,
                                    const float *xo, const uint8_t *const *planes, float *out,
                                    const int R) {
    const size_t cols = m->cols, bc = m->bcols;
    __m256 t0[2], t1[2];
    for (int i = 0; i < R; i++) t0[i] = t1[i] = _mm256_setzero_ps();
    for (size_t b = 0, c = 0; c < cols; b++) {
        __m256i lo[2], hi[2];
        for (int i = 0; i < R; i++) {
            lo[i] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(planes[i] + 32 * b)));
            hi[i] = _mm256_broadcastsi128_si256(
                _mm_loadu_si128((const __m128i *)(planes[i] + 32 * b + 16)));
        }
        for (const size_t end = c + bc; c < end; c += 32) {
            if (!(c & 127))
                for (int i = 0; i < R; i++)
                    _mm_prefetch((const char *)(row[i] + c / 2 + QPF), _MM_HINT_T0);
            for (int i = 0; i < R; i++) wide4_step(row[i] + c / 2, xo + c, lo[i], hi[i], &t0[i], &t1[i]);
        }
    }
    for (int i = 0; i < R; i++) out[i] = wide4_sum(t0[i], t1[i]);
}

VK_T_AVX2 static void avx2_wide4(const vk_qmat *m, const float *xo, float *acc, size_t r0,
                                 size_t r1) {
    const size_t cols = m->cols, nb = cols / m->bcols;
    row_scratch *const scratch = thread_scratch();
    uint8_t *const pa = (uint8_t *)scratch->tables, *const pb = pa + 32 * QMAXB;
    size_t for_a = (size_t)-1, for_b = (size_t)-1;   /* the b0 each plane set holds */
    for (size_t r = r0; r < r1; r += 2) {
        const int R = r + 2 <= r1 ? 2 : 1;
        const uint8_t *rows[2] = {m->codes + r * cols / 2, m->codes + (r + R - 1) * cols / 2};
        const size_t ba = (r / m->brows) * nb, bb = ((r + R - 1) / m->brows) * nb;
        if (ba != for_a) row_planes(m, ba, nb, scratch->sc, scratch->of, pa), for_a = ba;
        const uint8_t *planes[2] = {pa, pa};
        if (bb != ba) {
            if (bb != for_b) row_planes(m, bb, nb, scratch->sc, scratch->of, pb), for_b = bb;
            planes[1] = pb;
        }
        if (R == 2)
            wide4_rows(m, rows, xo, planes, acc + (r - r0), 2);
        else
            wide4_rows(m, rows, xo, planes, acc + (r - r0), 1);
    }
}

/* Blocks of 16 columns: codes unpacked and looked up 32 at a time (16 at a block's
 * end), x in column order, summed in the dense GEMV's two chains. */
VK_T_AVX2 static void avx2_narrow4(const vk_qmat *m, const float *x, float *acc, size_t r0,
                                   size_t r1) {
    const size_t cols = m->cols, bc = m->bcols, nb = cols / bc;
    const __m128i nib = _mm_set1_epi8(0x0F);
    float sc[QMAXB], of[QMAXB];
    __m256i *const tables = (__m256i *)thread_scratch()->tables;   /* 2 a block: the same bytes */
    size_t scaled_for = (size_t)-1;
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *row = m->codes + r * cols / 2;
        const size_t b0 = (r / m->brows) * nb;
        if (b0 != scaled_for) {   /* the row's tables, all before any is used */
            if (!m->lut) {
                cvt_row_256(m->scale + b0, sc, nb);
                if (m->offset) cvt_row_256(m->offset + b0, of, nb);
            }
            for (size_t b = 0; b < nb; b++)
                table16_256(m, b0 + b, m->lut ? 0.0f : sc[b], m->offset ? of[b] : 0.0f,
                            &tables[2 * b], &tables[2 * b + 1]);
            scaled_for = b0;
        }
        __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
        for (size_t b = 0; b < nb; b++) {
            const __m256i tlo = _mm256_load_si256(&tables[2 * b]);
            const __m256i thi = _mm256_load_si256(&tables[2 * b + 1]);
            size_t c = b * bc;
            const size_t end = c + bc;
            for (; c + 32 <= end; c += 32) {
                _mm_prefetch((const char *)(row + c / 2 + QPF), _MM_HINT_T0);
                __m128i bytes = _mm_loadu_si128((const __m128i *)(row + c / 2));
                __m128i lo = _mm_and_si128(bytes, nib);
                __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), nib);
                __m256i idx = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
                __m256i a, v;                 /* a: codes 0-7 | 16-23, v: 8-15 | 24-31 */
                lookup_256(idx, tlo, thi, &a, &v);
                s0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(a)),
                                     _mm256_loadu_ps(x + c), s0);
                s1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(v)),
                                     _mm256_loadu_ps(x + c + 8), s1);
                s0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(a, 1)),
                                     _mm256_loadu_ps(x + c + 16), s0);
                s1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(v, 1)),
                                     _mm256_loadu_ps(x + c + 24), s1);
            }
            if (c < end) {               /* 16 more codes: 8 bytes */
                __m128i bytes = _mm_loadl_epi64((const __m128i *)(row + c / 2));
                __m128i lo = _mm_and_si128(bytes, nib);
                __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), nib);
                __m256i idx = _mm256_castsi128_si256(_mm_unpacklo_epi8(lo, hi));
                __m256i a, v;
                lookup_256(idx, tlo, thi, &a, &v);
                s0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(a)),
                                     _mm256_loadu_ps(x + c), s0);
                s1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(v)),
                                     _mm256_loadu_ps(x + c + 8), s1);
            }
        }
        acc[r - r0] = hsum_256(_mm256_add_ps(s0, s1));
    }
}

/* x is in avx2_order4's order exactly where the blocks are wide. */
VK_T_AVX2 static void avx2_rows4(const vk_qmat *m, const float *x, float *acc, size_t r0,
                                 size_t r1) {
    if (m->bcols % 32)
        avx2_narrow4(m, x, acc, r0, r1);
    else
        avx2_wide4(m, x, acc, r0, r1);
}

/* 8 products of codes k (32-bit lanes) rounded as the device rounds a weight:
 * fp16(s * fp16(k - o)), or fp16(s * k) with no offset (k - 0 is exact, so skipping
 * the subtraction keeps the bits). Each rounding goes out by vcvtps2ph and back by the
 * memory form of vcvtph2ps (cvt_stored_256), which takes no shuffle port. */
VK_T_AVX2 VK_INLINE __m256 weights8_256(__m256i k, __m256 s, __m256 o, __m128i *scratch,
                                        const int off) {
    __m256 d = _mm256_cvtepi32_ps(k);
    if (off) {
        _mm_store_si128(scratch, _mm256_cvtps_ph(_mm256_sub_ps(d, o), VK_RNE));
        d = cvt_stored_256(scratch);
    }
    _mm_store_si128(scratch, _mm256_cvtps_ph(_mm256_mul_ps(d, s), VK_RNE));
    return cvt_stored_256(scratch);
}

VK_T_AVX2 VK_INLINE void rows8_256(const vk_qmat *m, const float *x, float *acc, size_t r0,
                                   size_t r1, const int sgn, const int off) {
    const size_t cols = m->cols, bc = m->bcols, nb = cols / bc;
    float scs[QMAXB], ofs[QMAXB];
    __m128i scratch[2];
    size_t scaled_for = (size_t)-1;
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *row = m->codes + r * cols;
        const size_t b0 = (r / m->brows) * nb;
        if (b0 != scaled_for) {
            cvt_row_256(m->scale + b0, scs, nb);
            if (off) cvt_row_256(m->offset + b0, ofs, nb);
            scaled_for = b0;
        }
        __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
        for (size_t b = 0; b < nb; b++) {
            const __m256 sc = _mm256_broadcast_ss(scs + b);
            const __m256 o = off ? _mm256_broadcast_ss(ofs + b) : _mm256_setzero_ps();
            for (size_t c = b * bc; c < (b + 1) * bc; c += 16) {
                _mm_prefetch((const char *)(row + c + QPF), _MM_HINT_T0);
                const __m128i q0 = _mm_loadl_epi64((const __m128i *)(row + c));
                const __m128i q1 = _mm_loadl_epi64((const __m128i *)(row + c + 8));
                const __m256i k0 = sgn ? _mm256_cvtepi8_epi32(q0) : _mm256_cvtepu8_epi32(q0);
                const __m256i k1 = sgn ? _mm256_cvtepi8_epi32(q1) : _mm256_cvtepu8_epi32(q1);
                s0 = _mm256_fmadd_ps(weights8_256(k0, sc, o, &scratch[0], off),
                                     _mm256_loadu_ps(x + c), s0);
                s1 = _mm256_fmadd_ps(weights8_256(k1, sc, o, &scratch[1], off),
                                     _mm256_loadu_ps(x + c + 8), s1);
            }
        }
        acc[r - r0] = hsum_256(_mm256_add_ps(s0, s1));
    }
}

VK_T_AVX2 static void avx2_rows8(const vk_qmat *m, const float *x, float *acc, size_t r0,
                                 size_t r1) {
    ROWS_BY_KIND(rows8_256, m, x, acc, r0, r1);
}

/* Rows decoded to fp16: the 4-bit lookup of avx2_rows4, its fp16 values stored as
 * they come (16 a shuffle; nothing is converted). AVX-512 uses it too. */
VK_T_AVX2 static void avx2_dense4(const vk_qmat *m, fp16_t *dst, size_t r0, size_t r1) {
    const size_t cols = m->cols, bc = m->bcols, nb = cols / bc;
    const __m128i nib = _mm_set1_epi8(0x0F);
    float sc[QMAXB], of[QMAXB];
    size_t scaled_for = (size_t)-1;
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *row = m->codes + r * cols / 2;
        fp16_t *out = dst + (r - r0) * cols;
        const size_t b0 = (r / m->brows) * nb;
        if (!m->lut && b0 != scaled_for) {
            cvt_row_256(m->scale + b0, sc, nb);
            if (m->offset) cvt_row_256(m->offset + b0, of, nb);
            scaled_for = b0;
        }
        for (size_t b = 0; b < nb; b++) {
            __m256i tlo, thi;
            table16_256(m, b0 + b, m->lut ? 0.0f : sc[b], m->offset ? of[b] : 0.0f, &tlo, &thi);
            for (size_t c = b * bc; c < (b + 1) * bc; c += 16) {
                __m128i bytes = _mm_loadl_epi64((const __m128i *)(row + c / 2));
                __m128i lo = _mm_and_si128(bytes, nib);
                __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), nib);
                __m256i a, v;
                lookup_256(_mm256_castsi128_si256(_mm_unpacklo_epi8(lo, hi)), tlo, thi, &a, &v);
                _mm_storeu_si128((__m128i *)(out + c), _mm256_castsi256_si128(a));
                _mm_storeu_si128((__m128i *)(out + c + 8), _mm256_castsi256_si128(v));
            }
        }
    }
}

/* 8-bit rows decoded to fp16, as avx2_rows8 computes each weight. */
VK_T_AVX2 static void avx2_dense8(const vk_qmat *m, fp16_t *dst, size_t r0, size_t r1) {
    const size_t cols = m->cols, bc = m->bcols, nb = cols / bc;
    float scs[QMAXB], ofs[QMAXB];
    size_t scaled_for = (size_t)-1;
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *row = m->codes + r * cols;
        fp16_t *out = dst + (r - r0) * cols;
        const size_t b0 = (r / m->brows) * nb;
        if (b0 != scaled_for) {
            cvt_row_256(m->scale + b0, scs, nb);
            if (m->offset) cvt_row_256(m->offset + b0, ofs, nb);
            scaled_for = b0;
        }
        for (size_t b = 0; b < nb; b++) {
            const __m256 sc = _mm256_set1_ps(scs[b]);
            const __m256 o = _mm256_set1_ps(m->offset ? ofs[b] : 0.0f);
            for (size_t c = b * bc; c < (b + 1) * bc; c += 8) {
                __m128i q = _mm_loadl_epi64((const __m128i *)(row + c));
                __m256i k = m->is_signed ? _mm256_cvtepi8_epi32(q) : _mm256_cvtepu8_epi32(q);
                __m256 d = _mm256_sub_ps(_mm256_cvtepi32_ps(k), o);
                if (m->offset) d = r16_256(d);
                _mm_storeu_si128((__m128i *)(out + c),
                                 _mm256_cvtps_ph(_mm256_mul_ps(d, sc), VK_RNE));
            }
        }
    }
}

static const vk_qrows avx512_qrows = {avx512_rows4, avx512_rows8, avx2_dense4, avx2_dense8,
                                       order4_512};
static const vk_qrows avx2_qrows = {avx2_rows4, avx2_rows8, avx2_dense4, avx2_dense8,
                                     avx2_order4};
#if VK_HAVE_FP16
static const vk_qrows fp16_qrows = {fp16_rows4, fp16_rows8, avx2_dense4, avx2_dense8,
                                     order4_512};
const vk_qrows *vk_qrows_avx512fp16(void) { return &fp16_qrows; }
#else
const vk_qrows *vk_qrows_avx512fp16(void) { return 0; }
#endif

const vk_qrows *vk_qrows_avx512(void) { return &avx512_qrows; }
const vk_qrows *vk_qrows_avx2(void) { return &avx2_qrows; }

#else

const vk_qrows *vk_qrows_avx512(void) { return 0; }
const vk_qrows *vk_qrows_avx512fp16(void) { return 0; }
const vk_qrows *vk_qrows_avx2(void) { return 0; }

#endif
