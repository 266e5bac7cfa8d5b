/* Products in bf16 or fp16 for a thread that asked for them (dsc_kernels_set_matmul_dtype: mixed
 * precision training): both operands rounded to the type, the products (exact in f32) summed in
 * f32, as torch.autocast's bf16 matmuls and a GPU's fp16 GEMM with f32 accumulation. On AVX-512
 * BF16 a prompt-sized bf16 product runs the vdpbf16ps tiles of cpu_bf16_gemm.c over op(a) rounded
 * once and op(b) rounded into packed blocks; elsewhere, for fp16, and for small products, sgemm
 * multiplies rounded copies. */
#include <cblas.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_bf16_gemm.h"
#include "kernels/cpu/cpu_gemm.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_round.h"
#include "kernels/cpu/cpu_simd.h"

static _Thread_local dsc_dtype matmul_dtype = DSC_DTYPE_F32;

dsc_dtype dsc_kernels_set_matmul_dtype(dsc_dtype dtype) {
    dsc_dtype was = matmul_dtype;
    matmul_dtype = dtype == DSC_DTYPE_BF16 || dtype == DSC_DTYPE_F16 ? dtype : DSC_DTYPE_F32;
    return was;
}

dsc_dtype dsc_cpu_matmul_dtype(void) {
    return matmul_dtype;
}

/* The two operands' buffers, kept by each calling thread between products (the rounded x and the
 * packs of the dot, or the rounded copies sgemm multiplies: a product takes one way), grown to the
 * largest product asked for (GPT-2's head input gradient, 512 rows of 50257: 51 MB for the dot's
 * x). */
static _Thread_local dsc_cpu_kept first_scratch, second_scratch;
/* The threads' tiles of a product whose sum is rounded before it is added (dsc_cpu_gemm_add_rounded). */
static _Thread_local dsc_cpu_kept tile_scratch;

void *dsc_cpu_kept_at_least(dsc_cpu_kept *s, size_t bytes) {
    if (s->bytes >= bytes) return s->p;
    free(s->p);
    dsc_mem_account(DSC_MEM_OTHER, -(int64_t)s->bytes); /* counted as the other workspaces */
    size_t whole = (bytes + 63) / 64 * 64;
    s->p = aligned_alloc(64, whole);
    s->bytes = s->p ? whole : 0;
    dsc_mem_account(DSC_MEM_OTHER, (int64_t)s->bytes);
    return s->p;
}

#if defined(__x86_64__)
/* out's columns one packed block of op(b) serves (cpu_bf16_gemm.c), and the rows of op(a) one
 * chunk rounds when op(a) is the larger operand (16 of the kernel's 6-row tiles) */
enum { BF16_BLOCK = 64, BF16_ROWS = 96 };

/* One operand prepared whole, the other in pieces per thread. With at least as many columns as
 * rows, op(a) is rounded once into xb and each BF16_BLOCK columns of out packs op(b)'s rows for
 * them into its thread's pack and multiplies every row of xb; with more rows (the weight gradients
 * of wide layers, the head's: 50257 rows), op(b) is packed whole once and each BF16_ROWS rows of
 * op(a) are rounded into their thread's xb and multiply every packed block, so the larger operand
 * is read once. Element (i, kk) of op(a) is at a[i * a_rs + kk * a_cs], element (j, kk) of
 * op(b)^T at b[j * b_rs + kk * b_ks]. */
typedef struct bf16_job {
    const gemm_args *g;
    uint16_t *xb;
    uint32_t *packs;
    size_t pack_words, xb_halves; /* one block's words; one thread's chunk of x (by rows) */
    int64_t a_rs, a_cs, b_rs, b_ks;
    bool pool;
} bf16_job;

static int thread_slot(const bf16_job *J) {
    return J->pool ? dsc_cpu_pool_thread() : omp_get_thread_num();
}

static int64_t block_cols(const gemm_args *g, int64_t j0) {
    return g->n - j0 < BF16_BLOCK ? g->n - j0 : BF16_BLOCK;
}

/* The bias and the GELU of rows [i0, i1), columns [j0, j0 + cols) of out. */
static void epilogue(const gemm_args *g, int64_t i0, int64_t i1, int64_t j0, int64_t cols) {
    for (int64_t i = i0; (g->bias || g->act) && i < i1; i++) {
        float *row = g->o + i * g->n + j0;
        for (int64_t j = 0; g->bias && j < cols; j++)
            row[j] += g->bias[j0 + j];
        if (g->act) dsc_cpu_gelu_rows(g->act + i * g->n + j0, row, cols);
    }
}

static void round_rows(void *arg, int64_t p) {
    const bf16_job *J = arg;
    int64_t i0 = p * BF16_BLOCK, i1 = i0 + BF16_BLOCK < J->g->m ? i0 + BF16_BLOCK : J->g->m;
    dsc_cpu_bf16_round_x_rows(J->xb, J->g->a, J->a_rs, J->a_cs, J->g->k, i0, i1);
}

static void columns_block(void *arg, int64_t p) {
    const bf16_job *J = arg;
    const gemm_args *g = J->g;
    uint32_t *pack = J->packs + (size_t)thread_slot(J) * J->pack_words;
    int64_t j0 = p * BF16_BLOCK, cols = block_cols(g, j0);
    dsc_cpu_bf16_pack_f32(pack, g->b, J->b_rs, J->b_ks, g->k, j0, cols);
    dsc_cpu_bf16_multiply(g->o, g->n, J->xb, g->m, pack, g->k, j0, cols, g->alpha, g->beta == 1.0f);
    epilogue(g, 0, g->m, j0, cols);
}

static void pack_block(void *arg, int64_t p) {
    const bf16_job *J = arg;
    int64_t j0 = p * BF16_BLOCK;
    dsc_cpu_bf16_pack_f32(J->packs + (size_t)p * J->pack_words, J->g->b, J->b_rs, J->b_ks, J->g->k, j0,
                          block_cols(J->g, j0));
}

static void rows_chunk(void *arg, int64_t p) {
    const bf16_job *J = arg;
    const gemm_args *g = J->g;
    uint16_t *xb = J->xb + (size_t)thread_slot(J) * J->xb_halves;
    int64_t i0 = p * BF16_ROWS, len = g->m - i0 < BF16_ROWS ? g->m - i0 : BF16_ROWS;
    dsc_cpu_bf16_pad_x(xb, len, g->k);
    dsc_cpu_bf16_round_x_rows(xb, g->a + i0 * J->a_rs, J->a_rs, J->a_cs, g->k, 0, len);
    for (int64_t j0 = 0, b = 0; j0 < g->n; j0 += BF16_BLOCK, b++)
        dsc_cpu_bf16_multiply(g->o + i0 * g->n, g->n, xb, len, J->packs + (size_t)b * J->pack_words, g->k, j0,
                              block_cols(g, j0), g->alpha, g->beta == 1.0f);
    epilogue(g, i0, i0 + len, 0, g->n);
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

/* The product on AVX-512 BF16 (vdpbf16ps), where it pays: more rows than decode streams and
 * enough work to split; false leaves it to the rounded copies. */
static bool bf16_dot_gemm(const gemm_args *g) {
    if (!dsc_cpu_bf16_gemm_available() || g->m <= DSC_CPU_STREAM_MAX_ROWS || g->k < 2 ||
        g->m * g->n * g->k < DSC_CPU_GEMM_SPLIT_MIN_WORK)
        return false;
    int nt = dsc_kernels_get_num_threads();
    bf16_job J = {.g = g,
                  .pack_words = dsc_cpu_bf16_pack_bytes(BF16_BLOCK, g->k) / sizeof(uint32_t),
                  .a_rs = g->ta ? 1 : g->k,
                  .a_cs = g->ta ? g->m : 1,
                  .b_rs = g->tb ? g->k : 1,
                  .b_ks = g->tb ? 1 : g->n,
                  .pool = dsc_cpu_pool_scope() && !dsc_cpu_pool_inside()};
    const int64_t blocks = (g->n + BF16_BLOCK - 1) / BF16_BLOCK;
    const bool by_rows = g->m > g->n;
    J.xb_halves = dsc_cpu_bf16_x_bytes(BF16_ROWS, g->k) / sizeof(uint16_t);
    J.xb = dsc_cpu_kept_at_least(&first_scratch, by_rows ? (size_t)nt * J.xb_halves * sizeof(uint16_t)
                                                         : dsc_cpu_bf16_x_bytes(g->m, g->k));
    J.packs =
        dsc_cpu_kept_at_least(&second_scratch, (size_t)(by_rows ? blocks : nt) * J.pack_words * sizeof(uint32_t));
    if (!J.xb || !J.packs) return false;
    if (by_rows) {
        bf16_parallel(&J, pack_block, blocks, nt);
        bf16_parallel(&J, rows_chunk, (g->m + BF16_ROWS - 1) / BF16_ROWS, nt);
    } else {
        dsc_cpu_bf16_pad_x(J.xb, g->m, g->k);
        bf16_parallel(&J, round_rows, (g->m + BF16_BLOCK - 1) / BF16_BLOCK, nt);
        bf16_parallel(&J, columns_block, blocks, nt);
    }
    return true;
}
#else
static bool bf16_dot_gemm(const gemm_args *g) {
    (void)g;
    return false;
}
#endif

float *dsc_cpu_rounded_copy(dsc_cpu_kept *s, const float *v, int64_t n, dsc_dtype dtype) {
    enum { CHUNK = 1 << 14 };
    float *r = dsc_cpu_kept_at_least(s, (size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!r) return NULL;
    const int64_t chunks = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for num_threads(dsc_kernels_get_num_threads()) if (dsc_cpu_parallel(n)) schedule(static)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t b = c * CHUNK;
        dsc_cpu_round_span(r + b, v + b, n - b < CHUNK ? n - b : CHUNK, dtype);
    }
    return r;
}

/* A product in bf16 / fp16: both operands rounded to the type, the products (exact in f32) summed
 * in f32. On AVX-512 BF16 vdpbf16ps does both at once for bf16; elsewhere, and for small products,
 * sgemm multiplies rounded copies. The same values either way but for the order of the sums. */
dsc_status dsc_cpu_gemm_rounded(const gemm_args *g, dsc_dtype dtype) {
    if (g->beta != 0.0f && g->beta != 1.0f) { /* the bf16 tiles add or overwrite */
        for (int64_t i = 0; i < g->m * g->n; i++)
            g->o[i] *= g->beta;
        gemm_args one = *g;
        one.beta = 1.0f;
        return dsc_cpu_gemm_rounded(&one, dtype);
    }
    if (dtype == DSC_DTYPE_BF16 && bf16_dot_gemm(g)) return NULL;
    gemm_args r = *g;
    float *ra = dsc_cpu_rounded_copy(&first_scratch, g->a, g->m * g->k, dtype),
          *rb = dsc_cpu_rounded_copy(&second_scratch, g->b, g->k * g->n, dtype);
    dsc_status s = ra && rb ? NULL
                            : dsc_error(DSC_ERR_NOMEM,
                                        "dsc_kernel_gemm: %s copies of a (%lld x %lld) and b "
                                        "(%lld x %lld)",
                                        dsc_dtype_name(dtype), (long long)g->m, (long long)g->k, (long long)g->k,
                                        (long long)g->n);
    if (!s) {
        r.a = ra;
        r.b = rb;
        dsc_cpu_gemm_f32(&r);
    }
    return s;
}

/* out tiles of dsc_cpu_gemm_add_rounded: TILE_COLS columns (or fewer) by as many rows as make
 * TILE_FLOATS (a megabyte, in L2 while it is rounded and added), a multiple of 16 */
enum { TILE_COLS = 2048, TILE_FLOATS = 1 << 18 };

typedef struct add_rounded_job {
    const gemm_args *g;
    dsc_dtype sum;
    float *tiles; /* one tile per thread */
    int64_t rows, cols, col_tiles;
    bool pool;
} add_rounded_job;

static void add_rounded_tile(void *arg, int64_t p) {
    const add_rounded_job *J = arg;
    const gemm_args *g = J->g;
    const int64_t r0 = p / J->col_tiles * J->rows, c0 = p % J->col_tiles * J->cols;
    const int64_t m = g->m - r0 < J->rows ? g->m - r0 : J->rows, n = g->n - c0 < J->cols ? g->n - c0 : J->cols;
    float *tile = J->tiles + (size_t)(J->pool ? dsc_cpu_pool_thread() : omp_get_thread_num()) * TILE_FLOATS;
    int lda = (int)(g->ta ? g->m : g->k), ldb = (int)(g->tb ? g->k : g->n);
    const float *a = g->a + (g->ta ? r0 : r0 * g->k), *b = g->b + (g->tb ? c0 * g->k : c0);
    cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans, (int)m,
                (int)n, (int)g->k, g->alpha, a, lda > 0 ? lda : 1, b, ldb > 0 ? ldb : 1, 0.0f, tile, (int)n);
    for (int64_t i = 0; i < m; i++) {
        float *row = tile + i * n, *o = g->o + (r0 + i) * g->n + c0;
        dsc_cpu_round_span(row, row, n, J->sum);
        for (int64_t j = 0; j < n; j++)
            o[j] += row[j];
    }
}

dsc_status dsc_cpu_gemm_add_rounded(const gemm_args *g, dsc_dtype products, dsc_dtype sum) {
    if (g->m <= 0 || g->n <= 0 || g->k <= 0) return NULL; /* a sum of nothing adds 0 */
    gemm_args r = *g;
    if (products != DSC_DTYPE_F32) {
        r.a = dsc_cpu_rounded_copy(&first_scratch, g->a, g->m * g->k, products);
        r.b = dsc_cpu_rounded_copy(&second_scratch, g->b, g->k * g->n, products);
    }
    const int nt = g->m * g->n * g->k < DSC_CPU_GEMM_SPLIT_MIN_WORK ? 1 : dsc_kernels_get_num_threads();
    add_rounded_job J = {.g = &r, .sum = sum, .pool = dsc_cpu_pool_scope() && !dsc_cpu_pool_inside()};
    J.cols = g->n < TILE_COLS ? g->n : TILE_COLS;
    J.col_tiles = (g->n + J.cols - 1) / J.cols;
    /* Row tiles of at most a tile's floats, as many as give every thread the same number of tiles
     * (or at least 8 each): GPT-2's 768 x 768 weight gradients in 3 tiles left one of 2 threads idle
     * for a third of each, a 5-8 % slower bf16 step. */
    const int64_t most_rows = TILE_FLOATS / J.cols / 16 * 16;
    int64_t row_tiles = (g->m + most_rows - 1) / most_rows;
    while (row_tiles * J.col_tiles % nt != 0 && row_tiles * J.col_tiles < 8 * (int64_t)nt)
        row_tiles++;
    J.rows = ((g->m + row_tiles - 1) / row_tiles + 15) / 16 * 16;
    J.tiles = dsc_cpu_kept_at_least(&tile_scratch, (size_t)nt * TILE_FLOATS * sizeof(float));
    DSC_CHECK(r.a && r.b && J.tiles, DSC_ERR_NOMEM,
              "dsc_kernel_linear_backward: %s copies of dy (%lld x %lld) and x (%lld x %lld), and %d tiles",
              dsc_dtype_name(products), (long long)g->k, (long long)g->m, (long long)g->k, (long long)g->n, nt);
    const int64_t tiles = (g->m + J.rows - 1) / J.rows * J.col_tiles;
    if (nt == 1) {
        J.pool = false; /* omp_get_thread_num() is 0 outside a region */
        for (int64_t p = 0; p < tiles; p++)
            add_rounded_tile(&J, p);
    } else if (J.pool) {
        dsc_cpu_pool_run_upto(add_rounded_tile, &J, tiles, nt);
    } else {
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int64_t p = 0; p < tiles; p++)
            add_rounded_tile(&J, p);
    }
    return NULL;
}
