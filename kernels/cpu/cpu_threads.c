/* How many threads the CPU kernels use. Read once from the environment
 * (DSC_NUM_THREADS, else OMP_NUM_THREADS, else all cores) and handed to
 * OpenMP per parallel region (num_threads). OpenBLAS is kept at one thread:
 * its own pthread pool would compete with OpenMP's for the same cores (each
 * spinning while the other works), so the kernels split large products over
 * OpenMP threads themselves (cpu_gemm.c); and it runs the kernels this CPU has
 * (cpu_blas_core.c), both settled at the first use. Not a thread pool: OpenMP
 * owns that. */
#include <cblas.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "kernels/cpu/cpu_blas_core.h"
#include "kernels/cpu/cpu_kernels.h"

static _Atomic int num_threads; /* 0 until first use */

/* A positive integer at the start of `value` (OMP_NUM_THREADS may be a list "4,2"), else 0. */
static int parse_threads(const char *value) {
    if (!value) return 0;
    char *end;
    long n = strtol(value, &end, 10);
    return end != value && n > 0 && n < 4096 ? (int)n : 0;
}

void dsc_kernels_set_num_threads(int n) {
    if (n < 1) n = 1;
    atomic_store(&num_threads, n);
    dsc_cpu_blas_choose_core();
    openblas_set_num_threads(1);
}

int dsc_kernels_get_num_threads(void) {
    int n = atomic_load(&num_threads);
    if (n > 0) return n;
    n = parse_threads(getenv("DSC_NUM_THREADS"));
    if (!n) n = parse_threads(getenv("OMP_NUM_THREADS"));
    if (!n) n = omp_get_num_procs();
    dsc_kernels_set_num_threads(n);
    return n;
}
