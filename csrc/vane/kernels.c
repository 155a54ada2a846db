/* kernels.c -- vane's CPU kernels: fp16 conversion, the scalar reference
 * kernels, the GEMM/GEMV drivers, run-time ISA dispatch and the thread pool.
 *
 * The scalar path defines the expected results. SIMD paths live in
 * kernels_x86.c (AVX2+F16C+FMA, AVX-512, AVX512-FP16) and kernels_neon.c and
 * plug into the drivers here through vk_isa_ops (kernels_impl.h).
 *
 * Numerics (both modes accumulate in fp32 and round each result to fp16 once):
 *   FP16    products are exact in fp32 (fp16 x fp16 fits in 22 bits), so a
 *           sum differs between paths only by the order of fp32 additions.
 *   STRICT  (ANE-C42) inputs' denormals are flushed, each product is rounded
 *           to fp16 (nearest even) and flushed if denormal, then added in
 *           fp32; a denormal result is flushed too.
 * Tolerance between any two paths, for an element with K terms p_k:
 *   |c1 - c2| <= ulp16(c) + K * 2^-23 * sum_k |p_k|
 * (one fp16 rounding that may fall either side, plus the fp32 reordering
 * bound). GEMM paths add in k order and usually agree bit for bit; GEMV
 * paths split each row into partial sums. */
#include "kernels_impl.h"


#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define VK_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define VK_PAUSE() __asm__ __volatile__("yield")
#else
#define VK_PAUSE() ((void)0)
#endif

/* ---- conversion --------------------------------------------------------- */

static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float vk_f16_to_f32(fp16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f)            /* inf, or NaN: payload kept, made quiet (as vcvtph2ps) */
        return bits_f32(sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0));
    if (exp != 0)
        return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
    /* zero or denormal: man * 2^-24, exact in fp32 */
    return bits_f32(sign | f32_bits((float)man * 0x1p-24f));
}

fp16_t vk_f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) {    /* inf, or NaN: top payload bits kept, made quiet */
        if (ax == 0x7f800000u)
            return sign | 0x7c00u;
        return (fp16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    }
    if (ax >= 0x477ff000u)      /* >= 65520 rounds (ties to even) to inf */
        return sign | 0x7c00u;
    if (ax >= 0x38800000u) {    /* normal fp16 range: >= 2^-14 */
        uint32_t r = ax - 0x38000000u;      /* rebias exponent 127 -> 15 */
        uint32_t h = r >> 13, rem = r & 0x1fffu;
        h += (rem > 0x1000u) || (rem == 0x1000u && (h & 1u));
        return (fp16_t)(sign | h);          /* a carry may step into the next binade */
    }
    uint32_t e = ax >> 23;
    if (e < 102)                /* < 2^-25: rounds to zero */
        return sign;
    /* denormal: value = m * 2^(e - 150), in units of 2^-24 that is m >> (126 - e) */
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    unsigned shift = 126 - e;   /* 14 .. 24 */
    uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    h += (rem > half) || (rem == half && (h & 1u));
    return (fp16_t)(sign | h);
}

static void scalar_f16_to_f32(const fp16_t *src, float *dst, size_t n) {
    for (size_t i = 0; i < n; i++)
        dst[i] = vk_f16_to_f32(src[i]);
}

static void scalar_f32_to_f16(const float *src, fp16_t *dst, size_t n) {
    for (size_t i = 0; i < n; i++)
        dst[i] = vk_f32_to_f16(src[i]);
}

void vk_f16_flush_denormals(fp16_t *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((x[i] & 0x7c00u) == 0)
            x[i] &= 0x8000u;
}

/* ---- scalar kernels (the reference path) -------------------------------- */

static void scalar_gemv_rows(const vk_gemv_job *j, size_t r0, size_t r1) {
    for (size_t i = r0; i < r1; i++) {
        const fp16_t *a = j->a + i * j->lda;
        float acc = 0.0f;
        if (j->strict) {
            for (size_t k = 0; k < j->K; k++)
                acc += vk_strict_mul(vk_flush_f32(vk_f16_to_f32(a[k])), j->x[k]);
        } else {
            for (size_t k = 0; k < j->K; k++)
                acc += vk_f16_to_f32(a[k]) * j->x[k];
        }
        fp16_t h = vk_f32_to_f16(acc);
        if (j->strict && (h & 0x7c00u) == 0)
            h &= 0x8000u;
        j->y[i * j->incy] = h;
    }
}

/* Packs op(A) rows [i0, i0+rows) into dst[k * mr + r], zero padded. */
void vk_pack_a_f32(const vk_mat *a, size_t i0, size_t rows, size_t K,
                   float *dst, unsigned mr, int strict,
                   void (*cvt)(const fp16_t *, float *, size_t)) {
    float tmp[256];
    if (rows < mr)
        memset(dst, 0, K * mr * sizeof(float));
    if (a->cs == 1) {           /* each row contiguous along k: convert, then scatter */
        for (size_t r = 0; r < rows; r++) {
            const fp16_t *src = a->p + (i0 + r) * a->rs;
            for (size_t k0 = 0; k0 < K; k0 += 256) {
                size_t kn = K - k0 < 256 ? K - k0 : 256;
                cvt(src + k0, tmp, kn);
                for (size_t k = 0; k < kn; k++)
                    dst[(k0 + k) * mr + r] = tmp[k];
            }
        }
    } else if (a->rs == 1 && rows == mr) {  /* each k contiguous across rows */
        for (size_t k = 0; k < K; k++)
            cvt(a->p + k * a->cs + i0, dst + k * mr, mr);
    } else {
        for (size_t r = 0; r < rows; r++)
            for (size_t k = 0; k < K; k++)
                dst[k * mr + r] = vk_f16_to_f32(a->p[(i0 + r) * a->rs + k * a->cs]);
    }
    if (strict)
        for (size_t i = 0; i < K * mr; i++)
            dst[i] = vk_flush_f32(dst[i]);
}

/* Packs op(B) columns [j0, j0+cols) into dst[k * nr + c], zero padded. */
void vk_pack_b_f32(const vk_mat *b, size_t j0, size_t cols, size_t K,
                   float *dst, unsigned nr, int strict,
                   void (*cvt)(const fp16_t *, float *, size_t)) {
    if (cols < nr)
        memset(dst, 0, K * nr * sizeof(float));
    if (b->cs == 1) {           /* each k row contiguous along j */
        for (size_t k = 0; k < K; k++)
            cvt(b->p + k * b->rs + j0, dst + k * nr, cols);
    } else {                    /* same layout problem as packing A */
        vk_mat bt = {b->p + j0 * b->cs, b->cs, b->rs};
        vk_pack_a_f32(&bt, 0, cols, K, dst, nr, 0, cvt);
    }
    if (strict)
        for (size_t i = 0; i < K * nr; i++)
            dst[i] = vk_flush_f32(dst[i]);
}

#define SCALAR_MR 4
#define SCALAR_NR 4

static void scalar_pack_a(const vk_mat *a, size_t i0, size_t rows, size_t K,
                          void *dst, int strict) {
    vk_pack_a_f32(a, i0, rows, K, dst, SCALAR_MR, strict, scalar_f16_to_f32);
}

static void scalar_pack_b(const vk_mat *b, size_t j0, size_t cols, size_t K,
                          void *dst, int strict) {
    vk_pack_b_f32(b, j0, cols, K, dst, SCALAR_NR, strict, scalar_f16_to_f32);
}

static void scalar_micro(size_t K, const void *ap_, const void *bp_, float *tile,
                         int strict) {
    const float *ap = ap_, *bp = bp_;
    float acc[SCALAR_MR * SCALAR_NR];
    memcpy(acc, tile, sizeof acc);
    for (size_t k = 0; k < K; k++)
        for (int r = 0; r < SCALAR_MR; r++)
            for (int c = 0; c < SCALAR_NR; c++) {
                float a = ap[k * SCALAR_MR + r], b = bp[k * SCALAR_NR + c];
                acc[r * SCALAR_NR + c] += strict ? vk_strict_mul(a, b) : a * b;
            }
    memcpy(tile, acc, sizeof acc);
}

static const vk_gemm_kernel scalar_gemm = {
    SCALAR_MR, SCALAR_NR, 4, scalar_pack_a, scalar_pack_b, scalar_micro};

const vk_isa_ops vk_ops_scalar = {
    "scalar", scalar_f16_to_f32, scalar_f32_to_f16, scalar_gemv_rows, NULL,
    &scalar_gemm, &scalar_gemm, NULL, NULL, NULL, NULL};

#if !defined(__x86_64__)   /* kernels_x86.c provides these on x86-64 */
const vk_isa_ops *vk_ops_avx2(void) { return NULL; }
const vk_isa_ops *vk_ops_avx512(int native_fp16) { (void)native_fp16; return NULL; }
int vk_cpu_has_avx2(void) { return 0; }
int vk_cpu_has_avx512(void) { return 0; }
int vk_cpu_has_avx512fp16(void) { return 0; }
#endif
#if !defined(__aarch64__)
const vk_isa_ops *vk_ops_neon(void) { return NULL; }
int vk_cpu_has_neon(void) { return 0; }
#endif

/* ---- dispatch ----------------------------------------------------------- */

static _Atomic(const vk_isa_ops *) g_ops;
static atomic_int g_native_fp16 = 1;    /* use AVX512-FP16 when the CPU has it */
static pthread_once_t g_ops_once = PTHREAD_ONCE_INIT;

static const vk_isa_ops *ops_by_name(const char *name) {
    if (!name || !strcmp(name, "") || !strcmp(name, "auto")) {
        const vk_isa_ops *o;
        if ((o = ops_by_name("avx512")) || (o = ops_by_name("avx2")) ||
            (o = ops_by_name("neon")))
            return o;
        return &vk_ops_scalar;
    }
    if (!strcmp(name, "scalar"))
        return &vk_ops_scalar;
    if (!strcmp(name, "avx512"))
        return vk_cpu_has_avx512()
                   ? vk_ops_avx512(atomic_load(&g_native_fp16) && vk_cpu_has_avx512fp16())
                   : NULL;
    if (!strcmp(name, "avx2"))
        return vk_cpu_has_avx2() ? vk_ops_avx2() : NULL;
    if (!strcmp(name, "neon"))
        return vk_cpu_has_neon() ? vk_ops_neon() : NULL;
    return NULL;
}

static void ops_init(void) {
    const vk_isa_ops *o = NULL;
    const char *env = getenv("ORION_VANE_ISA");
    if (env && !strcmp(env, "avx512-f16c")) {   /* AVX-512 without AVX512-FP16 (as Zen 4
                                                 * or Ice Lake runs it), on any AVX-512 CPU */
        atomic_store(&g_native_fp16, 0);
        env = "avx512";
    }
    if (env && *env)
        o = ops_by_name(env);       /* an unknown or unsupported name falls back */
    atomic_store(&g_ops, o ? o : ops_by_name(NULL));
}

static const vk_isa_ops *ops(void) {
    pthread_once(&g_ops_once, ops_init);
    return atomic_load_explicit(&g_ops, memory_order_acquire);
}

const char *vk_isa(void) { return ops()->name; }

int vk_force_isa(const char *name) {
    ops();
    const vk_isa_ops *o = ops_by_name(name);
    if (!o)
        return -1;
    atomic_store(&g_ops, o);
    return 0;
}

/* Extension: 0 makes the AVX-512 path emulate strict numerics with F16C even
 * on a CPU with AVX512-FP16 (to test one against the other). Returns -1 when
 * asked for native fp16 arithmetic the CPU lacks. Applies to the next
 * vk_force_isa("avx512") and to the path in use if it is AVX-512. */
int vk_set_native_fp16(int enable) {
    if (enable && !vk_cpu_has_avx512fp16())
        return -1;
    atomic_store(&g_native_fp16, enable ? 1 : 0);
    const vk_isa_ops *o = ops();
    if (!strcmp(o->name, "avx512"))
        atomic_store(&g_ops, vk_ops_avx512(enable));
    return 0;
}

/* Extension: whether the path in use rounds strict products with native
 * fp16 arithmetic (AVX512-FP16 vmulph, NEON fp16). */
int vk_native_fp16(void) {
    const vk_isa_ops *o = ops();
    return !strcmp(o->name, "avx512") && o == vk_ops_avx512(1) && vk_cpu_has_avx512fp16();
}

void vk_f16_to_f32_array(const fp16_t *src, float *dst, size_t n) {
    ops()->f16_to_f32(src, dst, n);
}

void vk_f32_to_f16_array(const float *src, fp16_t *dst, size_t n) {
    ops()->f32_to_f16(src, dst, n);
}

int vk_ew_f16(const vk_ew_rows *job) {
    const vk_isa_ops *o = ops();
    if (!o->ew_f16 || job->a_cs > 1 || (job->b && job->b_cs > 1))
        return -1;
    if (job->rows && job->n)
        o->ew_f16(job);
    return 0;
}
/* ---- thread pool -------------------------------------------------------- */
/* One pool for the process. The caller of vk_parallel_for runs items too, as
 * worker 0; workers 1..n-1 are created on first use. Idle workers spin
 * briefly (a decode step issues many small jobs back to back), then sleep.
 *
 * Items are claimed, not assigned: `word` holds the job's generation (high 32
 * bits) and the next unclaimed item (low 32), and a thread claims one by a
 * compare-and-swap of the whole word, so a worker still holding an old
 * generation can never claim. The caller waits for the items to be *done*,
 * not for the workers to check in: on a machine shared with other work a
 * worker may not be scheduled for a while, and then the caller runs every
 * item itself instead of waiting for it (2304 x 768 GEMV, 2 threads, with the
 * cores busy elsewhere: 173 us waiting on the worker, against 62 us alone).
 * At the end the caller closes the job (next = VK_CLOSED) before the next
 * job's fields are written, so a late claim fails. */

#define VK_MAX_THREADS 256
#define VK_SPIN 4000
#define VK_CLOSED 0xffffffffu     /* next item of a finished job: nothing to claim */

typedef struct vk_pool {
    pthread_mutex_t dispatch;   /* held for a whole vk_parallel_for */
    pthread_mutex_t lock;       /* guards the condition variables below */
    pthread_cond_t wake;        /* workers wait for a new generation */
    pthread_cond_t done;        /* the dispatcher waits for finished == n */
    pthread_t workers[VK_MAX_THREADS];
    unsigned nworkers;          /* started workers (excluding the caller) */
    atomic_uint threads;        /* configured total, 0 = not yet decided; read without
                                 * the lock (kernels ask from inside jobs) */
    /* the current job: fn and ctx are read only after a successful claim */
    void (*fn)(void *ctx, size_t i, unsigned tid);
    void *ctx;
    atomic_size_t n;            /* items of the job */
    atomic_uint_least64_t word; /* generation << 32 | next item to claim */
    atomic_size_t finished;     /* items finished */
    atomic_int stop;
    atomic_int sleepers;        /* workers waiting on `wake` */
    /* the warm-up request (vk_warm_async): a sequence count, odd while the
     * ranges are written (by one writer at a time: warm_lock); worker 1 reads
     * them while it has no job, and uses them only if the count is unchanged */
    pthread_mutex_t warm_lock;
    atomic_uint warm_seq;
    atomic_int warm_n;
    _Atomic(uintptr_t) warm_base[VK_WARM_MAX];
    atomic_size_t warm_bytes[VK_WARM_MAX];
    atomic_int warming;         /* worker 1 is reading ranges (vk_warm_cancel waits) */
} vk_pool;

static vk_pool g_pool = {
    .dispatch = PTHREAD_MUTEX_INITIALIZER,
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .wake = PTHREAD_COND_INITIALIZER,
    .done = PTHREAD_COND_INITIALIZER,
    .warm_lock = PTHREAD_MUTEX_INITIALIZER,
    .word = VK_CLOSED,
};
static _Thread_local int t_in_pool;     /* inside a job: nested calls run inline */

static unsigned default_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1)
        n = 1;
    return n > 8 ? 8 : (unsigned)n;
}

static unsigned word_generation(uint64_t w) { return (unsigned)(w >> 32); }

/* Reads the ranges of warm-up request `seq` a cache line at a time, until done,
 * a job is published (its generation leaves `gen`) or the request changes. The
 * lines end in this core's L2 and, pushed out of it, in the shared L3, where
 * the job that reads them next finds them. */
static void warm_ranges(vk_pool *p, unsigned seq, unsigned gen) {
    uintptr_t base[VK_WARM_MAX];
    size_t bytes[VK_WARM_MAX];
    int n = atomic_load(&p->warm_n);
    for (int r = 0; r < n; r++) {
        base[r] = atomic_load_explicit(&p->warm_base[r], memory_order_relaxed);
        bytes[r] = atomic_load_explicit(&p->warm_bytes[r], memory_order_relaxed);
    }
    /* announce before checking: vk_warm_cancel changes the sequence, then waits
     * while `warming`, so either this check sees the change or it waits */
    atomic_store(&p->warming, 1);
    if (atomic_load(&p->warm_seq) == seq) {
        unsigned sink = 0;
        for (int r = 0; r < n; r++) {
            const volatile unsigned char *b = (const volatile unsigned char *)base[r];
            for (size_t off = 0; off < bytes[r]; off += 4096) {
                size_t end = off + 4096 < bytes[r] ? off + 4096 : bytes[r];
                for (size_t l = off; l < end; l += 64)
                    sink += b[l];
                if (atomic_load(&p->warm_seq) != seq ||
                    word_generation(atomic_load(&p->word)) != gen)
                    goto out;
            }
        }
out:
        (void)sink;
    }
    atomic_store(&p->warming, 0);
}

/* Claims and runs items until none is left, in this job or (for a worker that
 * loops on) in one published since. */
static void run_items(vk_pool *p, unsigned tid) {
    for (;;) {
        uint64_t w = atomic_load(&p->word);
        uint32_t i = (uint32_t)w;
        size_t n = atomic_load(&p->n);      /* may be a newer job's: then the swap fails */
        if (i == VK_CLOSED || i >= n)
            return;
        if (!atomic_compare_exchange_weak(&p->word, &w, w + 1))
            continue;
        p->fn(p->ctx, i, tid);              /* the job cannot end before this item */
        if (atomic_fetch_add(&p->finished, 1) + 1 == n && tid != 0) {
            pthread_mutex_lock(&p->lock);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->lock);
        }
    }
}

typedef struct { vk_pool *p; unsigned tid, generation; } worker_arg;
static worker_arg g_worker_args[VK_MAX_THREADS];

static void *worker_main(void *arg_) {
    worker_arg *arg = arg_;
    vk_pool *p = arg->p;
    unsigned seen = arg->generation;    /* the generation before its first job */
    unsigned warm_seen = atomic_load(&p->warm_seq);
    int warmer = arg->tid == 1;
    t_in_pool = 1;
    for (;;) {
        unsigned g = seen;
        for (int s = 0; s < VK_SPIN; s++) {
            g = word_generation(atomic_load(&p->word));
            if (g != seen || atomic_load(&p->stop))
                break;
            unsigned ws = warmer ? atomic_load(&p->warm_seq) : warm_seen;
            if (ws != warm_seen && !(ws & 1u)) {
                warm_seen = ws;
                warm_ranges(p, ws, seen);
                s = 0;
                continue;
            }
            VK_PAUSE();
        }
        if (g == seen) {
            pthread_mutex_lock(&p->lock);
            atomic_fetch_add(&p->sleepers, 1);
            while ((g = word_generation(atomic_load(&p->word))) == seen &&
                   !atomic_load(&p->stop) &&
                   !(warmer && atomic_load(&p->warm_seq) != warm_seen))
                pthread_cond_wait(&p->wake, &p->lock);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->lock);
            if (g == seen && !atomic_load(&p->stop))
                continue;               /* woken for a warm-up: back to the spin */
        }
        if (atomic_load(&p->stop))
            return NULL;
        seen = g;
        run_items(p, arg->tid);
    }
}

/* Call with dispatch held. */
static void pool_stop(vk_pool *p) {
    if (!p->nworkers)
        return;
    pthread_mutex_lock(&p->lock);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (unsigned i = 0; i < p->nworkers; i++)
        pthread_join(p->workers[i], NULL);
    p->nworkers = 0;
    atomic_store(&p->stop, 0);
}

/* A child of fork() has only the thread that forked: the workers are gone, and
 * a lock another thread held at the fork stays held. The child starts the pool
 * over (workers are created on next use); without this its first parallel
 * kernel -- or numpy product, once host_blas shares the pool -- waits forever. */
static pthread_mutex_t g_scratch_lock;    /* defined with the GEMM scratch below */

static void pool_reset_in_child(void) {
    pthread_mutex_init(&g_pool.dispatch, NULL);
    pthread_mutex_init(&g_pool.lock, NULL);
    pthread_cond_init(&g_pool.wake, NULL);
    pthread_cond_init(&g_pool.done, NULL);
    g_pool.nworkers = 0;
    atomic_store(&g_pool.stop, 0);
    atomic_store(&g_pool.sleepers, 0);
    atomic_store(&g_pool.warming, 0);
    pthread_mutex_init(&g_pool.warm_lock, NULL);
    t_in_pool = 0;
    pthread_mutex_init(&g_scratch_lock, NULL);
}

static pthread_once_t g_fork_once = PTHREAD_ONCE_INIT;
static void register_fork_handler(void) { pthread_atfork(NULL, NULL, pool_reset_in_child); }

/* Call with dispatch held. */
static void pool_start(vk_pool *p) {
    if (!atomic_load(&p->threads))
        atomic_store(&p->threads, default_threads());
    while (p->nworkers + 1 < atomic_load(&p->threads)) {
        pthread_once(&g_fork_once, register_fork_handler);   /* before the first worker */
        unsigned i = p->nworkers;
        g_worker_args[i] = (worker_arg){p, i + 1, word_generation(atomic_load(&p->word))};
        if (pthread_create(&p->workers[i], NULL, worker_main, &g_worker_args[i]) != 0)
            break;              /* run with the workers we have */
        p->nworkers++;
    }
}

void vk_set_threads(unsigned n) {
    pthread_mutex_lock(&g_pool.dispatch);
    unsigned want = n ? (n > VK_MAX_THREADS ? VK_MAX_THREADS : n) : default_threads();
    if (want != atomic_load(&g_pool.threads)) {
        pool_stop(&g_pool);
        atomic_store(&g_pool.threads, want);    /* workers start again on next use */
    }
    pthread_mutex_unlock(&g_pool.dispatch);
}

/* Lock-free: a kernel running inside a pool job may ask. */
unsigned vk_threads(void) {
    unsigned n = atomic_load(&g_pool.threads);
    if (n == 0) {
        unsigned zero = 0;
        atomic_compare_exchange_strong(&g_pool.threads, &zero, default_threads());
        n = atomic_load(&g_pool.threads);
    }
    return n;
}

/* Runs the items over the pool. With `concurrent`, only when every item can
 * have a thread of its own at the same time (items that wait for one another);
 * otherwise returns -1 and runs nothing. */
static int pool_run(size_t n, void (*fn)(void *ctx, size_t i, unsigned tid), void *ctx,
                    int concurrent) {
    if (n == 0)
        return 0;
    vk_pool *p = &g_pool;
    if (t_in_pool || n == 1) {
        if (concurrent && n > 1)
            return -1;
        for (size_t i = 0; i < n; i++)
            fn(ctx, i, 0);
        return 0;
    }
    pthread_mutex_lock(&p->dispatch);
    pool_start(p);
    if (concurrent && p->nworkers + 1 < n) {
        pthread_mutex_unlock(&p->dispatch);
        return -1;
    }
    if (p->nworkers == 0) {
        pthread_mutex_unlock(&p->dispatch);
        t_in_pool = 1;
        for (size_t i = 0; i < n; i++)
            fn(ctx, i, 0);
        t_in_pool = 0;
        return 0;
    }
    /* the previous job is closed: no claim can succeed until the new word */
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->n, n);
    atomic_store(&p->finished, 0);
    unsigned gen = word_generation(atomic_load(&p->word)) + 1;
    pthread_mutex_lock(&p->lock);
    atomic_store(&p->word, (uint64_t)gen << 32);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);

    t_in_pool = 1;
    run_items(p, 0);
    t_in_pool = 0;
    for (int s = 0; s < VK_SPIN && atomic_load(&p->finished) < n; s++)
        VK_PAUSE();
    if (atomic_load(&p->finished) < n) {
        pthread_mutex_lock(&p->lock);
        while (atomic_load(&p->finished) < n)
            pthread_cond_wait(&p->done, &p->lock);
        pthread_mutex_unlock(&p->lock);
    }
    atomic_store(&p->word, (uint64_t)gen << 32 | VK_CLOSED);
    pthread_mutex_unlock(&p->dispatch);
    return 0;
}

static atomic_int g_warm_on = 1;

void vk_set_warm(int enable) { atomic_store(&g_warm_on, enable != 0); }
int vk_warm(void) { return atomic_load(&g_warm_on); }

void vk_warm_async(const void *const *base, const size_t *bytes, int n) {
    vk_pool *p = &g_pool;
    if (n <= 0 || t_in_pool || !vk_warm() || pthread_mutex_trylock(&p->dispatch) != 0)
        return;                         /* the pool is busy with another caller's job */
    pool_start(p);
    if (p->nworkers == 0) {
        pthread_mutex_unlock(&p->dispatch);
        return;
    }
    if (n > VK_WARM_MAX)
        n = VK_WARM_MAX;
    pthread_mutex_lock(&p->warm_lock);
    atomic_fetch_add(&p->warm_seq, 1);  /* odd: being written */
    atomic_store(&p->warm_n, n);
    for (int r = 0; r < n; r++) {
        atomic_store_explicit(&p->warm_base[r], (uintptr_t)base[r], memory_order_relaxed);
        atomic_store_explicit(&p->warm_bytes[r], bytes[r], memory_order_relaxed);
    }
    atomic_fetch_add(&p->warm_seq, 1);  /* even: ready */
    pthread_mutex_unlock(&p->warm_lock);
    if (atomic_load(&p->sleepers)) {
        pthread_mutex_lock(&p->lock);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->lock);
    }
    pthread_mutex_unlock(&p->dispatch);
}

void vk_warm_cancel(void) {
    vk_pool *p = &g_pool;
    /* a new, empty request: a worker that read the old one before this finds the
     * count changed once it has announced itself `warming`, or is waited for */
    pthread_mutex_lock(&p->warm_lock);
    atomic_fetch_add(&p->warm_seq, 1);
    atomic_store(&p->warm_n, 0);
    atomic_fetch_add(&p->warm_seq, 1);
    pthread_mutex_unlock(&p->warm_lock);
    for (int s = 0; atomic_load(&p->warming); s++) {
        if (s < VK_SPIN)
            VK_PAUSE();
        else
            sched_yield();              /* the worker was descheduled mid-range */
    }
}

void vk_parallel_for_tid(size_t n, void (*fn)(void *ctx, size_t i, unsigned tid),
                         void *ctx) {
    pool_run(n, fn, ctx, 0);
}

typedef struct { void (*fn)(void *, size_t); void *ctx; } plain_job;

static void plain_item(void *ctx, size_t i, unsigned tid) {
    (void)tid;
    plain_job *j = ctx;
    j->fn(j->ctx, i);
}

void vk_parallel_for(size_t n, void (*fn)(void *ctx, size_t i), void *ctx) {
    plain_job j = {fn, ctx};
    vk_parallel_for_tid(n, plain_item, &j);
}

int vk_parallel_for_concurrent(size_t n, void (*fn)(void *ctx, size_t i), void *ctx) {
    plain_job j = {fn, ctx};
    return pool_run(n, plain_item, &j, 1);
}

/* ---- GEMV driver -------------------------------------------------------- */

typedef struct { const vk_isa_ops *o; const vk_gemv_job *job; size_t chunk; } gemv_ctx;

/* gemv_multi_rows where the ISA has none: gemv_rows for one vector after another over
 * blocks of rows small enough to stay in cache, so A still comes from memory once. Each
 * row's sum does not depend on the rows around it, so each vector gets gemv's bits. */
void vk_gemv_multi_each(const vk_isa_ops *o, const vk_gemv_job *job, size_t r0, size_t r1) {
    size_t block = (size_t)(32u << 10) / (job->K * 2 + 1);    /* 32 KiB of A */
    block = block < 16 ? 16 : block & ~(size_t)15;
    for (size_t i = r0; i < r1; i += block) {
        size_t i1 = r1 - i < block ? r1 : i + block;
        for (size_t v = 0; v < job->nx; v++) {
            vk_gemv_job one = *job;
            one.x = job->xm + v * job->ldx;
            one.x16 = job->xm16 + v * job->ldx;
            one.y = job->ym + v * job->ldy;
            one.nx = 0;
            o->gemv_rows(&one, i, i1);
        }
    }
}

static void gemv_item(void *ctx, size_t i) {
    gemv_ctx *g = ctx;
    size_t r0 = i * g->chunk, r1 = r0 + g->chunk;
    if (r1 > g->job->M)
        r1 = g->job->M;
    if (g->job->nx && g->o->gemv_multi_rows)
        g->o->gemv_multi_rows(g->job, r0, r1);
    else if (g->job->nx)
        vk_gemv_multi_each(g->o, g->job, r0, r1);
    else if (g->job->x2)
        g->o->gemv_pair_rows(g->job, r0, r1);
    else
        g->o->gemv_rows(g->job, r0, r1);
}

/* Spreads a GEMV job's rows over the pool. */
static void gemv_run(const vk_isa_ops *o, const vk_gemv_job *job) {
    unsigned t = vk_threads();
    /* items of a multiple of 16 rows, about 8 per thread, at least 64 KiB of A each */
    size_t min_rows = (64u << 10) / (job->K * 2 + 1) + 1;
    size_t chunk = (job->M + t * 8 - 1) / (t * 8);
    if (chunk < min_rows)
        chunk = min_rows;
    chunk = (chunk + 15) & ~(size_t)15;
    gemv_ctx g = {o, job, chunk};
    vk_parallel_for((job->M + chunk - 1) / chunk, gemv_item, &g);
}

/* y = A x with A (M, K) rows contiguous; x[k] at x[k * incx]. */
static void gemv(const vk_isa_ops *o, size_t M, size_t K, const fp16_t *A, size_t lda,
                 const fp16_t *x, size_t incx, fp16_t *y, size_t incy, int strict) {
    float xs_stack[1024];
    fp16_t hs_stack[1024];
    float *xs = xs_stack;
    fp16_t *hs = hs_stack;
    if (K > 1024) {
        xs = malloc(K * sizeof(float));
        hs = malloc(K * sizeof(fp16_t));
        if (!xs || !hs) {       /* no memory for scratch: the scalar path needs none */
            free(xs);
            free(hs);
            for (size_t i = 0; i < M; i++) {
                float acc = 0.0f;
                for (size_t k = 0; k < K; k++) {
                    float a = vk_f16_to_f32(A[i * lda + k]), b = vk_f16_to_f32(x[k * incx]);
                    acc += strict ? vk_strict_mul(vk_flush_f32(a), vk_flush_f32(b)) : a * b;
                }
                fp16_t h = vk_f32_to_f16(acc);
                y[i * incy] = (strict && (h & 0x7c00u) == 0) ? (h & 0x8000u) : h;
            }
            return;
        }
    }
    for (size_t k = 0; k < K; k++)
        hs[k] = x[k * incx];
    if (strict)
        vk_f16_flush_denormals(hs, K);
    o->f16_to_f32(hs, xs, K);
    vk_gemv_job job = {A, lda, M, K, xs, hs, y, incy, strict, NULL, NULL, 0, 0, 0, NULL,
                       NULL, NULL};
    gemv_run(o, &job);
    if (xs != xs_stack) {
        free(xs);
        free(hs);
    }
}

/* y = A x and y2 = A x2 (x and x2 at unit stride), each row of A read once for both,
 * where the ISA has a pair kernel and the vectors fit the stack; else one at a time.
 * The same bits either way. */
static void gemv_pair(const vk_isa_ops *o, size_t M, size_t K, const fp16_t *A, size_t lda,
                      const fp16_t *x, const fp16_t *x2, fp16_t *y, fp16_t *y2, size_t incy) {
    float xs[1024], xs2[1024];
    if (!o->gemv_pair_rows || K > 1024) {
        gemv(o, M, K, A, lda, x, 1, y, incy, 0);
        gemv(o, M, K, A, lda, x2, 1, y2, incy, 0);
        return;
    }
    o->f16_to_f32(x, xs, K);
    o->f16_to_f32(x2, xs2, K);
    vk_gemv_job job = {A, lda, M, K, xs, x, y, incy, 0, xs2, y2, 0, 0, 0, NULL, NULL, NULL};
    gemv_run(o, &job);
}

/* ---- several GEMVs over one A ---------------------------------------------- */
/* C[:, j] = A op(B)[:, j] for a few columns j (batched decode, speculative
 * verification: a 1x1 conv over N tokens), each row of A read from memory once for
 * all of them, each column given the bits the one-column GEMV gives it (gemv). */

#define VK_MULTI_STACK 4096     /* vector elements gathered on the stack (24 KiB) */

static int multi_cols(size_t M, size_t N, size_t K, size_t csa);
static const vk_isa_ops *ops(void);

static void *scratch_get(size_t bytes, int *shared);
static void scratch_put(void *p, int shared);

/* Column j of op(B) at (k * rsb + j * csb) for j < N, into N vectors of K: fp16 (flushed
 * if strict) and fp32, as gemv gathers its one vector. Returns -1, computing nothing,
 * where there is no memory for them. */
static void gather_columns(const vk_isa_ops *o, size_t N, size_t K, const fp16_t *B,
                           size_t rsb, size_t csb, int strict, float *xs, fp16_t *hs) {
    for (size_t v = 0; v < N; v++) {
        fp16_t *h = hs + v * K;
        const fp16_t *b = B + v * csb;
        for (size_t k = 0; k < K; k++)
            h[k] = b[k * rsb];
        if (strict)
            vk_f16_flush_denormals(h, K);
        o->f16_to_f32(h, xs + v * K, K);
    }
}

/* The rows of job (rows [r0, r1) of A) for its vectors: the ISA's kernel or the fallback. */
static void gemv_multi_block(const vk_isa_ops *o, const vk_gemv_job *job, size_t r0,
                             size_t r1) {
    if (o->gemv_multi_rows)
        o->gemv_multi_rows(job, r0, r1);
    else
        vk_gemv_multi_each(o, job, r0, r1);
}

static int gemv_multi(const vk_isa_ops *o, size_t M, size_t N, size_t K, const fp16_t *A,
                      size_t lda, const fp16_t *B, size_t rsb, size_t csb, fp16_t *C,
                      size_t rsc, size_t csc, int strict) {
    float xs_stack[VK_MULTI_STACK];
    fp16_t hs_stack[VK_MULTI_STACK];
    float *xs = xs_stack;
    fp16_t *hs = hs_stack;
    void *heap = NULL;
    int shared = 0;
    if (N * K > VK_MULTI_STACK) {
        heap = scratch_get(N * K * (sizeof(float) + sizeof(fp16_t)), &shared);
        if (!heap)
            return -1;
        xs = heap;
        hs = (fp16_t *)(xs + N * K);
    }
    gather_columns(o, N, K, B, rsb, csb, strict, xs, hs);
    vk_gemv_job job = {A, lda, M, K, NULL, NULL, NULL, rsc, strict, NULL, NULL,
                       N, K, csc, xs, hs, C};
    gemv_run(o, &job);
    if (heap)
        scratch_put(heap, shared);
    return 0;
}

/* ---- several GEMVs over rows made as they are needed ------------------------ */
/* vk_gemv_multi_made: each pool item makes its rows of A a block at a time into a
 * thread's own 64 KiB (compressed weights decoded there, in L1/L2) and runs the
 * few-column kernel over the block before making the next: the weight is read once
 * for all the columns and never written out whole. */

#define VK_MADE_ELEMS 32768     /* fp16 elements of one made block */
static _Thread_local fp16_t g_made[VK_MADE_ELEMS];

typedef struct {
    const vk_isa_ops *o;
    vk_gemv_job job;            /* a, ym: set per block */
    fp16_t *c;
    size_t ldc, chunk, block;
    void (*make)(void *ctx, size_t r0, size_t n, fp16_t *dst);
    void *ctx;
} made_ctx;

static void made_item(void *ctx_, size_t it) {
    const made_ctx *g = ctx_;
    size_t M = g->job.M, r1 = (it + 1) * g->chunk < M ? (it + 1) * g->chunk : M;
    for (size_t r = it * g->chunk; r < r1; r += g->block) {
        size_t n = r1 - r < g->block ? r1 - r : g->block;
        g->make(g->ctx, r, n, g_made);
        vk_gemv_job job = g->job;
        job.a = g_made;
        job.ym = g->c + r * g->ldc;
        gemv_multi_block(g->o, &job, 0, n);
    }
}

int vk_gemv_multi_made(size_t M, size_t N, size_t K,
                       void (*make)(void *ctx, size_t r0, size_t n, fp16_t *dst), void *ctx,
                       const fp16_t *B, size_t ldb, fp16_t *C, size_t ldc,
                       vk_numerics numerics) {
    if (!multi_cols(M, N, K, 1) || K > VK_MADE_ELEMS)
        return -1;
    const vk_isa_ops *o = ops();
    int strict = numerics == VK_NUMERICS_STRICT;
    float xs_stack[VK_MULTI_STACK];
    fp16_t hs_stack[VK_MULTI_STACK];
    float *xs = xs_stack;
    fp16_t *hs = hs_stack;
    void *heap = NULL;
    if (N * K > VK_MULTI_STACK) {
        heap = malloc(N * K * (sizeof(float) + sizeof(fp16_t)));
        if (!heap)
            return -1;
        xs = heap;
        hs = (fp16_t *)(xs + N * K);
    }
    gather_columns(o, N, K, B, ldb, 1, strict, xs, hs);
    made_ctx g = {o, {NULL, K, M, K, NULL, NULL, NULL, ldc, strict, NULL, NULL, N, K, 1, xs,
                      hs, NULL}, C, ldc, 0, VK_MADE_ELEMS / K, make, ctx};
    /* items of whole blocks, about 8 per thread */
    unsigned t = vk_threads();
    size_t chunk = (M + t * 8 - 1) / (t * 8);
    g.chunk = (chunk + g.block - 1) / g.block * g.block;
    vk_parallel_for((M + g.chunk - 1) / g.chunk, made_item, &g);
    free(heap);
    return 0;
}

/* ---- GEMM driver -------------------------------------------------------- */
/* op(B) is packed whole into NR-column panels once (shared). Each tile of
 * MC rows x NC columns walks K in blocks of KC: it packs its rows of op(A) for
 * the block into the worker's own buffer and runs the MR x NR microkernel,
 * which continues the tile's fp32 sums; so every C element is still summed in
 * k order in fp32, and rounded once at the end. */

#define VK_MC 64
#define VK_KC 256               /* k block: a 256 x 32 fp32 B panel is 32 KiB, in L1 */
#define VK_NC 512

typedef struct gemm_ctx {
    const vk_isa_ops *o;
    const vk_gemm_kernel *kern;
    size_t M, N, K;
    vk_mat a, b;
    fp16_t *c;
    size_t rsc, csc;
    int strict;
    unsigned char *bpack;       /* (N_pad / NR) panels of K * NR elements */
    unsigned char *apack;       /* per worker: MC_pad * K elements */
    size_t apack_stride;        /* bytes per worker buffer */
    size_t tiles_n;             /* tiles along N */
    size_t nc;                  /* columns per tile (multiple of NR) */
    unsigned nslots;            /* worker buffers in apack */
    size_t acc_offset;          /* bytes from a worker buffer to its fp32 accumulators */
    atomic_int failed;          /* a tile could not get memory */
} gemm_ctx;

static void gemm_pack_b_item(void *ctx_, size_t jp) {
    gemm_ctx *g = ctx_;
    size_t nr = g->kern->nr, j0 = jp * nr;
    size_t cols = g->N - j0 < nr ? g->N - j0 : nr;
    g->kern->pack_b(&g->b, j0, cols, g->K, g->bpack + jp * g->K * nr * g->kern->elem,
                    g->strict);
}

static void store_tile(const gemm_ctx *g, const float *tile, size_t i0, size_t j0,
                       size_t rows, size_t cols) {
    unsigned nr = g->kern->nr;
    fp16_t h[64];
    for (size_t r = 0; r < rows; r++) {
        fp16_t *dst = g->c + (i0 + r) * g->rsc + j0 * g->csc;
        if (g->csc == 1) {
            g->o->f32_to_f16(tile + r * nr, dst, cols);
            if (g->strict)
                vk_f16_flush_denormals(dst, cols);
        } else {
            g->o->f32_to_f16(tile + r * nr, h, cols);
            if (g->strict)
                vk_f16_flush_denormals(h, cols);
            for (size_t c = 0; c < cols; c++)
                dst[c * g->csc] = h[c];
        }
    }
}

static void *aligned_buf(size_t bytes);

static void gemm_tile_item(void *ctx_, size_t t, unsigned tid) {
    gemm_ctx *g = ctx_;
    const vk_gemm_kernel *kn = g->kern;
    size_t mr = kn->mr, nr = kn->nr, es = kn->elem;
    size_t ti = t / g->tiles_n, tj = t % g->tiles_n;
    size_t i0 = ti * VK_MC, i1 = i0 + VK_MC < g->M ? i0 + VK_MC : g->M;
    size_t j0 = tj * g->nc, j1 = j0 + g->nc < g->N ? j0 + g->nc : g->N;
    size_t nmi = (i1 - i0 + mr - 1) / mr, njp = (j1 - j0 + nr - 1) / nr;
    /* a worker beyond the slots counted at the start (vk_set_threads raced
     * with this call) packs into a buffer of its own */
    unsigned char *own = NULL, *ap;
    if (tid < g->nslots) {
        ap = g->apack + tid * g->apack_stride;
    } else {
        ap = own = aligned_buf(g->apack_stride);
        if (!ap) {
            atomic_store(&g->failed, 1);
            return;
        }
    }
    float *acc = (float *)(ap + g->acc_offset);     /* njp x nmi tiles of mr x nr */
    memset(acc, 0, njp * nmi * mr * nr * sizeof(float));

    for (size_t pc = 0; pc < g->K; pc += VK_KC) {
        size_t kc = g->K - pc < VK_KC ? g->K - pc : VK_KC;
        vk_mat a = {g->a.p + pc * g->a.cs, g->a.rs, g->a.cs};
        for (size_t ip = 0; ip < nmi; ip++) {
            size_t i = i0 + ip * mr, rows = i1 - i < mr ? i1 - i : mr;
            kn->pack_a(&a, i, rows, kc, ap + ip * mr * kc * es, g->strict);
        }
        for (size_t jp = 0; jp < njp; jp++) {
            /* this k block of the panel: kc x nr, in L1 across the row tiles */
            const unsigned char *bp = g->bpack + ((j0 / nr + jp) * g->K + pc) * nr * es;
            for (size_t ip = 0; ip < nmi; ip++)
                kn->micro(kc, ap + ip * mr * kc * es, bp, acc + (jp * nmi + ip) * mr * nr,
                          g->strict);
        }
    }
    for (size_t jp = 0; jp < njp; jp++)
        for (size_t ip = 0; ip < nmi; ip++) {
            size_t i = i0 + ip * mr, j = j0 + jp * nr;
            size_t rows = i1 - i < mr ? i1 - i : mr, cols = j1 - j < nr ? j1 - j : nr;
            store_tile(g, acc + (jp * nmi + ip) * mr * nr, i, j, rows, cols);
        }
    free(own);
}

static void *aligned_buf(size_t bytes) {
    void *p = NULL;
    if (bytes == 0)
        bytes = 64;
    if (posix_memalign(&p, 64, (bytes + 63) & ~(size_t)63) != 0)
        return NULL;
    return p;
}

/* One packing buffer kept between calls: fresh pages for a 10 MB pack cost
 * page faults on every call (a third of a 256x768x3072 GEMM). A caller that
 * finds it in use by another thread gets its own for the call, and so does a
 * pack over VK_SCRATCH_KEEP bytes (not worth holding for the process). */
#define VK_SCRATCH_KEEP (64u << 20)
static pthread_mutex_t g_scratch_lock = PTHREAD_MUTEX_INITIALIZER;
static void *g_scratch;
static size_t g_scratch_bytes;

static void *scratch_get(size_t bytes, int *shared) {
    *shared = 0;
    if (bytes > VK_SCRATCH_KEEP || pthread_mutex_trylock(&g_scratch_lock) != 0)
        return aligned_buf(bytes);
    if (g_scratch_bytes < bytes) {
        free(g_scratch);
        g_scratch = aligned_buf(bytes);
        g_scratch_bytes = g_scratch ? bytes : 0;
    }
    if (!g_scratch) {
        pthread_mutex_unlock(&g_scratch_lock);
        return NULL;
    }
    *shared = 1;
    return g_scratch;
}

static void scratch_put(void *p, int shared) {
    if (shared)
        pthread_mutex_unlock(&g_scratch_lock);
    else
        free(p);
}

static int gemm_run(const vk_isa_ops *o, const vk_gemm_kernel *kern, size_t M, size_t N,
                    size_t K, vk_mat a, vk_mat b, fp16_t *c, size_t rsc, size_t csc,
                    int strict) {
    gemm_ctx g = {o, kern, M, N, K, a, b, c, rsc, csc, strict, NULL, NULL, 0, 0, 0, 0, 0, 0};
    size_t mr = kern->mr, nr = kern->nr, es = kern->elem;
    size_t npanels = (N + nr - 1) / nr;
    unsigned threads = vk_threads();
    size_t mc_pad = (VK_MC + mr - 1) / mr * mr;
    size_t tiles_m = (M + VK_MC - 1) / VK_MC;
    /* split N as well when M alone gives too few tiles for the workers */
    size_t nc = (N + nr - 1) / nr * nr;
    if (nc > VK_NC)
        nc = VK_NC;
    while (tiles_m * ((N + nc - 1) / nc) < 4 * (size_t)threads && nc > nr)
        nc = (nc / 2 + nr - 1) / nr * nr;
    g.nc = nc;
    g.tiles_n = (N + nc - 1) / nc;
    /* per worker: op(A) rows packed for one k block, then the tile's fp32 sums */
    size_t kc = K < VK_KC ? K : VK_KC;
    size_t bbytes = (npanels * K * nr * es + 63) & ~(size_t)63;
    g.acc_offset = (mc_pad * kc * es + 63) & ~(size_t)63;
    g.apack_stride = g.acc_offset + ((mc_pad * nc * sizeof(float) + 63) & ~(size_t)63);
    int shared;
    unsigned char *buf = scratch_get(bbytes + g.apack_stride * threads, &shared);
    if (!buf)
        return -1;
    g.bpack = buf;
    g.apack = buf + bbytes;
    g.nslots = threads;
    vk_parallel_for(npanels, gemm_pack_b_item, &g);
    vk_parallel_for_tid(tiles_m * g.tiles_n, gemm_tile_item, &g);
    scratch_put(buf, shared);
    return atomic_load(&g.failed) ? -1 : 0;
}

/* ---- vector x matrix ---------------------------------------------------- */
/* c[j] = sum_k x[k] * B[k, j] with rows of B contiguous along j, FP16
 * numerics: each sum runs in k order from zero, as the GEMM microkernels add
 * (products of two fp16 values are exact in fp32, so fused or not they agree
 * bit for bit). Decode attention's probabilities times the cached values. */

#define VK_VECMAT_COLS 256
#define VK_FEW_ROWS_MAX_B ((size_t)1 << 20) /* elements of op(B): an 8192-row cache head */

VK_CLONES static void vecmat_cols(size_t K, const float *x, const fp16_t *B, size_t rsb,
                                  size_t cols, float *acc, float *row,
                                  void (*cvt)(const fp16_t *, float *, size_t)) {
    for (size_t j = 0; j < cols; j++)
        acc[j] = 0.0f;
    for (size_t k = 0; k < K; k++) {
        cvt(B + k * rsb, row, cols);
        float xk = x[k];
        for (size_t j = 0; j < cols; j++)
            acc[j] += xk * row[j];
    }
}

/* x[k] = A[k * csa] in fp32, by the ISA's array conversion (the same values): one
 * portable call per element cost more than the product itself in decode attention */
static void vector_f32(const vk_isa_ops *o, const fp16_t *A, size_t csa, size_t K, float *xs) {
    if (csa == 1) {
        o->f16_to_f32(A, xs, K);
        return;
    }
    fp16_t hs[256];
    for (size_t k0 = 0; k0 < K; k0 += 256) {
        size_t n = K - k0 < 256 ? K - k0 : 256;
        for (size_t k = 0; k < n; k++)
            hs[k] = A[(k0 + k) * csa];
        o->f16_to_f32(hs, xs + k0, n);
    }
}

static int vecmat(const vk_isa_ops *o, size_t N, size_t K, const fp16_t *A, size_t csa,
                  const fp16_t *B, size_t rsb, fp16_t *C) {
    float xs_stack[1024], *xs = K <= 1024 ? xs_stack : malloc(K * sizeof(float));
    if (!xs)
        return -1;
    vector_f32(o, A, csa, K, xs);
    float acc[VK_VECMAT_COLS], row[VK_VECMAT_COLS];
    for (size_t j0 = 0; j0 < N; j0 += VK_VECMAT_COLS) {
        size_t cols = N - j0 < VK_VECMAT_COLS ? N - j0 : VK_VECMAT_COLS;
        if (o->vecmat)
            o->vecmat(K, xs, B + j0, rsb, cols, acc);
        else
            vecmat_cols(K, xs, B + j0, rsb, cols, acc, row, o->f16_to_f32);
        o->f32_to_f16(acc, C + j0, cols);
    }
    if (xs != xs_stack)
        free(xs);
    return 0;
}

/* vecmat for the rows A and A2 at once where the ISA has a pair kernel and they fit
 * the stack (each row of B converted once for both); else one at a time. */
static int vecmat_pair(const vk_isa_ops *o, size_t N, size_t K, const fp16_t *A,
                       const fp16_t *A2, size_t csa, const fp16_t *B, size_t rsb, fp16_t *C,
                       fp16_t *C2) {
    if (!o->vecmat_pair || K > 1024) {
        int rc = vecmat(o, N, K, A, csa, B, rsb, C);
        return rc ? rc : vecmat(o, N, K, A2, csa, B, rsb, C2);
    }
    float xs[1024], xs2[1024], acc[VK_VECMAT_COLS], acc2[VK_VECMAT_COLS];
    vector_f32(o, A, csa, K, xs);
    vector_f32(o, A2, csa, K, xs2);
    for (size_t j0 = 0; j0 < N; j0 += VK_VECMAT_COLS) {
        size_t cols = N - j0 < VK_VECMAT_COLS ? N - j0 : VK_VECMAT_COLS;
        o->vecmat_pair(K, xs, xs2, B + j0, rsb, cols, acc, acc2);
        o->f32_to_f16(acc, C + j0, cols);
        o->f32_to_f16(acc2, C2 + j0, cols);
    }
    return 0;
}

void vk_gemm_f16(int trans_a, int trans_b, size_t M, size_t N, size_t K,
                 const fp16_t *A, size_t lda, const fp16_t *B, size_t ldb,
                 fp16_t *C, size_t ldc, vk_numerics numerics) {
    vk_gemm_f16_strided(M, N, K, A, trans_a ? 1 : lda, trans_a ? lda : 1,
                        B, trans_b ? 1 : ldb, trans_b ? ldb : 1, C, ldc, numerics);
}

/* One row, or a few with a small op(B): computed as vector products (below). */
static int few_rows(size_t M, size_t N, size_t K) {
    return M == 1 || (M <= VK_FEW_ROWS && N * K <= VK_FEW_ROWS_MAX_B);
}

/* A few columns over rows of op(A) contiguous along K, more than few_rows takes: one
 * GEMV per column, all over one read of A (gemv_multi). */
static int multi_cols(size_t M, size_t N, size_t K, size_t csa) {
    return csa == 1 && N >= 2 && N <= VK_GEMV_MULTI_MAX && !few_rows(M, N, K);
}

/* How the product sums each C element: 1 as a GEMV does (8- or 16-wide lanes, then a
 * reduction, a shape that depends on K alone: one column, a few columns, or a few rows
 * with rows of op(B) contiguous, which is the same dot product with the operands'
 * roles swapped), 0 in k order from +0 (GEMM, vecmat). Products of one kind give an
 * element the same bits. */
static int sums_as_gemv(size_t M, size_t N, size_t K, size_t csa, size_t rsb) {
    if (N == 1 && csa == 1)
        return 1;
    if (few_rows(M, N, K))
        return rsb == 1;
    return multi_cols(M, N, K, csa);
}

/* vk_gemm_f16_strided; k_order: the sums in k order (no GEMV path) whatever the shape. */
static void gemm_strided(size_t M, size_t N, size_t K, const fp16_t *A, size_t rsa,
                         size_t csa, const fp16_t *B, size_t rsb, size_t csb, fp16_t *C,
                         size_t ldc, vk_numerics numerics, int k_order) {
    if (M == 0 || N == 0)
        return;
    int strict = numerics == VK_NUMERICS_STRICT;
    if (K == 0) {
        for (size_t i = 0; i < M; i++)
            memset(C + i * ldc, 0, N * sizeof(fp16_t));
        return;
    }
    const vk_isa_ops *o = ops();
    /* op(A)(i, k) = a.p[i * a.rs + k * a.cs]; op(B)(k, j) = b.p[k * b.rs + j * b.cs] */
    vk_mat a = {A, rsa, csa};
    vk_mat b = {B, rsb, csb};
    size_t rsc = ldc, csc = 1;

    if (N == 1 && a.cs == 1 && !k_order) {
        gemv(o, M, K, A, a.rs, B, b.rs, C, rsc, strict);
        return;
    }
    /* One row, or a few (decode attention with grouped queries: G query heads share a
     * key head): each row as a vector product, so a row's values do not depend on how
     * many rows share the call and a few rows do not pay for packing a whole operand
     * into GEMM panels. Not for a large op(B), which GEMM reads once for all rows. */
    int few = few_rows(M, N, K);
    /* Rows two at a time where they can share op(B)'s conversion (grouped queries). */
    int pairs = !strict && M >= 2;
    if (few && b.rs == 1 && !k_order) {  /* row i of C^T = op(B)^T a_i, rows contiguous */
        size_t i = 0;
        for (; pairs && a.cs == 1 && i + 2 <= M; i += 2)
            gemv_pair(o, N, K, B, b.cs, A + i * a.rs, A + (i + 1) * a.rs, C + i * rsc,
                      C + (i + 1) * rsc, csc);
        for (; i < M; i++)
            gemv(o, N, K, B, b.cs, A + i * a.rs, a.cs, C + i * rsc, csc, strict);
        return;
    }
    if (few && b.cs == 1 && !strict) {
        size_t i = 0;
        while (pairs && i + 2 <= M && vecmat_pair(o, N, K, A + i * a.rs, A + (i + 1) * a.rs,
                                                  a.cs, B, b.rs, C + i * rsc,
                                                  C + (i + 1) * rsc) == 0)
            i += 2;
        while (i < M && vecmat(o, N, K, A + i * a.rs, a.cs, B, b.rs, C + i * rsc) == 0)
            i++;
        if (i == M)
            return;
    }
    /* A few columns (a 1x1 conv over a few tokens): each column a GEMV, with the bits
     * it has alone (N == 1 above), whatever the other columns are. */
    if (multi_cols(M, N, K, a.cs) && !k_order) {
        if (gemv_multi(o, M, N, K, A, a.rs, B, b.rs, b.cs, C, rsc, csc, strict) != 0)
            for (size_t j = 0; j < N; j++)  /* no memory to gather them: one at a time */
                gemv(o, M, K, A, a.rs, B + j * b.cs, b.rs, C + j * csc, rsc, strict);
        return;
    }
    if (N < 16 && M > N) {      /* few columns: compute C^T = op(B)^T op(A)^T */
        vk_mat at = {b.p, b.cs, b.rs}, bt = {a.p, a.cs, a.rs};
        size_t t = M; M = N; N = t;
        a = at;
        b = bt;
        t = rsc; rsc = csc; csc = t;
    }
    const vk_gemm_kernel *kern = strict ? o->gemm_strict : o->gemm;
    if (gemm_run(o, kern, M, N, K, a, b, C, rsc, csc, strict) == 0)
        return;
    /* out of memory for packing: element by element, no scratch */
    for (size_t i = 0; i < M; i++)
        for (size_t j = 0; j < N; j++) {
            float acc = 0.0f;
            for (size_t k = 0; k < K; k++) {
                float x = vk_f16_to_f32(a.p[i * a.rs + k * a.cs]);
                float y = vk_f16_to_f32(b.p[k * b.rs + j * b.cs]);
                acc += strict ? vk_strict_mul(vk_flush_f32(x), vk_flush_f32(y)) : x * y;
            }
            fp16_t h = vk_f32_to_f16(acc);
            C[i * rsc + j * csc] = (strict && (h & 0x7c00u) == 0) ? (h & 0x8000u) : h;
        }
}

void vk_gemm_f16_strided(size_t M, size_t N, size_t K,
                         const fp16_t *A, size_t rsa, size_t csa,
                         const fp16_t *B, size_t rsb, size_t csb,
                         fp16_t *C, size_t ldc, vk_numerics numerics) {
    gemm_strided(M, N, K, A, rsa, csa, B, rsb, csb, C, ldc, numerics, 0);
}

/* No infinity or NaN among n fp16 values `stride` apart. */
static int f16_all_finite(const fp16_t *p, size_t n, size_t stride) {
    for (size_t i = 0; i < n; i++)
        if ((p[i * stride] & 0x7c00u) == 0x7c00u)
            return 0;
    return 1;
}

/* Which products may be skipped without a bit of C changing, where op(B) is zero from
 * column n_live on, or from row k_live on:
 *  - columns: every path computes each C element on its own, so the live columns keep
 *    their bits as long as the narrower product sums as the full one does
 *    (sums_as_gemv): a product summed in k order is narrowed in k order (it would
 *    otherwise become one or a few GEMVs); one summed as GEMVs mostly stays so when it
 *    loses columns, and is computed in full where it would not. A skipped element is
 *    sum_k a_ik * 0, which is +0 for finite a (every sum, every lane, starts at +0);
 *  - rows: the k-order paths add each element's products in k order from +0, and
 *    adding a +-0 product to such a sum leaves it as it is, so the last terms may go
 *    when they are zeros (their a_ik finite); not the GEMV paths, whose lanes and
 *    tails depend on K. */
void vk_gemm_f16_live(size_t M, size_t N, size_t K, const fp16_t *A, size_t rsa, size_t csa,
                      const fp16_t *B, size_t rsb, size_t csb, fp16_t *C, size_t ldc,
                      vk_numerics numerics, size_t n_live, size_t k_live) {
    int finite_a = 1, as_gemv = sums_as_gemv(M, N, K, csa, rsb);
    /* a few columns over few enough rows and a long K can narrow into vecmat's k order */
    if (n_live < N && (!as_gemv || n_live == 0 || sums_as_gemv(M, n_live, K, csa, rsb))) {
        for (size_t i = 0; i < M && finite_a; i++)
            finite_a = f16_all_finite(A + i * rsa, K, csa);
        if (finite_a) {
            gemm_strided(M, n_live, K, A, rsa, csa, B, rsb, csb, C, ldc, numerics, !as_gemv);
            for (size_t i = 0; i < M; i++)
                memset(C + i * ldc + n_live, 0, (N - n_live) * sizeof(fp16_t));
            return;
        }
    }
    if (k_live < K && !as_gemv) {
        for (size_t i = 0; i < M && finite_a; i++)
            finite_a = f16_all_finite(A + i * rsa + k_live * csa, K - k_live, csa);
        if (finite_a) {
            gemm_strided(M, N, k_live, A, rsa, csa, B, rsb, csb, C, ldc, numerics, 1);
            return;
        }
    }
    gemm_strided(M, N, K, A, rsa, csa, B, rsb, csb, C, ldc, numerics, 0);
}
