/* blas_pool.c -- a host BLAS library's parallel jobs run on vane's kernel
 * threads, so the process has one thread pool.
 *
 * Why: on vane the "device" is these same CPU cores. OpenBLAS (numpy's BLAS)
 * keeps a pool of its own whose idle threads spin for about 0.1 s after every
 * call; in a training step they took a core from the device programs and the
 * optimizer right after each host product (a Stories110M step measured ~9%
 * faster with them sleeping at once). OpenBLAS 0.3.27+ lets the caller run its
 * jobs instead (openblas_set_threads_callback_function); orion_blas_run_jobs
 * has that callback's signature, and orion.host_blas installs it.
 *
 * The contract: every job of a call is done on return, and the jobs run
 * concurrently -- OpenBLAS's threaded level-3 drivers spin until the other
 * jobs have packed their panels, so jobs run one after another on fewer
 * threads would never finish. When the pool cannot give each job a thread at
 * once (called from inside a pool job, or more jobs than pool threads), the
 * extra jobs get threads of their own for the call. */
#include <pthread.h>
#include <stdlib.h>

#include "../vane/kernels.h"
#include "error.h"

typedef struct blas_jobs {
    orion_blas_dojob dojob;
    char *data;
    size_t elsize;
    int arg;
} blas_jobs;

typedef struct own_thread {
    const blas_jobs *jobs;
    int index;
} own_thread;

static void run_job(void *ctx, size_t i) {
    const blas_jobs *j = ctx;
    j->dojob((int)i, j->data + i * j->elsize, j->arg);
}

static void *own_thread_main(void *arg) {
    own_thread *t = arg;
    run_job((void *)t->jobs, (size_t)t->index);
    return NULL;
}

#define STACK_JOBS 64     /* OpenBLAS's jobs per call: its thread count, rarely more */

/* Jobs 1..n-1 on fresh threads, job 0 here. A job whose thread cannot be
 * created runs here after job 0: the last resort, which completes only if no
 * other job waits on it (the system is out of threads by then). */
static void run_on_own_threads(const blas_jobs *j, int numjobs) {
    pthread_t stack_threads[STACK_JOBS];
    own_thread stack_args[STACK_JOBS];
    unsigned char stack_started[STACK_JOBS];
    int heap = numjobs > STACK_JOBS;
    pthread_t *threads = heap ? malloc((size_t)numjobs * sizeof *threads) : stack_threads;
    own_thread *args = heap ? malloc((size_t)numjobs * sizeof *args) : stack_args;
    unsigned char *started = heap ? calloc((size_t)numjobs, 1) : stack_started;
    if (!threads || !args || !started) {
        for (int i = 0; i < numjobs; i++) run_job((void *)j, (size_t)i);
    } else {
        for (int i = 1; i < numjobs; i++) {
            args[i] = (own_thread){j, i};
            started[i] = pthread_create(&threads[i], NULL, own_thread_main, &args[i]) == 0;
        }
        run_job((void *)j, 0);
        for (int i = 1; i < numjobs; i++) {
            if (started[i]) pthread_join(threads[i], NULL);
            else run_job((void *)j, (size_t)i);
        }
    }
    if (heap) {
        free(threads);
        free(args);
        free(started);
    }
}

void orion_blas_run_jobs(int sync, orion_blas_dojob dojob, int numjobs, size_t jobdata_elsize,
                         void *jobdata, int dojob_data) {
    (void)sync;   /* OpenBLAS always asks for completion on return; this always gives it */
    if (numjobs <= 0 || !dojob) return;
    blas_jobs j = {dojob, jobdata, jobdata_elsize, dojob_data};
    if (vk_parallel_for_concurrent((size_t)numjobs, run_job, &j) != 0)
        run_on_own_threads(&j, numjobs);
}
