/* kernels_x86.h -- what the x86-64 kernel files (kernels_x86.c, kernels_quant_x86.c)
 * share: the target attribute each function carries (the files are built for the
 * baseline ISA; the dispatcher picks a path at run time) and F16C's rounding mode.
 * Only those files include it, after immintrin.h. */
#ifndef ORION_VANE_KERNELS_X86_H
#define ORION_VANE_KERNELS_X86_H

/* AVX512-FP16 intrinsics: GCC 12, clang 16 */
#if (defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12) || \
    (defined(__clang_major__) && __clang_major__ >= 16)
#define VK_HAVE_FP16 1
#else
#define VK_HAVE_FP16 0
#endif

#define VK_T_AVX2 __attribute__((target("avx2,fma,f16c")))
#define VK_T_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define VK_T_FP16 \
    __attribute__((target("avx512fp16,avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define VK_INLINE static inline __attribute__((always_inline))
#define VK_RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

#endif
