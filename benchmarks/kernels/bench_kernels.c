/* bench_kernels.c -- measures vane's kernels themselves (no interpreter).
 *
 *   cc -O2 -std=gnu11 -pthread -Icsrc benchmarks/kernels/bench_kernels.c csrc/vane/kernels*.c -lm
 *   ./a.out gemv M K [threads [isa]]       GB/s of A's bytes, and memcpy of the same bytes
 *   ./a.out gemm M N K [threads [isa] [ta tb]]   GFLOP/s
 * Set VK_BENCH_STRICT=1 in the environment to time STRICT numerics.
 *
 * Prints one JSON object per line. Times are the fastest of repeated runs
 * after a warm-up (the machine may be shared); GEMV and memcpy alternate and
 * their per-pair ratios' median is printed too; for the GEMV, A is walked in full each call, so a shape
 * larger than the last-level cache measures memory bandwidth. */
#include "vane/kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Runs fn (and fn2, alternating with it, when given: both then see the same
 * machine noise) until ~0.5 s or 200 reps; stores the minimum seconds of each
 * (the least disturbed run) and the median of the paired ratios t2 / t1. */
static double g_pair_ratio;

static void time_median(void (*fn)(void *), void (*fn2)(void *), void *ctx, double *t1,
                        double *t2) {
    static double ratio[200];
    static double t[2][200];
    int n = 0;
    for (int w = 0; w < 2; w++) {   /* warm-up: pool started, pages touched */
        fn(ctx);
        if (fn2)
            fn2(ctx);
    }
    double start = now();
    while (n < 200 && (n < 9 || now() - start < 0.5)) {
        double t0 = now();
        fn(ctx);
        t[0][n] = now() - t0;
        if (fn2) {
            t0 = now();
            fn2(ctx);
            t[1][n] = now() - t0;
            ratio[n] = t[1][n] / t[0][n];
        }
        n++;
    }
    qsort(t[0], n, sizeof(double), cmp_double);
    *t1 = t[0][0];
    if (fn2) {
        qsort(t[1], n, sizeof(double), cmp_double);
        *t2 = t[1][0];
        qsort(ratio, n, sizeof(double), cmp_double);
        g_pair_ratio = ratio[n / 2];
    }
}

static fp16_t *random_f16(size_t n, unsigned seed) {
    fp16_t *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        p[i] = vk_f32_to_f16(((seed >> 8) & 0xffff) / 65536.0f - 0.5f);
    }
    return p;
}

typedef struct {
    size_t M, N, K;
    int ta, tb;
    fp16_t *A, *B, *C, *copy;
    vk_numerics numerics;
    size_t bytes, chunk;
} bench;

static void run_gemm(void *ctx) {
    bench *b = ctx;
    size_t lda = b->ta ? b->M : b->K, ldb = b->tb ? b->K : b->N;
    vk_gemm_f16(b->ta, b->tb, b->M, b->N, b->K, b->A, lda, b->B, ldb, b->C, b->N, b->numerics);
}

static void copy_item(void *ctx, size_t i) {
    bench *b = ctx;
    size_t off = i * b->chunk, n = b->bytes - off < b->chunk ? b->bytes - off : b->chunk;
    memcpy((char *)b->copy + off, (const char *)b->A + off, n);
}

/* memcpy of A's bytes, split over the pool like the GEMV. */
static void run_memcpy(void *ctx) {
    bench *b = ctx;
    unsigned t = vk_threads();
    b->chunk = (b->bytes / t + 4095) & ~(size_t)4095;
    vk_parallel_for((b->bytes + b->chunk - 1) / b->chunk, copy_item, b);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s gemv M K [threads [isa]] | gemm M N K [threads [isa] [ta tb]]\n",
                argv[0]);
        return 2;
    }
    int is_gemv = !strcmp(argv[1], "gemv");
    int a = 2;
    bench b = {0};
    b.M = strtoull(argv[a++], NULL, 10);
    b.N = is_gemv ? 1 : strtoull(argv[a++], NULL, 10);
    if (a >= argc) {
        fprintf(stderr, "missing K\n");
        return 2;
    }
    b.K = strtoull(argv[a++], NULL, 10);
    unsigned threads = a < argc ? (unsigned)atoi(argv[a++]) : 0;
    const char *isa = a < argc ? argv[a++] : NULL;
    if (!is_gemv && a + 1 < argc) {
        b.ta = atoi(argv[a]);
        b.tb = atoi(argv[a + 1]);
    }
    const char *strict = getenv("VK_BENCH_STRICT");
    b.numerics = strict && *strict == '1' ? VK_NUMERICS_STRICT : VK_NUMERICS_FP16;
    vk_set_threads(threads);
    if (isa && vk_force_isa(isa) != 0) {
        fprintf(stderr, "this CPU has no %s path\n", isa);
        return 2;
    }
    b.A = random_f16(b.M * b.K, 1);
    b.B = random_f16(b.K * b.N, 2);
    b.C = calloc(b.M * b.N, sizeof(fp16_t));
    double t = 0, tc = 0;
    if (is_gemv) {
        b.bytes = b.M * b.K * sizeof(fp16_t);
        b.copy = malloc(b.bytes);
        time_median(run_gemm, run_memcpy, &b, &t, &tc);
        printf("{\"kernel\": \"gemv\", \"numerics\": \"%s\", \"isa\": \"%s\", \"threads\": %u, \"M\": %zu, \"K\": %zu, "
               "\"seconds\": %.9f, \"gbps\": %.3f, \"memcpy_seconds\": %.9f, \"memcpy_gbps\": %.3f, "
               "\"ratio\": %.3f, \"ratio_paired_median\": %.3f}\n",
               b.numerics ? "strict" : "fp16", vk_isa(), vk_threads(), b.M, b.K, t, b.bytes / t * 1e-9, tc, b.bytes / tc * 1e-9,
               tc / t, g_pair_ratio);
        free(b.copy);
    } else {
        time_median(run_gemm, NULL, &b, &t, NULL);
        double flops = 2.0 * b.M * b.N * b.K;
        printf("{\"kernel\": \"gemm\", \"numerics\": \"%s\", \"isa\": \"%s\", \"threads\": %u, \"M\": %zu, \"N\": %zu, "
               "\"K\": %zu, \"ta\": %d, \"tb\": %d, \"seconds\": %.9f, \"gflops\": %.3f}\n",
               b.numerics ? "strict" : "fp16", vk_isa(), vk_threads(), b.M, b.N, b.K, b.ta, b.tb, t, flops / t * 1e-9);
    }
    free(b.A);
    free(b.B);
    free(b.C);
    return 0;
}
