/* GEMM on the CPU through OpenBLAS (row-major cblas_sgemm, one call per
 * batch entry: this OpenBLAS has no batched entry point), plus the bias
 * broadcast and the bias gradient. Threads come from OpenBLAS itself, which
 * dsc_kernels_set_num_threads keeps in step with OpenMP. */
#include <cblas.h>
#include <limits.h>

#include "kernels/cpu/cpu_kernels.h"

dsc_status dsc_cpu_gemm(const dsc_backend *backend, float *out, const float *a, const float *b, const float *bias,
                        int64_t batch, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, float alpha,
                        float beta) {
    (void)backend;
    DSC_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX, DSC_ERR_UNSUPPORTED,
              "cblas_sgemm: extents (%lld, %lld, %lld) exceed the 32-bit BLAS interface", (long long)m,
              (long long)n, (long long)k);
    dsc_kernels_get_num_threads(); /* applies the thread count to OpenBLAS on first use */
    /* Leading dimensions of the stored (untransposed) matrices; BLAS wants at least 1. */
    int lda = (int)(trans_a ? m : k), ldb = (int)(trans_b ? k : n);
    if (lda < 1) lda = 1;
    if (ldb < 1) ldb = 1;
    for (int64_t i = 0; i < batch; i++) {
        float *o = out + i * m * n;      /* (M, N) */
        const float *ai = a + i * m * k; /* (M, K) or (K, M) */
        const float *bi = b + i * k * n; /* (K, N) or (N, K) */
        if (m == 1 && n > 0 && k > 0)
            /* One row (a decode step): sgemv reads b once, where sgemm would first pack all of it. */
            cblas_sgemv(CblasRowMajor, trans_b ? CblasNoTrans : CblasTrans, (int)(trans_b ? n : k),
                        (int)(trans_b ? k : n), alpha, bi, ldb, ai, 1, beta, o, 1);
        else if (m > 0 && n > 0)
            cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                        (int)m, (int)n, (int)k, alpha, ai, lda, bi, ldb, beta, o, (int)n);
        if (!bias) continue;
        for (int64_t r = 0; r < m; r++) {
            float *row = o + r * n;
            for (int64_t j = 0; j < n; j++)
                row[j] += bias[j];
        }
    }
    return NULL;
}

dsc_status dsc_cpu_linear_backward_bias(const dsc_backend *backend, float *dbias, const float *dy, int64_t n,
                                        int64_t oc) {
    (void)backend;
    int nt = dsc_kernels_get_num_threads();
    /* Each thread owns a slice of channels, so the accumulation is race-free. */
#pragma omp parallel for num_threads(nt) if (n * oc > DSC_CPU_PARALLEL_MIN) schedule(static)
    for (int64_t c0 = 0; c0 < oc; c0 += 64) {
        int64_t c1 = c0 + 64 < oc ? c0 + 64 : oc;
        float acc[64] = {0};
        for (int64_t r = 0; r < n; r++) {
            const float *row = dy + r * oc;
            for (int64_t c = c0; c < c1; c++)
                acc[c - c0] += row[c];
        }
        for (int64_t c = c0; c < c1; c++)
            dbias[c] += acc[c - c0];
    }
    return NULL;
}
