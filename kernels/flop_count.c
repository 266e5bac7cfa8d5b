/* The running count of floating-point operations the matrix-class kernels
 * (GEMM, linear, attention) have been asked to do, for the FLOPs profiler.
 * Elementwise kernels are not counted: in a transformer step they are well
 * under 1% of the arithmetic. A multiply-add counts 2, as DeepSpeed's
 * profiler counts (2 * MACs). Relaxed atomics: the count is read between
 * calls, never used to order memory. */
#include <stdatomic.h>

#include "kernels/dispatch.h"

static _Atomic int64_t flops;

void kernel_count_flops(int64_t n) {
    atomic_fetch_add_explicit(&flops, n, memory_order_relaxed);
}

int64_t dsc_kernel_flop_count(void) {
    return atomic_load_explicit(&flops, memory_order_relaxed);
}
