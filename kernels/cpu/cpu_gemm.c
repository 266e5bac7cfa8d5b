/* GEMM on the CPU through OpenBLAS (row-major cblas_sgemm, one call per
 * batch entry: this OpenBLAS has no batched entry point), plus the bias
 * broadcast, the GELU epilogue of a linear layer and the bias gradient.
 * There is one thread pool, OpenMP's: OpenBLAS always runs single-threaded
 * (cpu_threads.c) and a large product is split into one contiguous block of
 * rows (or columns) per OpenMP thread, each a single-threaded sgemm that adds
 * the bias (and the GELU) to its own block while it is in cache. So BLAS threads and OpenMP threads never compete
 * for cores, and nothing spins between calls but the pool itself. A linear
 * layer's forward over a few rows (decode) streams the weight instead
 * (cpu_linear.c); a thread whose products are bf16 goes to cpu_gemm_bf16.c. */
#include <cblas.h>
#include <limits.h>

#include "kernels/cpu/cpu_gemm.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_round.h"
#include "kernels/cpu/cpu_simd.h"

/* act = gelu(o), o rounded to `input` first (f32: as it is). */
static void gelu_of(float *act, float *o, int64_t n, dsc_dtype input) {
    if (input != DSC_DTYPE_F32) dsc_cpu_round_span(o, o, n, input);
    dsc_cpu_gelu_rows(act, o, n);
}

void dsc_cpu_gemm_epilogue_row(const gemm_args *g, float *row, float *act_row, int64_t c0, int64_t n) {
    for (int64_t j = 0; g->bias && j < n; j++)
        row[j] += g->bias[c0 + j];
    if (act_row) gelu_of(act_row, row, n, g->act_input);
}

/* Rows [r0, r1) and columns [c0, c1) of out, as one single-threaded sgemm, then the bias and the
 * GELU epilogue row by row (a row of the block is still in L1 for its GELU). */
static void gemm_block(const gemm_args *g, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    int64_t m = r1 - r0, n = c1 - c0, k = g->k;
    if (m <= 0 || n <= 0) return;
    /* Leading dimensions of the stored (untransposed) matrices; BLAS wants at least 1. */
    int64_t lda = dsc_cpu_gemm_lda(g), ldb = dsc_cpu_gemm_ldb(g), ldo = dsc_cpu_gemm_ldo(g);
    const float *a = g->a + (g->ta ? r0 : r0 * lda); /* (M, K) or (K, M) */
    const float *b = g->b + (g->tb ? c0 * ldb : c0); /* (K, N) or (N, K) */
    float *o = g->o + r0 * ldo + c0;
    cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans, (int)m,
                (int)n, (int)k, g->alpha, a, lda > 1 ? (int)lda : 1, b, ldb > 1 ? (int)ldb : 1, g->beta, o,
                (int)ldo);
    for (int64_t r = 0; (g->bias || g->act) && r < m; r++)
        dsc_cpu_gemm_epilogue_row(g, o + r * ldo, g->act ? g->act + (r0 + r) * ldo + c0 : NULL, c0, n);
}

/* One of `parts` blocks of the longer side (multiples of 16, the kernels' register blocks). */
typedef struct split_job {
    const gemm_args *g;
    bool by_rows;
    int64_t len, part;
} split_job;

static void split_block(void *arg, int64_t p) {
    const split_job *S = arg;
    int64_t s = p * S->part, e = s + S->part < S->len ? s + S->part : S->len;
    if (S->by_rows)
        gemm_block(S->g, s, e, 0, S->g->n);
    else
        gemm_block(S->g, 0, S->g->m, s, e);
}

static void gemm_split(const gemm_args *g) {
    int nt = dsc_kernels_get_num_threads();
    if (nt <= 1 || g->m * g->n * g->k < DSC_CPU_GEMM_SPLIT_MIN_WORK) {
        gemm_block(g, 0, g->m, 0, g->n);
        return;
    }
    /* The longer side is split, one block per thread: each block's sgemm packs the whole of the
     * other operand again, so more blocks (for balance) cost more than a late thread does
     * (prefill 512: 4 blocks a thread ran 7% slower than 1, bench_decode). */
    bool by_rows = g->m >= g->n, pool = dsc_cpu_pool_scope();
    int64_t len = by_rows ? g->m : g->n, parts = nt;
    split_job S = {.g = g, .by_rows = by_rows, .len = len, .part = ((len + parts - 1) / parts + 15) / 16 * 16};
    int64_t blocks = (len + S.part - 1) / S.part;
    if (pool) {
        dsc_cpu_pool_run(split_block, &S, blocks);
        return;
    }
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t p = 0; p < blocks; p++)
        split_block(&S, p);
}

/* A linear layer over a few rows (decode) streams b once instead of packing it; the rest splits. */
void dsc_cpu_gemm_f32(const gemm_args *g) {
    const bool packed = dsc_cpu_gemm_lda(g) == g->k && dsc_cpu_gemm_ldb(g) == g->k && dsc_cpu_gemm_ldo(g) == g->n;
    if (g->m <= DSC_CPU_STREAM_MAX_ROWS && !g->ta && g->tb && g->alpha == 1.0f && g->beta == 0.0f && g->k > 0 &&
        packed) {
        dsc_cpu_stream_rows(g->o, g->a, g->b, DSC_WEIGHT_F32, g->bias, g->m, g->n, g->k);
        if (g->act) gelu_of(g->act, g->o, g->m * g->n, g->act_input);
        return;
    }
    gemm_split(g);
}

/* In the calling thread's product type (dsc_kernels_set_matmul_dtype). */
static dsc_status run(const gemm_args *g) {
    dsc_dtype products = dsc_kernels_get_matmul_dtype();
    if (products != DSC_DTYPE_F32 && g->m > 0 && g->n > 0 && g->k > 0) return dsc_cpu_gemm_rounded(g, products);
    dsc_cpu_gemm_f32(g);
    return NULL;
}

static dsc_status check_extents(int64_t m, int64_t n, int64_t k) {
    DSC_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX, DSC_ERR_UNSUPPORTED,
              "cblas_sgemm: extents (%lld, %lld, %lld) exceed the 32-bit BLAS interface", (long long)m,
              (long long)n, (long long)k);
    return NULL;
}

dsc_status dsc_cpu_gemm(const dsc_backend *backend, float *out, const float *a, const float *b, const float *bias,
                        int64_t batch, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, float alpha,
                        float beta) {
    (void)backend;
    DSC_TRY(check_extents(m, n, k));
    for (int64_t i = 0; i < batch; i++) {
        gemm_args g = {.o = out + i * m * n,
                       .a = a + i * m * k,
                       .b = b + i * k * n,
                       .bias = bias,
                       .m = m,
                       .n = n,
                       .k = k,
                       .ta = trans_a,
                       .tb = trans_b,
                       .alpha = alpha,
                       .beta = beta};
        DSC_TRY(run(&g));
    }
    return NULL;
}

/* A linear layer's product: y (n, oc) = x (n, c) @ w^T + bias. */
static gemm_args linear_args(void *y, const float *x, const float *w, const float *bias, int64_t n, int64_t oc,
                             int64_t c) {
    return (gemm_args){.o = y, .a = x, .b = w, .bias = bias, .m = n, .n = oc, .k = c, .tb = true, .alpha = 1.0f};
}

dsc_status dsc_cpu_linear_gelu(const dsc_backend *backend, float *act, float *y, const float *x, const float *w,
                               const float *bias, int64_t n, int64_t oc, int64_t c) {
    (void)backend;
    DSC_TRY(check_extents(n, oc, c));
    gemm_args g = linear_args(y, x, w, bias, n, oc, c);
    g.act = act;
    g.act_input = dsc_kernels_get_matmul_dtype();
    return run(&g);
}

/* dbias += sum_rows dy, the sums rounded to `sum` (f32: as summed) before they are added. */
static void bias_grad(float *dbias, const float *dy, int64_t n, int64_t oc, dsc_dtype sum) {
    int nt = dsc_kernels_get_num_threads();
    /* Each thread owns a slice of channels, so the accumulation is race-free. */
#pragma omp parallel for num_threads(nt) if (dsc_cpu_parallel(n * oc)) schedule(static)
    for (int64_t c0 = 0; c0 < oc; c0 += 64) {
        int64_t c1 = c0 + 64 < oc ? c0 + 64 : oc;
        float acc[64] = {0};
        for (int64_t r = 0; r < n; r++) {
            const float *row = dy + r * oc;
            for (int64_t c = c0; c < c1; c++)
                acc[c - c0] += row[c];
        }
        if (sum != DSC_DTYPE_F32) dsc_cpu_round_span(acc, acc, c1 - c0, sum);
        for (int64_t c = c0; c < c1; c++)
            dbias[c] += acc[c - c0];
    }
}

dsc_status dsc_cpu_linear_backward_bias(const dsc_backend *backend, float *dbias, const float *dy, int64_t n,
                                        int64_t oc) {
    (void)backend;
    bias_grad(dbias, dy, n, oc, DSC_DTYPE_F32);
    return NULL;
}

dsc_status dsc_cpu_linear_grads_rounded(const dsc_backend *backend, float *dw, float *dbias, const float *dy,
                                        const float *x, int64_t n, int64_t oc, int64_t c, dsc_dtype dtype) {
    (void)backend;
    DSC_TRY(check_extents(oc, c, n));
    /* dw (OC, C) += round(dy^T (OC, N) @ x (N, C)) */
    gemm_args g = {.o = dw, .a = dy, .b = x, .m = oc, .n = c, .k = n, .ta = true, .alpha = 1.0f, .beta = 1.0f};
    if (dw) DSC_TRY(dsc_cpu_gemm_add_rounded(&g, dsc_kernels_get_matmul_dtype(), dtype));
    if (dbias) bias_grad(dbias, dy, n, oc, dtype);
    return NULL;
}

dsc_status dsc_cpu_linear_narrow_y(const dsc_backend *backend, void *y, dsc_dtype y_type, const float *x,
                                   const float *w, const float *bias, int64_t n, int64_t oc, int64_t c) {
    (void)backend;
    DSC_TRY(check_extents(n, oc, c));
    if (n == 0 || oc == 0 || c == 0) return NULL; /* the wrapper takes no linear map from 0 features */
    gemm_args g = linear_args(y, x, w, bias, n, oc, c);
    g.o_type = y_type;
    return dsc_cpu_gemm_rounded(&g, dsc_kernels_get_matmul_dtype());
}

dsc_status dsc_cpu_linear_backward_narrow_dy(const dsc_backend *backend, float *dx, float *dw, const void *dy,
                                             dsc_dtype dy_type, const float *x, const float *w, int64_t n,
                                             int64_t oc, int64_t c, dsc_dtype grad_dtype) {
    (void)backend;
    DSC_TRY(check_extents(n, oc, c));
    if (dx && n > 0 && c > 0 && oc > 0) { /* oc 0 leaves no row of dy: the wrapper takes no such map */
        /* dx (N, C) = dy (N, OC) @ w (OC, C) */
        gemm_args g = {.o = dx, .a = dy, .a_type = dy_type, .b = w, .m = n, .n = c, .k = oc, .alpha = 1.0f};
        DSC_TRY(dsc_cpu_gemm_rounded(&g, dsc_kernels_get_matmul_dtype()));
    }
    /* dw (OC, C) += round(dy^T (OC, N) @ x (N, C)) */
    gemm_args g = {.o = dw,
                   .a = dy,
                   .a_type = dy_type,
                   .b = x,
                   .m = oc,
                   .n = c,
                   .k = n,
                   .ta = true,
                   .alpha = 1.0f,
                   .beta = 1.0f};
    return dw ? dsc_cpu_gemm_add_rounded(&g, dsc_kernels_get_matmul_dtype(), grad_dtype) : NULL;
}
