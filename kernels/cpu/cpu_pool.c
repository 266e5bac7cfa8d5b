/* The decode thread pool of cpu_pool.h.
 *
 * One job at a time. Its state is one 64-bit word, claim = generation (32
 * bits) | units (16) | next unit (16): a thread takes unit `next` by a
 * compare-exchange of the whole word, so a thread holding a stale view (a
 * worker that woke after the job it saw had ended) can never take a unit of
 * another job. The function and argument are written before the word that
 * publishes them, and a unit can only be taken while its job is unfinished,
 * that is before the next job's fields are written. Above 65535 chunks a
 * unit is a run of consecutive chunks. `done` counts finished units; the
 * caller returns when it reaches the job's units. Workers wait for a new
 * generation spinning (SPIN_NS), then yielding the core (YIELD_NS), then on
 * a condition variable, which the caller signals only when someone sleeps. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, sched_yield */
#include "kernels/cpu/cpu_pool.h"

#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>

#include "kernels/cpu/cpu_kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

typedef void (*pool_fn)(void *arg, int64_t chunk);

enum { MAX_WORKERS = 255, MAX_UNITS = 0xffff };
#define SPIN_NS 50000LL    /* pure spinning after a job: the gaps between a token's GEMVs */
#define YIELD_NS 2000000LL /* then yielding the core to anything runnable, then sleeping */

static struct {
    pthread_mutex_t busy;  /* held by the thread whose job runs */
    pthread_mutex_t sleep; /* with `wake`: workers with nothing to do */
    pthread_cond_t wake;
    _Atomic uint64_t claim;
    _Atomic int64_t done;
    _Atomic(pool_fn) fn;
    _Atomic(void *) arg;
    _Atomic int64_t chunks, per_unit;
    _Atomic int width; /* threads the job may use, the caller included */
    _Atomic int sleepers;
    int workers; /* started (under busy) */
} pool = {.busy = PTHREAD_MUTEX_INITIALIZER, .sleep = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

static _Thread_local bool in_pool;  /* a worker, or a caller inside its job */
static _Thread_local int thread_id; /* 0 for callers, 1.. for workers */
static _Thread_local bool scope;

bool dsc_cpu_pool_set_scope(bool on) {
    bool was = scope;
    scope = on;
    return was;
}

bool dsc_cpu_pool_scope(void) {
    return scope;
}

int dsc_cpu_pool_thread(void) {
    return thread_id;
}

bool dsc_cpu_pool_inside(void) {
    return in_pool;
}

static inline uint32_t gen_of(uint64_t c) {
    return (uint32_t)(c >> 32);
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Takes and runs units of generation g until none is left (or the job is another one). */
static void run_units(uint32_t g, pool_fn fn, void *arg, int64_t chunks, int64_t per_unit) {
    uint64_t c = atomic_load_explicit(&pool.claim, memory_order_acquire);
    for (;;) {
        uint64_t units = (c >> 16) & MAX_UNITS, next = c & MAX_UNITS;
        if (gen_of(c) != g || next >= units) return;
        if (!atomic_compare_exchange_weak_explicit(&pool.claim, &c, c + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        int64_t i0 = (int64_t)next * per_unit, i1 = i0 + per_unit < chunks ? i0 + per_unit : chunks;
        for (int64_t i = i0; i < i1; i++)
            fn(arg, i);
        atomic_fetch_add_explicit(&pool.done, 1, memory_order_release);
        c = atomic_load_explicit(&pool.claim, memory_order_acquire);
    }
}

/* Waits until the published generation differs from `seen`; returns the new one. */
static uint32_t wait_job(uint32_t seen) {
    int64_t t0 = now_ns();
    for (unsigned spins = 0;; spins++) {
        uint32_t g = gen_of(atomic_load_explicit(&pool.claim, memory_order_acquire));
        if (g != seen) return g;
        if (spins % 256 != 255) {
            cpu_relax();
            continue;
        }
        int64_t idle = now_ns() - t0;
        if (idle < SPIN_NS) continue;
        if (idle < YIELD_NS) {
            sched_yield();
            continue;
        }
        pthread_mutex_lock(&pool.sleep);
        atomic_fetch_add(&pool.sleepers, 1);
        while (gen_of(atomic_load(&pool.claim)) == seen)
            pthread_cond_wait(&pool.wake, &pool.sleep);
        atomic_fetch_sub(&pool.sleepers, 1);
        pthread_mutex_unlock(&pool.sleep);
        t0 = now_ns();
    }
}

static void *worker_main(void *p) {
    int id = (int)(intptr_t)p; /* 1, 2, ... (the caller is 0) */
    in_pool = true;
    thread_id = id;
    uint32_t seen = gen_of(atomic_load(&pool.claim));
    for (;;) {
        seen = wait_job(seen);
        if (id >= atomic_load(&pool.width)) continue;
        run_units(seen, atomic_load(&pool.fn), atomic_load(&pool.arg), atomic_load(&pool.chunks),
                  atomic_load(&pool.per_unit));
    }
    return NULL;
}

/* Starts workers up to `want` (under busy); fewer if the system refuses threads. */
static void start_workers(int want) {
    want = want < MAX_WORKERS ? want : MAX_WORKERS;
    while (pool.workers < want) {
        pthread_t t;
        pthread_attr_t attr;
        if (pthread_attr_init(&attr)) return;
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&t, &attr, worker_main, (void *)(intptr_t)(pool.workers + 1));
        pthread_attr_destroy(&attr);
        if (rc) return;
        pool.workers++;
    }
}

void dsc_cpu_pool_run(void (*fn)(void *arg, int64_t chunk), void *arg, int64_t chunks) {
    dsc_cpu_pool_run_upto(fn, arg, chunks, dsc_kernels_get_num_threads());
}

void dsc_cpu_pool_run_upto(void (*fn)(void *arg, int64_t chunk), void *arg, int64_t chunks, int max_threads) {
    if (chunks <= 0) return;
    int nt = dsc_kernels_get_num_threads();
    nt = nt < max_threads ? nt : max_threads;
    if (nt <= 1 || chunks == 1 || in_pool || omp_in_parallel() || pthread_mutex_trylock(&pool.busy) != 0) {
        for (int64_t i = 0; i < chunks; i++)
            fn(arg, i);
        return;
    }
    start_workers(nt - 1);
    int64_t per_unit = (chunks + MAX_UNITS - 1) / MAX_UNITS, units = (chunks + per_unit - 1) / per_unit;
    uint32_t g = gen_of(atomic_load(&pool.claim)) + 1;
    atomic_store(&pool.fn, fn);
    atomic_store(&pool.arg, arg);
    atomic_store(&pool.chunks, chunks);
    atomic_store(&pool.per_unit, per_unit);
    atomic_store(&pool.width, nt);
    atomic_store(&pool.done, 0);
    atomic_store(&pool.claim, (uint64_t)g << 32 | (uint64_t)units << 16);
    if (atomic_load(&pool.sleepers) > 0) {
        pthread_mutex_lock(&pool.sleep);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.sleep);
    }
    in_pool = true;
    run_units(g, fn, arg, chunks, per_unit);
    /* Only units other threads took and have not finished are left. */
    for (unsigned spins = 0; atomic_load_explicit(&pool.done, memory_order_acquire) < units; spins++) {
        if (spins < 4096)
            cpu_relax();
        else
            sched_yield();
    }
    in_pool = false;
    pthread_mutex_unlock(&pool.busy);
}
