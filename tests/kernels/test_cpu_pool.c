/* The decode thread pool (kernels/cpu/cpu_pool.c): every chunk of every job
 * runs exactly once, whatever the chunk count (one, a few, more than the
 * 65535 units a job word can count), across thousands of back-to-back jobs
 * (a stale worker must never take a chunk of a later job), and a job
 * started from inside a chunk runs on the calling thread. Run with 1, 2
 * and 4 threads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "dsc/kernels.h"
#include "kernels/cpu/cpu_pool.h"

typedef struct job {
    _Atomic int *hits; /* per chunk */
    int64_t chunks;
    _Atomic int64_t nested_bad;
} job;

static void count(void *arg, int64_t i) {
    job *J = arg;
    atomic_fetch_add(&J->hits[i], 1);
}

static void check_jobs(int threads) {
    dsc_kernels_set_num_threads(threads);
    const int64_t sizes[] = {1, 2, 3, 17, 64, 1000, 70000, 200000};
    _Atomic int *hits = calloc(200000, sizeof *hits);
    assert_non_null(hits);
    for (int rep = 0; rep < 3000; rep++) {
        int64_t n = sizes[rep % 8];
        if (n > 1000 && rep % 100 >= 8) continue; /* the big ones a few times only */
        for (int64_t i = 0; i < n; i++)
            atomic_store(&hits[i], 0);
        job J = {.hits = hits, .chunks = n};
        dsc_cpu_pool_run(count, &J, n);
        for (int64_t i = 0; i < n; i++)
            if (atomic_load(&hits[i]) != 1)
                fail_msg("threads %d job %d: chunk %lld of %lld ran %d times", threads, rep, (long long)i,
                         (long long)n, atomic_load(&hits[i]));
    }
    free(hits);
}

static void test_every_chunk_once(void **state) {
    (void)state;
    check_jobs(1);
    check_jobs(2);
    check_jobs(4);
}

/* A chunk that runs a job of its own: the inner job runs inline and completely. */
static void outer(void *arg, int64_t i) {
    job *J = arg;
    _Atomic int inner[8] = {0};
    job I = {.hits = inner, .chunks = 8};
    dsc_cpu_pool_run(count, &I, 8);
    for (int k = 0; k < 8; k++)
        if (atomic_load(&inner[k]) != 1) atomic_fetch_add(&J->nested_bad, 1);
    atomic_fetch_add(&J->hits[i], 1);
}

static void test_nested_runs_inline(void **state) {
    (void)state;
    dsc_kernels_set_num_threads(2);
    _Atomic int hits[32] = {0};
    job J = {.hits = hits, .chunks = 32};
    dsc_cpu_pool_run(outer, &J, 32);
    assert_int_equal(atomic_load(&J.nested_bad), 0);
    for (int i = 0; i < 32; i++)
        assert_int_equal(atomic_load(&hits[i]), 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_chunk_once),
        cmocka_unit_test(test_nested_runs_inline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
