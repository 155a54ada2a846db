/* kernels_impl.h -- private contract between the kernel dispatcher
 * (kernels.c) and the per-ISA kernel files (kernels_x86.c, kernels_neon.c).
 * Not part of the vane interface: only kernels*.c include it. */
#ifndef ORION_VANE_KERNELS_IMPL_H
#define ORION_VANE_KERNELS_IMPL_H

#include "kernels.h"

/* ---- shapes handed to the per-ISA kernels ------------------------------ */

/* A strided fp16 matrix view: element (i, j) is p[i * rs + j * cs]. */
typedef struct vk_mat {
    const fp16_t *p;
    size_t rs, cs;
} vk_mat;

/* y[i * incy] = sum_k A[i * lda + k] * x[k] for a range of rows. */
typedef struct vk_gemv_job {
    const fp16_t *a;      /* (M, K) rows contiguous along K, stride lda */
    size_t lda;
    size_t M, K;
    const float *x;       /* (K) the vector in fp32 (denormals flushed if strict) */
    const fp16_t *x16;    /* (K) the vector in fp16 (flushed if strict), unit stride */
    fp16_t *y;            /* (M) output, stride incy */
    size_t incy;
    int strict;           /* VK_NUMERICS_STRICT */
    const float *x2;      /* a second vector (K, fp32) and its output (stride incy), */
    fp16_t *y2;           /* for gemv_pair_rows only; FP16 numerics */
    /* gemv_multi_rows only (nx >= 2; x, x16, y unused): vector v in fp32 at xm + v * ldx
     * and in fp16 at xm16 + v * ldx (as x and x16 above), its output at ym + v * ldy */
    size_t nx, ldx, ldy;
    const float *xm;
    const fp16_t *xm16;
    fp16_t *ym;
} vk_gemv_job;

/* The GEMM microkernel family of one ISA. op(A) is packed into MR-row panels
 * laid out [k][MR], op(B) into NR-column panels laid out [k][NR], both fp32
 * (or fp16 for the native-fp16 strict kernel), zero padded to full panels. */
typedef struct vk_gemm_kernel {
    unsigned mr, nr;
    unsigned elem;        /* bytes per packed element: 4 (fp32) or 2 (fp16) */
    /* Packs rows [i0, i0 + rows) of op(A) (rows <= mr) over all K. */
    void (*pack_a)(const vk_mat *a, size_t i0, size_t rows, size_t K,
                   void *dst, int strict);
    /* Packs columns [j0, j0 + cols) of op(B) (cols <= nr) over all K. */
    void (*pack_b)(const vk_mat *b, size_t j0, size_t cols, size_t K,
                   void *dst, int strict);
    /* tile[r * nr + c] += sum_k ap[k][r] * bp[k][c], fp32, k in order,
     * the sums continuing from the tile's values (K blocks chain). */
    void (*micro)(size_t K, const void *ap, const void *bp, float *tile,
                  int strict);
} vk_gemm_kernel;

/* Everything one ISA provides. */
typedef struct vk_isa_ops {
    const char *name;
    void (*f16_to_f32)(const fp16_t *src, float *dst, size_t n);
    void (*f32_to_f16)(const float *src, fp16_t *dst, size_t n);
    void (*gemv_rows)(const vk_gemv_job *job, size_t r0, size_t r1);
    /* gemv_rows for x and x2 at once, each row of A read and converted once: the
     * same bits as gemv_rows for each (FP16 numerics only); NULL: two gemv_rows. */
    void (*gemv_pair_rows)(const vk_gemv_job *job, size_t r0, size_t r1);
    const vk_gemm_kernel *gemm;          /* FP16 numerics */
    const vk_gemm_kernel *gemm_strict;   /* STRICT numerics */
    /* acc[j] = sum_k x[k] * B[k * rsb + j] for j < N (N <= 256), fp32, each sum
     * from zero in k order (FP16 numerics only); NULL: the portable loop in
     * kernels.c, which gives the same bits. */
    void (*vecmat)(size_t K, const float *x, const fp16_t *B, size_t rsb, size_t N,
                   float *acc);
    /* vecmat for x and x2 at once (acc and acc2), each row of B converted once: the
     * same bits as vecmat for each; NULL: two vecmat calls. */
    void (*vecmat_pair)(size_t K, const float *x, const float *x2, const fp16_t *B,
                        size_t rsb, size_t N, float *acc, float *acc2);
    /* gemv_rows for the job's nx vectors (xm, ym), each row of A read from memory once
     * for all of them: for each vector the bits gemv_rows gives it alone, both
     * numerics; NULL: gemv_rows per vector over blocks of rows that stay in cache. */
    void (*gemv_multi_rows)(const vk_gemv_job *job, size_t r0, size_t r1);
    /* vk_ew_f16 in one pass (column strides 0 or 1); NULL: vk_ew_f16 returns -1 */
    void (*ew_f16)(const vk_ew_rows *job);
} vk_isa_ops;

#if defined(__x86_64__)
/* kernels_ew_x86.c */
void vk_avx512_ew_f16(const vk_ew_rows *job);
void vk_avx2_ew_f16(const vk_ew_rows *job);
#endif

/* gemv_multi_rows' fallback: o's gemv_rows for one vector after another over blocks of
 * rows small enough to stay in cache (A still comes from memory once). */
void vk_gemv_multi_each(const vk_isa_ops *o, const vk_gemv_job *job, size_t r0, size_t r1);

/* Fused kernels over compressed rows (kernels_quant.c picks them): acc[r - r0]
 * = sum_c W(r, c) x[c] in fp32 for rows [r0, r1), each code decoded to its exact
 * fp16 value as it is read. rows4: 4-bit codes, cols a multiple of 32, bcols of
 * 16; rows8: 8-bit codes without a lut, cols a multiple of 32, bcols of 16. NULL: the
 * portable decoder. */
#define VK_QMAXB 2048   /* blocks in a row the fused kernels take */
typedef struct vk_qrows {
    void (*rows4)(const vk_qmat *m, const float *x, float *acc, size_t r0, size_t r1);
    void (*rows8)(const vk_qmat *m, const float *x, float *acc, size_t r0, size_t r1);
    /* rows [r0, r1) decoded to fp16, row-major (cols each), under rows4's conditions */
    void (*dense4)(const vk_qmat *m, fp16_t *dst, size_t r0, size_t r1);
    /* the same under rows8's conditions */
    void (*dense8)(const vk_qmat *m, fp16_t *dst, size_t r0, size_t r1);
    /* x (cols floats) into xo in the order rows4 reads it for m, returning 1; 0 (or
     * NULL): rows4 reads x as given */
    int (*order4)(const vk_qmat *m, const float *x, float *xo);
} vk_qrows;
const vk_qrows *vk_qrows_avx2(void);      /* NULL unless x86-64 */
const vk_qrows *vk_qrows_avx512(void);
const vk_qrows *vk_qrows_avx512fp16(void);   /* NULL without AVX512-FP16 intrinsics */
const vk_qrows *vk_qrows_neon(void);      /* NULL unless aarch64 (kernels_quant_neon.c) */

/* C[M, N] = A B for B [K, N] (row stride ldb) where vk_gemm_f16 would run one GEMV per
 * column (VK_GEMV_MULTI_MAX columns at most, more than VK_FEW_ROWS rows) and A's rows
 * are made as needed: make(ctx, r0, n, dst) writes rows [r0, r0 + n) of A in fp16, K
 * each, row-major, into dst (any thread, any order). The bits of vk_gemm_f16 on all of
 * A. Returns -1, computing nothing, for any other shape (or K over 32768, or no
 * memory). */
int vk_gemv_multi_made(size_t M, size_t N, size_t K,
                       void (*make)(void *ctx, size_t r0, size_t n, fp16_t *dst), void *ctx,
                       const fp16_t *B, size_t ldb, fp16_t *C, size_t ldc,
                       vk_numerics numerics);

/* ---- the per-ISA tables (NULL when not compiled for this target) ------- */
extern const vk_isa_ops vk_ops_scalar;
const vk_isa_ops *vk_ops_avx2(void);     /* NULL unless x86-64 */
const vk_isa_ops *vk_ops_avx512(int native_fp16);
const vk_isa_ops *vk_ops_neon(void);     /* NULL unless aarch64 */
/* CPU support, checked at run time. */
int vk_cpu_has_avx2(void);
int vk_cpu_has_avx512(void);
int vk_cpu_has_avx512fp16(void);
int vk_cpu_has_neon(void);

/* ---- shared helpers --------------------------------------------------- */
/* The strict-mode product: a * b (both fp16 values, exact in fp32) rounded
 * to fp16, a denormal result flushed to zero, returned as fp32. */
static inline float vk_strict_mul(float a, float b) {
    fp16_t h = vk_f32_to_f16(a * b);
    if ((h & 0x7c00u) == 0)
        return 0.0f;
    return vk_f16_to_f32(h);
}

/* Flushes an fp16 value given as fp32: |v| < 2^-14 becomes zero. */
static inline float vk_flush_f32(float v) {
    return (v > -0x1p-14f && v < 0x1p-14f) ? 0.0f : v;
}

/* Scalar packers usable by every ISA (they call the ISA's converter). */
void vk_pack_a_f32(const vk_mat *a, size_t i0, size_t rows, size_t K,
                   float *dst, unsigned mr, int strict,
                   void (*cvt)(const fp16_t *, float *, size_t));
void vk_pack_b_f32(const vk_mat *b, size_t j0, size_t cols, size_t K,
                   float *dst, unsigned nr, int strict,
                   void (*cvt)(const fp16_t *, float *, size_t));

/* vk_parallel_for that also passes the worker index, in [0, vk_threads()). */
void vk_parallel_for_tid(size_t n, void (*fn)(void *ctx, size_t i, unsigned tid),
                         void *ctx);

#endif
