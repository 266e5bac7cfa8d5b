/* GEMM on the CPU through OpenBLAS (row-major cblas_sgemm, one call per
 * batch entry: this OpenBLAS has no batched entry point), plus the bias
 * broadcast, the GELU epilogue of a linear layer and the bias gradient.
 * There is one thread pool, OpenMP's: OpenBLAS always runs single-threaded
 * (cpu_threads.c) and a large product is split into one contiguous block of
 * rows (or columns) per OpenMP thread, each a single-threaded sgemm that adds
 * the bias (and the GELU) to its own block while it is in cache. So BLAS threads and OpenMP threads never compete
 * for cores, and nothing spins between calls but the pool itself. A linear
 * layer's forward over a few rows (decode) streams the weight instead
 * (cpu_linear.c). */
#include <cblas.h>
#include <limits.h>
#include <omp.h>
#include <stdlib.h>

#include "kernels/cpu/cpu_bf16_gemm.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_simd.h"

/* Multiply-adds below which one thread does the whole product. */
#define SPLIT_MIN_WORK (1 << 18)

typedef struct gemm_args {
    float *o;
    float *act; /* gelu(o) after the bias, out of the same block while it is in cache; NULL: none */
    const float *a, *b, *bias;
    int64_t m, n, k;
    bool ta, tb;
    float alpha, beta;
} gemm_args;

/* Rows [r0, r1) and columns [c0, c1) of out, as one single-threaded sgemm, then the bias and the
 * GELU epilogue row by row (a row of the block is still in L1 for its GELU). */
static void gemm_block(const gemm_args *g, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    int64_t m = r1 - r0, n = c1 - c0, k = g->k;
    if (m <= 0 || n <= 0) return;
    /* Leading dimensions of the stored (untransposed) matrices; BLAS wants at least 1. */
    int lda = (int)(g->ta ? g->m : k), ldb = (int)(g->tb ? k : g->n);
    if (lda < 1) lda = 1;
    if (ldb < 1) ldb = 1;
    const float *a = g->a + (g->ta ? r0 : r0 * k); /* (M, K) or (K, M) */
    const float *b = g->b + (g->tb ? c0 * k : c0); /* (K, N) or (N, K) */
    float *o = g->o + r0 * g->n + c0;
    cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans, (int)m,
                (int)n, (int)k, g->alpha, a, lda, b, ldb, g->beta, o, (int)g->n);
    for (int64_t r = 0; (g->bias || g->act) && r < m; r++) {
        float *row = o + r * g->n;
        for (int64_t j = 0; g->bias && j < n; j++)
            row[j] += g->bias[c0 + j];
        if (g->act) dsc_cpu_gelu_rows(g->act + (r0 + r) * g->n + c0, row, n);
    }
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
    if (nt <= 1 || g->m * g->n * g->k < SPLIT_MIN_WORK) {
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

/* ---- products in bf16 (dsc_kernels_set_matmul_dtype) ---- */

static _Thread_local dsc_dtype matmul_dtype = DSC_DTYPE_F32;

dsc_dtype dsc_kernels_set_matmul_dtype(dsc_dtype dtype) {
    dsc_dtype was = matmul_dtype;
    matmul_dtype = dtype == DSC_DTYPE_BF16 ? DSC_DTYPE_BF16 : DSC_DTYPE_F32;
    return was;
}

#if defined(__x86_64__)
enum { BF16_BLOCK = 64 }; /* out's columns one packed block of op(b) serves (cpu_bf16_gemm.c) */

/* op(a) rounded once into xb, then each BF16_BLOCK columns of out: op(b)'s rows for them packed
 * (rounded) into the running thread's buffer and multiplied with every row of xb. Element (i, kk)
 * of op(a) is at a[i * a_rs + kk * a_cs], element (j, kk) of op(b)^T at b[j * b_rs + kk * b_ks]. */
typedef struct bf16_job {
    const gemm_args *g;
    uint16_t *xb;
    uint32_t *packs;
    size_t pack_words;
    int64_t a_rs, a_cs, b_rs, b_ks;
    bool pool;
} bf16_job;

static void bf16_round(void *arg, int64_t p) {
    const bf16_job *J = arg;
    int64_t i0 = p * BF16_BLOCK, i1 = i0 + BF16_BLOCK < J->g->m ? i0 + BF16_BLOCK : J->g->m;
    dsc_cpu_bf16_round_x_rows(J->xb, J->g->a, J->a_rs, J->a_cs, J->g->k, i0, i1);
}

static void bf16_block(void *arg, int64_t p) {
    const bf16_job *J = arg;
    const gemm_args *g = J->g;
    int slot = J->pool ? dsc_cpu_pool_thread() : omp_get_thread_num();
    int64_t j0 = p * BF16_BLOCK, cols = g->n - j0 < BF16_BLOCK ? g->n - j0 : BF16_BLOCK;
    dsc_cpu_bf16_gemm_f32_block(g->o, g->n, J->xb, g->m, g->b, J->b_rs, J->b_ks, g->k, j0, cols,
                                J->packs + (size_t)slot * J->pack_words, g->alpha, g->beta == 1.0f);
    for (int64_t i = 0; (g->bias || g->act) && i < g->m; i++) {
        float *row = g->o + i * g->n + j0;
        for (int64_t j = 0; g->bias && j < cols; j++)
            row[j] += g->bias[j0 + j];
        if (g->act) dsc_cpu_gelu_rows(g->act + i * g->n + j0, row, cols);
    }
}

static void bf16_parallel(bf16_job *J, void (*fn)(void *, int64_t), int64_t chunks, int nt) {
    if (J->pool) {
        dsc_cpu_pool_run_upto(fn, J, chunks, nt);
        return;
    }
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t p = 0; p < chunks; p++)
        fn(J, p);
}

/* The rounded x and the pack buffers, kept by each calling thread between products: a fresh
 * allocation of megabytes is a fresh mapping, and faulting its pages in (the kernel zeroing each)
 * took as long as the products themselves in a GPT-2 step. Grown to the largest product asked
 * for (GPT-2's head gradient: 51 MB) and kept while the thread lives. */
typedef struct bf16_scratch {
    void *p;
    size_t bytes;
} bf16_scratch;
static _Thread_local bf16_scratch xb_scratch, pack_scratch;

static void *scratch_at_least(bf16_scratch *s, size_t bytes) {
    if (s->bytes >= bytes) return s->p;
    free(s->p);
    dsc_mem_account(DSC_MEM_OTHER, -(int64_t)s->bytes); /* counted as the other workspaces */
    size_t whole = (bytes + 63) / 64 * 64;
    s->p = aligned_alloc(64, whole);
    s->bytes = s->p ? whole : 0;
    dsc_mem_account(DSC_MEM_OTHER, (int64_t)s->bytes);
    return s->p;
}

/* The product on AVX-512 BF16 (vdpbf16ps), where it pays: more rows than decode streams and
 * enough work to split; false leaves it to the rounded copies. */
static bool bf16_dot_gemm(const gemm_args *g) {
    if (!dsc_cpu_bf16_gemm_available() || g->m <= DSC_CPU_STREAM_MAX_ROWS || g->k < 2 ||
        g->m * g->n * g->k < SPLIT_MIN_WORK)
        return false;
    int nt = dsc_kernels_get_num_threads();
    bf16_job J = {.g = g,
                  .pack_words = dsc_cpu_bf16_pack_bytes(BF16_BLOCK, g->k) / sizeof(uint32_t),
                  .a_rs = g->ta ? 1 : g->k,
                  .a_cs = g->ta ? g->m : 1,
                  .b_rs = g->tb ? g->k : 1,
                  .b_ks = g->tb ? 1 : g->n,
                  .pool = dsc_cpu_pool_scope() && !dsc_cpu_pool_inside()};
    J.xb = scratch_at_least(&xb_scratch, dsc_cpu_bf16_x_bytes(g->m, g->k));
    J.packs = scratch_at_least(&pack_scratch, (size_t)nt * J.pack_words * sizeof(uint32_t));
    if (!J.xb || !J.packs) return false;
    dsc_cpu_bf16_pad_x(J.xb, g->m, g->k);
    bf16_parallel(&J, bf16_round, (g->m + BF16_BLOCK - 1) / BF16_BLOCK, nt);
    bf16_parallel(&J, bf16_block, (g->n + BF16_BLOCK - 1) / BF16_BLOCK, nt);
    return true;
}
#else
static bool bf16_dot_gemm(const gemm_args *g) {
    (void)g;
    return false;
}
#endif

static void run_f32(const gemm_args *g);

/* f32 copies of v[0 .. n) rounded to bf16 (NULL without memory). */
static float *rounded_copy(const float *v, int64_t n) {
    float *r = malloc((size_t)(n > 0 ? n : 1) * sizeof *r);
    if (!r) return NULL;
    for (int64_t i = 0; i < n; i++)
        r[i] = dsc_bf16_to_f32(dsc_f32_to_bf16(v[i]));
    return r;
}

/* A product in bf16: both operands rounded to bf16, the products (exact in f32) summed in f32.
 * On AVX-512 BF16 vdpbf16ps does both at once; elsewhere, and for small products, sgemm
 * multiplies rounded copies. The same values either way but for the order of the sums. */
static dsc_status run_bf16(const gemm_args *g) {
    if (g->beta != 0.0f && g->beta != 1.0f) { /* the bf16 tiles add or overwrite */
        for (int64_t i = 0; i < g->m * g->n; i++)
            g->o[i] *= g->beta;
        gemm_args one = *g;
        one.beta = 1.0f;
        return run_bf16(&one);
    }
    if (bf16_dot_gemm(g)) return NULL;
    gemm_args r = *g;
    float *ra = rounded_copy(g->a, g->m * g->k), *rb = rounded_copy(g->b, g->k * g->n);
    dsc_status s = ra && rb ? NULL
                            : dsc_error(DSC_ERR_NOMEM,
                                        "dsc_kernel_gemm: bf16 copies of a (%lld x %lld) and b "
                                        "(%lld x %lld)",
                                        (long long)g->m, (long long)g->k, (long long)g->k, (long long)g->n);
    if (!s) {
        r.a = ra;
        r.b = rb;
        run_f32(&r);
    }
    free(ra);
    free(rb);
    return s;
}

/* A linear layer over a few rows (decode) streams b once instead of packing it; the rest splits. */
static void run_f32(const gemm_args *g) {
    if (g->m <= DSC_CPU_STREAM_MAX_ROWS && !g->ta && g->tb && g->alpha == 1.0f && g->beta == 0.0f && g->k > 0) {
        dsc_cpu_stream_rows(g->o, g->a, g->b, DSC_WEIGHT_F32, g->bias, g->m, g->n, g->k);
        if (g->act) dsc_cpu_gelu_rows(g->act, g->o, g->m * g->n);
        return;
    }
    gemm_split(g);
}

/* In the calling thread's product type (dsc_kernels_set_matmul_dtype). */
static dsc_status run(const gemm_args *g) {
    if (matmul_dtype == DSC_DTYPE_BF16 && g->m > 0 && g->n > 0 && g->k > 0) return run_bf16(g);
    run_f32(g);
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

dsc_status dsc_cpu_linear_gelu(const dsc_backend *backend, float *act, float *y, const float *x, const float *w,
                               const float *bias, int64_t n, int64_t oc, int64_t c) {
    (void)backend;
    DSC_TRY(check_extents(n, oc, c));
    gemm_args g = {
        .o = y, .act = act, .a = x, .b = w, .bias = bias, .m = n, .n = oc, .k = c, .tb = true, .alpha = 1.0f};
    return run(&g);
}

dsc_status dsc_cpu_linear_backward_bias(const dsc_backend *backend, float *dbias, const float *dy, int64_t n,
                                        int64_t oc) {
    (void)backend;
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
        for (int64_t c = c0; c < c1; c++)
            dbias[c] += acc[c - c0];
    }
    return NULL;
}
