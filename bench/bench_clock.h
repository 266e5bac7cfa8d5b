/* Shared by the benchmark programs: a monotonic clock in seconds and a
 * qsort comparator for medians. Header-only (each bench is one program). */
#ifndef DSC_BENCH_CLOCK_H
#define DSC_BENCH_CLOCK_H

#include <time.h>

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#endif
