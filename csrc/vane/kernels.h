/* kernels.h -- vane's CPU kernels, chosen at run time by CPU features.
 *
 * Every kernel has a portable scalar version that defines the expected
 * results; the SIMD versions (AVX-512, AVX2+F16C+FMA, NEON) agree with it to
 * fp32 summation-order tolerance. Work is split over the kernel thread pool. */
#ifndef ORION_VANE_KERNELS_H
#define ORION_VANE_KERNELS_H

#include <stddef.h>
#include <stdint.h>

typedef uint16_t fp16_t;   /* IEEE binary16 bits */

/* Hot loops built once per x86-64 level and picked at load time (an ifunc):
 * the library itself is built for baseline x86-64 (SSE2), where plain C loops
 * vectorize only 4 lanes wide. ELF/GCC-style toolchains only; elsewhere plain. */
#if defined(__x86_64__) && defined(__ELF__) && defined(__GNUC__) && \
    (!defined(__clang__) || __clang_major__ >= 14) && !defined(ORION_NO_CLONES)
#define VK_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define VK_CLONES
#endif

typedef enum vk_numerics {
    VK_NUMERICS_FP16 = 0,   /* fp32 accumulate, one fp16 rounding of each result */
    VK_NUMERICS_STRICT = 1  /* ANE-C42: each product rounded to fp16 first, denormals flushed */
} vk_numerics;

/* ---- conversion (round to nearest even; overflow -> inf, NaN kept) ---- */
float vk_f16_to_f32(fp16_t h);
fp16_t vk_f32_to_f16(float f);
void vk_f16_to_f32_array(const fp16_t *src, float *dst, size_t n);
void vk_f32_to_f16_array(const float *src, fp16_t *dst, size_t n);
/* Flushes fp16 denormals to signed zero, in place (strict numerics). */
void vk_f16_flush_denormals(fp16_t *x, size_t n);
/* dst[c][r] = src[r][c] for a row-major [rows, cols] src (dst [cols, rows]), over the
 * kernel threads; src and dst must not overlap. */
void vk_f16_transpose(const fp16_t *src, size_t rows, size_t cols, fp16_t *dst);

/* ---- elementwise over fp16 rows ------------------------------------------ */
typedef enum vk_ew_op {
    VK_EW_ADD, VK_EW_SUB, VK_EW_MUL, VK_EW_DIV, VK_EW_MAX, VK_EW_MIN,   /* a op b */
    VK_EW_RELU, VK_EW_NEG, VK_EW_CLIP                                    /* of a; clip to [p0, p1] */
} vk_ew_op;
/* o[r][i] = op(a[r * a_rs + i * a_cs], b[r * b_rs + i * b_cs]) over [rows, n], o
 * row-major: each operand's rows anywhere (a_rs, b_rs; 0 repeats one), its values
 * along a row at stride 1 or 0 (one value the row long). Computed in fp32 and
 * rounded to fp16 once; NaN-propagating max and min, relu and clip that keep NaN and
 * -0 (the expressions of vane's executor). */
typedef struct vk_ew_rows {
    vk_ew_op op;
    size_t rows, n;
    const fp16_t *a, *b;            /* b: NULL for relu, neg and clip */
    size_t a_rs, a_cs, b_rs, b_cs;
    fp16_t *o;
    float p0, p1;                   /* clip's bounds */
} vk_ew_rows;
/* Returns 0, or -1 where the path in use has no such kernel or a column stride is
 * neither 0 nor 1 (the caller computes the values itself). */
int vk_ew_f16(const vk_ew_rows *job);

/* ---- matrix products ---------------------------------------------------
 * C[M,N] = op(A)[M,K] * op(B)[K,N], all fp16, row-major with leading
 * dimensions lda/ldb/ldc in elements. op(A) = A or A^T (trans_a). Each C
 * element is accumulated in fp32 and rounded to fp16 once (FP16 numerics).
 * N == 1 (a GEMV, the decode case) and trans_a == 0 is the hot path: it must
 * run near memory bandwidth over A.
 * Paths differ only in the order of fp32 additions; for an element with K
 * terms p_k any two agree within ulp16(c) + K * 2^-23 * sum_k |p_k|
 * (kernels.c, tested by tests/c/test_kernels.c). */
void vk_gemm_f16(int trans_a, int trans_b, size_t M, size_t N, size_t K,
                 const fp16_t *A, size_t lda, const fp16_t *B, size_t ldb,
                 fp16_t *C, size_t ldc, vk_numerics numerics);
/* The same over any element strides: op(A)(i, k) = A[i * rsa + k * csa],
 * op(B)(k, j) = B[k * rsb + j * csb] (a transposed view read in place, with
 * no copy). Up to VK_FEW_ROWS rows with rows of op(B) contiguous (csb == 1)
 * sum each C element in k order, as the GEMM path does. A product of more than
 * VK_FEW_ROWS rows and more than one column takes the GEMM path, whose sums run
 * in k order whatever the strides, except up to VK_GEMV_MULTI_MAX columns with
 * rows of op(A) contiguous, which sum as the GEMV does (below); smaller ones pick
 * a vector kernel by the operands' strides, so their sums' order may depend on
 * them. */
#define VK_FEW_ROWS 8   /* rows a product may compute as vector products: the most
                           query heads per key head in grouped-query attention */
/* Up to VK_GEMV_MULTI_MAX columns with rows of op(A) contiguous (csa == 1), over more
 * than VK_FEW_ROWS rows: one GEMV per column over a single read of A, each column with
 * the bits of the same product of that column alone (N == 1): a 1x1 conv over a few
 * tokens gives each token the values it has when run alone (batch invariance). */
#define VK_GEMV_MULTI_MAX 32
void vk_gemm_f16_strided(size_t M, size_t N, size_t K,
                         const fp16_t *A, size_t rsa, size_t csa,
                         const fp16_t *B, size_t rsb, size_t csb,
                         fp16_t *C, size_t ldc, vk_numerics numerics);
/* vk_gemm_f16_strided where op(B) is known zero from column n_live on and from row
 * k_live on (n_live = N, k_live = K: nothing known): the products that meet only those
 * zeros are skipped where that provably keeps every bit of C (decode attention over
 * the live rows of a KV cache); anything else computes in full. */
void vk_gemm_f16_live(size_t M, size_t N, size_t K, const fp16_t *A, size_t rsa, size_t csa,
                      const fp16_t *B, size_t rsb, size_t csb, fp16_t *C, size_t ldc,
                      vk_numerics numerics, size_t n_live, size_t k_live);

/* ---- compressed weights (kernels_quant.c) -------------------------------
 * A weight W (rows x cols) held as codes of `bits` bits, packed least
 * significant bits first over the row-major matrix (coremltools' sub-byte
 * blob layout), with one scale (and offset), or one lookup table, per block of
 * brows x bcols elements. Element (r, c), block b = (r / brows, c / bcols):
 *   shift-scale  w = fp16(scale[b] * fp16(code - offset[b]))   (offset 0 if none)
 *   lut          w = lut[b][code]
 * as coremltools' decompress computes it, each operation rounded to fp16. */
typedef struct vk_qmat {
    size_t rows, cols;
    const uint8_t *codes;     /* rows * cols codes */
    unsigned bits;            /* 1, 2, 3, 4, 6 or 8 */
    int is_signed;            /* two's complement codes (int4, int8); lut: never */
    size_t brows, bcols;      /* each divides rows / cols */
    const fp16_t *scale;      /* shift-scale: [rows / brows][cols / bcols] */
    const fp16_t *offset;     /* shift-scale: the same grid, or NULL */
    const fp16_t *lut;        /* lut: [rows / brows][cols / bcols][1 << bits], else NULL */
} vk_qmat;

/* Elements (r, c0 .. c0 + n - 1) of W, each an exact fp16 value, as fp32. */
void vk_qmat_decode(const vk_qmat *m, size_t r, size_t c0, size_t n, float *dst);
/* All of W in fp16 (rows * cols elements). */
void vk_qmat_dense(const vk_qmat *m, fp16_t *dst);
/* C[rows, N] = W B for B [cols, N] (row stride ldb): vk_gemm_f16 with W as A, its
 * elements decoded from the codes as the product needs them (W is never held
 * whole), with vk_gemm_f16's bits on the decoded W, except that N == 1 with FP16
 * numerics (the decode hot path: each row's codes read once and multiplied as they
 * are decoded) is only within fp32 summation of it where vk_qmat_columns_alone(W)
 * is 0. */
void vk_qgemm_f16(const vk_qmat *A, size_t N, const fp16_t *B, size_t ldb, fp16_t *C,
                  size_t ldc, vk_numerics numerics);
/* 1 where vk_qgemm_f16's one-column FP16 product has vk_gemm_f16's bits on the
 * decoded W on the path in use, so that a column has the same bits alone or among
 * a few (batched decode): the scalar path, and 4-bit and 8-bit codes on every SIMD
 * path. 0 elsewhere (layouts left to the portable decoder under a SIMD path). */
int vk_qmat_columns_alone(const vk_qmat *m);
/* The bytes of W's codes, scales, offsets and tables. */
size_t vk_qmat_bytes(const vk_qmat *m);

/* ---- dispatch and threads ---------------------------------------------- */
/* "avx512", "avx2", "neon" or "scalar": the path in use. */
const char *vk_isa(void);
/* Forces a path no better than the CPU supports ("scalar" always works).
 * Returns 0 on success, -1 if the CPU lacks it. Also read once from the
 * ORION_VANE_ISA environment variable, which also takes "avx512-f16c": the
 * AVX-512 path without AVX512-FP16's arithmetic (vk_set_native_fp16(0)). */
int vk_force_isa(const char *name);
void vk_set_threads(unsigned n);
unsigned vk_threads(void);
/* Runs fn(ctx, i) for i in [0, n) over the pool; returns when all are done.
 * One item (or a call from inside a pool job) runs on the calling thread. */
void vk_parallel_for(size_t n, void (*fn)(void *ctx, size_t i), void *ctx);
/* The same, for items that wait on one another: runs them only if each can
 * have a thread of its own at once (0); otherwise runs nothing and returns -1
 * (inside a pool job, or n over the threads the pool has). */
int vk_parallel_for_concurrent(size_t n, void (*fn)(void *ctx, size_t i), void *ctx);

/* Warm-up: asks an idle pool worker to read up to VK_WARM_MAX byte ranges
 * that the caller's next jobs will read (the weights of the next GEMVs while
 * the caller runs small serial steps), so they come from cache rather than
 * memory. A hint: nothing is written, it stops when a job starts, and it is
 * skipped when the pool is busy or has no worker. The memory must stay mapped
 * until vk_warm_cancel returns, which stops any warm-up and waits for it. */
#define VK_WARM_MAX 4
void vk_warm_async(const void *const *base, const size_t *bytes, int n);
void vk_warm_cancel(void);
/* On by default; off makes vk_warm_async do nothing (to measure what it buys). */
void vk_set_warm(int enable);
int vk_warm(void);

/* ---- additions (kernels.c) --------------------------------------------- */
/* With 0, the AVX-512 path emulates strict numerics with F16C even on a CPU
 * with AVX512-FP16 (so tests can compare the two); 1 (the default) uses the
 * native fp16 multiply where present. Returns -1 if 1 is asked of a CPU
 * without AVX512-FP16. */
int vk_set_native_fp16(int enable);
/* 1 if the path in use rounds strict products with native fp16 arithmetic. */
int vk_native_fp16(void);

#endif
